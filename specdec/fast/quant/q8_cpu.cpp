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
// Each row of x is quantized on its own, per block of 32: d = max|x| / 127, qx = round(x / d) ∈ −127..127. Per group
// g of G weights (the scale's groups) the product is an integer dot product, exact in int32:
//   dot_g = Σ q·qx   (4-bit: q ∈ 0..15 unsigned × qx signed; 8-bit: |q| · sign(qx, q), |q| ≤ 128: no saturation, or
//                    on VNNI Σ (qx + 128)·q − 128·Σq: the same int32)
// and the float arithmetic is, per row, over chunks of 8 groups, group j of a chunk in float lane L(j) =
// 4·(j mod 2) + ⌊j/2⌋ (the order the integer reductions leave the groups in):
//   acc[L] = fma(float(dot_g), scale_g · d_g, acc[L])       off[L] = fma(offset_g, d_g · Σ_g qx, off[L])
// and at the end the 16 lanes (acc, off) are summed in a fixed order. Every ISA path runs these same integer sums and
// float operations in the same order, so the output is bit for bit the same on every path and for every row count M
// (each row quantized and reduced alone): greedy decoding gives the same tokens one row at a time or in a verify
// pass. Compiled with -ffp-contract=off (no fusing the compiler chooses); the SIMD paths are compiled with target
// attributes and chosen at run time from the CPU's flags (no -march: the build runs on any x86-64).
//
// Cost: a chunk's 4-bit weights (8 blocks of 32, two blocks a register against activations stored in the same pair
// order) are decoded once and applied to a tile of up to 8 rows; 8-bit weights (Q5_*, Q6_K, Q8_0) are staged once a
// chunk too, transposed (Act's kTransposed: each group's partial sums in its own lane, so a row's dots need no
// horizontal reduction; AVX2 stages |w|, VNNI −128 · Σw against activations biased by 128), at every row count. A
// row's share is its integer dots (4-bit: and a horizontal-add tree, 8 groups → 8 lanes) and, per 8 groups, one
// convert, one multiply and two fused multiply-adds. The AVX-512 path is the AVX2 one with vpdpbusd (256-bit) for
// the dots. Output columns are split across torch's intra-op threads (the split changes
// no column's arithmetic).

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

inline int lane_of_group(int64_t j) { return static_cast<int>((j & 1) * 4 + ((j >> 1) & 3)); }  // j: within a chunk

enum Layout { kNatural, kPaired, kTransposed };

struct Act {  // the quantized rows of x
  // q [M, row]: kNatural: the K values as they are (row = K); kPaired (bits 4): blocks in pairs (2p, 2p + 1), 64 bytes
  //   a pair: x_2p[0:16] x_2p+1[0:16] x_2p[16:32] x_2p+1[16:32] (the weights' nibble order; a missing odd block:
  //   zeros); kTransposed (bits 8 in the staged loop): per chunk of 8 groups, G/4 registers of 32 bytes, register w's
  //   lane L(j) holding bytes 4w..4w+3 of group j (row = chunks · 8 · G; groups past the last: zeros), so one
  //   register's dot leaves every group's partial sum in its own lane; biased (bits 8 staged on AVX-512 VNNI): every
  //   byte qx + 128 (qx ^ 0x80), vpdpbusd's unsigned operand
  std::vector<int8_t> q;
  std::vector<float> d;   // [M, chunks, 8]: lane L(j) of chunk c: the scale d of the block holding group 8c + j
  std::vector<float> cs;  // [M, chunks, 8]: d · Σ qx over that group (the offsets' factor); 0 past the last group
  int64_t K = 0, row = 0, groups = 0, chunks = 0;
  Layout layout = kNatural;
};

inline int64_t x4_index(int64_t b, int j) {  // where value j of block b sits in a kPaired row of Act::q
  return (b / 2) * 64 + (b & 1) * 16 + (j < 16 ? j : j + 16);
}

