// AVX2 interleaved products (the layout and the arithmetic: x16.cpp): the group blocks as two halves
// of 8 rows; maddubs + madd stand in for vpdpbusd.
#include "x16.h"

#if ANYSPEC_X86
#include <algorithm>

namespace anyspec {
namespace {

// The most activation rows one pass over a group's blocks takes: the K-quants' pair sums of 6 rows
// fit the 16 registers, the 32-weight blocks' of 4.
constexpr int GROUP_ROWS = 6, SMALL_ROWS = 4;

// The int16 pair sums of 4 weights by 4 broadcast activations, added to acc in int16. Exact while
// no lane passes 32767: 8 of them for 4-bit weights (8 * 2 * 15 * 127), 2 for 6-bit ones.
inline __m256i pairs4(__m256i acc, __m256i w, __m256i x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)); }
inline __m256i pairs4(__m256i acc, __m256i w, int32_t x) { return pairs4(acc, w, _mm256_set1_epi32(x)); }

inline __m256i widen(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }

// Half h (rows 8h..8h+7) of 64 bytes of a group block, and 8 bytes into the low lane.
inline __m256i half(const uint8_t* p, int h) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h)); }
inline __m128i bytes8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }

// Block b of a Q6_K group: each half's scaled sums, rows 8h..8h+7 for h = h0 .. h0 + H - 1, into I.
template <int R, int H>
void q6k_block(const uint8_t* gb, const Act& a, int64_t r0, int h0, int64_t b, __m256i (&I)[H][R]) {
  const int64_t K = a.K;
  const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
  for (int s = 0; s < 16; ++s)
    for (int u = 0; u < H; ++u) {
      const int h = h0 + u;
      const __m256i v0 = half(gb + QL6 + (2 * s) * 64, h), v1 = half(gb + QL6 + (2 * s + 1) * 64, h);
      const __m256i hb = half(gb + QH6 + s * 64, h);
      auto top = [&](int shift) {
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, shift), two), 4);
      };
      const __m256i w0 = _mm256_or_si256(_mm256_and_si256(v0, low4), top(0));
      const __m256i w1 = _mm256_or_si256(_mm256_and_si256(v1, low4), top(2));
      const __m256i w2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low4), top(4));
      const __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low4), top(6));
      const __m256i sc = _mm256_cvtepi8_epi32(bytes8(gb + SC6 + 16 * s + 8 * h));
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a.q.data() + (r0 + r) * K + 256 * b + 16 * s;
        const __m256i zero = _mm256_setzero_si256();  // 6-bit weights: two pair sums per int16
        __m256i S = _mm256_add_epi32(widen(pairs4(pairs4(zero, w0, word(x)), w1, word(x + 4))),
                                     widen(pairs4(pairs4(zero, w2, word(x + 8)), w3, word(x + 12))));
        S = _mm256_sub_epi32(S, _mm256_set1_epi32(a.b16x32[(r0 + r) * (K / 16) + 16 * b + s]));
        I[u][r] = _mm256_add_epi32(I[u][r], _mm256_mullo_epi32(S, sc));
      }
    }
}

