// y = x @ Wᵀ for a block-quantized W with the activations quantized to 8 bits: specdec.fast.quant's CPU kernel
// (kernel.py builds it with torch.utils.cpp_extension; W's layout is weight.py's QuantWeight).
//
//   x      [M, K] float32, contiguous, any M
//   qs     bits 4: uint8 [N, K/2], block b's byte j holds q[32b + j] (low nibble) and q[32b + 16 + j] (high)
//          bits 8: int8  [N, K]
//   scale  [N, K/G] float32, offset [N, K/G] float32 or empty (= 0): w[n, k] = scale[n, k/G] · q[n, k] + offset
//   out    [M, N] float32; accumulate: out += x @ Wᵀ (the residual add), else out = x @ Wᵀ (+ bias)
//   isa    0 the best this CPU runs, 1 portable C++, 2 AVX2, 3 AVX-512 VNNI (a test forces each)
//
// Each row of x is quantized on its own, per block of 32: d = max|x| / 127, qx = round(x / d) ∈ −127..127, with the
// sums d·Σqx of its two halves (for the offsets). A block's product is then an integer dot product, exact in int32:
//   4-bit: Σ q·qx (q ∈ 0..15 unsigned, qx signed: maddubs / vpdpbusd directly)
//   8-bit: Σ |q|·sign(qx, q) (the unsigned × signed form; |q| ≤ 128, each pair ≤ 2·128·127 < 2¹⁵: no saturation)
// summed in 8 int32 lanes (lane i: the block's values 4i..4i+3; lanes 0–3 the first 16, 4–7 the second: group 16
// scales apply per half), converted to float and fused-multiply-added into 8 float lanes by scale·d; the offsets add
// offset·d·Σqx apart; at the end the 8 lanes are summed in a fixed order. Every ISA path runs these same integer
// sums and float operations in the same order, so the output is bit for bit the same on every path and for every
// row count M (each row quantized and reduced alone): greedy decoding gives the same tokens one row at a time or in
// a verify pass. Compiled with -ffp-contract=off (no fusing the compiler chooses); the SIMD paths are compiled with
// target attributes and chosen at run time from the CPU's flags (no -march: the build runs on any x86-64).
// Output columns are split across torch's intra-op threads (the split changes no column's arithmetic).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPECDEC_X86 1
#endif

namespace {

struct Act {  // the quantized rows of x
  std::vector<int8_t> q;   // [M, K]
  std::vector<float> dx;   // [M, K/32, 8]: the block's scale d, once per int32 lane
  std::vector<float> cdx;  // [M, K/32, 8]: d · (the sum of the lane's 4 values) — the offsets' factor
  int64_t K = 0;
};

void quantize_rows(const float* x, int64_t M, int64_t K, Act& a) {
  const int64_t B = K / 32;
  a.K = K;
  a.q.resize(M * K);
  a.dx.resize(M * B * 8);
  a.cdx.resize(M * B * 8);
  for (int64_t i = 0; i < M * B; ++i) {
    const float* v = x + i * 32;
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));
    const float d = amax / 127.f, id = d > 0.f ? 127.f / amax : 0.f;
    int8_t* q = a.q.data() + i * 32;
    for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(std::nearbyint(v[j] * id));
    for (int l = 0; l < 8; ++l) {
      a.dx[i * 8 + l] = d;
      a.cdx[i * 8 + l] = d * static_cast<float>(q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
    }
  }
}

