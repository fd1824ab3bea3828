"""Kernels of the fast model's decode step, each with a readable eager reference it is tested against.

  attention   `slot_attention`: queries of k new tokens per row over that row's slot cache, each query
              seeing the slots at or before its own position (one definition for k = 1 and for k = γ+1)
  linear      `linear`: x @ Wᵀ (+ bias) (+ residual) for few rows (decode / verify, M ≤ 16) as one weight-streaming
              Triton kernel for every M (configs per shape in `linear.CONFIGS`, from scripts/bench_linear.py)
"""
