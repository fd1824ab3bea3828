"""The mixed step's bounded shapes (`EngineConfig.mixed_step`): which ragged batches a run can reach, and the host's
half of one step's batch.

A mixed step's ragged batch (`mixed_step.mixed_batch`) has a fixed layout per key (batch bucket b, γ, flavor, token
bucket T): rows 0..b−1 the verify rows (γ + 1 tokens each; rows past the n running ones are dead: start 0, the
null block 0), then `max_chunks` = max_batch_size chunk rows (the first c are this step's chunks, the rest feed
no token), then one pad row holding T − (the chunks' tokens) tokens (position 0, the null block 0: they write only
that block, and no logits are taken of them). So N = b·(γ + 1) + T tokens, B = b + max_batch_size + 1 rows and
M = b·(γ + 1) logits, whatever the step feeds: the set of shapes is `mixed_keys` (batch buckets × γ values ×
flavors × `token_buckets`), finite and known from the config, which the warm-up builds ahead of traffic and the
CUDA graphs capture once each.

Token buckets: 16, 32, 48, 64, 96, 128, 192, ... (powers of two and their midpoints 3·2^k: a step pads at most a
third of its chunk tokens) up to `token_cap`: an int `prefill_budget`'s bucket (with `prefill_steps`, the larger of it
and `prefill_chunk`), else ("auto") max(`prefill_chunk`, `AUTO_CAP`)'s, which `prefill.plan_mixed` never exceeds
(with "auto" its budget is rounded down to a bucket, so full steps pad nothing). The buckets up to `graph_cap` (the
int budget's — with `prefill_steps` at least `prefill_chunk`'s —, else `prefill_chunk`'s) are warmed and graphed;
"auto"'s larger ones run eagerly and only when its deadline asks for them: on one H200 a cap at `prefill_chunk`
(512) starved 64 speculative slots — they finish requests ~τ times faster than plain ones, and 512 prompt tokens a
step could not refill them (head "auto" 0.80x plain, most steps at 16 rows; BENCHMARKS.md).

`host_meta` is the step's one host → device transfer: O(rows + tiles) integers in a fixed-length vector (n, the
chunks' starts, counts and slots, the pad count, and the Triton chunk launch's tiles, unused tiles pointing past
every row: their programs exit), which a captured graph reads from a persistent buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AUTO_CAP", "MIN_TOKENS", "MixedLayout", "graph_buckets", "graph_cap", "host_meta", "mixed_keys",
           "token_bucket", "token_buckets", "token_cap",
           "token_floor"]

MIN_TOKENS = 16  # the smallest token bucket
AUTO_CAP = 4096  # "auto"'s most chunk tokens a step, where its deadline asks (peers budget thousands a step)
UNUSED_TILE = 1 << 16  # a tile's part past any row's query rows (G · count < 2^16 · BLOCK_M): its program exits


def _buckets_to(top: int) -> list[int]:
    out, size = [], MIN_TOKENS
    while True:
        for b in (size, size * 3 // 2):
            out.append(b)
            if b >= top:
                return out
        size *= 2


def token_cap(config) -> int:
    """The most chunk tokens a mixed step feeds: `graph_cap` for an int `prefill_budget`, else ("auto") the bucket of
    max(`prefill_chunk`, `AUTO_CAP`) — what "auto"'s deadline (`prefill_steps`) may need when speculation empties
    the slots faster than a `prefill_chunk` a step refills them."""
    budget = config.prefill_budget
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        return graph_cap(config)
    return _buckets_to(max(int(config.prefill_chunk), AUTO_CAP, MIN_TOKENS))[-1]


def graph_cap(config) -> int:
    """The largest token bucket warmed ahead of traffic and captured as CUDA graphs: an int `prefill_budget`'s
    bucket (with `prefill_steps` — a deadline may ask a step for more than the budget — the larger of it and
    `prefill_chunk`'s), else `prefill_chunk`'s; the buckets past it (up to `token_cap`, "auto" only) run eagerly,
    built when a step first reaches them (a forward of that many tokens is bound by its work, not its launches)."""
    budget = config.prefill_budget
    want = budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else config.prefill_chunk
    if config.prefill_steps:
        want = max(want, config.prefill_chunk)
    return _buckets_to(max(int(want), MIN_TOKENS))[-1]


def token_buckets(config) -> tuple[int, ...]:
    """Every chunk-token bucket a mixed step of this config can reach, ascending (the last is `token_cap`)."""
    return tuple(_buckets_to(token_cap(config)))


def graph_buckets(config) -> tuple[int, ...]:
    """The token buckets warmed and graphed (`graph_cap`), ascending."""
    return tuple(_buckets_to(graph_cap(config)))


def token_bucket(tokens: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket ≥ `tokens` (≥ 1), or an error naming the cap."""
    for b in buckets:
        if b >= tokens:
            return b
    raise ValueError(f"a mixed step's chunks hold {tokens} tokens, past the largest token bucket {buckets[-1]} "
                     "(prefill.plan_mixed caps a step's budget there)")


def token_floor(tokens: int, buckets: tuple[int, ...]) -> int:
    """The largest bucket ≤ `tokens` (the smallest where none is)."""
    return max([b for b in buckets if b <= tokens], default=buckets[0])


def mixed_keys(batches, gammas, flavors, config) -> list[tuple]:
    """The mixed step shapes (batch bucket, γ, flavor, token bucket) of these batch buckets, γ values and flavors
    that the warm-up builds: the graphed token buckets (`graph_buckets`)."""
    return [(b, g, f, t) for b in batches for g in gammas for f in flavors for t in graph_buckets(config)]


@dataclass(frozen=True)
class MixedLayout:
    """The fixed layout of one key's batch (module doc): `batch` verify rows of `k` = γ + 1 tokens, `max_chunks`
    chunk rows, one pad row, `tokens` (T) chunk + pad tokens; the Triton chunk launch's `block_m` and query heads
    per KV head `group` (its `num_tiles` tiles: every chunk and the pad row in tiles of block_m query rows); the
    model's `head_dim` and whether it runs in fp32 (the verify launch's BLOCK_M follows them)."""

    batch: int
    k: int
    tokens: int
    max_chunks: int
    group: int
    block_m: int
    head_dim: int = 64
    fp32: bool = False

    @property
    def num_rows(self) -> int:
        return self.batch + self.max_chunks + 1

    @property
    def num_tokens(self) -> int:
        return self.batch * self.k + self.tokens

    @property
    def num_tiles(self) -> int:
        """The chunk launch's tiles at most: Σ ⌈G·c_i / block_m⌉ over the rows that feed tokens (Σ c_i = T, each
        c_i ≥ 1: at most min(max_chunks + 1, T) such rows, each a partial tile at most)."""
        return -(-self.group * self.tokens // self.block_m) + min(self.max_chunks + 1, self.tokens)

    @property
    def meta_size(self) -> int:
        return 2 + 3 * self.max_chunks + 2 * self.num_tiles

    def verify_tiles(self, block_m: int) -> list[tuple[int, int]]:
        """The verify launch's tiles (row, part): fixed per layout."""
        parts = -(-self.group * self.k // block_m)
        return [(r, p) for r in range(self.batch) for p in range(parts)]


def host_meta(layout: MixedLayout, chunks, n: int) -> tuple[list[int], tuple[int, ...], tuple[int, ...]]:
    """One step's host integers (`chunks` a `PrefillChunks`, `n` running rows ≤ layout.batch) → (the meta vector
    [meta_size]: n, chunk starts / counts / slots, the pad count, the chunk launch's tiles; the rows' counts; their
    starts), the last two the host's copy of what the device derives (the reference attention's groups)."""
    c, C = len(chunks.slots), layout.max_chunks
    if not 0 <= n <= layout.batch:  # (0: a warm-up's step)
        raise ValueError(f"a mixed step runs 0..{layout.batch} verify rows, got {n}")
    if c > C:
        raise ValueError(f"a mixed step feeds at most {C} chunks, got {c}")
    counts = [e - s for s, e in zip(chunks.starts, chunks.ends)]
    if counts and min(counts) < 1:
        raise ValueError(f"every chunk feeds at least one token, got counts {counts}")
    pad = layout.tokens - sum(counts)
    if pad < 0:
        raise ValueError(f"the chunks hold {sum(counts)} tokens, past the layout's bucket of {layout.tokens}")
    rest = [0] * (C - c)
    starts = list(chunks.starts) + rest
    counts_c = counts + rest
    slots = list(chunks.slots) + rest
    tiles: list[int] = []
    for i, count in enumerate(counts_c + [pad]):
        for part in range(-(-layout.group * count // layout.block_m)):
            tiles += (layout.batch + i, part)
    if len(tiles) // 2 > layout.num_tiles:  # (cannot happen: `num_tiles` bounds it)
        raise AssertionError(f"{len(tiles) // 2} tiles past the layout's {layout.num_tiles}")
    tiles += (0, UNUSED_TILE) * (layout.num_tiles - len(tiles) // 2)
    meta = [n] + starts + counts_c + slots + [pad] + tiles
    row_counts = (layout.k,) * layout.batch + tuple(counts_c) + (pad,)
    row_starts = tuple(length - 1 for length in chunks.lengths[:n]) + (0,) * (layout.batch - n) + tuple(starts) + (0,)
    return meta, row_counts, row_starts