inline int64_t x_index(const Act& a, int G, int64_t k) {  // where value k sits in a row of Act::q
  if (a.layout == kNatural) return k;
  if (a.layout == kPaired) return x4_index(k / 32, static_cast<int>(k % 32));
  const int64_t g = k / G;
  return (g / 8) * 8 * G + (k % G) / 4 * 32 + lane_of_group(g % 8) * 4 + k % 4;
}

void quantize_rows(const float* x, int64_t M, int64_t K, int G, Layout layout, bool biased, Act& a) {
  const int64_t B = K / 32;
  a.K = K;
  a.groups = K / G;
  a.chunks = (a.groups + 7) / 8;
  a.layout = layout;
  a.row = layout == kPaired ? (B + 1) / 2 * 64 : layout == kTransposed ? a.chunks * 8 * G : K;
  a.q.assign(M * a.row, 0);
  a.d.assign(M * a.chunks * 8, 0.f);
  a.cs.assign(M * a.chunks * 8, 0.f);
  for (int64_t m = 0; m < M; ++m) {
    int8_t* row = a.q.data() + m * a.row;
    for (int64_t b = 0; b < B; ++b) {
      const float* v = x + m * K + b * 32;
      float amax = 0.f;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));
      const float d = amax / 127.f, id = d > 0.f ? 127.f / amax : 0.f;
      int8_t q[32];
      for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(std::nearbyint(v[j] * id));
      for (int j = 0; j < 32; ++j) row[x_index(a, G, b * 32 + j)] = q[j];
      for (int h = 0; h < 32 / G; ++h) {
        const int64_t g = b * (32 / G) + h, at = (m * a.chunks + g / 8) * 8 + lane_of_group(g % 8);
        int s = 0;
        for (int j = h * G; j < (h + 1) * G; ++j) s += q[j];
        a.d[at] = d;
        a.cs[at] = d * static_cast<float>(s);
      }
    }
  }
  if (biased)
    for (int8_t& v : a.q) v = static_cast<int8_t>(v ^ 0x80);
}

// The 16 float lanes (0–7: acc, 8–15: off) summed in the fixed order every path ends with.
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

// ---- portable C++: the reference the SIMD paths equal bit for bit (the module comment's arithmetic, group by group)
template <int BITS, int G>
void cols_ref(const Args& p, int64_t M, int64_t n0, int64_t n1) {
  const Act& a = *p.a;
  const int64_t K = a.K, row_bytes = BITS == 4 ? K / 2 : K;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qrow = p.qs + n * row_bytes;
    const float* sc = p.scale + n * a.groups;
    const float* of = p.offset ? p.offset + n * a.groups : nullptr;
    for (int64_t m = 0; m < M; ++m) {
      float acc[16] = {0};
      const int8_t* xq = a.q.data() + m * a.row;
      for (int64_t g = 0; g < a.groups; ++g) {
        int32_t dot = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) {
          const int64_t b = k / 32;
          const int j = static_cast<int>(k % 32);
          const int w = BITS == 4 ? (j < 16 ? qrow[b * 16 + j] & 15 : qrow[b * 16 + j - 16] >> 4)
                                  : static_cast<int8_t>(qrow[k]);
          dot += w * xq[x_index(a, G, k)];
        }
        const int L = lane_of_group(g % 8);
        const int64_t at = (m * a.chunks + g / 8) * 8 + L;
        acc[L] = std::fma(static_cast<float>(dot), sc[g] * a.d[at], acc[L]);
        if (of) acc[8 + L] = std::fma(of[g], a.cs[at], acc[8 + L]);
      }
      store(p, m, n, lanes_sum(acc));
    }
  }
}

#ifdef SPECDEC_X86
#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))
#define SPECDEC_AVX512 __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define SPECDEC_INLINE inline __attribute__((always_inline))  // (helpers of the inner loop: never a call)

// ==== the staged loop (8-bit weights, 2 rows or more; helpers shared by the AVX2 and the AVX-512 paths) ====
// A chunk's 8 groups are staged once for the tile of rows, transposed to Act's kTransposed order: NW = G/4 registers,
// register w's lane L(j) = bytes 4w..4w+3 of group j (G 16: an in-lane 4 × 4 transpose of the chunk's 4 blocks;
// G 32: the 8 blocks' low and high halves paired across lanes, then two such transposes). A row's dot of register w
// then adds 4 products into each group's own lane: the row's share is NW loads and dots, no horizontal reduction.
constexpr int kStaged = 16;  // registers a chunk's staged weights take at most

