// AVX-512 VNNI interleaved products (the layout and the arithmetic: x16.cpp): one group of 16 rows
// against R activation rows, vpdpbusd on 16 rows' 4 weights and 4 broadcast activations at a time.
#include "x16.h"

#if ANYSPEC_X86
#include <algorithm>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace anyspec {
namespace {

template <int R>
AVX512 void q4k_group512(const uint8_t* group, int64_t nb, const Act& a, int64_t r0, __m512* F) {
  const int64_t K = a.K;
  const __m512i low4 = _mm512_set1_epi8(15);
  for (int r = 0; r < R; ++r) F[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * GB4;
    __m512i I[R];
    for (int r = 0; r < R; ++r) I[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      fetch_part(gb + PREFETCH_BLOCKS * GB4, GB4, j, 8);
      __m512i S[R];
      for (int r = 0; r < R; ++r) S[r] = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_load_si512(gb + 320 + (4 * j + c) * 64);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = a.q.data() + (r0 + r) * K + 256 * b + 32 * j + 4 * c;
          S[r] = _mm512_dpbusd_epi32(S[r], lo, _mm512_set1_epi32(word(x)));
          S[r] = _mm512_dpbusd_epi32(S[r], hi, _mm512_set1_epi32(word(x + 16)));
        }
      }
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 64 + 16 * j)));
      for (int r = 0; r < R; ++r) I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(S[r], sc));
    }
    __m512i mn[4];
    for (int i = 0; i < 4; ++i)
      mn[i] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + 192 + 32 * i)));
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + 32)));
    for (int r = 0; r < R; ++r) {
      const int16_t* bs = a.bsum32.data() + (r0 + r) * (K / 32) + 8 * b;
      __m512i M = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i)
        M = _mm512_dpwssd_epi32(M, mn[i], _mm512_set1_epi32(word(reinterpret_cast<const int8_t*>(bs + 2 * i))));
      const __m512 dx = _mm512_set1_ps(a.d[(r0 + r) * nb + b]);
      F[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(I[r]), F[r]);
      F[r] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(M), F[r]);
    }
  }
}

// Q6_K's top 2 bits of each byte of h, at bit position SHIFT, moved to bits 4-5.
template <int SHIFT>
AVX512 inline __m512i top512(__m512i h, __m512i two) {
  return _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, SHIFT), two), 4);
}

template <int R>
AVX512 void q6k_group512(const uint8_t* group, int64_t nb, const Act& a, int64_t r0, __m512* F) {
  const int64_t K = a.K;
  const __m512i low4 = _mm512_set1_epi8(15), two = _mm512_set1_epi8(3);
  for (int r = 0; r < R; ++r) F[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * GB6;
    __m512i I[R];
    for (int r = 0; r < R; ++r) I[r] = _mm512_setzero_si512();
    for (int s = 0; s < 16; ++s) {
      fetch_part(gb + PREFETCH_BLOCKS * GB6, GB6, s, 16);
      const __m512i v0 = _mm512_load_si512(gb + QL6 + (2 * s) * 64);
      const __m512i v1 = _mm512_load_si512(gb + QL6 + (2 * s + 1) * 64);
      const __m512i h = _mm512_load_si512(gb + QH6 + s * 64);
      const __m512i w0 = _mm512_or_si512(_mm512_and_si512(v0, low4), top512<0>(h, two));
      const __m512i w1 = _mm512_or_si512(_mm512_and_si512(v1, low4), top512<2>(h, two));
      const __m512i w2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low4), top512<4>(h, two));
      const __m512i w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low4), top512<6>(h, two));
      const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + SC6 + 16 * s)));
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a.q.data() + (r0 + r) * K + 256 * b + 16 * s;
        __m512i S = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, _mm512_set1_epi32(word(x)));
        S = _mm512_dpbusd_epi32(S, w1, _mm512_set1_epi32(word(x + 4)));
        S = _mm512_dpbusd_epi32(S, w2, _mm512_set1_epi32(word(x + 8)));
        S = _mm512_dpbusd_epi32(S, w3, _mm512_set1_epi32(word(x + 12)));
        S = _mm512_sub_epi32(S, _mm512_set1_epi32(a.b16x32[(r0 + r) * (K / 16) + 16 * b + s]));
        I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(S, sc));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(a.d[(r0 + r) * nb + b]);
      F[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(I[r]), F[r]);  // no mins: adding -0 is exact
    }
  }
}

