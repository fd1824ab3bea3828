"""`FastTarget` and `FastDrafter`: the fast Llama behind the same interfaces as `HFCausalLM` / `ModelDrafter`
(`FastDrafter` IS a `ModelDrafter`, the one model drafter class, over a `FastLoopState`).

    target = FastTarget(hf_llama, dtype=torch.bfloat16, device="cuda")
    drafter = FastDrafter(hf_small_llama, dtype=torch.bfloat16, device="cuda")
    specdec.generate(target, prompts, drafter=drafter, temperature=0)

Shapes never change inside a request (`drop_finished_rows = False`: the loop keeps finished rows in the
batch), so on CUDA every decode call is a CUDA-graph replay: the target's verify pass (k = γ+1, or k = 1
for plain decoding) per batch size, and the drafter's whole proposal — γ single-token forwards plus
sampling — as one graph. The cache is sized to what the request needs (longest prompt + max_new_tokens +
max_draft_tokens slots per row) and reused, graphs included, while requests keep that shape.
"""

from __future__ import annotations

import torch

from specdec.drafters.base import LoopDraws, Proposal
from specdec.drafters.model import DraftState, ModelDrafter
from specdec.fast.graphs import CapturedStep, graph_options, new_pool
from specdec.fast.model import FastLlama, KVCache
from specdec.sequences import TokenBuffer

__all__ = ["FastTarget", "FastDrafter", "FastLoopState", "PairFeed", "load_fast_llama"]


def load_fast_llama(model, *, device=None, dtype: torch.dtype | None = None) -> FastLlama:
    """A `FastLlama` from a FastLlama, a transformers Llama object or a local folder."""
    if isinstance(model, FastLlama):
        if (device is not None and torch.device(device) != model.device) or (dtype is not None and dtype != model.dtype):
            raise ValueError("pass device/dtype when loading from transformers, not with a FastLlama")
        return model
    if device is None and isinstance(model, torch.nn.Module):
        device = next(model.parameters()).device
    return FastLlama.from_hf(model, device=device, dtype=dtype)


class _FastLM:
    """A FastLlama plus one cache and the graphs captured against it."""

    def __init__(self, model, device, dtype, max_draft_tokens: int, cuda_graphs: bool | None):
        self.model = load_fast_llama(model, device=device, dtype=dtype)
        self.max_draft_tokens, self.cuda_graphs = graph_options(self.model.device, max_draft_tokens, cuda_graphs)
        self.vocab_size: int = self.model.shape.vocab_size
        self.cache: KVCache | None = None
        self._graphs: dict = {}
        self._pool = None

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def lengths(self) -> torch.Tensor:
        return self.cache.lengths

    def allocate(self, batch_size: int, num_slots: int) -> None:
        """Make the cache `[B, H_kv, num_slots(+junk), D]`; an identical one (and its graphs) is reused."""
        cache = self.cache
        if cache is None or cache.batch_size != batch_size or cache.num_slots != _slots(num_slots):
            self.cache = None
            self._graphs.clear()  # graphs point at the old cache
            self.cache = self.model.new_cache(batch_size, num_slots)
            self.model.rope_tables(self.cache.keys[0].shape[2])  # fill lazily built tables outside any capture
        self.cache.lengths.zero_()

    def release(self) -> None:
        """Free the cache and graphs (e.g. between benchmark configurations)."""
        self.cache = None
        self._graphs.clear()
        self._pool = None

    def pool(self):
        """The memory pool shared by this model's graphs (created on first use)."""
        if self._pool is None:
            self._pool = new_pool()
        return self._pool

    def run(self, key, make_fn, inputs: dict[str, torch.Tensor], restore=()):
        """Run a step: eagerly, or by copying `inputs` into a captured graph's static tensors and replaying."""
        if not self.cuda_graphs:
            return make_fn(inputs)()
        entry = self._graphs.get(key)
        if entry is None:
            static = {name: t.clone() for name, t in inputs.items()}
            step = CapturedStep(make_fn(static), pool=self.pool(), restore=restore)
            entry = self._graphs[key] = (static, step)
        static, step = entry
        for name, t in inputs.items():
            static[name].copy_(t)
        return step.replay()

    def select_rows(self, index: torch.Tensor) -> None:
        self.cache = self.cache.select_rows(index)
        self._graphs.clear()


