// Products of GGUF-quantized weights with a few activation rows, each row computed alone.
//
// Block layouts (ggml's, little-endian; d, m, dmin are fp16):
//   Q4_0  32 weights, 18 bytes: d, qs[16]. w[i] = d * (lo4(qs[i]) - 8), w[16 + i] = d * (hi4(qs[i]) - 8)
//   Q4_1  32 weights, 20 bytes: d, m, qs[16]. w[i] = d * lo4(qs[i]) + m, w[16 + i] = d * hi4(qs[i]) + m
//   Q8_0  32 weights, 34 bytes: d, qs[32] (int8). w[i] = d * qs[i]
//   Q4_K  256 weights, 144 bytes: d, dmin, scales[12] (eight 6-bit scales sc and mins mn), qs[128].
//         Sub-block j (32 weights) = d * sc[j] * q - dmin * mn[j]; weights 64g..64g+31 are the low
//         nibbles of qs[32g..32g+31], weights 64g+32..64g+63 their high nibbles.
//   Q6_K  256 weights, 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d.
//         Sub-block s (16 weights) = d * scales[s] * (q - 32), q in 0..63.
//
// How an output is computed (the same sequence of operations at every instruction-set level, for
// any number of rows, so the bits depend on neither):
//   * the activation row is quantized by itself (quantize): int8 per block, a scale per block;
//   * within a block every product is an integer, summed exactly in int32 "lanes" of 4 weights;
//   * K-quants: each block adds (d * dx) * lane to 16 fp32 lanes (fused multiply-add) and
//     -(k * dx) * (sum over sub-blocks of mult * x sums) to one more fp32 accumulator, where
//     k = dmin (Q4_K) or 32 d (Q6_K);
//   * 32-weight blocks: even blocks add (d * dx) * lane into fp32 lanes 0-7, odd ones into 8-15;
//     Q4_0 adds -(8 d dx) * (x sum) and Q4_1 adds m * (dx * x sum) to the extra accumulator;
//   * the output is the 16 lanes summed in a fixed tree, plus the extra accumulator, plus the bias.
// Integer sums are exact, so the AVX2 and AVX-512 VNNI paths agree bit for bit with the plain C++.
#include "quant.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace anyspec {
namespace {

struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34, "layout");
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210, "layout");

inline float half(uint16_t h) { return _cvtsh_ss(h); }