// Rows 8h..8h+7 of a group against R (at most GROUP_ROWS) activation rows. H = 2: both halves in one
// pass (rows 8..15 in F[R + r]), each weight line read once and each broadcast used twice, for
// R * H at most GROUP_ROWS; each output row's arithmetic is the same, in the same order.
template <int R, int H = 1>
void group_avx2(int64_t type, const uint8_t* group, int64_t nb, const Act& a, int64_t r0, int h0, __m256* F) {
  const int64_t K = a.K;
  const __m256i low4 = _mm256_set1_epi8(15);
  const int64_t gbytes = x16_group_bytes(type);
  for (int r = 0; r < H * R; ++r) F[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * gbytes;
    if (h0 == 0) fetch_ahead(gb + PREFETCH_BLOCKS * gbytes, gbytes);  // a second pass reads them from L2
    __m256i I[H][R], M[H][R];
    for (int u = 0; u < H; ++u)
      for (int r = 0; r < R; ++r) I[u][r] = M[u][r] = _mm256_setzero_si256();
    if (type == Q4_K_X16) {
      for (int j = 0; j < 8; ++j) {
        __m256i S[H][R];  // int16 pair sums of the sub-block's 32 weights: at most 8 * 2 * 15 * 127
        for (int u = 0; u < H; ++u)
          for (int r = 0; r < R; ++r) S[u][r] = _mm256_setzero_si256();
        auto chunk = [&](int c) {
          __m256i lo[H], hi[H];
          for (int u = 0; u < H; ++u) {
            const __m256i v = half(gb + 320 + (4 * j + c) * 64, h0 + u);
            lo[u] = _mm256_and_si256(v, low4), hi[u] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          }
          for (int r = 0; r < R; ++r) {
            const int8_t* x = a.q.data() + (r0 + r) * K + 256 * b + 32 * j + 4 * c;
            const __m256i xl = _mm256_set1_epi32(word(x)), xh = _mm256_set1_epi32(word(x + 16));
            for (int u = 0; u < H; ++u) S[u][r] = pairs4(pairs4(S[u][r], lo[u], xl), hi[u], xh);
          }
        };
        if constexpr (H * R <= 3) {
          for (int c = 0; c < 4; ++c) chunk(c);
        } else {  // unrolled over c, the compiler reorders 4 or more sums into trees and spills them
#pragma GCC unroll 1
          for (int c = 0; c < 4; ++c) chunk(c);
        }
        for (int u = 0; u < H; ++u) {
          const __m256i sc = _mm256_cvtepu8_epi32(bytes8(gb + 64 + 16 * j + 8 * (h0 + u)));
          for (int r = 0; r < R; ++r) I[u][r] = _mm256_add_epi32(I[u][r], _mm256_mullo_epi32(widen(S[u][r]), sc));
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int u = 0; u < H; ++u) {
          const __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 192 + 32 * i + 16 * (h0 + u))));
          for (int r = 0; r < R; ++r) {
            const int16_t* bs = a.bsum32.data() + (r0 + r) * (K / 32) + 8 * b;
            M[u][r] = _mm256_add_epi32(M[u][r], _mm256_madd_epi16(mn, _mm256_set1_epi32(word(reinterpret_cast<const int8_t*>(bs + 2 * i)))));
          }
        }
    } else {
      q6k_block<R, H>(gb, a, r0, h0, b, I);
    }
    for (int u = 0; u < H; ++u) {
      const int h = h0 + u;
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16 * h)));
      const __m256 dmin = type == Q4_K_X16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 32 + 16 * h)))
                                           : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r) {
        const __m256 dx = _mm256_set1_ps(a.d[(r0 + r) * nb + b]);
        __m256& acc = F[u * R + r];
        acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(I[u][r]), acc);
        acc = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(M[u][r]), acc);
      }
    }
  }
}

// Rows 8h..8h+7 of a 32-weight group against R (at most SMALL_ROWS) activation rows; Q8_0 through |w| and sign.
// H = 2: both halves in one pass over the group's blocks (F[R] then rows 8..15 in F[R + r]), for at
// most 2 activation rows; each output row's arithmetic is the same, in the same order.
template <int R, int H = 1>
void small_avx2(int64_t type, const uint8_t* group, int64_t nb, const Act& a, int64_t r0, int h0, __m256* F) {
  const int64_t K = a.K, gbytes = x16_group_bytes(type), off = type == S8_X16 ? QS8 : QS;
  const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const int32_t offset = type == Q4_0_X16 ? 8 : 0;
  for (int r = 0; r < H * R; ++r) F[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * gbytes;
    if (h0 == 0) fetch_ahead(gb + 4 * PREFETCH_BLOCKS * gbytes, gbytes);
    for (int u = 0; u < H; ++u) {
      const int h = h0 + u;
      __m256i S[R];
      for (int r = 0; r < R; ++r) S[r] = _mm256_setzero_si256();
      if (type == Q8_0_X16 || type == S8_X16) {  // no weight is -128, so |w| and the sign are exact
        for (int c = 0; c < 8; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + off + 64 * c + 32 * h));
          const __m256i mag = _mm256_sign_epi8(v, v);
          for (int r = 0; r < R; ++r) {
            const __m256i x = _mm256_set1_epi32(word(a.q.data() + (r0 + r) * K + 32 * b + 4 * c));
            S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(x, v)), ones));
          }
        }
      } else {
        __m256i P[R];  // int16 pair sums of the block's 32 4-bit weights
        for (int r = 0; r < R; ++r) P[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + off + 64 * c + 32 * h));
          const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          for (int r = 0; r < R; ++r) {
            const int8_t* x = a.q.data() + (r0 + r) * K + 32 * b + 4 * c;
            P[r] = pairs4(pairs4(P[r], lo, word(x)), hi, word(x + 16));
          }
        }
        for (int r = 0; r < R; ++r) S[r] = widen(P[r]);
      }
      const float* d32 = reinterpret_cast<const float*>(gb);
      const __m256 d = type == S8_X16 ? _mm256_loadu_ps(d32 + 8 * h)
                                      : _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16 * h)));
      const __m256 m = type == S8_X16    ? _mm256_loadu_ps(d32 + 16 + 8 * h)
                       : type == Q4_1_X16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 32 + 16 * h)))
                                          : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r) {
        const int64_t i = (r0 + r) * nb + b;
        __m256& acc = F[u * R + r];
        const __m256i I = _mm256_sub_epi32(S[r], _mm256_set1_epi32(offset * a.bsum32[i]));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a.d[i])), _mm256_cvtepi32_ps(I), acc);
        if (with_m(type)) acc = _mm256_fmadd_ps(m, _mm256_set1_ps(a.sx[i]), acc);
      }
    }
  }
}