// The 16 float lanes (lanes 0–7: even blocks, 8–15: odd blocks) summed in the fixed order every path ends with.
inline float lanes_sum(const float* l) {
  float t[8];
  for (int i = 0; i < 8; ++i) t[i] = l[i] + l[i + 8];
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

struct Args {
  const Act* a;
  const uint8_t* qs;
  const float* scale;
  const float* offset;  // null: none
  float* out;
  int64_t N;
  const float* bias;
  bool accumulate;
};

inline void store(const Args& p, int64_t m, int64_t n, float y) {
  float* o = p.out + m * p.N + n;
  *o = p.accumulate ? *o + y : y + (p.bias ? p.bias[n] : 0.f);
}

// ---- portable C++: the reference the SIMD paths equal bit for bit ----
// Block b's lane i (its values 4i..4i+3) is float lane 8·(b mod 2) + i:
//   acc = fma(cdx, offset, acc) (with offsets), then acc = fma(float(Σ q·qx), scale · d, acc).
template <int BITS, int G>
void cols_ref(const Args& p, int64_t M, int64_t n0, int64_t n1) {
  const int64_t K = p.a->K, B = K / 32, row_bytes = BITS == 4 ? K / 2 : K, gpb = 32 / G;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qrow = p.qs + n * row_bytes;
    const float* sc = p.scale + n * (K / G);
    const float* of = p.offset ? p.offset + n * (K / G) : nullptr;
    for (int64_t m = 0; m < M; ++m) {
      float acc[16] = {0};
      const int8_t* xq = p.a->q.data() + m * K;
      for (int64_t b = 0; b < B; ++b) {
        int32_t lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < 32; ++j) {
          const int w = BITS == 4 ? (j < 16 ? qrow[b * 16 + j] & 15 : qrow[b * 16 + j - 16] >> 4)
                                  : static_cast<int8_t>(qrow[b * 32 + j]);
          lane[j / 4] += w * xq[b * 32 + j];
        }
        const float* dx = p.a->dx.data() + (m * B + b) * 8;
        const float* cdx = p.a->cdx.data() + (m * B + b) * 8;
        for (int i = 0; i < 8; ++i) {
          const int64_t g = b * gpb + (i < 4 ? 0 : gpb - 1);
          float& a = acc[8 * (b & 1) + i];
          if (of) a = std::fma(cdx[i], of[g], a);
          a = std::fma(static_cast<float>(lane[i]), sc[g] * dx[i], a);
        }
      }
      store(p, m, n, lanes_sum(acc));
    }
  }
}

#ifdef SPECDEC_X86
#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))
#define SPECDEC_AVX512 __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))

// ---- AVX2: one block at a time, maddubs + madd; two accumulators per row (even / odd blocks) ----
template <int G>
SPECDEC_AVX2 inline __m256 halves256(const float* v, int64_t b) {  // a block's two halves' values, 4 lanes each
  return G == 32 ? _mm256_set1_ps(v[b]) : _mm256_set_m128(_mm_set1_ps(v[2 * b + 1]), _mm_set1_ps(v[2 * b]));
}

template <int BITS, int G, int MT>
SPECDEC_AVX2 void cols_avx2(const Args& p, int64_t M, int64_t n0, int64_t n1) {
  const int64_t K = p.a->K, B = K / 32, row_bytes = BITS == 4 ? K / 2 : K;
  const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qrow = p.qs + n * row_bytes;
    const float* sc = p.scale + n * (K / G);
    const float* of = p.offset ? p.offset + n * (K / G) : nullptr;
    for (int64_t m0 = 0; m0 < M; m0 += MT) {
      const int R = M - m0 < MT ? static_cast<int>(M - m0) : MT;
      __m256 acc[MT][2];
      for (int r = 0; r < MT; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      for (int64_t b = 0; b < B; ++b) {
        __m256i w;
        if (BITS == 4) {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qrow + b * 16));
          w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(h, 4), h), low4);
        } else {
          w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qrow + b * 32));
        }
        const __m256i u = BITS == 4 ? w : _mm256_sign_epi8(w, w);
        const __m256 sw = halves256<G>(sc, b), ow = of ? halves256<G>(of, b) : _mm256_setzero_ps();
        for (int r = 0; r < R; ++r) {
          const int64_t mb = (m0 + r) * B + b;
          __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.a->q.data() + mb * 32));
          if (BITS == 8) xq = _mm256_sign_epi8(xq, w);
          const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), ones));
          __m256 a = acc[r][b & 1];
          if (of) a = _mm256_fmadd_ps(_mm256_loadu_ps(p.a->cdx.data() + mb * 8), ow, a);
          acc[r][b & 1] = _mm256_fmadd_ps(f, _mm256_mul_ps(sw, _mm256_loadu_ps(p.a->dx.data() + mb * 8)), a);
        }
      }
      for (int r = 0; r < R; ++r) {
        alignas(32) float l[16];
        _mm256_store_ps(l, acc[r][0]);
        _mm256_store_ps(l + 8, acc[r][1]);
        store(p, m0 + r, n, lanes_sum(l));
      }
    }
  }
}

