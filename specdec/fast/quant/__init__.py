"""Quantized weights on the CPU: GGUF tensors kept block-quantized in the engine and multiplied by a kernel that
reads them so (the fp32 dequantized matrix is never made).

Terms:
  block type   GGUF's (llama.cpp's) encoding of a tensor: Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 here.
  QuantWeight  `weight.py`: one matrix in the kernel's layout — 4- or 8-bit integer values, a float32 scale and
               (optional) offset per group of 16 or 32 weights along K; every block type above maps onto it exactly
               (`blocks.py`, its table).
  kernel       `kernel.py` / `quant_cpu.cpp`: y = x @ Wᵀ for up to 512 rows reading W quantized (a C++ extension
               built once per host); more rows, or no compiler, dequantize a few thousand weight rows at a time.
  dense        `dense.py`: 8-bit block copies of dense float32 matrices (a feature head's, bound to a quantized
               target), attached beside the dense tensors for the same kernel.
  attach       `attach.py`: a `FastLlama`'s linear weights replaced by `QuantWeight`s read from its GGUF, the GEMM
               helpers (`fast.kernels.cpu_linear`) dispatching on them.
  GPU formats  `int4.py` (GPTQ / AWQ) and `fp8.py` (e4m3): weight-only matrices for CUDA through the same hook
               (`gpu_attach.py`), their kernel `fast.kernels.quant_linear`; `pack.py`: reference packers.
"""

from specdec.fast.quant.blocks import SUPPORTED, from_blocks
from specdec.fast.quant.kernel import kernel_available, kernel_name, quant_add_linear_, quant_linear
from specdec.fast.quant.weight import QuantWeight, join

__all__ = ["SUPPORTED", "QuantWeight", "from_blocks", "join", "kernel_available", "kernel_name", "quant_linear",
           "quant_add_linear_"]
