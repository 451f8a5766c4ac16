// Products over GGUF blocks interleaved 16 rows at a time.
//
// repack_x16 regroups a matrix's blocks without changing a single value: for each group of 16
// rows (the last padded with zero blocks) and each block, one "group block" holds the 16 rows'
// fp16 scales, their sub-block scales and mins, and their weights arranged so that 4 bytes of one
// SIMD lane are 4 consecutive weights of one row:
//
//   Q4_0, 320 bytes: d[16] fp16 | 32 unused | qs[4][16][4]; low nibble = weight 4c + i, high = 16 + 4c + i
//   Q4_1, 320 bytes: d[16] fp16 | m[16] fp16 | qs[4][16][4] as Q4_0
//   Q8_0, 576 bytes: d[16] fp16 | 32 unused | qs[8][16][4] (int8 weight 4c + i)
//   Q4_K, 2368 bytes: d[16] fp16 | dmin[16] fp16 | sc[8][16] | mn pairs[4][16][2] | qs[8][4][16][4]
//         qs[j][c][n][i]: low nibble = weight 32j + 4c + i of row n, high nibble = weight 32j + 16 + 4c + i
//   S8,   640 bytes: d[16] fp32 | m[16] fp32 | qs[8][16][4] (int8 weight 4c + i); w = d * q + m
//   Q6_K, 3392 bytes: d[16] fp16 | 32 unused | sc[16][16] int8 | ql[16][2][16][4] | qh[16][16][4]
//         ql[s][c][n][i]: low nibble = low 4 bits of weight 16s + 4c + i, high nibble = of 16s + 8 + 4c + i;
//         qh[s][n][i]: bits 2t..2t+1 = the top 2 bits of weight 16s + 4t + i
//
// Output (n, r) is then, for each block b in order (the same operations at every instruction-set
// level, for any number of rows):
//   I = sum over sub-blocks of scale * (integer dot of weights and int8 activations)   (exact)
//       (Q6_K: the dot minus 32 * the activations' sum, for its offset of 32)
//   M = sum over sub-blocks of min * (sum of the activations)                           (exact, Q4_K)
//   acc = fma(d * dx, float(I), acc);  acc = fma(-(dmin * dx), float(M), acc)
// 32-weight blocks: I = the integer dot minus 8 (Q4_0) or 0 (Q4_1, Q8_0, S8) times the activations' sum;
//   acc = fma(d * dx, float(I), acc), then for Q4_1 and S8 acc = fma(m, dx * sum, acc).
// S8 has no AVX-512 code of its own: its products take the AVX2 path there too.
// and y = acc + bias. With the lanes being rows, vpdpbusd multiplies 16 rows' 4 weights by 4
// broadcast activations at a time, and no lane ever needs summing with another.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant.h"

namespace anyspec {
namespace {

// Every section starts on a 64-byte line, so no vector load straddles two lines.
constexpr int64_t GB4 = 2368, GB6 = 3392, GB40 = 320, GB41 = 320, GB80 = 576, GB8S = 640;
constexpr int64_t SC6 = 64, QL6 = 320, QH6 = 2368;
constexpr int64_t PREFETCH_BLOCKS = 4;  // how far ahead the weight stream is fetched, in group blocks

// Every line of the group block at p into L2: the weights stream from memory while the products run.
inline void fetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T1);
}

// Part i of `parts` of those lines: a large block's fetches spread over its sub-blocks keep a steady
// number of lines in flight, which lets the memory stream overlap the products of several rows.
inline void fetch_part(const uint8_t* p, int64_t bytes, int64_t i, int64_t parts) {
  const int64_t lines = (bytes + 63) / 64, from = lines * i / parts, to = lines * (i + 1) / parts;
  for (int64_t l = from; l < to; ++l) _mm_prefetch(reinterpret_cast<const char*>(p + 64 * l), _MM_HINT_T1);
}

bool small(int64_t type) { return type == Q4_0_X16 || type == Q4_1_X16 || type == Q8_0_X16 || type == S8_X16; }
constexpr int64_t QS = 64;  // where a 32-weight group block's weights start (S8: QS8)
constexpr int64_t QS8 = 128;
inline bool with_m(int64_t type) { return type == Q4_1_X16 || type == S8_X16; }
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

