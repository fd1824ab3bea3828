"""Kernels of the fast model's decode step, each with a readable eager reference it is tested against.

  attention   `slot_attention`: queries of k new tokens per row over that row's slot cache, each query
              seeing the slots at or before its own position (one definition for k = 1 and for k = γ+1)
  norm        `rms_norm`, `add_rms_norm`: RMSNorm (after a residual add) in one launch, float32 inside
  rope        `rope_cache_write`: bias, RoPE (and Qwen3's q/k norm) on the q|k|v projection, k and v written
              straight into the slot cache, q returned for attention
  mlp         `silu_mul`: silu(gate)·up over the fused gate|up projection
  select      the `kernel="auto" | "triton" | "reference"` rule (Triton imported lazily)
  linear      `linear`: x @ Wᵀ (+ bias) (+ residual) for few rows (decode / verify, M ≤ 16) as one weight-streaming
              Triton kernel for every M (configs per shape in `linear.CONFIGS`, from scripts/bench_linear.py); optional
              prologues: the RMSNorm before it, or silu·mul over a gate|up input (one launch fewer each)
  linear_choice  cuBLAS vs that kernel timed per weight shape on the device (the shapes the kernel wins)
  triton_attention  its split-K (flash-decoding) Triton kernel, imported only when triton is (kernel="auto"
              takes it for CUDA tensors; tests run it under TRITON_INTERPRET=1 on CPU)
  random      `specdec.rng`'s counter-based draws (exponentials, uniforms) in one launch each, bit-identical to
              the torch reference, and `race`: the exponential-race token without writing the noise (`rng`
              dispatches to them for CUDA tensors; kernels in `_random_triton`)
"""
