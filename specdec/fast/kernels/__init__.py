"""Kernels of the fast model's decode step, each with a readable eager reference it is tested against.

  attention   `slot_attention`: queries of k new tokens per row over that row's slot cache, each query
              seeing the slots at or before its own position (one definition for k = 1 and for k = γ+1)
  triton_attention  its split-K (flash-decoding) Triton kernel, imported only when triton is (kernel="auto"
              takes it for CUDA tensors; tests run it under TRITON_INTERPRET=1 on CPU)
"""
