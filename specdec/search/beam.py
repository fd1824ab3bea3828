"""Speculative beam search (paper appendix A.4): `specdec.beam_search(target, prompts, drafter=...)`.

The result is identical to the target's own beam search of width w (transformers'
`generate(num_beams=w, do_sample=False)`, whose rules `specdec.search.beam_rules` reproduces), in fewer target passes:

  1. draft: from the w running beams (with their target scores) the drafter runs beam search of width
     u ≥ w for γ levels (continuations ending in EOS are not expanded, as they never run on in the target);
     each level is one drafter pass over the new nodes (tree attention);
  2. verify: the target scores the running beams' last tokens and all u·γ draft nodes in ONE tree pass
     (row = running beam, its tree = the draft nodes descending from it);
  3. accept: replay the target's beam steps on those scores. Step d needs p at the running beams of step
     d − 1, so the replay goes on while the target's new running beams are all draft nodes
     (top_w(target) ⊆ top_u(draft)) — up to γ + 1 steps per pass, at least 1;
  4. commit: the new running beams' rows are re-gathered from their roots and keep exactly their path's
     KV slots (`TreeCausalLM.commit_path`), in the target and in the drafter.
Without a drafter (or γ = 0) it is plain beam search, one target pass per token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.search.beam_rules import BeamConfig, BeamState, beam_step
from specdec.search.beam_tree import DraftTree
from specdec.models.tree_lm import TreeCausalLM
from specdec.request import check_num_draft_tokens, normalize_prompts, resolve_eos, vocab_size

__all__ = ["beam_search", "BeamSearch", "BeamSearchResult", "BeamStats", "BeamRequest", "decoder_only"]

MAX_BEAMS = 256


@dataclass
class BeamStats:
    """target_calls includes the prefill; beam_steps = Σ over prompts of beam steps (= generated length)."""

    target_calls: int = 0
    drafter_calls: int = 0
    passes: int = 0  # target verification passes
    beam_steps: int = 0
    prompt_passes: int = 0  # Σ over passes of the prompts still running
    draft_nodes: int = 0
    wall_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0

    @property
    def steps_per_pass(self) -> float:
        """Beam steps per target pass per prompt (1.0 for plain beam search)."""
        return self.beam_steps / self.prompt_passes if self.prompt_passes else 0.0

    # --- the fold: the only writers of the fields above -----------------------------------------------
    def add_prefill(self, target_calls: int, drafter_calls: int = 0) -> None:
        self.target_calls += target_calls
        self.drafter_calls += drafter_calls

    def add_drafter_pass(self) -> None:
        self.drafter_calls += 1

    def add_draft_nodes(self, num_nodes: int) -> None:
        self.draft_nodes += num_nodes

    def add_pass(self, num_prompts: int, beam_steps: int, draft_time_s: float, verify_time_s: float) -> None:
        """One target verification pass over `num_prompts` running prompts that replayed `beam_steps` steps."""
        self.target_calls += 1
        self.passes += 1
        self.prompt_passes += num_prompts
        self.beam_steps += beam_steps
        self.draft_time_s += draft_time_s
        self.verify_time_s += verify_time_s

    def set_wall_time(self, seconds: float) -> None:
        self.wall_time_s = seconds

    def merge(self, other: "BeamStats") -> "BeamStats":
        """Add another search's counts and times (the engine runs one search per prompt); wall time: the longer."""
        for name in ("target_calls", "drafter_calls", "passes", "beam_steps", "prompt_passes", "draft_nodes",
                     "draft_time_s", "verify_time_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wall_time_s = max(self.wall_time_s, other.wall_time_s)
        return self


@dataclass(frozen=True)
class BeamSearchResult:
    sequences: list[list[list[int]]]  # [prompt][beam]: generated tokens (EOS included), best beam first
    scores: list[list[float]]  # transformers' sequences_scores: Σ log p / length ** length_penalty
    stats: BeamStats = field(default_factory=BeamStats)


def beam_search(target, prompts, drafter=None, **options) -> BeamSearchResult:
    """Beam search of width `num_beams` = w, identical to transformers' `generate(num_beams=w, do_sample=False)`,
    on transformers' forward passes (`TreeCausalLM`). `specdec.beam_search` (`decoding.py`) is the front door:
    its engine="fast" runs the same search inside the engine (`engine/beam.py`). Arguments: `BeamRequest.of`."""
    request = BeamRequest.of(target, prompts, drafter, **options)
    lm = TreeCausalLM(request.target)
    draft = TreeCausalLM(request.drafter) if request.drafter is not None else None
    return BeamSearch(lm, draft, request.config, request.draft_beams, request.num_draft_tokens).run(request.prompts)


@dataclass(frozen=True)
class BeamRequest:
    """A beam search call, checked once for every runner (errors name the argument): the transformers models
    (drafter None when γ = 0), the prompts, the search's rules (`BeamConfig`: w, max_new_tokens, EOS, length
    penalty, early stopping), u and γ."""

    target: torch.nn.Module
    drafter: torch.nn.Module | None
    prompts: list[list[int]]
    config: BeamConfig
    draft_beams: int
    num_draft_tokens: int

    @classmethod
    def of(
        cls,
        target,
        prompts,
        drafter=None,
        *,
        num_beams: int = 4,
        draft_beams: int | None = None,
        num_draft_tokens: int = 3,
        max_new_tokens: int = 32,
        eos_token_id: "int | Sequence[int] | None" = None,
        length_penalty: float = 1.0,
        early_stopping: "bool | str" = False,
        attention_mask: torch.Tensor | None = None,
    ) -> "BeamRequest":
        """target            a transformers decoder-only model
        prompts           list[list[int]] (ragged) or LongTensor [B, T] (+ attention_mask)
        drafter           None (plain beam search) or a transformers decoder-only model with the same vocabulary
        draft_beams       u ≥ w, the drafter's beam width (default w); num_draft_tokens γ ≥ 0 levels per pass
        eos_token_id      int or list; None = the target's generation config (as in transformers)
        length_penalty, early_stopping   as in transformers (defaults 1.0, False)"""
        w = _int_in("num_beams", num_beams, 1, MAX_BEAMS)
        u = w if draft_beams is None else _int_in("draft_beams", draft_beams, w, MAX_BEAMS)
        gamma = check_num_draft_tokens(num_draft_tokens, minimum=0) if drafter is not None else 0
        n = _int_in("max_new_tokens", max_new_tokens, 1, 1 << 20)
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or length_penalty != length_penalty:
            raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")
        if early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
        model = decoder_only(target, "target")
        vocab = vocab_size(model)
        rows = normalize_prompts(prompts, attention_mask, vocab)
        eos = tuple(resolve_eos(eos_token_id, model))
        draft = None
        if drafter is not None and gamma > 0:
            draft = decoder_only(drafter, "drafter")
            if vocab_size(draft) != vocab:
                raise ValueError(f"draft and target vocabularies differ: drafter has {vocab_size(draft)} tokens, "
                                 f"target has {vocab}")
            if u > vocab:
                raise ValueError(f"draft_beams ({u}) cannot exceed the vocabulary size ({vocab})")
        config = BeamConfig(w, n, eos, float(length_penalty), early_stopping)
        return cls(model, draft, rows, config, u, gamma if draft is not None else 0)


class BeamSearch:
    """One beam search: w rows per prompt in the target (and the drafter), each row = one running beam.
    `run` drives it to the end; the engine (`engine/beam.py`) drives `start` and `step` itself, one pass per engine step.

    Both caches hold each running beam's text but its last token (`self.last`); the drafter may also lag
    by one token (`self.pending`, a last-level draft node it never fed) that it feeds with the next proposal.
    """

    def __init__(self, lm: TreeCausalLM, draft: TreeCausalLM | None, config: BeamConfig, u: int, gamma: int):
        self.lm, self.draft, self.config, self.u, self.gamma = lm, draft, config, u, gamma
        self.stats = BeamStats()

    def start(self, prompts: list[list[int]]) -> BeamState:
        """Prefill w copies of each prompt (as transformers does) in the target and the drafter → the start state."""
        w, device = self.config.num_beams, self.lm.device
        state = BeamState.start(len(prompts), self.config, device)
        if not bool(state.done.all()):
            beams = [p for p in prompts for _ in range(w)]
            context = self.lm.begin(beams, self.config.max_new_tokens)
            self.last = context.tail(1)[0][:, 0]  # [P·w] last token of each running beam
            drafter_passes = 0
            if self.draft is not None:
                self.draft.begin(beams, self.config.max_new_tokens)
                drafter_passes = self.draft.begin_forward_passes
                self.pending = torch.full_like(self.last, -1)
            self.stats.add_prefill(self.lm.begin_forward_passes, drafter_passes)
        return state

    @staticmethod
    def hypotheses(state: BeamState, i: int) -> tuple[list[list[int]], list[float]]:
        """Prompt i's w finished hypotheses, best first → (generated tokens per beam, sequences_scores)."""
        tokens, scores, lengths = state.finished_tokens[i], state.finished_scores[i], state.finished_lengths[i]
        return ([tokens[j, : int(lengths[j])].tolist() for j in range(tokens.shape[0])],
                [float(x) for x in scores])

    def run(self, prompts: list[list[int]]) -> BeamSearchResult:
        t_start = time.perf_counter()
        w, device = self.config.num_beams, self.lm.device
        state = self.start(prompts)
        prompt_of = torch.arange(len(prompts), device=device)  # running prompt slot → caller's prompt
        final: dict[int, tuple] = {}
        while True:
            for i in state.done.nonzero().squeeze(1).tolist():
                final[int(prompt_of[i])] = self.hypotheses(state, i)
            running = (~state.done).nonzero().squeeze(1)
            if running.numel() == 0:
                break
            if running.numel() < state.done.numel():  # finished prompts leave the batch
                state, prompt_of = state.select(running), prompt_of[running]
                self._select_rows((running[:, None] * w + torch.arange(w, device=device)).flatten())
            state = self.step(state)
        self.stats.set_wall_time(time.perf_counter() - t_start)
        return BeamSearchResult([final[i][0] for i in range(len(prompts))], [final[i][1] for i in range(len(prompts))],
                                self.stats)

    def _select_rows(self, rows: torch.Tensor) -> None:
        self.lm.select_rows(rows)
        self.last = self.last[rows]
        if self.draft is not None:
            self.draft.select_rows(rows)
            self.pending = self.pending[rows]

    def step(self, state: BeamState) -> BeamState:
        """One pass for the prompts not done: draft, verify in one target pass, replay the target's beam steps, commit."""
        w, gamma = self.config.num_beams, self.gamma
        num_prompts, device = state.t.shape[0], self.last.device
        t0 = time.perf_counter()
        tree = self._draft(state) if self.draft is not None else None
        t1 = time.perf_counter()
        # target rows: (prompt, beam j) = [beam j's last token] + the draft nodes under it, level by level
        tokens = self.last[:, None]
        parents = torch.full_like(tokens, -1)
        if tree is not None:
            tokens = torch.cat([tokens, tree.tokens], 1)
            parents = torch.cat([parents, tree.parents + 1], 1)  # block slot s is tree slot s + 1; level 0 → root
        self.lm.begin_tree()
        log_probs = self.lm.forward_tree(tokens, parents).float().log_softmax(-1)  # [P·w, 1 + M, V]
        log_probs = log_probs.reshape(num_prompts, w, tokens.shape[1], -1)

        # replay the target's beam steps while its new running beams are all draft nodes
        rows = torch.arange(num_prompts, device=device)[:, None]
        root = torch.arange(w, device=device).expand(num_prompts, -1).clone()  # running beam → its row's beam
        node = torch.full((num_prompts, w), -1, dtype=torch.long, device=device)  # running beam → its draft node
        path = torch.full((num_prompts, w, gamma + 1), -1, dtype=torch.long, device=device)  # node per level
        last = torch.zeros(num_prompts, w, dtype=torch.long, device=device)
        steps = torch.zeros(num_prompts, dtype=torch.long, device=device)
        stepping = ~state.done
        for d in range(gamma + 1):
            slot = torch.zeros_like(node) if d == 0 else tree.levels[d - 1].tslot.gather(1, node.clamp_min(0)) + 1
            state, parent, token = beam_step(state, log_probs[rows, root, slot], self.config, stepping)
            on = stepping[:, None]
            steps += stepping.long()
            parent_node = node.gather(1, parent)
            root = torch.where(on, root.gather(1, parent), root)
            path = torch.where(on[..., None], path.gather(1, parent[..., None].expand_as(path)), path)
            last = torch.where(on, token, last)
            if d == gamma:
                break
            child = tree.child(d, root if d == 0 else parent_node, token)  # −1: not a draft node
            path[:, :, d] = torch.where(on, child, path[:, :, d])
            node = torch.where(on, child, node)
            stepping = stepping & ~state.done & (child >= 0).all(1)
            if not bool(stepping.any()):
                break
        beam_steps = int(steps.sum())
        self._commit(root, path, steps, last, tree)
        self.stats.add_pass(num_prompts, beam_steps, t1 - t0, time.perf_counter() - t1)
        return state

    def _commit(self, root, path, steps, last, tree) -> None:
        """Rows for the new running beams: gathered from their roots, keeping their path but the newest token."""
        w, device = self.config.num_beams, root.device
        num_prompts = root.shape[0]
        rows = (torch.arange(num_prompts, device=device)[:, None] * w + root).flatten()
        levels = torch.arange(path.shape[2], device=device)[None, None, :]
        on_path = (levels < (steps - 1)[:, None, None]) & (path >= 0)  # draft nodes of the accepted steps
        keep = torch.zeros(num_prompts, w, self.lm.num_nodes, dtype=torch.bool, device=device)
        keep[..., 0] = True  # the beam's previous last token
        if tree is not None:
            keep.scatter_(2, torch.where(on_path, tree.slots(path, "tslot") + 1, 0), on_path)
            keep[..., 0] = True
        self.lm.commit_path(keep.reshape(num_prompts * w, -1), rows=rows)
        self.last = last.flatten()
        if self.draft is not None:
            dslot = tree.slots(path, "dslot")
            fed = on_path & (dslot >= 0)
            dkeep = torch.zeros(num_prompts, w, self.draft.num_nodes + 1, dtype=torch.bool, device=device)
            dkeep.scatter_(2, torch.where(fed, dslot, self.draft.num_nodes), fed)
            self.draft.commit_path(dkeep[..., :-1].reshape(num_prompts * w, -1), rows=rows)
            unfed = (on_path & (dslot < 0)).any(2)  # a last-level node the drafter never saw
            pending = tree.slots(path, "token").masked_fill(~(on_path & (dslot < 0)), -1).max(2).values
            self.pending = torch.where(unfed, pending, -1).flatten()

    def _draft(self, state: BeamState) -> DraftTree:
        """The drafter's beam search of width u for γ levels from the running beams (target scores)."""
        w, u, gamma = self.config.num_beams, self.u, self.gamma
        num_prompts = state.t.shape[0]
        block = torch.stack([self.pending.clamp_min(0), self.last], 1)
        valid = torch.stack([self.pending >= 0, torch.ones_like(self.last, dtype=torch.bool)], 1)
        parent_logq = self.draft.forward(block, valid)[:, -1].float().log_softmax(-1)
        vocab = parent_logq.shape[-1]
        parent_logq = parent_logq.reshape(num_prompts, w, vocab)
        self.stats.add_drafter_pass()
        self.draft.begin_tree()
        tree = DraftTree(num_prompts, w)
        scores = state.running_scores
        eos = list(self.config.eos)
        prompts = torch.arange(num_prompts, device=scores.device)[:, None]
        for level in range(gamma):
            candidates = scores[:, :, None] + parent_logq
            if eos:
                candidates[:, :, eos] = float("-inf")  # beams ending in EOS never run on
            scores, index = candidates.reshape(num_prompts, -1).topk(u)
            parent, token = index // vocab, index % vocab
            node_root = parent if level == 0 else tree.levels[-1].root.gather(1, parent)
            feed = level < gamma - 1  # the last level is only scored by the target
            block_tokens, block_parents = tree.add_level(parent, token, node_root, fed=feed)
            if feed:
                logits = self.draft.forward_tree(block_tokens, block_parents)  # [P·w, m, V]
                self.stats.add_drafter_pass()
                logq = logits.float().log_softmax(-1).reshape(num_prompts, w, -1, vocab)
                parent_logq = logq[prompts, node_root, tree.levels[-1].rank]  # [P, u, V]
        self.stats.add_draft_nodes(num_prompts * u * gamma)
        return tree


def _int_in(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high):
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


def decoder_only(model, what: str) -> torch.nn.Module:
    from specdec.models.protocol import own_methods

    if own_methods(model):  # (its own begin / forward / crop would not be called: the model inside would run)
        raise TypeError(f"{what} must be a transformers decoder-only model, got {type(model).__name__}, a Target "
                        f"whose {', '.join(own_methods(model))} its own class defines")
    inner = getattr(model, "model", None) if not isinstance(model, torch.nn.Module) else model
    if not isinstance(inner, torch.nn.Module) or getattr(inner, "config", None) is None:
        raise TypeError(f"{what} must be a transformers decoder-only model, got {type(model).__name__}")
    if getattr(inner.config, "is_encoder_decoder", False):
        raise ValueError(f"beam_search supports decoder-only models only ({what} is an encoder-decoder model)")
    return inner