// ---- AVX-512 VNNI: two blocks at a time in 16 lanes, vpdpbusd; the odd last block on the low 8 lanes ----
template <int G>
SPECDEC_AVX512 inline __m512 halves512(const float* v, int64_t pair) {  // blocks 2·pair, 2·pair + 1
  if (G == 32) {
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(
        reinterpret_cast<const double*>(v + 2 * pair)))));
  }
  const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps(v + 4 * pair)));
}

template <int BITS, int G, int MT>
SPECDEC_AVX512 void cols_avx512(const Args& p, int64_t M, int64_t n0, int64_t n1) {
  const int64_t K = p.a->K, B = K / 32, row_bytes = BITS == 4 ? K / 2 : K;
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qrow = p.qs + n * row_bytes;
    const float* sc = p.scale + n * (K / G);
    const float* of = p.offset ? p.offset + n * (K / G) : nullptr;
    for (int64_t m0 = 0; m0 < M; m0 += MT) {
      const int R = M - m0 < MT ? static_cast<int>(M - m0) : MT;
      __m512 acc[MT];
      for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
      for (int64_t b = 0; b + 1 < B; b += 2) {
        __m512i u;
        __mmask64 neg = 0;
        if (BITS == 4) {
          const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qrow + b * 16));
          const __m256i lo = _mm256_and_si256(y, low4), hi = _mm256_and_si256(_mm256_srli_epi16(y, 4), low4);
          const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  // b lo, b+1 lo, b hi, b+1 hi
          u = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
        } else {
          const __m512i w = _mm512_loadu_si512(qrow + b * 32);
          u = _mm512_abs_epi8(w);
          neg = _mm512_movepi8_mask(w);
        }
        const __m512 sw = halves512<G>(sc, b / 2), ow = of ? halves512<G>(of, b / 2) : _mm512_setzero_ps();
        for (int r = 0; r < R; ++r) {
          const int64_t mb = (m0 + r) * B + b;
          __m512i xq = _mm512_loadu_si512(p.a->q.data() + mb * 32);
          if (BITS == 8) xq = _mm512_mask_sub_epi8(xq, neg, zero, xq);
          const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, u, xq));
          __m512 a = acc[r];
          if (of) a = _mm512_fmadd_ps(_mm512_loadu_ps(p.a->cdx.data() + mb * 8), ow, a);
          acc[r] = _mm512_fmadd_ps(f, _mm512_mul_ps(sw, _mm512_loadu_ps(p.a->dx.data() + mb * 8)), a);
        }
      }
      if (B & 1) {  // the last block, even: the low 8 lanes
        const int64_t b = B - 1;
        __m256i u, w;
        if (BITS == 4) {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qrow + b * 16));
          u = w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(h, 4), h), low4);
        } else {
          w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qrow + b * 32));
          u = _mm256_sign_epi8(w, w);
        }
        const __m256 sw = halves256<G>(sc, b), ow = of ? halves256<G>(of, b) : _mm256_setzero_ps();
        for (int r = 0; r < R; ++r) {
          const int64_t mb = (m0 + r) * B + b;
          __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.a->q.data() + mb * 32));
          if (BITS == 8) xq = _mm256_sign_epi8(xq, w);
          const __m256 f = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, xq));
          __m256 a = _mm512_castps512_ps256(acc[r]);
          if (of) a = _mm256_fmadd_ps(_mm256_loadu_ps(p.a->cdx.data() + mb * 8), ow, a);
          a = _mm256_fmadd_ps(f, _mm256_mul_ps(sw, _mm256_loadu_ps(p.a->dx.data() + mb * 8)), a);
          acc[r] = _mm512_insertf32x8(acc[r], a, 0);
        }
      }
      for (int r = 0; r < R; ++r) {
        alignas(64) float l[16];
        _mm512_store_ps(l, acc[r]);
        store(p, m0 + r, n, lanes_sum(l));
      }
    }
  }
}
#endif

