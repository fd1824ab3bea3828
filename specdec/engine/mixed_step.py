"""The runner's half of the mixed prefill/decode step (`EngineConfig.mixed_step`): one target forward over the
running rows' verify tokens and the filling rows' prompt chunks, at a bounded shape (`engine/mixed_shapes.py`).

`MixedStepRunner` is a `step_runner.StepRunner` per key (batch bucket b, γ, flavor, token bucket T) whose target
forward is `fast.ragged.forward_ragged` over the key's fixed ragged batch (`mixed_shapes` module doc): the b verify
rows first (slot i, tokens [last, x_1..x_γ] at positions length_i − 1 + j; rows past the n running ones dead),
then the chunks (slot s, prompt positions [start, end)), each through its own row of the paged pool's block table,
then the pad row; dead rows and the pad row read and write the null block 0 only (their table rows zeroed) and
their logits are never read. The verify rows' logits `[b, γ+1, V]` and hidden states go through the verify body
unchanged (rejection / greedy commit, features of the committed prefix; rows ≥ n are inactive, as a decode step's
padding rows); the chunks are scored nowhere (a filling row's first token comes from its first verify step, as
after a whole prefill: the target is fed all but a prompt's last token), their K/V are written by the same forward,
and with a feature drafter their hidden states land in the pool's feature blocks at the chunk's own entries.

The draft half is the decode step's own (`Runner.step_for` of the same batch, γ, length bucket and flavor: warmed
and captured with the decode steps); its drafts are copied into this shape's static buffers when the verify half
is a CUDA graph. The verify half is captured once per key (`cuda_graphs`, on CUDA through the Triton varlen
attention): every per-step input lives in persistent device buffers — `meta` (the step's one host → device copy,
`mixed_shapes.host_meta`: O(rows + tiles) integers) from which the graph derives positions, slot mapping, query
starts, block tables and the chunks' tokens (gathered from `state.tokens`); the verify rows' starts are the device
lengths; the attention's launches have fixed grids (`RaggedLayout.launches`).
"""

from __future__ import annotations

import torch

from specdec.drafters.protocol import Proposal
from specdec.engine.mixed_shapes import MixedLayout, graph_cap, host_meta, token_bucket, token_buckets
from specdec.engine.step_input import PrefillChunks
from specdec.engine.step_runner import StepRunner
from specdec.fast.graphs import CapturedStep
from specdec.fast.kernels.ragged_attention import RaggedLayout, block_m_for, ragged_unsupported
from specdec.fast.ragged import RaggedBatch, forward_ragged

__all__ = ["MixedStepRunner", "mixed_batch", "mixed_for", "mixed_shape"]

NOTHING = PrefillChunks((), (), (), ())  # a warm-up's step: no chunk, no running row (every token padding)