SPECDEC_AVX2 SPECDEC_INLINE __m256i ld(const void* at) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)); }

// v[8c + j] in lane L(j) (0 past `groups`): a chunk's scales or offsets in the lanes' order
SPECDEC_AVX2 SPECDEC_INLINE __m256 chunk_lanes(const float* v, int64_t g0, int64_t groups) {
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  if (g0 + 8 <= groups) return _mm256_permutevar8x32_ps(_mm256_loadu_ps(v + g0), order);
  const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(groups - g0)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_permutevar8x32_ps(_mm256_maskload_ps(v + g0, live), order);  // (the lanes past the end: 0, unread)
}

// The weights' stream a few chunks ahead (the hardware prefetcher alone left the single-row pass waiting on loads):
// the `bytes` of values a chunk reads and its 32 bytes of scales (and offsets), `kAhead` bytes of values ahead.
constexpr int kAhead = 2048;
SPECDEC_AVX2 SPECDEC_INLINE void prefetch_ahead(const uint8_t* qs, int bytes, const float* sc, const float* of) {
  for (int i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(qs) + kAhead + i, _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(sc) + kAhead / 4, _MM_HINT_T0);
  if (of) _mm_prefetch(reinterpret_cast<const char*>(of) + kAhead / 4, _MM_HINT_T0);
}

// In each 128-bit lane, rows r[0..3] of 4 int32 words → columns: t[w] = (r0[w], r1[w], r2[w], r3[w]).
SPECDEC_AVX2 SPECDEC_INLINE void transpose4(const __m256i* r, __m256i* t) {
  const __m256i a = _mm256_unpacklo_epi32(r[0], r[1]), b = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i c = _mm256_unpacklo_epi32(r[2], r[3]), d = _mm256_unpackhi_epi32(r[2], r[3]);
  t[0] = _mm256_unpacklo_epi64(a, c);
  t[1] = _mm256_unpackhi_epi64(a, c);
  t[2] = _mm256_unpacklo_epi64(b, d);
  t[3] = _mm256_unpackhi_epi64(b, d);
}

// Chunk c's weights in kTransposed order, t[0 .. G/4) (blocks past the last: zeros). G 16: block k = groups 2k (low
// lane) and 2k + 1 (high lane), so the lanes' transpose puts group 2k in lane k and 2k + 1 in lane 4 + k = L(j).
// G 32: [block 2k low | block 2k + 1 low] and the high halves, k = 0..3, then the same transpose of each.
template <int G>
SPECDEC_AVX2 SPECDEC_INLINE void stage_transposed(const uint8_t* qrow, int64_t c, int64_t B, __m256i* t) {
  constexpr int NB = G / 4;  // blocks of 32 in a chunk
  const int64_t b0 = c * NB;
  __m256i r[NB];
  if (b0 + NB <= B) {
    for (int k = 0; k < NB; ++k) r[k] = ld(qrow + (b0 + k) * 32);
  } else {
    for (int k = 0; k < NB; ++k) r[k] = b0 + k < B ? ld(qrow + (b0 + k) * 32) : _mm256_setzero_si256();
  }
  if (G == 16) {
    transpose4(r, t);
  } else {
    __m256i lo[4], hi[4];
    for (int k = 0; k < 4; ++k) {
      lo[k] = _mm256_permute2x128_si256(r[2 * k], r[2 * k + 1], 0x20);
      hi[k] = _mm256_permute2x128_si256(r[2 * k], r[2 * k + 1], 0x31);
    }
    transpose4(lo, t);
    transpose4(hi, t + 4);
  }
}

template <int MT>
SPECDEC_AVX2 SPECDEC_INLINE void finish(const Args& p, int64_t m0, int R, int64_t n, const __m256* acc, const __m256* off) {
  for (int r = 0; r < R; ++r) {
    alignas(32) float l[16];
    _mm256_store_ps(l, acc[r]);
    _mm256_store_ps(l + 8, off[r]);
    store(p, m0 + r, n, lanes_sum(l));
  }
}