def crop_lengths(current: torch.Tensor, lengths: torch.Tensor | int) -> None:
    """A cache's roll-back to absolute lengths: `current` `[B]` (its lengths) set to `lengths` (an int or `[B]`), a
    pointer move (slots past it are invisible, later overwritten); checked on the CPU (a check would sync a GPU)."""
    if isinstance(lengths, int):
        current.fill_(lengths)
        return
    if current.device.type == "cpu" and bool(((lengths > current) | (lengths < 0)).any()):
        raise ValueError("crop can only shorten sequences (0 <= lengths <= current lengths)")
    current.copy_(lengths)


def _slots(num_slots: int) -> int:
    # KVCache.num_slots of a cache made for `num_slots` (alignment rounding included)
    return (num_slots + 1 + 15) // 16 * 16 - 1


class FastTarget(_FastLM):
    """The target M_p: `begin`, `forward(tokens [B, k]) -> logits [B, k, V]`, `crop(lengths)`, `select_rows`.

    max_draft_tokens: the largest γ this target will verify (it sizes the cache); cuda_graphs: None = on CUDA.
    """

    drop_finished_rows = False

    def __init__(self, model, *, device=None, dtype: torch.dtype | None = None, max_draft_tokens: int = 16,
                 cuda_graphs: bool | None = None):
        super().__init__(model, device, dtype, max_draft_tokens, cuda_graphs)
        self.config = self.model.config

    def begin(self, prompts: list[list[int]], max_new_tokens: int) -> TokenBuffer:
        """Start a batch: cache for prompt + max_new_tokens + max_draft_tokens; prefill all but each last token."""
        longest = max(len(p) for p in prompts)
        context = TokenBuffer(prompts, capacity=longest + max_new_tokens + 1, device=self.device)
        self.allocate(len(prompts), longest + max_new_tokens + self.max_draft_tokens)
        if longest > 1:
            width = longest - 1
            valid = torch.arange(width, device=self.device)[None, :] < (context.lengths - 1)[:, None]
            with torch.inference_mode():
                self.model(context.tokens[:, :width] * valid, self.cache, valid, last_only=True)
        return context

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Append `tokens [B, k]` at each row's own slots → logits `[B, k, V]` (float32, a fresh tensor)."""
        if tokens.shape[1] > self.max_draft_tokens + 1:
            raise ValueError(
                f"FastTarget was built for at most {self.max_draft_tokens} draft tokens per step "
                f"(max_draft_tokens); got a block of {tokens.shape[1]} tokens"
            )
        with torch.inference_mode():
            if valid is not None:
                return self.model(tokens, self.cache, valid)
            cache, model = self.cache, self.model

            def make(static):
                return lambda: model(static["tokens"], cache)

            return self.run(("verify", tuple(tokens.shape)), make, {"tokens": tokens}, restore=[cache.lengths]).clone()

    def crop(self, lengths: torch.Tensor | int) -> None:
        """Roll back to absolute lengths (`crop_lengths`)."""
        crop_lengths(self.cache.lengths, lengths)


