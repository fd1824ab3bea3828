"""The runner's half of the mixed prefill/decode step (`EngineConfig.mixed_step`): one target forward over the
running rows' verify tokens and the filling rows' prompt chunks.

`MixedStepRunner` is a `step_runner.StepRunner` over the running rows (batch = their count, no padding rows), always
eager, whose target forward is `fast.ragged.forward_ragged` over a ragged batch of B = n + c rows: the n verify rows
first (slot i, tokens [last, x_1..x_γ] at positions length_i − 1 + j), then the c chunks (slot s, prompt positions
[start, end)), each through its own row of the paged pool's block table. The verify rows' logits `[n, γ+1, V]` and
hidden states go through the verify body unchanged (rejection / greedy commit, features of the committed prefix);
the chunks are scored nowhere (a filling row's first token comes from its first verify step, as after a whole
prefill: the target is fed all but a prompt's last token), their K/V are written by the same forward, and with a
feature drafter their hidden states land in the pool's feature blocks at the chunk's own entries.

`mixed_batch` builds that batch on the device from O(B) host integers (the rows' slots, starts and counts): one
host → device copy; every per-token vector (positions, slot mapping, the chunks' tokens, gathered from
`state.tokens`) is computed there, so the host's cost does not grow with the tokens fed (`RaggedBatch.from_rows`
checks and builds per token on the host: 15.8 ms a step at 64 rows + 512 chunk tokens on an H200's host). The
block table's rows are read where the pool keeps them (`KVPool.table`), never rebuilt.
"""

from __future__ import annotations

import torch

from specdec.engine.kv_pool import blocks_for
from specdec.engine.step_input import PrefillChunks
from specdec.engine.step_runner import StepRunner
from specdec.fast.kernels.ragged_attention import RaggedLayout
from specdec.fast.ragged import RaggedBatch, forward_ragged

__all__ = ["MixedStepRunner", "mixed_batch"]


def mixed_batch(verify: torch.Tensor, chunks: PrefillChunks, table: torch.Tensor, block_size: int,
                tokens: torch.Tensor, *, num_blocks: int, hidden: bool = False) -> RaggedBatch:
    """The ragged batch of a mixed step: verify `[n, k]` (the running rows' tokens, slots 0..n−1, row i from
    position chunks.lengths[i] − 1), then each chunk of `chunks` (its tokens read from `tokens [max_batch, C]`, the
    slot state's), through `table [max_batch, W]` (int32, the pool's block table) in blocks of `block_size`;
    `num_blocks` the pool's (every id the table holds is below it: the pool's own allocator wrote them). hidden:
    the batch's `hidden_index` covers every token (a feature drafter stores the chunks' states)."""
    n, k = verify.shape
    device = verify.device
    if len(chunks.lengths) != n:
        raise ValueError(f"chunks.lengths holds {len(chunks.lengths)} running rows, verify {n}")
    counts = [k] * n + [e - s for s, e in zip(chunks.starts, chunks.ends)]
    starts = [length - 1 for length in chunks.lengths] + list(chunks.starts)
    if min(counts) < 1 or min(starts) < 0:
        raise ValueError(f"every row feeds at least one token from position >= 0, got counts {counts}, "
                         f"starts {starts}")
    slots = list(range(n)) + list(chunks.slots)
    rows, query_start = len(counts), [0]
    for c in counts:
        query_start.append(query_start[-1] + c)
    total = query_start[-1]
    width = blocks_for(max(s + c for s, c in zip(starts, counts)), block_size)
    host = torch.tensor(starts + counts + slots + query_start, dtype=torch.long)
    if device.type == "cuda":  # (pinned, from torch's caching host allocator: the copy never waits for the device)
        host = host.pin_memory()
    meta = host.to(device, non_blocking=True)  # one copy
    d_starts, _, d_slots, d_query = meta.split([rows, rows, rows, rows + 1])
    flat = torch.arange(total, device=device)
    # each token's row: a 1 where each row after the first starts, summed (torch's CPU repeat_interleave and
    # searchsorted split even 768 tokens over the intra-op threads: ~10–30 ms a call where those cores were busy)
    row_of = torch.zeros(total, dtype=torch.long, device=device)
    row_of[d_query[1:-1]] = 1  # (every row brings a token: the starts are distinct)
    row_of = row_of.cumsum(0)
    positions = d_starts[row_of] + flat - d_query[row_of]
    block_table = table.index_select(0, d_slots)[:, :width].contiguous()
    slot_mapping = block_table[row_of, positions // block_size].long() * block_size + positions % block_size
    fed = n * k
    ids = verify.reshape(-1)
    if total > fed:  # the chunks' prompt tokens, where admission wrote them
        ids = torch.cat([ids, tokens[d_slots[row_of[fed:]], positions[fed:]]])
    query = d_query.int()
    layout = RaggedLayout(tuple(counts), tuple(starts), query, positions, block_table)
    return RaggedBatch(
        tokens=ids, query_start=query, starts=d_starts, positions=positions, block_table=block_table,
        slot_mapping=slot_mapping, logits_index=flat[:fed], counts=tuple(counts), start_positions=tuple(starts),
        num_logits=(k,) * n + (0,) * (rows - n), logits_start=tuple(range(0, fed + 1, k)) + (fed,) * (rows - n),
        block_size=block_size, max_block=num_blocks - 1,
        max_token=0,  # (the engine's own ids: prompts checked at add_request, drafts by `proposal_check`)
        layout=layout, hidden_index=flat if hidden else None)


class MixedStepRunner(StepRunner):
    """A mixed step's shape (the module doc): `StepRunner`'s halves, eager, over the running rows; `prefill` (set by
    `Runner.run` before each run) the chunks its target forward also feeds."""

    prefill: PrefillChunks | None = None

    @property
    def eager(self) -> bool:
        return True

    def target_forward(self, tokens: torch.Tensor, cache):
        """tokens `[n, γ+1]` → (logits `[n, γ+1, V]`, hidden `[n, γ+1, ·]`) of the verify rows; the chunks' K/V (and
        features) written by the same forward."""
        e, chunks = self.parts, self.prefill
        if chunks is None:
            raise RuntimeError("MixedStepRunner.prefill is unset: Runner.run sets it from StepInput.prefill")
        state, pool = e.state, e.cache.pool
        store = state.feature_store if state.features is not None else None
        batch = mixed_batch(tokens, chunks, pool.table, pool.block_size, state.tokens,
                            num_blocks=pool.allocator.num_blocks, hidden=store is not None)
        logits, hidden = forward_ragged(e.model, batch, cache, return_hidden=True)
        n, k = tokens.shape
        fed = n * k
        if store is not None and batch.num_tokens > fed:
            self.store_features(store, batch.slot_mapping[fed:], hidden[fed:])
        return logits.view(n, k, -1), hidden[:fed].view(n, k, -1)

    @staticmethod
    def store_features(store, entries: torch.Tensor, hidden: torch.Tensor) -> None:
        """The chunks' features `[T, dim]` into a paged `FeatureStore` at their pool entries `[T]` (the K/V's own)."""
        store.data.index_copy_(0, entries, hidden.to(store.data.dtype))
