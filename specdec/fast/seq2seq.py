"""`FastSeq2SeqTarget` and `FastSeq2SeqDrafter`: the fast T5 decoder behind the interfaces of `HFSeq2SeqLM`
and `Seq2SeqModelDrafter`, so the ordinary loop runs it unchanged:

    target = FastSeq2SeqTarget(hf_t5, device="cuda")
    drafter = FastSeq2SeqDrafter(hf_small_t5, device="cuda")
    specdec.generate(target, sources, drafter=drafter, temperature=0)

Per request: the sources are right-padded to a power-of-two width, encoded once and turned into
cross-attention K/V (one GEMM for all layers) in a cache of fixed shape. Shapes then never change inside a
request (`drop_finished_rows = False`), so on CUDA the encoding, the target's verify pass (per k) and the
drafter's whole γ-token proposal are CUDA-graph replays, captured once per cache shape (batch, decoder
slots, source width) and reused by later requests of that shape. Models the fast decoder does not cover raise ValueError
(`covers_seq2seq` says so without raising): use the transformers path for them.
"""

from __future__ import annotations

import torch

from specdec.drafters.model import ModelDrafter
from specdec.fast.graphs import CapturedStep, graph_options, new_pool
from specdec.fast.t5 import FastT5, T5Cache, check_t5
from specdec.fast.target import FastLoopState, crop_lengths
from specdec.models.seq2seq import check_encoder_inputs
from specdec.sequences import TokenBuffer

__all__ = ["FastSeq2SeqTarget", "FastSeq2SeqDrafter", "FastSeq2SeqState", "covers_seq2seq", "load_fast_t5"]

MIN_SOURCE_WIDTH = 16
MAX_STATES = 32  # cache shapes (batch, decoder slots, source width) kept with their graphs


def covers_seq2seq(model) -> bool:
    """True when the fast encoder-decoder path runs this model (a transformers T5 it reproduces)."""
    try:
        load_fast_t5(model, check_only=True)
    except (TypeError, ValueError):
        return False
    return True


def load_fast_t5(model, *, device=None, dtype: torch.dtype | None = None, check_only: bool = False):
    """A `FastT5` from a FastT5 or a transformers T5ForConditionalGeneration (None if check_only)."""
    if isinstance(model, FastT5):
        if (device is not None and torch.device(device) != model.device) or (dtype is not None and dtype != model.dtype):
            raise ValueError("pass device/dtype when loading from transformers, not with a FastT5")
        return None if check_only else model
    check_t5(model)
    return None if check_only else FastT5.from_hf(model, device=device, dtype=dtype)


def source_width(longest: int) -> int:
    """The padded encoder width for a batch whose longest source has `longest` tokens (a power of two)."""
    width = MIN_SOURCE_WIDTH
    while width < longest:
        width *= 2
    return width


class _State:
    """One cache shape: the cache and the graphs captured against it."""

    def __init__(self, cache: T5Cache):
        self.cache = cache
        self.graphs: dict = {}


class _FastSeq2SeqLM:
    """A FastT5, a cache per shape (graphs included), and the current request's cache."""

    def __init__(self, model, device, dtype, max_draft_tokens: int, cuda_graphs: bool | None):
        self.model = load_fast_t5(model, device=device, dtype=dtype)
        self.max_draft_tokens, self.cuda_graphs = graph_options(self.model.device, max_draft_tokens, cuda_graphs)
        self.vocab_size: int = self.model.shape.vocab_size
        self.decoder_start_token_id: int = self.model.start_token_id
        self.pad_token_id = getattr(self.model.config, "pad_token_id", None) or 0
        self.position_limit = None  # relative positions: no decoder or encoder length limit
        self._states: dict[tuple[int, int, int], _State] = {}
        self.state: _State | None = None
        self._pool = None

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def cache(self) -> T5Cache:
        return self.state.cache

    @property
    def lengths(self) -> torch.Tensor:
        return self.state.cache.lengths

    def encode(self, sources: list[list[int]], num_slots: int) -> None:
        """Run the encoder on `sources` and make (or reuse) the cache for them with `num_slots` decoder slots."""
        check_encoder_inputs(sources)
        longest = max(len(p) for p in sources)
        key = (len(sources), num_slots, source_width(longest))
        ids = torch.full((len(sources), key[2]), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(sources), key[2], dtype=torch.bool)
        for b, source in enumerate(sources):
            ids[b, : len(source)] = torch.as_tensor(source, dtype=torch.long)
            mask[b, : len(source)] = True
        if key not in self._states:  # made outside inference mode: crop writes lengths in place
            if len(self._states) >= MAX_STATES:  # many shapes seen: start over rather than hold every cache
                self.release()
            self._states[key] = _State(self.model.new_cache(*key))
        self.state = self._states[key]
        cache, model = self.state.cache, self.model

        def make(static):
            return lambda: model.encode_into(static["ids"], static["mask"], cache)

        with torch.inference_mode():
            self.run(("encode",), make, {"ids": ids.to(self.device), "mask": mask.to(self.device)})

    def release(self) -> None:
        """Free every cache and graph (e.g. between benchmark configurations)."""
        self._states.clear()
        self.state = None
        self._pool = None

    def run(self, key, make_fn, inputs: dict[str, torch.Tensor], restore=()):
        """Run a step: eagerly, or by copying `inputs` into a captured graph's static tensors and replaying."""
        if not self.cuda_graphs:
            return make_fn(inputs)()
        entry = self.state.graphs.get(key)
        if entry is None:
            if self._pool is None:
                self._pool = new_pool()
            static = {name: t.clone() for name, t in inputs.items()}
            step = CapturedStep(make_fn(static), pool=self._pool, restore=restore)
            entry = self.state.graphs[key] = (static, step)
        static, step = entry
        for name, t in inputs.items():
            static[name].copy_(t)
        return step.replay()

    def select_rows(self, index: torch.Tensor) -> None:
        # a new, unshared state: the old shape's cache and graphs stay for later requests
        self.state = _State(self.state.cache.select_rows(index))