inline int32_t word(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- the plain C++ reference: read row n of a group block back, then the canonical sums ----

struct RowBlock {
  uint8_t q[256];
  int32_t sc[16], mn[8];  // Q4_K: sc[j] for j < 8 (per 32 weights); Q6_K: sc[s] per 16 weights
  float d, dmin;
};

void read_row(int64_t type, const uint8_t* gb, int n, RowBlock& o) {
  uint16_t d;
  std::memcpy(&d, gb + 2 * n, 2);
  o.d = half(d);
  if (type == Q4_K_X16) {
    uint16_t dm;
    std::memcpy(&dm, gb + 32 + 2 * n, 2);
    o.dmin = half(dm);
    for (int j = 0; j < 8; ++j) o.sc[j] = gb[64 + 16 * j + n];
    for (int i = 0; i < 4; ++i)
      for (int t = 0; t < 2; ++t) o.mn[2 * i + t] = gb[192 + 32 * i + 2 * n + t];
    const uint8_t* qs = gb + 320;
    for (int j = 0; j < 8; ++j)
      for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 4; ++i) {
          const uint8_t byte = qs[((4 * j + c) * 16 + n) * 4 + i];
          o.q[32 * j + 4 * c + i] = byte & 15;
          o.q[32 * j + 16 + 4 * c + i] = byte >> 4;
        }
    return;
  }
  o.dmin = 0;
  for (int s = 0; s < 16; ++s) o.sc[s] = static_cast<int8_t>(gb[SC6 + 16 * s + n]);
  const uint8_t* ql = gb + QL6;
  const uint8_t* qh = gb + QH6;
  for (int s = 0; s < 16; ++s)
    for (int i = 0; i < 4; ++i) {
      const uint8_t h = qh[(16 * s + n) * 4 + i];
      for (int c = 0; c < 2; ++c) {
        const uint8_t l = ql[((2 * s + c) * 16 + n) * 4 + i];
        o.q[16 * s + 4 * c + i] = (l & 15) | (((h >> (2 * c)) & 3) << 4);
        o.q[16 * s + 8 + 4 * c + i] = (l >> 4) | (((h >> (2 * c + 4)) & 3) << 4);
      }
    }
}

// Row n of a 32-weight group block: weights (Q4 unsigned, Q8_0 signed), d and Q4_1's m.
void read_small(int64_t type, const uint8_t* gb, int n, int32_t* q, float& d, float& m) {
  uint16_t h;
  m = 0;
  if (type == S8_X16) {  // fp32 d and m
    std::memcpy(&d, gb + 4 * n, 4);
    std::memcpy(&m, gb + 64 + 4 * n, 4);
  } else {
    std::memcpy(&h, gb + 2 * n, 2);
    d = half(h);
  }
  if (type == Q4_1_X16) {
    std::memcpy(&h, gb + 32 + 2 * n, 2);
    m = half(h);
  }
  const bool wide = type == Q8_0_X16 || type == S8_X16;
  const uint8_t* qs = gb + (type == S8_X16 ? QS8 : QS);
  for (int c = 0; c < (wide ? 8 : 4); ++c)
    for (int i = 0; i < 4; ++i) {
      const uint8_t byte = qs[(16 * c + n) * 4 + i];
      if (wide) {
        q[4 * c + i] = static_cast<int8_t>(byte);
      } else {
        q[4 * c + i] = byte & 15;
        q[16 + 4 * c + i] = byte >> 4;
      }
    }
}

void small_rows_ref(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                    int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nb = K / 32, gbytes = x16_group_bytes(type);
  int32_t q[32];
  float d, m;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t r = 0; r < a.M; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        read_small(type, w + ((n / 16) * nb + b) * gbytes, static_cast<int>(n % 16), q, d, m);
        const int8_t* x = a.q.data() + r * K + 32 * b;
        int32_t I = 0;
        for (int i = 0; i < 32; ++i) I += q[i] * x[i];
        I -= (type == Q4_0_X16 ? 8 : 0) * a.bsum32[r * nb + b];
        acc = std::fma(d * a.d[r * nb + b], static_cast<float>(I), acc);
        if (with_m(type)) acc = std::fma(m, a.sx[r * nb + b], acc);
      }
      y[r * ldy + n] = acc + (bias ? bias[n] : 0.0f);
    }
}