inline float bf16(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The fixed tree that sums 16 lanes: (v[i] + v[i+8]), then (+4), (+2), (+1).
inline float tree16(const float* v) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

inline float hsum8(__m256 v) {  // the same tree on 8 lanes: (i + 4), (+2), (+1)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- K-quant blocks decoded to 256 unsigned weights, 16 scales and 16 min multipliers ----

struct KBlock {
  alignas(64) uint8_t q[256];
  alignas(32) int16_t sc[16];  // per 16 weights
  alignas(32) int16_t mu[16];  // per 16 weights: what multiplies the x sums
  float d, k;
};

inline void decode(const BlockQ4_K* b, KBlock& o) {
  // scales[0..3]: low 6 bits of sc[0..3] (top 2 bits: high bits of sc[4..7]); scales[4..7] likewise
  // for mn[0..3] and mn[4..7]; scales[8..11]: low nibble sc[4..7], high nibble mn[4..7].
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 4; ++j) {
    sc[j] = b->scales[j] & 63;
    mn[j] = b->scales[j + 4] & 63;
    sc[j + 4] = (b->scales[j + 8] & 15) | ((b->scales[j] >> 6) << 4);
    mn[j + 4] = (b->scales[j + 8] >> 4) | ((b->scales[j + 4] >> 6) << 4);
  }
  for (int g = 0; g < 4; ++g)
    for (int l = 0; l < 32; ++l) {
      o.q[64 * g + l] = b->qs[32 * g + l] & 15;
      o.q[64 * g + 32 + l] = b->qs[32 * g + l] >> 4;
    }
  for (int s = 0; s < 16; ++s) {
    o.sc[s] = sc[s / 2];
    o.mu[s] = mn[s / 2];
  }
  o.d = half(b->d);
  o.k = half(b->dmin);
}

inline void decode(const BlockQ6_K* b, KBlock& o) {
  for (int n = 0; n < 2; ++n) {
    const uint8_t* ql = b->ql + 64 * n;
    const uint8_t* qh = b->qh + 32 * n;
    uint8_t* q = o.q + 128 * n;
    for (int l = 0; l < 32; ++l) {
      q[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
      q[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
      q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
      q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
    }
  }
  for (int s = 0; s < 16; ++s) o.sc[s] = o.mu[s] = b->scales[s];
  o.d = half(b->d);
  o.k = 32.0f * o.d;
}

// ---- 32-weight blocks: unsigned (Q4) or signed (Q8_0) weights, scale, and the extra term ----

struct SBlock {
  alignas(32) int8_t q[32];
  float d, m;  // m: Q4_1's offset
};

inline void decode(const BlockQ4_0* b, SBlock& o) {
  for (int i = 0; i < 16; ++i) {
    o.q[i] = static_cast<int8_t>(b->qs[i] & 15);
    o.q[i + 16] = static_cast<int8_t>(b->qs[i] >> 4);
  }
  o.d = half(b->d);
  o.m = 0;
}

inline void decode(const BlockQ4_1* b, SBlock& o) {
  for (int i = 0; i < 16; ++i) {
    o.q[i] = static_cast<int8_t>(b->qs[i] & 15);
    o.q[i + 16] = static_cast<int8_t>(b->qs[i] >> 4);
  }
  o.d = half(b->d);
  o.m = half(b->m);
}

inline void decode(const BlockQ8_0* b, SBlock& o) {
  std::memcpy(o.q, b->qs, 32);
  o.d = half(b->d);
  o.m = 0;
}

// The extra term of a 32-weight block: Q4_0's -8 offset and Q4_1's m, on the block's x sum.
template <typename B> inline float s_extra(const SBlock&, float, const Act&, int64_t, int64_t, float e) { return e; }
template <> inline float s_extra<BlockQ4_0>(const SBlock&, float ds, const Act& a, int64_t i, int64_t, float e) {
  return std::fma(-8.0f * ds, static_cast<float>(a.bsum[2 * i] + a.bsum[2 * i + 1]), e);
}
template <> inline float s_extra<BlockQ4_1>(const SBlock& s, float, const Act& a, int64_t i, int64_t, float e) {
  return std::fma(s.m, a.sx[i], e);
}

// ---- the plain C++ reference ----

// A K-quant block in 16 lanes, one per 16 weights (lane l: weights 16l..16l+15): I_l, the exact
// integer sum of the lane's products with its scale applied (Q6_K's -32 included), and the 4 lanes
// of the extra term (Q4_K: its 8 mins paired with the x sums of 32; Q6_K: none).
inline void k_lanes(const BlockQ4_K*, const KBlock& kb, const int8_t* x, const int16_t* bs16, const int16_t* bs32,
                    int32_t* lane, int32_t* e) {
  for (int l = 0; l < 16; ++l) {
    int32_t sum = 0;
    for (int i = 16 * l; i < 16 * l + 16; ++i) sum += kb.q[i] * x[i];
    lane[l] = kb.sc[l] * sum;
  }
  (void)bs16;
  for (int i = 0; i < 4; ++i) e[i] = kb.mu[4 * i] * bs32[2 * i] + kb.mu[4 * i + 2] * bs32[2 * i + 1];
}

inline void k_lanes(const BlockQ6_K*, const KBlock& kb, const int8_t* x, const int16_t* bs16, const int16_t*,
                    int32_t* lane, int32_t* e) {
  for (int l = 0; l < 16; ++l) {
    int32_t sum = 0;
    for (int i = 16 * l; i < 16 * l + 16; ++i) sum += kb.q[i] * x[i];
    lane[l] = kb.sc[l] * (sum - 32 * bs16[l]);
  }
  for (int i = 0; i < 4; ++i) e[i] = 0;
}

inline float tree4(const float* e) { return (e[0] + e[2]) + (e[1] + e[3]); }

template <typename B>
void k_rows_ref(const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y, int64_t ldy,
                int64_t n0, int64_t n1) {
  const int64_t nb = K / 256;
  KBlock kb;
  for (int64_t n = n0; n < n1; ++n) {
    const B* blocks = reinterpret_cast<const B*>(w + n * nb * sizeof(B));
    for (int64_t r = 0; r < a.M; ++r) {
      float acc[16] = {}, extra[4] = {};
      for (int64_t b = 0; b < nb; ++b) {
        decode(&blocks[b], kb);
        int32_t lane[16], e[4];
        k_lanes(&blocks[b], kb, a.q.data() + r * K + b * 256, a.bsum.data() + r * (K / 16) + 16 * b,
                a.bsum32.data() + r * (K / 32) + 8 * b, lane, e);
        const float dx = a.d[r * nb + b], ds = kb.d * dx, ks = kb.k * dx;
        for (int l = 0; l < 16; ++l) acc[l] = std::fma(ds, static_cast<float>(lane[l]), acc[l]);
        for (int l = 0; l < 4; ++l) extra[l] = std::fma(-ks, static_cast<float>(e[l]), extra[l]);
      }
      y[r * ldy + n] = tree16(acc) + tree4(extra) + (bias ? bias[n] : 0.0f);
    }
  }
}

template <typename B>
void s_rows_ref(const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y, int64_t ldy,
                int64_t n0, int64_t n1) {
  const int64_t nb = K / 32;
  SBlock sb;
  for (int64_t n = n0; n < n1; ++n) {
    const B* blocks = reinterpret_cast<const B*>(w + n * nb * sizeof(B));
    for (int64_t r = 0; r < a.M; ++r) {
      float acc[16] = {}, extra = 0;
      for (int64_t b = 0; b < nb; ++b) {
        decode(&blocks[b], sb);
        const int8_t* x = a.q.data() + r * K + b * 32;
        int32_t lane[8] = {};
        for (int e = 0; e < 32; ++e) lane[e / 4] += sb.q[e] * x[e];
        const float ds = sb.d * a.d[r * nb + b];
        float* half_acc = acc + (b & 1) * 8;
        for (int l = 0; l < 8; ++l) half_acc[l] = std::fma(ds, static_cast<float>(lane[l]), half_acc[l]);
        extra = s_extra<B>(sb, ds, a, r * nb + b, 0, extra);
      }
      y[r * ldy + n] = tree16(acc) + extra + (bias ? bias[n] : 0.0f);
    }
  }
}

// ---- SIMD K-quants: each block is decoded into registers once and used by every activation row ----

inline float tree4(__m128 e) {
  e = _mm_add_ps(e, _mm_movehl_ps(e, e));
  return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}

// Q4_K's 6-bit scales and mins as 16 bytes: sc[0..7], mn[0..7].
inline __m128i q4k_scales(const BlockQ4_K* b) {
  uint32_t u[3], v[4];
  std::memcpy(u, b->scales, 12);
  v[0] = u[0] & 0x3f3f3f3f;
  v[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
  v[2] = u[1] & 0x3f3f3f3f;
  v[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

// AVX-512: a block as 4 vectors V[t] of 16 lanes, lane l holding weights 16l+4t..16l+4t+3 (the
// activations are stored in the same order, see quantize), so 4 vpdpbusd leave lane l with the
// sum of its 16 products; one vpmulld applies the scales.
struct KRegs512 {
  __m512i V[4], scale;
  __m128i mins;  // Q4_K: 8 mins as int16
  float d, k;
};

// Word of qs and nibble for lane l of V[0] (V[t]: word + t): Q4_K weights 16l.. are nibble (l/2)%2 of
// qs bytes 32(l/4) + 16(l%2)...
AVX512 inline void load_block(const BlockQ4_K* b, KRegs512& o) {
  const __m512i idx = _mm512_setr_epi32(0, 4, 0, 4, 8, 12, 8, 12, 16, 20, 16, 20, 24, 28, 24, 28);
  const __m512i shift = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);
  const __m512i low4 = _mm512_set1_epi8(15);
  const __m512i q0 = _mm512_loadu_si512(b->qs), q1 = _mm512_loadu_si512(b->qs + 64);
  for (int t = 0; t < 4; ++t) {
    const __m512i words = _mm512_permutex2var_epi32(q0, _mm512_add_epi32(idx, _mm512_set1_epi32(t)), q1);
    o.V[t] = _mm512_and_si512(_mm512_srlv_epi32(words, shift), low4);
  }
  const __m128i sm = q4k_scales(b);  // sc[0..7], mn[0..7]
  o.scale = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(sm, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
  o.mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
  o.d = half(b->d);
  o.k = half(b->dmin);
}

// Q6_K lane l (sub-block l): chunk n = l/8, k = (l%8)/2; low bits: nibble k/2 of ql word
// 16n + 8(k%2) + 4(l%2) + t; high bits: bits 2k of qh word 8n + 4(l%2) + t.
AVX512 inline void load_block(const BlockQ6_K* b, KRegs512& o) {
  const __m512i idx_l = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 16, 20, 24, 28, 16, 20, 24, 28);
  const __m512i shift_l = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
  const __m512i idx_h = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12);
  const __m512i shift_h = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 0, 0, 2, 2, 4, 4, 6, 6);
  const __m512i low4 = _mm512_set1_epi8(15), two = _mm512_set1_epi8(3);
  const __m512i l0 = _mm512_loadu_si512(b->ql), l1 = _mm512_loadu_si512(b->ql + 64);
  const __m512i h = _mm512_loadu_si512(b->qh);
  for (int t = 0; t < 4; ++t) {
    const __m512i step = _mm512_set1_epi32(t);
    const __m512i lo = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_permutex2var_epi32(l0, _mm512_add_epi32(idx_l, step), l1), shift_l), low4);
    const __m512i hi = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_permutexvar_epi32(_mm512_add_epi32(idx_h, step), h), shift_h), two);
    o.V[t] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));
  }
  o.scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales)));
  o.mins = _mm_setzero_si128();
  o.d = half(b->d);
  o.k = 32.0f * o.d;
}