// Q8_0's weights enter vpdpbusd as unsigned w + 128; 128 times the activations' sum comes off again.
template <int R>
AVX512 void small_group512(int64_t type, const uint8_t* group, int64_t nb, const Act& a, int64_t r0, __m512* F) {
  const int64_t K = a.K, gbytes = x16_group_bytes(type), off = QS;
  const __m512i low4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int32_t offset = type == Q4_0_X16 ? 8 : type == Q8_0_X16 ? 128 : 0;
  for (int r = 0; r < R; ++r) F[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * gbytes;
    fetch_ahead(gb + 4 * PREFETCH_BLOCKS * gbytes, gbytes);
    __m512i S[R];
    for (int r = 0; r < R; ++r) S[r] = _mm512_setzero_si512();
    if (type == Q8_0_X16) {
      for (int c = 0; c < 8; ++c) {
        const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(gb + off + 64 * c), flip);
        for (int r = 0; r < R; ++r)
          S[r] = _mm512_dpbusd_epi32(S[r], v, _mm512_set1_epi32(word(a.q.data() + (r0 + r) * K + 32 * b + 4 * c)));
      }
    } else {
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(gb + off + 64 * c);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = a.q.data() + (r0 + r) * K + 32 * b + 4 * c;
          S[r] = _mm512_dpbusd_epi32(S[r], lo, _mm512_set1_epi32(word(x)));
          S[r] = _mm512_dpbusd_epi32(S[r], hi, _mm512_set1_epi32(word(x + 16)));
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    const __m512 m = type == Q4_1_X16 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + 32)))
                                      : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * nb + b;
      const __m512i I = _mm512_sub_epi32(S[r], _mm512_set1_epi32(offset * a.bsum32[i]));
      F[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a.d[i])), _mm512_cvtepi32_ps(I), F[r]);
      if (type == Q4_1_X16) F[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.sx[i]), F[r]);
    }
  }
}

template <int R>
AVX512 void group512(int64_t type, const uint8_t* group, int64_t nb, const Act& a, int64_t r0, float* out) {
  __m512 F[R];
  if (type == Q4_K_X16) q4k_group512<R>(group, nb, a, r0, F);
  else if (type == Q6_K_X16) q6k_group512<R>(group, nb, a, r0, F);
  else small_group512<R>(type, group, nb, a, r0, F);
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + 16 * r, F[r]);
}

}  // namespace

AVX512 void x16_rows_avx512(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                            int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nb = K / block_size(type), gbytes = x16_group_bytes(type);
  alignas(64) float out[8 * 16];
  for (int64_t g = n0 / 16; g * 16 < n1; ++g) {
    const uint8_t* group = w + g * nb * gbytes;
    for (int64_t r0 = 0; r0 < a.M; r0 += 8) {
      const int64_t R = std::min<int64_t>(8, a.M - r0);
      switch (R) {
        case 1: group512<1>(type, group, nb, a, r0, out); break;
        case 2: group512<2>(type, group, nb, a, r0, out); break;
        case 3: group512<3>(type, group, nb, a, r0, out); break;
        case 4: group512<4>(type, group, nb, a, r0, out); break;
        case 5: group512<5>(type, group, nb, a, r0, out); break;
        case 6: group512<6>(type, group, nb, a, r0, out); break;
        case 7: group512<7>(type, group, nb, a, r0, out); break;
        default: group512<8>(type, group, nb, a, r0, out); break;
      }
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = std::max(n0, 16 * g); n < std::min(n1, 16 * g + 16); ++n)
          y[(r0 + r) * ldy + n] = out[16 * r + n - 16 * g] + (bias ? bias[n] : 0.0f);
    }
  }
}

}  // namespace anyspec

#endif