// ---- AVX2: maddubs + madd: |w| (staged: w[NW + i]) · sign(qx, w), each register's int16 pairs (≤ 2 · 128 · 127 =
// 32512) widened by madd before the registers are added ----
template <int G>
SPECDEC_AVX2 SPECDEC_INLINE void stage_avx2(const uint8_t* qrow, int64_t c, int64_t B, __m256i* w) {
  stage_transposed<G>(qrow, c, B, w);
  for (int i = 0; i < G / 4; ++i) w[G / 4 + i] = _mm256_sign_epi8(w[i], w[i]);
}

template <int G>
SPECDEC_AVX2 SPECDEC_INLINE __m256i dots_avx2(const __m256i* w, const int8_t* x) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s[2];
  for (int i = 0; i < G / 4; ++i) {
    const __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(w[G / 4 + i], _mm256_sign_epi8(ld(x + 32 * i), w[i])), ones);
    s[i & 1] = i < 2 ? v : _mm256_add_epi32(s[i & 1], v);
  }
  return _mm256_add_epi32(s[0], s[1]);
}

// ---- AVX-512 VNNI: vpdpbusd (ymm): unsigned qx + 128 (Act biased) × signed w, the lanes started at −128 · Σw
// (staged once a chunk: w[NW]): Σ (qx + 128) · w − 128 · Σ w = Σ qx · w, exact (int32 sums far from wrapping) ----
template <int G>
SPECDEC_AVX512 SPECDEC_INLINE void stage_vnni(const uint8_t* qrow, int64_t c, int64_t B, __m256i* w) {
  stage_transposed<G>(qrow, c, B, w);
  const __m256i k128 = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i sum = _mm256_setzero_si256();
  for (int i = 0; i < G / 4; ++i) sum = _mm256_dpbusd_epi32(sum, k128, w[i]);
  w[G / 4] = _mm256_sub_epi32(_mm256_setzero_si256(), sum);
}

template <int G>
SPECDEC_AVX512 SPECDEC_INLINE __m256i dots_vnni(const __m256i* w, const int8_t* x) {
  __m256i s[2] = {w[G / 4], _mm256_setzero_si256()};  // (two chains: half the dependent vpdpbusd latency)
  for (int i = 0; i < G / 4; ++i) s[i & 1] = _mm256_dpbusd_epi32(s[i & 1], ld(x + 32 * i), w[i]);
  return _mm256_add_epi32(s[0], s[1]);
}

// The loop both SIMD paths run, each compiled with its own target (STAGE / DOTS: that path's functions): per output
// column, per tile of up to MT rows, per chunk: the weights staged once, then every row's dots, one convert, one
// multiply and two fused multiply-adds.
#define SPECDEC_COLS(STAGE, DOTS)                                                                                  \
  const Act& a = *p.a;                                                                                              \
  const int64_t B = a.K / 32;                                                                                       \
  for (int64_t n = n0; n < n1; ++n) {                                                                               \
    const uint8_t* qrow = p.qs + n * a.K;                                                                           \
    const float* sc = p.scale + n * a.groups;                                                                       \
    const float* of = p.offset ? p.offset + n * a.groups : nullptr;                                                 \
    for (int64_t m0 = 0; m0 < M; m0 += MT) {                                                                        \
      const int R = M - m0 < MT ? static_cast<int>(M - m0) : MT;                                                    \
      __m256 acc[MT], off[MT];                                                                                      \
      for (int r = 0; r < MT; ++r) acc[r] = off[r] = _mm256_setzero_ps();                                           \
      for (int64_t c = 0; c < a.chunks; ++c) {                                                                      \
        __m256i w[kStaged];                                                                                         \
        prefetch_ahead(qrow + c * 8 * G, 8 * G, sc + c * 8, of ? of + c * 8 : nullptr);                             \
        STAGE<G>(qrow, c, B, w);                                                                                    \
        const __m256 sw = chunk_lanes(sc, c * 8, a.groups), ow = of ? chunk_lanes(of, c * 8, a.groups) : sw;         \
        for (int r = 0; r < R; ++r) {                                                                               \
          const int64_t m = m0 + r;                                                                                 \
          const __m256i dots = DOTS<G>(w, a.q.data() + m * a.row + c * 8 * G);                                      \
          const float* dl = a.d.data() + (m * a.chunks + c) * 8;                                                    \
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(sw, _mm256_loadu_ps(dl)), acc[r]);       \
          if (of) off[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(a.cs.data() + (m * a.chunks + c) * 8), off[r]);      \
        }                                                                                                           \
      }                                                                                                             \
      finish<MT>(p, m0, R, n, acc, off);                                                                            \
    }                                                                                                               \
  }