void x16_rows_ref(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                  int64_t ldy, int64_t n0, int64_t n1) {
  if (small(type)) return small_rows_ref(type, w, K, a, bias, y, ldy, n0, n1);
  const int64_t nb = K / 256, gbytes = x16_group_bytes(type);
  RowBlock o;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* group = w + (n / 16) * nb * gbytes;
    for (int64_t r = 0; r < a.M; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        read_row(type, group + b * gbytes, static_cast<int>(n % 16), o);
        const int8_t* x = a.q.data() + r * K + 256 * b;
        int32_t I = 0, M = 0;
        if (type == Q4_K_X16) {
          for (int j = 0; j < 8; ++j) {
            int32_t dot = 0;
            for (int i = 32 * j; i < 32 * j + 32; ++i) dot += o.q[i] * x[i];
            I += o.sc[j] * dot;
            M += o.mn[j] * a.bsum32[r * (K / 32) + 8 * b + j];
          }
        } else {
          for (int s = 0; s < 16; ++s) {
            int32_t dot = 0;
            for (int i = 16 * s; i < 16 * s + 16; ++i) dot += o.q[i] * x[i];
            I += o.sc[s] * (dot - a.b16x32[r * (K / 16) + 16 * b + s]);
          }
        }
        const float dx = a.d[r * nb + b];
        acc = std::fma(o.d * dx, static_cast<float>(I), acc);
        acc = std::fma(-(o.dmin * dx), static_cast<float>(M), acc);
      }
      y[r * ldy + n] = acc + (bias ? bias[n] : 0.0f);
    }
  }
}

// ---- AVX-512 VNNI: one group of 16 rows against R activation rows ----

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

// ---- AVX2: the same group blocks as two halves of 8 rows; maddubs + madd stand in for vpdpbusd ----

// The int16 pair sums of 4 weights by 4 broadcast activations, added to acc in int16. Exact while
// no lane passes 32767: 8 of them for 4-bit weights (8 * 2 * 15 * 127), 2 for 6-bit ones.
inline __m256i pairs4(__m256i acc, __m256i w, int32_t x) {
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, _mm256_set1_epi32(x)));
}

inline __m256i widen(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }

// Rows 8h..8h+7 of a group against R (at most 4) activation rows.
template <int R>
void group_avx2(int64_t type, const uint8_t* group, int64_t nb, const Act& a, int64_t r0, int h, __m256* F) {
  const int64_t K = a.K;
  const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
  const int64_t gbytes = x16_group_bytes(type);
  for (int r = 0; r < R; ++r) F[r] = _mm256_setzero_ps();
  auto load = [&](const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h)); };
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * gbytes;
    if (h == 0) fetch_ahead(gb + PREFETCH_BLOCKS * gbytes, gbytes);  // the second half reads them from L2
    __m256i I[R], M[R];
    for (int r = 0; r < R; ++r) I[r] = M[r] = _mm256_setzero_si256();
    if (type == Q4_K_X16) {
      for (int j = 0; j < 8; ++j) {
        __m256i S[R];  // int16 pair sums of the sub-block's 32 weights: at most 8 * 2 * 15 * 127
        for (int r = 0; r < R; ++r) S[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          const __m256i v = load(gb + 320 + (4 * j + c) * 64);
          const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          for (int r = 0; r < R; ++r) {
            const int8_t* x = a.q.data() + (r0 + r) * K + 256 * b + 32 * j + 4 * c;
            S[r] = pairs4(pairs4(S[r], lo, word(x)), hi, word(x + 16));
          }
        }
        const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + 64 + 16 * j + 8 * h)));
        for (int r = 0; r < R; ++r) I[r] = _mm256_add_epi32(I[r], _mm256_mullo_epi32(widen(S[r]), sc));
      }
      for (int i = 0; i < 4; ++i) {
        const __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 192 + 32 * i + 16 * h)));
        for (int r = 0; r < R; ++r) {
          const int16_t* bs = a.bsum32.data() + (r0 + r) * (K / 32) + 8 * b;
          M[r] = _mm256_add_epi32(M[r], _mm256_madd_epi16(mn, _mm256_set1_epi32(word(reinterpret_cast<const int8_t*>(bs + 2 * i)))));
        }
      }
    } else {
      for (int s = 0; s < 16; ++s) {
        const __m256i v0 = load(gb + QL6 + (2 * s) * 64), v1 = load(gb + QL6 + (2 * s + 1) * 64);
        const __m256i hb = load(gb + QH6 + s * 64);
        auto top = [&](int shift) {
          return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, shift), two), 4);
        };
        const __m256i w0 = _mm256_or_si256(_mm256_and_si256(v0, low4), top(0));
        const __m256i w1 = _mm256_or_si256(_mm256_and_si256(v1, low4), top(2));
        const __m256i w2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low4), top(4));
        const __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low4), top(6));
        const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + SC6 + 16 * s + 8 * h)));
        for (int r = 0; r < R; ++r) {
          const int8_t* x = a.q.data() + (r0 + r) * K + 256 * b + 16 * s;
          const __m256i zero = _mm256_setzero_si256();  // 6-bit weights: two pair sums per int16
          __m256i S = _mm256_add_epi32(widen(pairs4(pairs4(zero, w0, word(x)), w1, word(x + 4))),
                                       widen(pairs4(pairs4(zero, w2, word(x + 8)), w3, word(x + 12))));
          S = _mm256_sub_epi32(S, _mm256_set1_epi32(a.b16x32[(r0 + r) * (K / 16) + 16 * b + s]));
          I[r] = _mm256_add_epi32(I[r], _mm256_mullo_epi32(S, sc));
        }
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16 * h)));
    const __m256 dmin = type == Q4_K_X16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 32 + 16 * h)))
                                         : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m256 dx = _mm256_set1_ps(a.d[(r0 + r) * nb + b]);
      F[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(I[r]), F[r]);
      F[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(M[r]), F[r]);
    }
  }
}