class FastSeq2SeqTarget(_FastSeq2SeqLM):
    """The target M_p for encoder-decoder models: `begin`, `encode`, `forward(tokens [B, k]) -> logits [B, k, V]`,
    `crop(lengths)`, `select_rows`. max_draft_tokens: the largest γ it verifies; cuda_graphs: None = on CUDA.
    """

    drop_finished_rows = False

    def __init__(self, model, *, device=None, dtype: torch.dtype | None = None, max_draft_tokens: int = 16,
                 cuda_graphs: bool | None = None):
        super().__init__(model, device, dtype, max_draft_tokens, cuda_graphs)
        self.config = self.model.config
        self._num_slots = 1

    def begin(self, prompts: list[list[int]], max_new_tokens: int) -> TokenBuffer:
        """Encode the prompts; the committed decoder text starts as `[decoder_start_token_id]` per row."""
        self._num_slots = max_new_tokens + self.max_draft_tokens + 1
        self.encode(prompts)
        context = TokenBuffer([[self.decoder_start_token_id]] * len(prompts), capacity=1 + max_new_tokens + 1,
                              device=self.device)
        context.source = [list(p) for p in prompts]
        return context

    def encode(self, prompts: list[list[int]], num_slots: int | None = None) -> None:
        """Start a batch of `prompts` (encoder inputs): run the encoder, reset the decoder cache."""
        super().encode(prompts, num_slots or self._num_slots)

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Append decoder `tokens [B, k]` at each row's own slots → logits `[B, k, V]` (float32, a fresh tensor)."""
        if self.state is None:
            raise RuntimeError("call begin(prompts, max_new_tokens) or encode(prompts) before forward")
        if tokens.shape[1] > self.max_draft_tokens + 1:
            raise ValueError(
                f"FastSeq2SeqTarget was built for at most {self.max_draft_tokens} draft tokens per step "
                f"(max_draft_tokens); got a block of {tokens.shape[1]} tokens"
            )
        with torch.inference_mode():
            cache, model = self.cache, self.model
            if valid is not None:
                return model(tokens, cache, valid)

            def make(static):
                return lambda: model(static["tokens"], cache)

            return self.run(("verify", tuple(tokens.shape)), make, {"tokens": tokens}, restore=[cache.lengths]).clone()

    def crop(self, lengths: torch.Tensor | int) -> None:
        """Roll back to absolute lengths (`fast.target.crop_lengths`)."""
        crop_lengths(self.cache.lengths, lengths)


class FastSeq2SeqState(FastLoopState):
    """A `ModelDrafter`'s state over a small `FastT5` behind the loop (`fast.target.FastLoopState`: the pair re-fed
    from L − 2, the whole proposal one graph replay on CUDA; position 0 reads its own decoder start token). It
    encodes the target's encoder inputs (`context.source`) once per request with its own encoder."""

    kind = "FastSeq2SeqDrafter"

    def begin(self, context: TokenBuffer) -> None:
        if context.source is None:
            raise ValueError(
                "FastSeq2SeqDrafter needs an encoder-decoder target: the context carries no encoder inputs "
                "(context.source is None)"
            )
        self.lm.encode(context.source, context.capacity + self.lm.max_draft_tokens)


def FastSeq2SeqDrafter(model, *, device=None, dtype: torch.dtype | None = None, max_draft_tokens: int = 16,
                       cuda_graphs: bool | None = None) -> ModelDrafter:
    """The model drafter (`drafters.model.ModelDrafter`) over a small T5 (`FastSeq2SeqState`): γ decoder tokens per
    step, on CUDA one graph replay. Finished rows stay in the batch (static shapes); no processors on the drafts."""
    drafter = ModelDrafter(state=FastSeq2SeqState(_FastSeq2SeqLM(model, device, dtype, max_draft_tokens, cuda_graphs)))
    drafter.drop_finished_rows, drafter.accepts_processor = False, False
    return drafter