template <int R>
void any_avx2(int64_t type, const uint8_t* group, int64_t nb, const Act& a, int64_t r0, int h, __m256* F) {
  if constexpr (R <= SMALL_ROWS) {
    if (small(type)) return small_avx2<R>(type, group, nb, a, r0, h, F);
  }
  group_avx2<R>(type, group, nb, a, r0, h, F);
}

}  // namespace

void x16_rows_avx2(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                   int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nb = K / block_size(type), gbytes = x16_group_bytes(type);
  alignas(32) float out[GROUP_ROWS * 8];
  __m256 F[GROUP_ROWS];
  auto put = [&](int64_t first, int64_t r0, int64_t R, const __m256* acc) {
    for (int64_t r = 0; r < R; ++r) _mm256_storeu_ps(out + 8 * r, acc[r]);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = std::max(n0, first); n < std::min(n1, first + 8); ++n)
        y[(r0 + r) * ldy + n] = out[8 * r + n - first] + (bias ? bias[n] : 0.0f);
  };
  for (int64_t g = n0 / 16; g * 16 < n1; ++g) {
    const uint8_t* group = w + g * nb * gbytes;
    if (a.M <= (small(type) ? 2 : 3) && 16 * g + 8 < n1) {  // both halves in one pass over the blocks
      if (small(type) && a.M == 1) small_avx2<1, 2>(type, group, nb, a, 0, 0, F);
      else if (small(type)) small_avx2<2, 2>(type, group, nb, a, 0, 0, F);
      else if (a.M == 1) group_avx2<1, 2>(type, group, nb, a, 0, 0, F);
      else if (a.M == 2) group_avx2<2, 2>(type, group, nb, a, 0, 0, F);
      else group_avx2<3, 2>(type, group, nb, a, 0, 0, F);
      put(16 * g, 0, a.M, F);
      put(16 * g + 8, 0, a.M, F + a.M);
      continue;
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t first = 16 * g + 8 * h;
      if (first >= n1) break;
      const int64_t most = small(type) ? SMALL_ROWS : GROUP_ROWS, passes = (a.M + most - 1) / most;
      for (int64_t r0 = 0, p = 0; p < passes; ++p) {
        const int64_t R = (a.M - r0 + passes - p - 1) / (passes - p);  // as even as the passes allow
        switch (R) {
          case 1: any_avx2<1>(type, group, nb, a, r0, h, F); break;
          case 2: any_avx2<2>(type, group, nb, a, r0, h, F); break;
          case 3: any_avx2<3>(type, group, nb, a, r0, h, F); break;
          case 4: any_avx2<4>(type, group, nb, a, r0, h, F); break;
          case 5: any_avx2<5>(type, group, nb, a, r0, h, F); break;
          default: any_avx2<6>(type, group, nb, a, r0, h, F); break;
        }
        put(first, r0, R, F);
        r0 += R;
      }
    }
  }
}

}  // namespace anyspec

#endif