AVX512 inline __m512i offset512(const BlockQ4_K*, __m512i sum, const int16_t*) { return sum; }
AVX512 inline __m512i offset512(const BlockQ6_K*, __m512i sum, const int16_t* bs16) {
  const __m512i bs = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs16)));
  return _mm512_sub_epi32(sum, _mm512_slli_epi32(bs, 5));
}

// Outputs for activation rows r0..r0+R-1 of one weight row.
template <typename B, int R>
AVX512 void k_group512(const B* blocks, int64_t nb, const Act& a, int64_t r0, float* out) {
  __m512 acc[R];
  __m128 extra[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), extra[r] = _mm_setzero_ps();
  KRegs512 o;
  const int64_t K = a.K;
  for (int64_t b = 0; b < nb; ++b) {
    _mm_prefetch(reinterpret_cast<const char*>(blocks + b + 4), _MM_HINT_T0);
    load_block(&blocks[b], o);
    for (int r = 0; r < R; ++r) {
      const int8_t* x = a.q.data() + (r0 + r) * K + 256 * b;
      __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), o.V[0], _mm512_loadu_si512(x));
      for (int t = 1; t < 4; ++t) sum = _mm512_dpbusd_epi32(sum, o.V[t], _mm512_loadu_si512(x + 64 * t));
      sum = _mm512_mullo_epi32(offset512(&blocks[b], sum, a.bsum.data() + (r0 + r) * (K / 16) + 16 * b), o.scale);
      const float dx = a.d[(r0 + r) * nb + b];
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(o.d * dx), _mm512_cvtepi32_ps(sum), acc[r]);
      if (std::is_same<B, BlockQ4_K>::value) {
        const __m128i e = _mm_madd_epi16(o.mins, _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(a.bsum32.data() + (r0 + r) * (K / 32) + 8 * b)));
        extra[r] = _mm_fnmadd_ps(_mm_set1_ps(o.k * dx), _mm_cvtepi32_ps(e), extra[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m256 folded = _mm256_add_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1));
    out[r] = hsum8(folded) + tree4(extra[r]);
  }
}

