// y = x @ Wᵀ for a block-quantized W, read quantized: specdec.fast.quant's CPU kernel (kernel.py builds it with
// torch.utils.cpp_extension; the layout is weight.py's QuantWeight, its reference `QuantWeight.dequantize`).
//
//   x      [M, K] float32, contiguous (any M, in row tiles of 8; kernel.py sends more than KERNEL_ROWS to the BLAS)
//   qs     bits 4: uint8 [N, K/2], group g's byte j holds q[32g + j] (low nibble) and q[32g + 16 + j] (high)
//          bits 8: int8  [N, K]
//   scale  [N, K/G] float32, offset [N, K/G] float32 or empty (= 0): w[n, k] = scale[n, k/G] · q[n, k] + offset
//   out    [M, N] float32; accumulate: out += x @ Wᵀ (the residual add), else out = x @ Wᵀ (+ bias)
//
// Each weight is dequantized in registers with one multiply-add — the same fp32 value the reference dequantizes to
// (GGUF's products d·q are exact in fp32) — and multiplied into up to 8 rows at once, so a verify pass of γ + 1 rows
// streams the weight once, like a one-row pass. Only the summation order differs from a dense fp32 GEMM's. GCC
// vector extensions (16 lanes; AVX-512 on this build's host, split by the compiler elsewhere); output rows are
// split across torch's intra-op threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

namespace {

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint8_t vu8 __attribute__((vector_size(16)));
typedef int8_t vs8 __attribute__((vector_size(16)));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof(v)); return v; }

inline float hsum(vf v) {  // a fixed order (no reassociation flags)
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

// Rows [n0, n1) of out[:M] for M = MT rows (a template: the accumulators stay in registers).
template <int BITS, int G, bool OFFSET, int MT>
void rows(const float* x, int64_t K, const uint8_t* qs, const float* scale, const float* offset, float* out,
          int64_t N, const float* bias, bool accumulate, int64_t n0, int64_t n1) {
  const int64_t groups = K / G, row_bytes = BITS == 4 ? K / 2 : K;
  for (int64_t n = n0; n < n1; ++n) {
    vf acc[MT];
    for (int r = 0; r < MT; ++r) acc[r] = vf{};
    const uint8_t* q = qs + n * row_bytes;
    const float* sc = scale + n * groups;
    const float* of = OFFSET ? offset + n * groups : nullptr;
    for (int64_t k = 0; k < K; k += 32) {  // 32 weights a step: two vectors
      vf w0, w1;
      if (BITS == 4) {
        vu8 b; std::memcpy(&b, q + k / 2, 16);
        vi wi = __builtin_convertvector(b, vi);
        w0 = __builtin_convertvector(wi & 15, vf);
        w1 = __builtin_convertvector(wi >> 4, vf);
      } else {
        vs8 b0, b1; std::memcpy(&b0, q + k, 16); std::memcpy(&b1, q + k + 16, 16);
        w0 = __builtin_convertvector(__builtin_convertvector(b0, vi), vf);
        w1 = __builtin_convertvector(__builtin_convertvector(b1, vi), vf);
      }
      const int64_t g0 = k / G, g1 = (k + 16) / G;  // (G = 16: two groups in the step, G = 32: one)
      w0 = w0 * sc[g0] + (OFFSET ? of[g0] : 0.f);
      w1 = w1 * sc[g1] + (OFFSET ? of[g1] : 0.f);
      for (int r = 0; r < MT; ++r) {
        acc[r] += w0 * load(x + r * K + k);
        acc[r] += w1 * load(x + r * K + k + 16);
      }
    }
    for (int r = 0; r < MT; ++r) {
      float y = hsum(acc[r]);
      float* o = out + r * N + n;
      *o = accumulate ? *o + y : y + (bias ? bias[n] : 0.f);
    }
  }
}

template <int BITS, int G, bool OFFSET>
void run(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& offset,
         const at::Tensor& out, const float* bias, bool accumulate) {
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  const float* xp = x.data_ptr<float>();
  const uint8_t* qp = static_cast<const uint8_t*>(qs.data_ptr());
  const float* sp = scale.data_ptr<float>();
  const float* op = OFFSET ? offset.data_ptr<float>() : nullptr;
  float* yp = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; m += 8) {  // row tiles of at most 8 (16 accumulators would spill)
      const float* xm = xp + m * K;
      float* ym = yp + m * N;
      switch (M - m >= 8 ? 8 : M - m) {
#define SPECDEC_ROWS(T) case T: rows<BITS, G, OFFSET, T>(xm, K, qp, sp, op, ym, N, bias, accumulate, n0, n1); break;
        SPECDEC_ROWS(1) SPECDEC_ROWS(2) SPECDEC_ROWS(3) SPECDEC_ROWS(4)
        SPECDEC_ROWS(5) SPECDEC_ROWS(6) SPECDEC_ROWS(7) SPECDEC_ROWS(8)
#undef SPECDEC_ROWS
      }
    }
  });
}

void quant_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& offset,
              int64_t bits, int64_t group, const c10::optional<at::Tensor>& bias, const at::Tensor& out,
              bool accumulate) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "quant_mm: x must be [M, K] fp32");
  TORCH_CHECK(out.dim() == 2 && out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) == x.size(0),
              "quant_mm: out must be [M, N] fp32, contiguous");
  const int64_t K = x.size(1), N = out.size(1);
  TORCH_CHECK(K % 32 == 0 && (group == 16 || group == 32), "quant_mm: K must be a multiple of 32, group 16 or 32");
  TORCH_CHECK((bits == 4 && group == 32) || bits == 8, "quant_mm: bits 4 (group 32) or 8");
  TORCH_CHECK(qs.is_contiguous() && qs.size(0) == N && qs.size(1) == (bits == 4 ? K / 2 : K), "quant_mm: qs shape");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == N * (K / group),
              "quant_mm: scale must be [N, K/group] fp32");
  const bool has_offset = offset.numel() > 0;
  TORCH_CHECK(!has_offset || (offset.scalar_type() == at::kFloat && offset.is_contiguous() &&
                              offset.numel() == scale.numel()), "quant_mm: offset must match scale");
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N, "quant_mm: bias");
    b = bias->data_ptr<float>();
  }
  if (bits == 4) {
    if (has_offset) run<4, 32, true>(x, qs, scale, offset, out, b, accumulate);
    else run<4, 32, false>(x, qs, scale, offset, out, b, accumulate);
  } else if (group == 32) {
    if (has_offset) run<8, 32, true>(x, qs, scale, offset, out, b, accumulate);
    else run<8, 32, false>(x, qs, scale, offset, out, b, accumulate);
  } else {
    if (has_offset) run<8, 16, true>(x, qs, scale, offset, out, b, accumulate);
    else run<8, 16, false>(x, qs, scale, offset, out, b, accumulate);
  }
}

}  // namespace

TORCH_LIBRARY(specdec_quant, m) {
  m.def("quant_mm(Tensor x, Tensor qs, Tensor scale, Tensor offset, int bits, int group, Tensor? bias, Tensor(a!) out, "
        "bool accumulate) -> ()");
}

TORCH_LIBRARY_IMPL(specdec_quant, CPU, m) { m.impl("quant_mm", quant_mm); }
