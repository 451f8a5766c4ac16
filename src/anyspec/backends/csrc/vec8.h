// Eight fp32 lanes: AVX2 registers where the build targets x86 with AVX2, FMA and F16C
// (-mavx2 -mfma -mf16c), else plain C++ arrays. Both compute the same bits: each lane's operation
// is one IEEE operation (a fused multiply-add rounds once, std::fma), and the horizontal sum and
// maximum combine the lanes in the order of the AVX2 shuffles. The kernel's float code is written
// once, over these.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ANYSPEC_X86 1
#include <immintrin.h>
#else
#define ANYSPEC_X86 0
#endif

namespace anyspec {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t v) { return bits_to_float(static_cast<uint32_t>(v) << 16); }

// An fp16 value as a KV cache of fp16 stores it (torch's float16); load8 and widen() widen it, exactly.
struct Half {
  uint16_t bits;
};

inline float widen(float x) { return x; }

#if ANYSPEC_X86

using F8 = __m256;

inline F8 zero8() { return _mm256_setzero_ps(); }
inline F8 set8(float x) { return _mm256_set1_ps(x); }
inline F8 load8(const float* p) { return _mm256_loadu_ps(p); }
inline F8 load8(const uint16_t* p) {  // bf16 -> fp32: widen and shift into the high half
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline F8 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline void store8(float* p, F8 v) { _mm256_storeu_ps(p, v); }
inline F8 add8(F8 a, F8 b) { return _mm256_add_ps(a, b); }
inline F8 sub8(F8 a, F8 b) { return _mm256_sub_ps(a, b); }
inline F8 mul8(F8 a, F8 b) { return _mm256_mul_ps(a, b); }
inline F8 div8(F8 a, F8 b) { return _mm256_div_ps(a, b); }
inline F8 fmadd8(F8 a, F8 b, F8 c) { return _mm256_fmadd_ps(a, b, c); }
inline F8 fnmadd8(F8 a, F8 b, F8 c) { return _mm256_fnmadd_ps(a, b, c); }
inline F8 min8(F8 a, F8 b) { return _mm256_min_ps(a, b); }
inline F8 max8(F8 a, F8 b) { return _mm256_max_ps(a, b); }
inline F8 abs8(F8 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
inline F8 round8(F8 v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline F8 exp2i8(F8 n) {  // 2^n for whole n in [-126, 127]
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

inline float hsum(F8 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// hsum of eight vectors at once, lane i holding hsum(v[i]), each the same bits: the same adds in
// the same tree, the lanes of several vectors side by side (IEEE addition is commutative).
inline F8 hsum8(const F8* v) {
  auto halves = [](F8 a, F8 b) {  // [lo a + hi a | lo b + hi b]
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  };
  auto pairs = [](F8 a, F8 b) {  // lanes 0, 1 + lanes 2, 3 of each 4 of a, then of b
    return _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  const F8 even = pairs(halves(v[0], v[4]), halves(v[1], v[5]));  // halfway sums of v[0], v[1] | v[4], v[5]
  const F8 odd = pairs(halves(v[2], v[6]), halves(v[3], v[7]));
  return _mm256_add_ps(_mm256_shuffle_ps(even, odd, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(even, odd, _MM_SHUFFLE(3, 1, 3, 1)));
}

inline float hmax(F8 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float half(uint16_t h) { return _cvtsh_ss(h); }  // fp16 -> fp32, exact
inline float widen(Half h) { return half(h.bits); }
inline F8 load8(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline Half to_half(float x) {  // fp32 -> fp16, rounded to nearest, ties to even
  return {static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))};
}

inline void prefetch_l1(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
inline void prefetch_l2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

#else

struct F8 {
  float v[8];
};

template <typename Op>
inline F8 lanes(Op op) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = op(i);
  return r;
}

inline F8 zero8() { return lanes([](int) { return 0.0f; }); }
inline F8 set8(float x) { return lanes([x](int) { return x; }); }
inline F8 load8(const float* p) { return lanes([p](int i) { return p[i]; }); }
inline F8 load8(const uint16_t* p) { return lanes([p](int i) { return bf16_to_float(p[i]); }); }
inline F8 load8(const int8_t* p) { return lanes([p](int i) { return static_cast<float>(p[i]); }); }
inline void store8(float* p, F8 v) { std::memcpy(p, v.v, sizeof v.v); }
inline F8 add8(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] + b.v[i]; }); }
inline F8 sub8(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] - b.v[i]; }); }
inline F8 mul8(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] * b.v[i]; }); }
inline F8 div8(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] / b.v[i]; }); }
inline F8 fmadd8(F8 a, F8 b, F8 c) { return lanes([&](int i) { return std::fma(a.v[i], b.v[i], c.v[i]); }); }
inline F8 fnmadd8(F8 a, F8 b, F8 c) { return lanes([&](int i) { return std::fma(-a.v[i], b.v[i], c.v[i]); }); }
// As minps and maxps: the second operand where the comparison fails (a NaN in either)
inline F8 min8(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
inline F8 max8(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
inline F8 abs8(F8 v) { return lanes([&](int i) { return std::fabs(v.v[i]); }); }
inline F8 round8(F8 v) { return lanes([&](int i) { return std::nearbyint(v.v[i]); }); }
inline F8 exp2i8(F8 n) {
  return lanes([&](int i) { return bits_to_float(static_cast<uint32_t>(static_cast<int32_t>(n.v[i]) + 127) << 23); });
}

inline float hsum(F8 x) {
  const float* v = x.v;
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

inline F8 hsum8(const F8* v) {
  return lanes([v](int i) { return hsum(v[i]); });
}

inline float hmax(F8 x) {
  auto mx = [](float a, float b) { return a > b ? a : b; };
  const float* v = x.v;
  return mx(mx(mx(v[0], v[4]), mx(v[2], v[6])), mx(mx(v[1], v[5]), mx(v[3], v[7])));
}

// fp16 -> fp32, exact; a NaN keeps its payload and becomes quiet, as F16C's conversion does
inline float half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
  if (e == 31) return bits_to_float(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e) return bits_to_float(sign | ((e + 112) << 23) | (m << 13));
  const float tiny = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
  return sign ? -tiny : tiny;
}

inline float widen(Half h) { return half(h.bits); }
inline F8 load8(const Half* p) { return lanes([p](int i) { return half(p[i].bits); }); }

// fp32 -> fp16 rounded to nearest, ties to even, as F16C's conversion: overflow to infinity, a NaN
// quiet with the top of its payload.
inline Half to_half(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  if (a >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // 65520 and up
  if (a < 0x38800000u)  // below 2^-14: a multiple of 2^-24 (the scaling is exact), 1024 the least normal
    return {static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(bits_to_float(a) * 16777216.0f)))};
  uint32_t h = (a - 0x38000000u) >> 13;
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return {static_cast<uint16_t>(sign | h)};
}

inline void prefetch_l1(const void* p) { __builtin_prefetch(p, 0, 3); }
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

#endif

}  // namespace anyspec