def _dead_table(block_table: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """The batch's block table `[B, W]` with the dead rows' (and the pad row's) zeroed: they see the null block 0."""
    return block_table * live[:, None]


def mixed_batch(meta: torch.Tensor, verify: torch.Tensor, lengths: torch.Tensor, table: torch.Tensor,
                block_size: int, tokens: torch.Tensor, layout: MixedLayout, verify_tiles: torch.Tensor, *,
                row_counts: tuple[int, ...], row_starts: tuple[int, ...], num_blocks: int,
                hidden: bool = False) -> RaggedBatch:
    """The bounded ragged batch of a mixed step, built on the device with no host sync (capturable): meta
    `[layout.meta_size]` long (`mixed_shapes.host_meta`), verify `[b, k]` (the verify rows' tokens; row i from
    position lengths[i] − 1, lengths `[b]` the device's), through `table [max_batch, W]` (int32, the pool's block
    table) in blocks of `block_size`, the chunks' tokens read from `tokens [max_batch, C]` (the slot state's);
    verify_tiles the verify launch's fixed tiles; row_counts / row_starts the host's copy of the rows (the
    reference attention's groups); `num_blocks` the pool's. hidden: `hidden_index` covers every token."""
    b, k = verify.shape
    C, device = layout.max_chunks, verify.device
    if (b, k) != (layout.batch, layout.k) or meta.shape != (layout.meta_size,):
        raise ValueError(f"verify {tuple(verify.shape)} / meta {tuple(meta.shape)} do not fit the layout {layout}")
    n = meta[0]
    c_starts, c_counts, c_slots = meta[1:1 + C], meta[1 + C:1 + 2 * C], meta[1 + 2 * C:1 + 3 * C]
    pad = meta[1 + 3 * C:2 + 3 * C]
    tiles = meta[2 + 3 * C:].view(-1, 2).to(torch.int32)
    rows = torch.arange(b, device=device)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    v_live = rows < n
    counts = torch.cat([torch.full((b,), k, dtype=torch.long, device=device), c_counts, pad])
    starts = torch.cat([torch.where(v_live, lengths - 1, 0), c_starts, zero])
    slots = torch.cat([rows, c_slots, zero])
    live = torch.cat([v_live, c_counts > 0, zero.bool()])
    query = torch.cat([zero, counts.cumsum(0)])  # [B + 1]
    total = layout.num_tokens
    # each token's row: the row boundaries at or below it, counted (rows of no token share a boundary)
    marks = torch.zeros(total + 1, dtype=torch.long, device=device)
    marks.index_add_(0, query[1:-1], torch.ones(layout.num_rows - 1, dtype=torch.long, device=device))
    row_of = marks[:total].cumsum(0)
    flat = torch.arange(total, device=device)
    positions = starts[row_of] + flat - query[row_of]
    positions = torch.where(live[row_of], positions, positions % block_size)  # (dead: inside the null block)
    block_table = _dead_table(table.index_select(0, slots), live)
    column = (positions // block_size).clamp_(max=block_table.shape[1] - 1)
    slot_mapping = block_table[row_of, column].long() * block_size + positions % block_size
    fed = b * k
    ids = torch.cat([verify.reshape(-1), tokens[slots[row_of[fed:]], positions[fed:]]])
    query = query.int()
    model_rows = layout.num_rows
    launches = ((verify_tiles, block_m_for(layout.group * k, layout.head_dim, layout.fp32)), (tiles, layout.block_m))
    ragged = RaggedLayout(row_counts, row_starts, query, positions, block_table, launches=launches)
    return RaggedBatch(
        tokens=ids, query_start=query, starts=starts, positions=positions, block_table=block_table,
        slot_mapping=slot_mapping, logits_index=flat[:fed], counts=row_counts, start_positions=row_starts,
        num_logits=(k,) * b + (0,) * (model_rows - b), logits_start=tuple(range(0, fed + 1, k)) + (fed,) * (model_rows - b),
        block_size=block_size, max_block=num_blocks - 1,
        max_token=0,  # (the engine's own ids: prompts checked at add_request, drafts by `proposal_check`)
        layout=ragged, hidden_index=flat if hidden else None)


class MixedStepRunner(StepRunner):
    """A mixed step's shape (the module doc): `StepRunner`'s halves over the key's bucket; `prefill` (set by
    `Runner.run` before each run) the chunks its target forward also feeds, `source` (set by `mixed_shape`) the
    decode step shape whose draft half it runs."""

    prefill: PrefillChunks | None = None
    source = None
    graphs = True  # False: the verify half eager even where it could be captured (`mixed_for`: `Runner.mixed_graphs`)

    def __init__(self, parts, batch: int, gamma: int, flavor, tokens: int):
        max_batch = parts.draft_caps.shape[0]
        super().__init__(parts, batch, gamma, parts.cache.num_positions, flavor)
        model, device = parts.model, parts.device
        s = model.shape
        fp32 = model.dtype == torch.float32
        group = s.n_heads // s.n_kv_heads
        self.tokens = tokens
        self.mixed_layout = layout = MixedLayout(min(batch, max_batch), gamma + 1, tokens, max_batch, group,
                                                 block_m_for(1 << 30, s.head_dim, fp32), s.head_dim, fp32)
        self.meta = torch.zeros(layout.meta_size, dtype=torch.long, device=device)
        self._host = torch.zeros(layout.meta_size, dtype=torch.long, pin_memory=device.type == "cuda")
        tiles = layout.verify_tiles(block_m_for(group * layout.k, s.head_dim, fp32))
        self.verify_tiles = torch.tensor(tiles, dtype=torch.int32).view(-1, 2).to(device)
        self._rows = None  # the host's (counts, starts) of the loaded step
        self._static: Proposal | None = None  # the verify graph's drafts (copied in from the source's)
        probe = torch.empty(1, s.n_heads, s.head_dim, dtype=model.dtype, device=device)
        self._graphable = (device.type == "cuda" and not model.bitwise and model.kernels != "reference"
                           and ragged_unsupported(probe, probe) is None)

    @property
    def eager(self) -> bool:
        """Eager where a decode step would be, where the attention would not be the Triton kernel (the reference
        builds its groups on the host), or with `graphs` off."""
        return super().eager or not self._graphable or not self.graphs

    def capture(self) -> None:
        """Capture the verify half once (its drafts: this shape's static buffers, `draft` filled them); the draft
        half is the source decode shape's own graph."""
        if self.eager or self._verify_graph is not None:
            return
        if self._static is None or self.drafts is not self._static:
            raise RuntimeError("MixedStepRunner.capture runs after draft (the verify graph reads its static drafts)")
        self._verify_graph = CapturedStep(self.verify_body, pool=self.parts.graph_pool, restore=self._verify_restore())

    def load(self, chunks: PrefillChunks) -> None:
        """This step's chunks (and its running rows, `chunks.lengths`) into the persistent `meta` (one copy)."""
        meta, counts, starts = host_meta(self.mixed_layout, chunks, len(chunks.lengths))
        self._host.copy_(torch.tensor(meta, dtype=torch.long))  # (the step's end synchronizes: never in flight)
        self.meta.copy_(self._host, non_blocking=True)
        self._rows = (counts, starts)

    def draft(self) -> None:
        """The source decode shape's draft half; the step's chunks loaded first."""
        if self.prefill is None or self.source is None:
            raise RuntimeError("MixedStepRunner.prefill / source are unset: Runner.run and mixed_shape set them")
        self.load(self.prefill)
        constraints = getattr(self.view, "constraints", None)
        if constraints is not None:  # (Runner.run sets them on the shape it runs: the draft half reads them too)
            self.source.view.constraints = constraints
        self.source.draft()
        drafts = self.source.drafts
        if self.eager:
            self.drafts = drafts
            return
        static = self._static
        if static is None:
            clone = lambda t: None if t is None else t.clone()  # noqa: E731
            static = self._static = Proposal(clone(drafts.tokens), clone(drafts.probs), clone(drafts.lengths),
                                             drafts.forward_passes)
        else:
            for mine, theirs, name in ((static.tokens, drafts.tokens, "tokens"), (static.probs, drafts.probs, "probs"),
                                       (static.lengths, drafts.lengths, "lengths")):
                if (mine is None) != (theirs is None) or (mine is not None and mine.shape != theirs.shape):
                    raise RuntimeError(f"the drafter's proposal changed its {name} between steps of one mixed shape")
                if mine is not None:
                    mine.copy_(theirs)
        self.drafts = static

    def warm(self, source) -> None:
        """Build this shape ahead of traffic: capture its verify graph (CUDA graphs), else run it once (Triton
        builds, the code path) with the state it changes put back; every token of the step is padding."""
        self.source, self.prefill = source, NOTHING
        if not self.eager:
            self.draft()
            self.capture()
            return
        restore = self._verify_restore() + (self._draft_restore() or [])
        saved = [t.clone() for t in restore]
        self.draft()
        self.verify()
        for t, s in zip(restore, saved):
            t.copy_(s)
        if self.parts.device.type == "cuda":  # (its meta's pinned copy done before a step rewrites it)
            torch.cuda.current_stream().synchronize()

    def target_forward(self, tokens: torch.Tensor, cache):
        """tokens `[b, γ+1]` → (logits `[b, γ+1, V]`, hidden `[b, γ+1, ·]`) of the verify rows; the chunks' K/V (and
        features) written by the same forward."""
        e = self.parts
        state, pool = e.state, e.cache.pool
        store = state.feature_store if state.features is not None else None
        counts, starts = self._rows
        batch = mixed_batch(self.meta, tokens, self.view.lengths, pool.table, pool.block_size, state.tokens,
                            self.mixed_layout, self.verify_tiles, row_counts=counts, row_starts=starts,
                            num_blocks=pool.allocator.num_blocks, hidden=store is not None)
        logits, hidden = forward_ragged(e.model, batch, cache, return_hidden=True)
        b, k = tokens.shape
        fed = b * k
        if store is not None:
            self.store_features(store, batch.slot_mapping[fed:], hidden[fed:])
        return logits.view(b, k, -1), hidden[:fed].view(b, k, -1)

    @staticmethod
    def store_features(store, entries: torch.Tensor, hidden: torch.Tensor) -> None:
        """The chunks' features `[T, dim]` into a paged `FeatureStore` at their pool entries `[T]` (the K/V's own;
        the pad tokens' land in the null block)."""
        store.data.index_copy_(0, entries, hidden.to(store.data.dtype))


def mixed_for(runner, key: tuple) -> MixedStepRunner:
    """The mixed step shape of `key` (batch bucket, γ, flavor, token bucket), built once (`runner.mixed_steps`);
    captured as CUDA graphs where decode steps are and its token bucket is at most `graph_cap`, unless
    `runner.mixed_graphs` is set False."""
    shape = runner.mixed_steps.get(key)
    if shape is None:
        shape = runner.mixed_steps[key] = MixedStepRunner(runner.parts, *key)
    graphed = key[3] <= graph_cap(runner.config)  # ("auto"'s buckets past prefill_chunk's run eagerly)
    shape.graphs = getattr(runner, "mixed_graphs", True) and graphed  # (mixed_graphs: a benchmark's switch)
    return shape


def mixed_shape(runner, step) -> MixedStepRunner:
    """The shape a mixed `StepInput` runs on: its key's, with the decode shape of its batch, γ, length bucket and
    flavor as the draft half."""
    tokens = token_bucket(step.prefill.num_tokens, token_buckets(runner.config))
    shape = mixed_for(runner, (step.batch, step.gamma, step.flavor, tokens))
    shape.source = runner.step_for(step.batch, step.gamma, step.positions, step.flavor)
    return shape