template <int G, int MT>
SPECDEC_AVX2 void cols_staged_avx2(const Args& p, int64_t M, int64_t n0, int64_t n1) { SPECDEC_COLS(stage_avx2, dots_avx2) }

template <int G, int MT>
SPECDEC_AVX512 void cols_staged_avx512(const Args& p, int64_t M, int64_t n0, int64_t n1) {
  SPECDEC_COLS(stage_vnni, dots_vnni)
}
#undef SPECDEC_COLS

// ==== the 4-bit loop: a chunk's block pairs decoded once for the tile of rows, against activations in kPaired order ====
constexpr int kMaxUnits = 8;  // registers a chunk's decoded nibbles take
constexpr int kPairs = 4;     // block pairs a chunk

// A chunk's weights, decoded once for every row: w[2i], w[2i + 1] = pair i's low / high nibbles (lanes 0–15 the even
// block's, 16–31 the odd one's; a missing odd block zero). Returns how many pairs the chunk has.
SPECDEC_AVX2 SPECDEC_INLINE int chunk_weights(const uint8_t* qrow, int64_t c, int64_t B, __m256i* w) {
  const int64_t b0 = c * 8;
  const __m256i low4 = _mm256_set1_epi8(15);
  int n = 0;
  for (int i = 0; i < kPairs && b0 + 2 * i < B; ++i, ++n) {
    const uint8_t* at = qrow + (b0 + 2 * i) * 16;
    const __m256i y = b0 + 2 * i + 1 < B ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))
        : _mm256_set_m128i(_mm_setzero_si128(), _mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    w[2 * i] = _mm256_and_si256(y, low4);
    w[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(y, 4), low4);
  }
  return n;
}

// The pairs' int32 dots (4 lanes a block) → one int32 a group, in the lanes' order ([b0 b2 b4 b6 | b1 b3 b5 b7]).
SPECDEC_AVX2 SPECDEC_INLINE __m256i lanes_of_pairs(const __m256i* v) {
  return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
}

// ---- AVX2: maddubs + madd for the dots (the two nibble halves' int16 sums added first, ≤ 7620) ----
SPECDEC_AVX2 SPECDEC_INLINE __m256i pair_dot_avx2(const __m256i* w, const int8_t* xr, int64_t c, int i) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* x = xr + (c * kPairs + i) * 64;
  const __m256i lo = _mm256_maddubs_epi16(w[2 * i], ld(x)), hi = _mm256_maddubs_epi16(w[2 * i + 1], ld(x + 32));
  return _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones);
}

// ---- AVX-512 VNNI: the AVX2 path with vpdpbusd (ymm) for the dots: the same int32 sums, the same float steps ----
SPECDEC_AVX512 SPECDEC_INLINE __m256i pair_dot_vnni(const __m256i* w, const int8_t* xr, int64_t c, int i) {
  const int8_t* x = xr + (c * kPairs + i) * 64;
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w[2 * i], ld(x)), w[2 * i + 1], ld(x + 32));
}