// Rows 8h..8h+7 of a 32-weight group against R (at most 4) activation rows; Q8_0 through |w| and sign.
template <int R>
void small_avx2(int64_t type, const uint8_t* group, int64_t nb, const Act& a, int64_t r0, int h, __m256* F) {
  const int64_t K = a.K, gbytes = x16_group_bytes(type), off = type == S8_X16 ? QS8 : QS;
  const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const int32_t offset = type == Q4_0_X16 ? 8 : 0;
  for (int r = 0; r < R; ++r) F[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * gbytes;
    if (h == 0) fetch_ahead(gb + 4 * PREFETCH_BLOCKS * gbytes, gbytes);
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
      const __m256i I = _mm256_sub_epi32(S[r], _mm256_set1_epi32(offset * a.bsum32[i]));
      F[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a.d[i])), _mm256_cvtepi32_ps(I), F[r]);
      if (with_m(type)) F[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.sx[i]), F[r]);
    }
  }
}

template <int R>
void any_avx2(int64_t type, const uint8_t* group, int64_t nb, const Act& a, int64_t r0, int h, __m256* F) {
  if (small(type)) small_avx2<R>(type, group, nb, a, r0, h, F);
  else group_avx2<R>(type, group, nb, a, r0, h, F);
}

void x16_rows_avx2(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                   int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nb = K / block_size(type), gbytes = x16_group_bytes(type);
  alignas(32) float out[4 * 8];
  __m256 F[4];
  for (int64_t g = n0 / 16; g * 16 < n1; ++g) {
    const uint8_t* group = w + g * nb * gbytes;
    for (int h = 0; h < 2; ++h) {
      const int64_t first = 16 * g + 8 * h;
      if (first >= n1) break;
      for (int64_t r0 = 0; r0 < a.M; r0 += 4) {
        const int64_t R = std::min<int64_t>(4, a.M - r0);
        switch (R) {
          case 1: any_avx2<1>(type, group, nb, a, r0, h, F); break;
          case 2: any_avx2<2>(type, group, nb, a, r0, h, F); break;
          case 3: any_avx2<3>(type, group, nb, a, r0, h, F); break;
          default: any_avx2<4>(type, group, nb, a, r0, h, F); break;
        }
        for (int64_t r = 0; r < R; ++r) _mm256_storeu_ps(out + 8 * r, F[r]);
        for (int64_t r = 0; r < R; ++r)
          for (int64_t n = std::max(n0, first); n < std::min(n1, first + 8); ++n)
            y[(r0 + r) * ldy + n] = out[8 * r + n - first] + (bias ? bias[n] : 0.0f);
      }
    }
  }
}

}  // namespace

