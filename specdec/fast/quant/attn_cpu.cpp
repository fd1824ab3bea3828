// Attention of a few new queries per row over a slot cache, on the CPU in float32: the quantized engine's decode
// and verify attention (attention.py builds it with q8_cpu.cpp; layers.py calls it where `cpu_attention` is set).
//
//   q       [N, H, D] float32, D contiguous: query n of row rows[n] at position pos[n]
//   keys    [P, BS, H_kv, D] (any strides, D contiguous): slot j of row b in block table[b, j / BS] at offset j % BS
//   values  as keys
//   table   [B, W] int32 (a static cache: [B, 1] = b and BS = its span)
//   rows    [N] int64, pos [N] int64
//   window  0 = none, else a query at p reads slots p − window < j ≤ p; softcap 0 = none, else s = c·tanh(s / c)
//   last    the last slot a query may read (the junk slot's index − 1)
//   out     [N, H, D] float32
//
// Each (query, head) reads exactly its own slots lo..hi in slot order: scores s_j = scale · q·k_j (a 16-lane dot
// product summed in a fixed order), m = max s_j, e_j = exp(s_j − m) (a fixed polynomial, not libm's), out =
// (Σ_j e_j v_j) / Σ_j e_j, both sums in slot order. Nothing in a query's arithmetic depends on the other queries,
// the rows, the span or the thread split: a row's attention is the same bits in a one-token step and in a verify
// pass of γ + 1 tokens (greedy plain == speculative on the quantized path). Only the live slots are read (the
// reference gathers the table's whole width and masks it). Compiled with -ffp-contract=off as the q8 kernel; the
// loops are written lane by lane so the compiler vectorizes them without reordering a sum.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int L = 16;  // lanes of the dot products and of the output accumulation

inline __attribute__((always_inline)) float exp_poly(float x) {  // e^x for x ≤ 0 (Cephes' expf polynomial; ~1 ulp), e^(−87) for anything below
  x = x < -87.f ? -87.f : x;
  const float fx = x * 1.44269504088896341f;
  const float n = (fx + 12582912.f) - 12582912.f;  // round to nearest (|fx| < 2²²)
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = (y * (r * r) + r) + 1.f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}

inline __attribute__((always_inline)) float dot(const float* a, const float* b, int64_t D) {
  float acc[L] = {0};
  int64_t d = 0;
  for (; d + L <= D; d += L)
    for (int l = 0; l < L; ++l) acc[l] += a[d + l] * b[d + l];
  for (int l = 0; d + l < D; ++l) acc[l] += a[d + l] * b[d + l];
  for (int w = L / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

struct Head {  // one (query, head): its query, its KV head's first key / value, its row's block table
  const float* q;
  const float* k;
  const float* v;
  const int32_t* table;
  int64_t ks0, ks1, vs0, vs1, BS, D;
  float scale, cap;
};

// (cloned for AVX-512 / AVX2 / the baseline and picked at load; no FMA contraction and no reordered sum in any clone:
// the same bits on each)
__attribute__((target_clones("avx512f", "avx2", "default")))
void one_head(const Head& a, int64_t lo, int64_t hi, float* s, float* o) {
  float m = -INFINITY;
  for (int64_t j = lo; j <= hi; ++j) {
    const int64_t blk = a.table[j / a.BS];
    float v = dot(a.q, a.k + blk * a.ks0 + (j % a.BS) * a.ks1, a.D) * a.scale;
    if (a.cap > 0.f) v = std::tanh(v / a.cap) * a.cap;
    s[j - lo] = v;
    m = v > m ? v : m;
  }
  float total = 0.f;
  for (int64_t j = 0; j <= hi - lo; ++j) s[j] = exp_poly(s[j] - m);
  for (int64_t j = 0; j <= hi - lo; ++j) total += s[j];
  for (int64_t d = 0; d < a.D; ++d) o[d] = 0.f;
  for (int64_t j = lo; j <= hi; ++j) {
    const int64_t blk = a.table[j / a.BS];
    const float* vv = a.v + blk * a.vs0 + (j % a.BS) * a.vs1;
    const float e = s[j - lo];
    for (int64_t d = 0; d < a.D; ++d) o[d] += e * vv[d];
  }
  const float inv = 1.f / total;
  for (int64_t d = 0; d < a.D; ++d) o[d] *= inv;
}

void attn_decode(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& table,
                 const at::Tensor& rows, const at::Tensor& pos, double scale, int64_t window, double softcap,
                 int64_t last, const at::Tensor& out) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.stride(2) == 1, "attn_decode: q [N, H, D] fp32");
  TORCH_CHECK(out.sizes() == q.sizes() && out.is_contiguous() && out.scalar_type() == at::kFloat,
              "attn_decode: out [N, H, D] fp32, contiguous");
  TORCH_CHECK(keys.dim() == 4 && keys.sizes() == values.sizes() && keys.scalar_type() == at::kFloat &&
              values.scalar_type() == at::kFloat && keys.stride(3) == 1 && values.stride(3) == 1,
              "attn_decode: keys / values [P, BS, H_kv, D] fp32 with D contiguous");
  TORCH_CHECK(table.dim() == 2 && table.scalar_type() == at::kInt && table.is_contiguous(), "attn_decode: table");
  const int64_t N = q.size(0), H = q.size(1), D = q.size(2), BS = keys.size(1), HKV = keys.size(2);
  TORCH_CHECK(keys.size(3) == D && H % HKV == 0, "attn_decode: head dims");
  TORCH_CHECK(rows.numel() == N && pos.numel() == N && rows.scalar_type() == at::kLong &&
              pos.scalar_type() == at::kLong && rows.is_contiguous() && pos.is_contiguous(), "attn_decode: rows/pos");
  const int64_t group = H / HKV, W = table.size(1), B = table.size(0);
  const int64_t* rw = rows.data_ptr<int64_t>();
  const int64_t* ps = pos.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n)
    TORCH_CHECK(rw[n] >= 0 && rw[n] < B && ps[n] >= 0 && ps[n] < W * BS, "attn_decode: row or position out of range");
  const int32_t* tb = table.data_ptr<int32_t>();
  const float* K = keys.data_ptr<float>();
  const float* V = values.data_ptr<float>();
  const int64_t ks0 = keys.stride(0), ks1 = keys.stride(1), ks2 = keys.stride(2);
  const int64_t vs0 = values.stride(0), vs1 = values.stride(1), vs2 = values.stride(2);
  const float* Q = q.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  float* O = out.data_ptr<float>();
  const float sc = static_cast<float>(scale), cap = static_cast<float>(softcap);
  at::parallel_for(0, N * H, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> s;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / H, h = i % H, p = ps[n];
      const int64_t hi = p < last ? p : last;
      const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
      float* o = O + (n * H + h) * D;
      if (hi < lo) {
        std::memset(o, 0, D * sizeof(float));
        continue;
      }
      s.resize(hi - lo + 1);
      const Head a{Q + n * qs0 + h * qs1, K + (h / group) * ks2, V + (h / group) * vs2, tb + rw[n] * W, ks0, ks1,
                   vs0, vs1, BS, D, sc, cap};
      one_head(a, lo, hi, s.data(), o);
    }
  });
}

}  // namespace

TORCH_LIBRARY(specdec_attn, m) {
  m.def("attn_decode(Tensor q, Tensor keys, Tensor values, Tensor table, Tensor rows, Tensor pos, float scale, "
        "int window, float softcap, int last, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(specdec_attn, CPU, m) { m.impl("attn_decode", attn_decode); }