template <typename B>
AVX512 void k_rows_avx512(const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y, int64_t ldy,
                          int64_t n0, int64_t n1) {
  const int64_t nb = K / 256;
  float out[8];
  for (int64_t n = n0; n < n1; ++n) {
    const B* blocks = reinterpret_cast<const B*>(w + n * nb * sizeof(B));
    for (int64_t r0 = 0; r0 < a.M; r0 += 8) {
      const int64_t R = std::min<int64_t>(8, a.M - r0);
      switch (R) {
        case 1: k_group512<B, 1>(blocks, nb, a, r0, out); break;
        case 2: k_group512<B, 2>(blocks, nb, a, r0, out); break;
        case 3: k_group512<B, 3>(blocks, nb, a, r0, out); break;
        case 4: k_group512<B, 4>(blocks, nb, a, r0, out); break;
        case 5: k_group512<B, 5>(blocks, nb, a, r0, out); break;
        case 6: k_group512<B, 6>(blocks, nb, a, r0, out); break;
        case 7: k_group512<B, 7>(blocks, nb, a, r0, out); break;
        default: k_group512<B, 8>(blocks, nb, a, r0, out); break;
      }
      for (int64_t r = 0; r < R; ++r) y[(r0 + r) * ldy + n] = out[r] + (bias ? bias[n] : 0.0f);
    }
  }
}

