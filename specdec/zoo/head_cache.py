"""A device-resident cache of a frozen target's features, for training a feature head without the target.

A head step needs, per training row, the target's final-normed features f_0..f_{L−1} (the head's inputs and
regression targets) and its logits p (for the KL). Without a cache every head step runs the whole frozen
target (24 layers for the zoo `gpu` pair) on its batch. With one, the target runs ONCE over a pool of rows
(the target's own generations and corpus windows) and stores f in bf16 on the device (2 bytes × dim per
token: 2 KiB for dim 1024, so 4M tokens = 8 GiB); head steps then draw batches from the cache and recompute
p = lm_head(f) (one GEMM, exactly what the target's forward does after its final norm).

    cache = build_feature_cache(target, data, max_tokens=4_000_000, batch_size=32, seq_len=512, pool=pool,
                                generated_fraction=0.5, rng=np.random.default_rng(0), device="cuda")
    tokens, features = cache.sample(32, generator)      # `[B, L]` int64, `[B, L, dim]`

Rows: the generated pool's rows at their full width (batch windows at random offsets when wider than L) and
corpus windows of L = min(seq_len + 1, pool width) tokens (L = seq_len + 1 without a pool), like
`specdec.zoo.distill.MixedData`. A batch takes round(fraction · B) rows from the generated part.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from specdec.zoo.data import TokenData

__all__ = ["CachedRows", "FeatureCache", "build_feature_cache", "check_cache_memory", "target_features",
           "MEMORY_FRACTION"]

MEMORY_FRACTION = 0.5  # the cache may take at most this share of the device's free memory
FILL_TOKENS = 32_768  # target tokens per forward while filling


def target_features(target: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The frozen target's final-normed features `[B, N, dim]` of tokens `[B, N]` (LlamaModel applies the norm)."""
    return target.model(input_ids=tokens, use_cache=False).last_hidden_state


@dataclass(frozen=True)
class CachedRows:
    tokens: torch.Tensor  # [R, W] int32
    features: torch.Tensor  # [R, W, dim]

    def window(self, n: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n random rows, each a random window of `length` positions: (`[n, length]` int64, `[n, length, dim]`)."""
        rows, width = self.tokens.shape
        device = self.tokens.device
        picked = torch.randint(0, rows, (n, 1), device=device, generator=generator)
        offsets = torch.randint(0, width - length + 1, (n, 1), device=device, generator=generator)
        index = offsets + torch.arange(length, device=device)
        return self.tokens[picked, index].long(), self.features[picked, index]


@dataclass
class FeatureCache:
    """Training rows with their target features; `sample` draws batches on the device (no host sync);
    `refresh` replaces the oldest corpus rows with fresh windows (a ring)."""

    length: int  # L: positions per training row
    generated_fraction: float
    generated: CachedRows | None
    corpus: CachedRows | None
    next_row: int = 0  # the corpus row `refresh` overwrites first

    @property
    def tokens_held(self) -> int:
        return sum(part.tokens.numel() for part in (self.generated, self.corpus) if part is not None)

    @property
    def nbytes(self) -> int:
        return sum(p.tokens.nbytes + p.features.nbytes for p in (self.generated, self.corpus) if p is not None)

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens `[B, L]` int64, features `[B, L, dim]`): generated rows first, then corpus rows."""
        n_generated = int(round(self.generated_fraction * batch_size)) if self.generated is not None else 0
        pieces = []
        if n_generated:
            pieces.append(self.generated.window(n_generated, self.length, generator))
        if batch_size - n_generated:
            pieces.append(self.corpus.window(batch_size - n_generated, self.length, generator))
        if len(pieces) == 1:
            return pieces[0]
        return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])

    @torch.no_grad()
    def refresh(self, target: torch.nn.Module, data: TokenData, rng: np.random.Generator, rows: int) -> None:
        """Overwrite `rows` corpus rows (the oldest first) with new random windows and their features (one target
        pass; call under the training autocast)."""
        if self.corpus is None:
            raise ValueError("refresh: this cache holds no corpus rows (generated_fraction 1)")
        n, device = self.corpus.tokens.shape[0], self.corpus.tokens.device
        rows = min(rows, n)
        index = (self.next_row + torch.arange(rows, device=device)) % n
        self.next_row = (self.next_row + rows) % n
        windows = _corpus_windows(data, rows, self.length, rng)
        windows = (windows.pin_memory() if device.type == "cuda" else windows).to(device, non_blocking=True)
        self.corpus.tokens[index] = windows.to(torch.int32)
        self.corpus.features[index] = target_features(target, windows).to(self.corpus.features.dtype)