class FastLoopState(DraftState):
    """A `ModelDrafter`'s state behind the transformers loop over a `FastLlama` (see `FastDrafter`): a per-row cache
    sized once per request shape, the whole proposal — γ single-token forwards plus the draws — one graph on CUDA.

    Each proposal re-feeds the last two committed tokens (static shape [B, 2]) at positions L−2, L−1, so the cache
    needs no commit bookkeeping: slots before L−2 always hold committed text."""

    kind = "FastDrafter"  # (for errors)

    def __init__(self, lm):
        self.lm = lm  # a `_FastLM` (or `fast.seq2seq`'s encoder-decoder one)
        self.model, self.vocab_size = lm.model, lm.vocab_size

    def begin(self, context: TokenBuffer) -> None:
        lm = self.lm
        lm.allocate(context.batch_size, context.capacity + lm.max_draft_tokens)
        prefix = (context.lengths - 2).clamp_min(0)
        width = max(int(context.start_lengths.max()) - 2, 0)  # host-known: the prompts' lengths
        if width:
            valid = torch.arange(width, device=lm.device)[None, :] < prefix[:, None]
            with torch.inference_mode():
                lm.model(context.tokens[:, :width] * valid, lm.cache, valid, last_only=True)

    def run(self, context: TokenBuffer, draws: LoopDraws, num_draft_tokens: int, chain) -> Proposal:
        """`chain` over the pair feed, with the noise drawn here from the loop's generator (outside the graph)."""
        lm, gamma, sampling = self.lm, num_draft_tokens, draws.sampling
        if gamma > lm.max_draft_tokens:
            raise ValueError(f"{self.kind} was built for at most {lm.max_draft_tokens} draft tokens (got {gamma})")
        inputs = pair_inputs(context.tokens, context.lengths)
        if not sampling.greedy:
            noise = torch.empty(context.batch_size, gamma, lm.vocab_size, device=lm.device)
            inputs["noise"] = noise.exponential_(generator=draws.generator)
        feed, threshold = PairFeed(lm.model, lm.cache), draws.confidence_threshold

        def make(static):
            graph_draws = LoopDraws(sampling, None, confidence_threshold=threshold, noise=static.get("noise"),
                                    host_stop=False)  # (no host sync inside a graph)
            return lambda: chain(feed, static, graph_draws, gamma)

        key = ("draft", context.batch_size, gamma, sampling, threshold)
        proposal = lm.run(key, make, inputs)
        return owned_proposal(proposal.tokens, proposal.probs, proposal.lengths, gamma)

    def commit(self, context: TokenBuffer) -> None:
        """Nothing to drop: the next proposal re-feeds from L − 2."""

    def select_rows(self, index: torch.Tensor) -> None:
        self.lm.select_rows(index)


class PairFeed(DraftState):
    """The feed of a cache re-fed from L − 2 (`pair_inputs`' `pair`, `valid`, `base` as the context)."""

    def __init__(self, model, cache: KVCache):
        self.model, self.cache = model, cache

    def feed(self, inputs: dict) -> torch.Tensor:
        self.cache.lengths.copy_(inputs["base"])
        return self.model(inputs["pair"], self.cache, inputs["valid"], last_only=True)[:, 0]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], self.cache, last_only=True)[:, 0]


def FastDrafter(model, *, device=None, dtype: torch.dtype | None = None, max_draft_tokens: int = 16,
                cuda_graphs: bool | None = None) -> ModelDrafter:
    """The model drafter (`drafters.model.ModelDrafter`, one class for both runners) over a `FastLlama` behind the
    transformers loop (`FastLoopState`): on CUDA the whole proposal is one graph replay. Finished rows stay in the
    batch (static shapes); no logits processors on the drafts (a host hook in a graph)."""
    drafter = ModelDrafter(state=FastLoopState(_FastLM(model, device, dtype, max_draft_tokens, cuda_graphs)))
    drafter.drop_finished_rows, drafter.accepts_processor = False, False
    return drafter


def owned_proposal(tokens: torch.Tensor, probs: torch.Tensor | None, lengths: torch.Tensor | None,
                   gamma: int) -> Proposal:
    """A `Proposal` of a graph's outputs, copied: the static tensors are overwritten by the next replay."""
    return Proposal(tokens=tokens.clone(), probs=probs.clone() if probs is not None else None,
                    lengths=lengths.clone() if lengths is not None else None, forward_passes=gamma)


def pair_inputs(tokens: torch.Tensor, lengths: torch.Tensor) -> dict:
    """The last two committed tokens of each row and where they go: `pair [B, 2]`, `valid [B, 2]`, `base [B]`."""
    pos = lengths[:, None] - 2 + torch.arange(2, device=tokens.device)[None, :]
    return {"pair": tokens.gather(1, pos.clamp_min(0)), "valid": pos >= 0, "base": (lengths - 2).clamp_min(0)}