// AVX2: the block decoded to 256 bytes in natural order; maddubs + madd give 4 lanes per 16 weights,
// which a tree of hadds folds to the 16 lane sums (in the order 0 2 4 6 1 3 5 7 | 8 10 .. 15).
struct KBuf {
  alignas(64) uint8_t q[256];
  alignas(32) int32_t scale[16];  // per lane, in the hadd order
  alignas(16) int16_t mins[8];
  float d, k;
};

constexpr int HADD_ORDER[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};

inline void load_block(const BlockQ4_K* b, KBuf& o) {
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int g = 0; g < 4; ++g) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * g));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o.q + 64 * g), _mm256_and_si256(v, low4));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o.q + 64 * g + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
  }
  alignas(16) uint8_t sm[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(sm), q4k_scales(b));
  for (int i = 0; i < 16; ++i) o.scale[i] = sm[HADD_ORDER[i] / 2];
  for (int i = 0; i < 8; ++i) o.mins[i] = sm[8 + i];
  o.d = half(b->d);
  o.k = half(b->dmin);
}

inline void load_block(const BlockQ6_K* b, KBuf& o) {
  const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
  for (int n = 0; n < 2; ++n) {
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->ql + 64 * n));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->ql + 64 * n + 32));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * n));
    auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), two), 4); };
    __m256i* out = reinterpret_cast<__m256i*>(o.q + 128 * n);
    _mm256_store_si256(out, _mm256_or_si256(_mm256_and_si256(l0, low4), high(0)));
    _mm256_store_si256(out + 1, _mm256_or_si256(_mm256_and_si256(l1, low4), high(2)));
    _mm256_store_si256(out + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), high(4)));
    _mm256_store_si256(out + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), high(6)));
  }
  for (int i = 0; i < 16; ++i) o.scale[i] = b->scales[HADD_ORDER[i]];
  for (int i = 0; i < 8; ++i) o.mins[i] = 0;
  o.d = half(b->d);
  o.k = 32.0f * o.d;
}

// The 16 lane sums of one row's block, in the hadd order, as two vectors.
inline void k_sums_avx2(const KBuf& o, const int8_t* x, __m256i& first, __m256i& second) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i v[8];
  for (int j = 0; j < 8; ++j)
    v[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(o.q + 32 * j)),
                                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * j))), ones);
  first = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  second = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
}

inline __m256i offset2(const BlockQ4_K*, __m256i sum, const int16_t*, int) { return sum; }
inline __m256i offset2(const BlockQ6_K*, __m256i sum, const int16_t* bs16, int half_) {
  alignas(32) int32_t v[8];
  for (int i = 0; i < 8; ++i) v[i] = 32 * bs16[HADD_ORDER[8 * half_ + i]];
  return _mm256_sub_epi32(sum, _mm256_load_si256(reinterpret_cast<const __m256i*>(v)));
}