def _corpus_windows(data: TokenData, n: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    """n random windows of `length` tokens of the training stream: `[n, length]` int64 (CPU)."""
    starts = rng.integers(0, len(data.train) - length, size=n)
    return torch.from_numpy(data.train[starts[:, None] + np.arange(length)[None, :]].astype(np.int64))


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":  # free on the device + what torch's allocator holds but does not use
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_cache_memory(n_tokens: int, dim: int, dtype: torch.dtype, device: torch.device | str) -> int:
    """Bytes a cache of `n_tokens` needs (features + int32 tokens); ValueError naming `feature_cache_tokens` when
    that exceeds MEMORY_FRACTION of the device's free memory (host memory on CPU)."""
    device = torch.device(device)
    need = n_tokens * (dim * torch.empty((), dtype=dtype).element_size() + 4)
    free = _free_bytes(device)
    if free is not None and need > MEMORY_FRACTION * free:
        raise ValueError(f"feature_cache_tokens: {n_tokens} tokens × dim {dim} need {need / 2**30:.2f} GiB, more "
                         f"than {MEMORY_FRACTION:.0%} of the free memory on {device} ({free / 2**30:.2f} GiB); "
                         "lower it")
    return need


@torch.no_grad()
def _fill(target, rows: torch.Tensor, dim: int, dtype: torch.dtype, device: torch.device) -> CachedRows:
    """Run the target over `rows` `[R, W]` (CPU int64) in chunks; the features land in one preallocated tensor."""
    n, width = rows.shape
    tokens = rows.to(device=device, dtype=torch.int32)
    features = torch.empty(n, width, dim, dtype=dtype, device=device)
    chunk = max(1, FILL_TOKENS // width)
    for lo in range(0, n, chunk):
        features[lo : lo + chunk] = target_features(target, tokens[lo : lo + chunk].long()).to(dtype)
    return CachedRows(tokens, features)


def build_feature_cache(target: torch.nn.Module, data: TokenData, *, max_tokens: int, batch_size: int, seq_len: int,
                        rng: np.random.Generator, device, pool: torch.Tensor | None = None,
                        generated_fraction: float = 0.0, dtype: torch.dtype = torch.bfloat16) -> FeatureCache:
    """Fill a cache of at most `max_tokens` positions (call under the training autocast).

    With a pool and generated_fraction > 0 the generated rows take up to that share of the tokens (all of the
    pool when it fits), corpus windows the rest; ValueError naming `feature_cache_tokens` when it cannot hold one
    batch or would take more than MEMORY_FRACTION of the free device memory."""
    device = torch.device(device)
    dim = target.config.hidden_size
    use_pool = pool is not None and generated_fraction > 0
    length = min(seq_len + 1, pool.shape[1]) if use_pool else seq_len + 1
    if max_tokens < batch_size * length:
        raise ValueError(f"feature_cache_tokens ({max_tokens}) must hold at least one batch: batch size "
                         f"{batch_size} × {length} positions = {batch_size * length}")
    n_generated = int(round(generated_fraction * batch_size)) if use_pool else 0
    gen_rows = 0
    if n_generated:
        share = max_tokens if n_generated == batch_size else int(generated_fraction * max_tokens)
        gen_rows = min(len(pool), share // pool.shape[1])
        if gen_rows < 1:
            raise ValueError(f"feature_cache_tokens ({max_tokens}): its generated share holds no row of "
                             f"{pool.shape[1]} tokens")
    corpus_rows = (max_tokens - gen_rows * (pool.shape[1] if use_pool else 0)) // length
    if batch_size > n_generated and corpus_rows < 1:
        raise ValueError(f"feature_cache_tokens ({max_tokens}): no room left for corpus rows of {length} tokens")
    corpus_rows = corpus_rows if batch_size > n_generated else 0
    total = gen_rows * (pool.shape[1] if use_pool else 0) + corpus_rows * length
    check_cache_memory(total, dim, dtype, device)
    generated = None
    if gen_rows:
        picked = torch.from_numpy(rng.permutation(len(pool))[:gen_rows])
        generated = _fill(target, pool[picked].long(), dim, dtype, device)
    corpus = None
    if corpus_rows:
        corpus = _fill(target, _corpus_windows(data, corpus_rows, length, rng), dim, dtype, device)
    return FeatureCache(length=length, generated_fraction=generated_fraction if gen_rows else 0.0,
                        generated=generated, corpus=corpus)