int64_t x16_type(int64_t type) {
  switch (type) {
    case Q4_K: return Q4_K_X16;
    case Q6_K: return Q6_K_X16;
    case Q4_0: return Q4_0_X16;
    case Q4_1: return Q4_1_X16;
    case Q8_0: case Q5_0: case IQ4_NL: return Q8_0_X16;
    case Q3_K: return Q6_K_X16;
    case Q5_1: case Q5_K: case IQ4_XS: return S8_X16;
    default: return 0;
  }
}

int64_t x16_group_bytes(int64_t type) {
  switch (type) {
    case Q4_K_X16: return GB4;
    case Q6_K_X16: return GB6;
    case Q4_0_X16: return GB40;
    case Q4_1_X16: return GB41;
    case Q8_0_X16: return GB80;
    case S8_X16: return GB8S;
    default: return 0;
  }
}

namespace {

// One 32-weight block of row r into its group block.
void repack_small(int64_t type, const uint8_t* src, uint8_t* gb, int r) {
  std::memcpy(gb + 2 * r, src, 2);  // d is the first field of all three
  if (type == Q4_1) std::memcpy(gb + 32 + 2 * r, src + 2, 2);
  uint8_t* qs = gb + QS;
  if (type == Q8_0) {
    for (int c = 0; c < 8; ++c) std::memcpy(qs + (16 * c + r) * 4, src + 2 + 4 * c, 4);
    return;
  }
  const uint8_t* nibbles = src + (type == Q4_1 ? 4 : 2);  // byte i: weight i (low), weight 16 + i (high)
  for (int c = 0; c < 4; ++c) std::memcpy(qs + (16 * c + r) * 4, nibbles + 4 * c, 4);
}

// Q6_K_X16's weights of row r (q: 256 values 0..63) into its group block.
void write_q6(uint8_t* gb, int r, const uint8_t* q) {
  for (int s = 0; s < 16; ++s)
    for (int i = 0; i < 4; ++i) {
      uint8_t h = 0;
      for (int t = 0; t < 4; ++t) h |= (q[16 * s + 4 * t + i] >> 4) << (2 * t);
      gb[QH6 + (16 * s + r) * 4 + i] = h;
      for (int c = 0; c < 2; ++c)
        gb[QL6 + ((2 * s + c) * 16 + r) * 4 + i] = (q[16 * s + 4 * c + i] & 15) | ((q[16 * s + 8 + 4 * c + i] & 15) << 4);
    }
}

// Block b of row r of a type kept in another type's layout (x16_type): its integer weights, unchanged,
// with its scales; `group` is the start of the row's group of 16.
void repack_other(int64_t type, const uint8_t* blk, uint8_t* group, int64_t b, int r) {
  Unpacked u;
  unpack(type, blk, u);
  const int64_t target = x16_type(type), gbytes = x16_group_bytes(target);
  if (target == Q8_0_X16) {  // Q5_0, IQ4_NL: the fp16 d is their first field
    uint8_t* gb = group + b * gbytes;
    std::memcpy(gb + 2 * r, blk, 2);
    for (int e = 0; e < 32; ++e) gb[QS + (16 * (e / 4) + r) * 4 + e % 4] = static_cast<uint8_t>(static_cast<int8_t>(u.q[e]));
  } else if (target == S8_X16) {
    const int64_t parts = block_size(type) / 32;
    for (int64_t j = 0; j < parts; ++j) {
      uint8_t* gb = group + (b * parts + j) * gbytes;
      std::memcpy(gb + 4 * r, &u.d[32 * j / u.g], 4);
      std::memcpy(gb + 64 + 4 * r, &u.m[32 * j / u.g], 4);
      for (int e = 0; e < 32; ++e)
        gb[QS8 + (16 * (e / 4) + r) * 4 + e % 4] = static_cast<uint8_t>(static_cast<int8_t>(u.q[32 * j + e]));
    }
  } else {  // Q3_K: weights -4..3 as 28..35, scales -32..31 as Q6_K's int8 ones
    uint8_t* gb = group + b * gbytes;
    std::memcpy(gb + 2 * r, &u.dh, 2);
    uint8_t q[256];
    for (int s = 0; s < 16; ++s) gb[SC6 + 16 * s + r] = static_cast<uint8_t>(static_cast<int8_t>(u.sc[s]));
    for (int e = 0; e < 256; ++e) q[e] = static_cast<uint8_t>(u.q[e] + 32);
    write_q6(gb, r, q);
  }
}

}  // namespace