template <typename B>
void k_rows_avx2(const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y, int64_t ldy,
                 int64_t n0, int64_t n1) {
  const int64_t nb = K / 256;
  // from the hadd order back to lanes 0..7 of each half, for the canonical sum tree
  const __m256i back = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  KBuf o;
  for (int64_t n = n0; n < n1; ++n) {
    const B* blocks = reinterpret_cast<const B*>(w + n * nb * sizeof(B));
    for (int64_t r0 = 0; r0 < a.M; r0 += 8) {
      const int64_t R = std::min<int64_t>(8, a.M - r0);
      __m256 lo[8], hi[8];
      __m128 extra[8];
      for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps(), extra[r] = _mm_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        load_block(&blocks[b], o);
        const __m256i s0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(o.scale));
        const __m256i s1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(o.scale + 8));
        for (int64_t r = 0; r < R; ++r) {
          const int64_t row = r0 + r;
          const int16_t* bs16 = a.bsum.data() + row * (K / 16) + 16 * b;
          __m256i first, second;
          k_sums_avx2(o, a.q.data() + row * K + 256 * b, first, second);
          first = _mm256_mullo_epi32(offset2(&blocks[b], first, bs16, 0), s0);
          second = _mm256_mullo_epi32(offset2(&blocks[b], second, bs16, 1), s1);
          const float dx = a.d[row * nb + b];
          const __m256 ds = _mm256_set1_ps(o.d * dx);
          lo[r] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(first), lo[r]);
          hi[r] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(second), hi[r]);
          if (std::is_same<B, BlockQ4_K>::value) {
            const __m128i e = _mm_madd_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(o.mins)), _mm_loadu_si128(
                reinterpret_cast<const __m128i*>(a.bsum32.data() + row * (K / 32) + 8 * b)));
            extra[r] = _mm_fnmadd_ps(_mm_set1_ps(o.k * dx), _mm_cvtepi32_ps(e), extra[r]);
          }
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const __m256 folded = _mm256_add_ps(_mm256_permutevar8x32_ps(lo[r], back), _mm256_permutevar8x32_ps(hi[r], back));
        y[(r0 + r) * ldy + n] = hsum8(folded) + tree4(extra[r]) + (bias ? bias[n] : 0.0f);
      }
    }
  }
}

// 32-weight blocks: 8 int32 lanes of one block, by instruction set.
inline __m256i s_lanes_avx2(const int8_t* q, const int8_t* x, bool is_signed) {
  const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i p = is_signed ? _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w))
                              : _mm256_maddubs_epi16(w, xv);
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

AVX512 inline __m256i s_lanes_avx512(const int8_t* q, const int8_t* x, bool is_signed) {
  const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  if (is_signed) return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, xv);
}

struct SRow {
  std::vector<int8_t> q;
  std::vector<float> d, m;
  void reserve(int64_t nb) {
    if (static_cast<int64_t>(d.size()) >= nb) return;
    q.resize(32 * nb + 32), d.resize(nb), m.resize(nb);
  }
  int8_t* qa(int64_t b) {
    return reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(q.data()) + 31) & ~uintptr_t(31)) + 32 * b;
  }
};

thread_local SRow s_scratch;

inline void nibbles(const uint8_t* qs, int8_t* out) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), low4 = _mm_set1_epi8(15);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out),
                     _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4)));
}

inline void decode_simd(const BlockQ4_0* b, SRow& row, int64_t i) {
  nibbles(b->qs, row.qa(i));
  row.d[i] = half(b->d), row.m[i] = 0;
}

inline void decode_simd(const BlockQ4_1* b, SRow& row, int64_t i) {
  nibbles(b->qs, row.qa(i));
  row.d[i] = half(b->d), row.m[i] = half(b->m);
}