int best_isa() {
#ifdef SPECDEC_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
#endif
  return 1;
}

template <int BITS, int G>
void run(const Args& p, int64_t M, int isa) {
  const int64_t N = p.N;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
#ifdef SPECDEC_X86
    if (isa == 3) return cols_avx512<BITS, G, 8>(p, M, n0, n1);
    if (isa == 2) return cols_avx2<BITS, G, 4>(p, M, n0, n1);
#endif
    cols_ref<BITS, G>(p, M, n0, n1);
  });
}

void q8_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& offset, int64_t bits,
           int64_t group, const c10::optional<at::Tensor>& bias, const at::Tensor& out, bool accumulate, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "q8_mm: x must be [M, K] fp32");
  TORCH_CHECK(out.dim() == 2 && out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) == x.size(0),
              "q8_mm: out must be [M, N] fp32, contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  TORCH_CHECK(K % 32 == 0 && (group == 16 || group == 32), "q8_mm: K must be a multiple of 32, group 16 or 32");
  TORCH_CHECK((bits == 4 && group == 32) || bits == 8, "q8_mm: bits 4 (group 32) or 8");
  TORCH_CHECK(qs.is_contiguous() && qs.size(0) == N && qs.size(1) == (bits == 4 ? K / 2 : K), "q8_mm: qs shape");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == N * (K / group),
              "q8_mm: scale must be [N, K/group] fp32");
  const bool has_offset = offset.numel() > 0;
  TORCH_CHECK(!has_offset || (offset.scalar_type() == at::kFloat && offset.is_contiguous() &&
                              offset.numel() == scale.numel()), "q8_mm: offset must match scale");
  TORCH_CHECK(isa >= 0 && isa <= 3, "q8_mm: isa 0..3");
  const int best = best_isa();
  TORCH_CHECK(isa <= best, "q8_mm: this CPU does not run isa ", isa, " (best ", best, ")");
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N, "q8_mm: bias");
    b = bias->data_ptr<float>();
  }
  if (M == 0 || N == 0) return;
  Act a;
  quantize_rows(x.data_ptr<float>(), M, K, a);
  const Args p{&a, static_cast<const uint8_t*>(qs.data_ptr()), scale.data_ptr<float>(),
               has_offset ? offset.data_ptr<float>() : nullptr, out.data_ptr<float>(), N, b, accumulate};
  const int use = isa == 0 ? best : static_cast<int>(isa);
  if (bits == 4) run<4, 32>(p, M, use);
  else if (group == 32) run<8, 32>(p, M, use);
  else run<8, 16>(p, M, use);
}

int64_t q8_isa() { return best_isa(); }

}  // namespace

TORCH_LIBRARY(specdec_q8, m) {
  m.def("q8_mm(Tensor x, Tensor qs, Tensor scale, Tensor offset, int bits, int group, Tensor? bias, Tensor(a!) out, "
        "bool accumulate, int isa) -> ()");
  m.def("q8_isa() -> int");
}

TORCH_LIBRARY_IMPL(specdec_q8, CPU, m) { m.impl("q8_mm", q8_mm); }
TORCH_LIBRARY_IMPL(specdec_q8, CatchAll, m) { m.impl("q8_isa", q8_isa); }