void repack_x16(int64_t type, const uint8_t* src, int64_t N, int64_t K, uint8_t* dst) {
  const int64_t target = x16_type(type), nb = K / block_size(type), groups = (N + 15) / 16;
  const int64_t gbytes = x16_group_bytes(target), group_bytes = (K / block_size(target)) * gbytes;
  std::memset(dst, 0, groups * group_bytes);
  const bool own = type == Q4_0 || type == Q4_1 || type == Q8_0 || type == Q4_K || type == Q6_K;
  if (!own) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < nb; ++b)
        repack_other(type, src + (n * nb + b) * block_bytes(type), dst + (n / 16) * group_bytes, b,
                     static_cast<int>(n % 16));
    return;
  }
  if (type == Q4_0 || type == Q4_1 || type == Q8_0) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < nb; ++b)
        repack_small(type, src + (n * nb + b) * block_bytes(type), dst + ((n / 16) * nb + b) * gbytes,
                     static_cast<int>(n % 16));
    return;
  }
  KBlock kb;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* gb = dst + ((n / 16) * nb + b) * gbytes;
      const int r = static_cast<int>(n % 16);
      if (type == Q4_K) {
        const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(src) + n * nb + b;
        decode(blk, kb);
        std::memcpy(gb + 2 * r, &blk->d, 2);
        std::memcpy(gb + 32 + 2 * r, &blk->dmin, 2);
        for (int j = 0; j < 8; ++j) gb[64 + 16 * j + r] = static_cast<uint8_t>(kb.sc[2 * j]);
        for (int i = 0; i < 4; ++i)
          for (int t = 0; t < 2; ++t) gb[192 + 32 * i + 2 * r + t] = static_cast<uint8_t>(kb.mu[2 * (2 * i + t)]);
        for (int j = 0; j < 8; ++j)
          for (int c = 0; c < 4; ++c)
            for (int i = 0; i < 4; ++i)
              gb[320 + ((4 * j + c) * 16 + r) * 4 + i] =
                  kb.q[32 * j + 4 * c + i] | (kb.q[32 * j + 16 + 4 * c + i] << 4);
      } else {
        const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(src) + n * nb + b;
        decode(blk, kb);
        std::memcpy(gb + 2 * r, &blk->d, 2);
        for (int s = 0; s < 16; ++s) gb[SC6 + 16 * s + r] = static_cast<uint8_t>(blk->scales[s]);
        write_q6(gb, r, kb.q);
      }
    }
}

void x16_rows(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y, int64_t ldy,
              int64_t n0, int64_t n1) {
  switch (isa()) {
    case 2:
      if (type == S8_X16) x16_rows_avx2(type, w, K, a, bias, y, ldy, n0, n1);
      else x16_rows_avx512(type, w, K, a, bias, y, ldy, n0, n1);
      break;
    case 1: x16_rows_avx2(type, w, K, a, bias, y, ldy, n0, n1); break;
    default: x16_rows_ref(type, w, K, a, bias, y, ldy, n0, n1); break;
  }
}

void x16_dequant_row(int64_t type, const uint8_t* w, int64_t K, int64_t n, float* out) {
  const int64_t nb = K / block_size(type), gbytes = x16_group_bytes(type);
  if (small(type)) {
    int32_t q[32];
    float d, m;
    for (int64_t b = 0; b < nb; ++b) {
      read_small(type, w + ((n / 16) * nb + b) * gbytes, static_cast<int>(n % 16), q, d, m);
      for (int i = 0; i < 32; ++i)
        out[32 * b + i] = with_m(type) ? d * q[i] + m : d * (q[i] - (type == Q4_0_X16 ? 8 : 0));
    }
    return;
  }
  RowBlock o;
  for (int64_t b = 0; b < nb; ++b) {
    read_row(type, w + ((n / 16) * nb + b) * gbytes, static_cast<int>(n % 16), o);
    for (int i = 0; i < 256; ++i)
      out[256 * b + i] = type == Q4_K_X16 ? o.d * o.sc[i / 32] * o.q[i] - o.dmin * o.mn[i / 32]
                                          : o.d * o.sc[i / 16] * (o.q[i] - 32);
  }
}

}  // namespace anyspec