#define SPECDEC_COLS4(DOT)                                                                                         \
  const Act& a = *p.a;                                                                                              \
  const int64_t B = a.K / 32;                                                                                       \
  for (int64_t n = n0; n < n1; ++n) {                                                                               \
    const uint8_t* qrow = p.qs + n * (a.K / 2);                                                                     \
    const float* sc = p.scale + n * a.groups;                                                                       \
    const float* of = p.offset ? p.offset + n * a.groups : nullptr;                                                 \
    for (int64_t m0 = 0; m0 < M; m0 += MT) {                                                                        \
      const int R = M - m0 < MT ? static_cast<int>(M - m0) : MT;                                                    \
      __m256 acc[MT], off[MT];                                                                                      \
      for (int r = 0; r < MT; ++r) acc[r] = off[r] = _mm256_setzero_ps();                                           \
      for (int64_t c = 0; c < a.chunks; ++c) {                                                                      \
        __m256i w[kMaxUnits];                                                                                       \
        prefetch_ahead(qrow + c * 128, 128, sc + c * 8, of ? of + c * 8 : nullptr);                                 \
        const int nu = chunk_weights(qrow, c, B, w);                                                                \
        const __m256 sw = chunk_lanes(sc, c * 8, a.groups), ow = of ? chunk_lanes(of, c * 8, a.groups) : sw;         \
        for (int r = 0; r < R; ++r) {                                                                               \
          const int64_t m = m0 + r;                                                                                 \
          const int8_t* xr = a.q.data() + m * a.row;                                                                \
          __m256i v[kPairs];                                                                                        \
          if (nu == kPairs) {                                                                                       \
            for (int i = 0; i < kPairs; ++i) v[i] = DOT(w, xr, c, i);                                               \
          } else {                                                                                                  \
            for (int i = 0; i < kPairs; ++i) v[i] = i < nu ? DOT(w, xr, c, i) : _mm256_setzero_si256();             \
          }                                                                                                         \
          const float* dl = a.d.data() + (m * a.chunks + c) * 8;                                                    \
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes_of_pairs(v)), _mm256_mul_ps(sw, _mm256_loadu_ps(dl)),    \
                                   acc[r]);                                                                         \
          if (of) off[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(a.cs.data() + (m * a.chunks + c) * 8), off[r]);      \
        }                                                                                                           \
      }                                                                                                             \
      finish<MT>(p, m0, R, n, acc, off);                                                                            \
    }                                                                                                               \
  }

template <int MT>
SPECDEC_AVX2 void cols4_avx2(const Args& p, int64_t M, int64_t n0, int64_t n1) { SPECDEC_COLS4(pair_dot_avx2) }

template <int MT>
SPECDEC_AVX512 void cols4_avx512(const Args& p, int64_t M, int64_t n0, int64_t n1) { SPECDEC_COLS4(pair_dot_vnni) }
#undef SPECDEC_COLS4
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

// The SIMD loop a call takes: 4-bit weights the pairs loop, 8-bit ones the staged loop, at every row count (staged at
// one row too: measured no slower than each row reading its blocks itself). Every row gets the same int32 dots and
// float steps on every path: the same bits whatever the loop.
template <int BITS, int G>
void run(const Args& p, int64_t M, int isa) {
  const int64_t N = p.N;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
#ifdef SPECDEC_X86
    if constexpr (BITS == 8) {
      if (isa == 3) return cols_staged_avx512<G, 8>(p, M, n0, n1);
      if (isa == 2) return cols_staged_avx2<G, 8>(p, M, n0, n1);
    } else {
      if (isa == 3) return cols4_avx512<8>(p, M, n0, n1);
      if (isa == 2) return cols4_avx2<8>(p, M, n0, n1);
    }
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
  const int use = isa == 0 ? best : static_cast<int>(isa);
  Act a;  // (the staged loops read 8-bit activations transposed as their weights are staged; VNNI biased)
  const bool stage8 = bits == 8 && use >= 2;  // (the staged loop reads them transposed)
  quantize_rows(x.data_ptr<float>(), M, K, static_cast<int>(group), bits == 4 ? kPaired : stage8 ? kTransposed
                : kNatural, stage8 && use == 3, a);
  const Args p{&a, static_cast<const uint8_t*>(qs.data_ptr()), scale.data_ptr<float>(),
               has_offset ? offset.data_ptr<float>() : nullptr, out.data_ptr<float>(), N, b, accumulate};
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