inline void decode_simd(const BlockQ8_0* b, SRow& row, int64_t i) {
  std::memcpy(row.qa(i), b->qs, 32);
  row.d[i] = half(b->d), row.m[i] = 0;
}

// One weight row's blocks decoded once, then each activation row over them; LANES(q, x) gives the
// 8 int32 lanes of one block.
#define ANYSPEC_S_ROWS(LANES)                                                                        \
  const int64_t nb = K / 32;                                                                         \
  SRow& row = s_scratch;                                                                             \
  row.reserve(nb);                                                                                   \
  SBlock sb;                                                                                         \
  for (int64_t n = n0; n < n1; ++n) {                                                                \
    const B* blocks = reinterpret_cast<const B*>(w + n * nb * sizeof(B));                            \
    for (int64_t b = 0; b < nb; ++b) decode_simd(&blocks[b], row, b);                                \
    for (int64_t r = 0; r < a.M; ++r) {                                                              \
      const int8_t* x = a.q.data() + r * K;                                                          \
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                                    \
      float extra = 0;                                                                               \
      for (int64_t b = 0; b < nb; ++b) {                                                             \
        const __m256i lanes = LANES(row.qa(b), x + 32 * b, std::is_same<B, BlockQ8_0>::value);       \
        const float ds = row.d[b] * a.d[r * nb + b];                                                 \
        acc[b & 1] = _mm256_fmadd_ps(_mm256_set1_ps(ds), _mm256_cvtepi32_ps(lanes), acc[b & 1]);     \
        sb.m = row.m[b];                                                                             \
        extra = s_extra<B>(sb, ds, a, r * nb + b, 0, extra);                                         \
      }                                                                                              \
      y[r * ldy + n] = hsum8(_mm256_add_ps(acc[0], acc[1])) + extra + (bias ? bias[n] : 0.0f);       \
    }                                                                                                \
  }

template <typename B>
void s_rows_avx2(const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y, int64_t ldy,
                 int64_t n0, int64_t n1) {
  ANYSPEC_S_ROWS(s_lanes_avx2)
}

template <typename B>
AVX512 void s_rows_avx512(const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y, int64_t ldy,
                          int64_t n0, int64_t n1) {
  ANYSPEC_S_ROWS(s_lanes_avx512)
}
#undef ANYSPEC_S_ROWS

int level = -1;

}  // namespace

int64_t block_size(int64_t type) {
  switch (type) {
    case Q4_0: case Q4_1: case Q8_0: return 32;
    case Q4_K: case Q6_K: return 256;
    default: return 1;
  }
}

int64_t block_bytes(int64_t type) {
  switch (type) {
    case Q4_0: return sizeof(BlockQ4_0);
    case Q4_1: return sizeof(BlockQ4_1);
    case Q8_0: return sizeof(BlockQ8_0);
    case Q4_K: return sizeof(BlockQ4_K);
    case Q6_K: return sizeof(BlockQ6_K);
    case F32: return 4;
    case F16: case BF16: return 2;
    default: return 0;
  }
}

bool is_quantized(int64_t type) { return block_size(type) > 1; }

int64_t act_block(int64_t type) { return block_size(type); }

int best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
    return 2;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}

int isa() {
  if (level < 0) level = best_isa();
  return level;
}

void set_isa(int wanted) { level = std::min(std::max(wanted, 0), best_isa()); }

void quantize(const float* x, int64_t M, int64_t K, int64_t blk, Act& a) {
  const int64_t nb = K / blk;
  a.M = M, a.K = K, a.blk = blk;
  a.q.resize(M * K);
  a.d.resize(M * nb);
  a.bsum.resize(M * K / 16);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float* v = x + r * K + b * blk;
      float amax = 0;
      for (int64_t i = 0; i < blk; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float id = amax > 0 ? 127.0f / amax : 0.0f;
      int8_t* q = a.q.data() + r * K + b * blk;
      for (int64_t i = 0; i < blk; ++i)
        q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(v[i] * id))));
      a.d[r * nb + b] = amax / 127.0f;
    }
  for (int64_t i = 0; i < M * K / 16; ++i) {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += a.q[16 * i + j];
    a.bsum[i] = static_cast<int16_t>(s);
  }
  a.permuted = blk == 256 && isa() == 2;
  if (a.permuted) {  // AVX-512 K-quants: byte 64t + 4l + i of a block holds value 16l + 4t + i
    std::vector<int8_t> block(256);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        int8_t* q = a.q.data() + r * K + b * 256;
        std::memcpy(block.data(), q, 256);
        for (int t = 0; t < 4; ++t)
          for (int l = 0; l < 16; ++l) std::memcpy(q + 64 * t + 4 * l, block.data() + 16 * l + 4 * t, 4);
      }
  }
  a.bsum32.resize(M * K / 32);
  for (int64_t i = 0; i < M * K / 32; ++i) a.bsum32[i] = static_cast<int16_t>(a.bsum[2 * i] + a.bsum[2 * i + 1]);
  if (blk == 32) {
    a.sx.resize(M * nb);
    for (int64_t i = 0; i < M * nb; ++i) a.sx[i] = a.d[i] * static_cast<float>(a.bsum32[i]);
  }
}

void qmatmul_rows(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                  int64_t ldy, int64_t n0, int64_t n1) {
  const int level = block_size(type) == 256 && a.permuted != (isa() == 2) ? -1 : isa();
  if (level < 0) throw std::runtime_error("activations quantized for another instruction-set level");
#define ANYSPEC_ROWS(kind, B)                                                       \
  (level == 2 ? kind##_rows_avx512<B> : level == 1 ? kind##_rows_avx2<B> : kind##_rows_ref<B>)
  switch (type) {
    case Q4_K: ANYSPEC_ROWS(k, BlockQ4_K)(w, K, a, bias, y, ldy, n0, n1); break;
    case Q6_K: ANYSPEC_ROWS(k, BlockQ6_K)(w, K, a, bias, y, ldy, n0, n1); break;
    case Q4_0: ANYSPEC_ROWS(s, BlockQ4_0)(w, K, a, bias, y, ldy, n0, n1); break;
    case Q4_1: ANYSPEC_ROWS(s, BlockQ4_1)(w, K, a, bias, y, ldy, n0, n1); break;
    case Q8_0: ANYSPEC_ROWS(s, BlockQ8_0)(w, K, a, bias, y, ldy, n0, n1); break;
    default: break;
  }
#undef ANYSPEC_ROWS
}

void dequant_row(int64_t type, const uint8_t* row, int64_t K, float* out) {
  if (type == F32) {
    std::memcpy(out, row, K * 4);
    return;
  }
  if (type == F16 || type == BF16) {
    const uint16_t* v = reinterpret_cast<const uint16_t*>(row);
    for (int64_t i = 0; i < K; ++i) out[i] = type == F16 ? half(v[i]) : bf16(v[i]);
    return;
  }
  const int64_t bs = block_size(type), nb = K / bs, bb = block_bytes(type);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * bb;
    float* o = out + b * bs;
    if (bs == 256) {
      KBlock kb;
      if (type == Q4_K) decode(reinterpret_cast<const BlockQ4_K*>(p), kb);
      else decode(reinterpret_cast<const BlockQ6_K*>(p), kb);
      if (type == Q4_K)
        for (int e = 0; e < 256; ++e) o[e] = kb.d * kb.sc[e / 16] * kb.q[e] - kb.k * kb.mu[e / 16];
      else
        for (int e = 0; e < 256; ++e) o[e] = kb.d * kb.sc[e / 16] * (kb.q[e] - 32);
    } else {
      SBlock sb;
      if (type == Q4_0) decode(reinterpret_cast<const BlockQ4_0*>(p), sb);
      else if (type == Q4_1) decode(reinterpret_cast<const BlockQ4_1*>(p), sb);
      else decode(reinterpret_cast<const BlockQ8_0*>(p), sb);
      const int offset = type == Q4_0 ? 8 : 0;
      for (int e = 0; e < 32; ++e) o[e] = type == Q4_1 ? sb.d * sb.q[e] + sb.m : sb.d * (sb.q[e] - offset);
    }
  }
}

}  // namespace anyspec
