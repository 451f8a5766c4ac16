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
//   Q5_0  32 weights, 22 bytes: d, qh[4] (bit i: the fifth bit of weight i), qs[16] as Q4_0.
//         w[i] = d * (q - 16), q in 0..31
//   Q5_1  32 weights, 24 bytes: d, m, qh[4], qs[16]. w[i] = d * q + m
//   Q3_K  256 weights, 110 bytes: hmask[32], qs[64] (low 2 bits), scales[12] (sixteen 6-bit scales), d.
//         Sub-block s (16 weights) = d * (sc[s] - 32) * (q - 4), q = low 2 bits + 4 * hmask bit;
//         weights 128h + 32t + l are bits 2t..2t+1 of qs[32h + l], their hmask bit is bit 4h + t of hmask[l]
//   Q5_K  256 weights, 176 bytes: d, dmin, scales[12] as Q4_K, qh[32], qs[128] as Q4_K's nibbles;
//         the fifth bit of weight 64g + l is bit 2g of qh[l], of weight 64g + 32 + l bit 2g + 1
//   IQ4_NL 32 weights, 18 bytes: d, qs[16] as Q4_0's nibbles, each an index into KVALUES. w = d * KVALUES[q]
//   IQ4_XS 256 weights, 136 bytes: d, scales_h, scales_l[4], qs[128]: sub-block j (32 weights) =
//         d * (ls - 32) * KVALUES[q], ls = nibble j of scales_l | (bits 2j..2j+1 of scales_h) << 4;
//         its nibbles are qs[16j..16j+15] as Q4_0's
//
// This file: the formats' de-quantization (the reference for embeddings and tests), activation
// quantization, and the choice of instruction set. The products run over blocks interleaved 16 rows
// at a time (x16.cpp), where the arithmetic of each output is written out.
#include "quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace anyspec {

void decode(const BlockQ4_K* b, KBlock& o) {
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

void decode(const BlockQ6_K* b, KBlock& o) {
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

namespace {

int level = -1;
bool standin = false;
int64_t tile_rows = 8;

// IQ4_NL's and IQ4_XS's 16 non-uniform levels
constexpr int8_t KVALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The low nibbles of 16 bytes are weights 0..15, the high nibbles 16..31.
void nibbles(const uint8_t* qs, int32_t* q) {
  for (int i = 0; i < 16; ++i) {
    q[i] = qs[i] & 15;
    q[16 + i] = qs[i] >> 4;
  }
}

// Q4_K's (and Q5_K's) packing of eight 6-bit scales and eight 6-bit mins in 12 bytes.
void scales_mins(const uint8_t* scales, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = scales[j] & 63;
    mn[j] = scales[j + 4] & 63;
    sc[j + 4] = (scales[j + 8] & 15) | ((scales[j] >> 6) << 4);
    mn[j + 4] = (scales[j + 8] >> 4) | ((scales[j + 4] >> 6) << 4);
  }
}

}  // namespace

void unpack(int64_t type, const uint8_t* p, Unpacked& u) {
  std::fill(u.m, u.m + 16, 0.0f);
  u.g = 32;
  if (type == Q5_0 || type == Q5_1) {
    const bool one = type == Q5_1;
    const uint8_t* qh = p + (one ? 4 : 2);
    uint32_t high;
    std::memcpy(&high, qh, 4);
    nibbles(qh + 4, u.q);
    for (int i = 0; i < 32; ++i) u.q[i] += ((high >> i) & 1) * 16 - (one ? 0 : 16);
    u.d[0] = half(u16(p));
    if (one) u.m[0] = half(u16(p + 2));
  } else if (type == IQ4_NL) {
    nibbles(p + 2, u.q);
    for (int i = 0; i < 32; ++i) u.q[i] = KVALUES[u.q[i]];
    u.d[0] = half(u16(p));
  } else if (type == IQ4_XS) {
    const BlockIQ4_XS* b = reinterpret_cast<const BlockIQ4_XS*>(p);
    for (int j = 0; j < 8; ++j) {
      const int ls = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((b->scales_h >> (2 * j)) & 3) << 4);
      nibbles(b->qs + 16 * j, u.q + 32 * j);
      for (int i = 0; i < 32; ++i) u.q[32 * j + i] = KVALUES[u.q[32 * j + i]];
      u.d[j] = half(b->d) * static_cast<float>(ls - 32);
    }
  } else if (type == Q5_K) {
    const BlockQ5_K* b = reinterpret_cast<const BlockQ5_K*>(p);
    uint8_t sc[8], mn[8];
    scales_mins(b->scales, sc, mn);
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) {
        u.q[64 * g + l] = (b->qs[32 * g + l] & 15) | (((b->qh[l] >> (2 * g)) & 1) << 4);
        u.q[64 * g + 32 + l] = (b->qs[32 * g + l] >> 4) | (((b->qh[l] >> (2 * g + 1)) & 1) << 4);
      }
    for (int j = 0; j < 8; ++j) {
      u.d[j] = half(b->d) * sc[j];
      u.m[j] = -(half(b->dmin) * mn[j]);
    }
  } else if (type == Q3_K) {
    const BlockQ3_K* b = reinterpret_cast<const BlockQ3_K*>(p);
    // scale s: its low nibble is nibble s / 8 of byte s % 8, its top 2 bits are bits 2 (s / 4) and up
    // of byte 8 + s % 4
    uint8_t sc[16];
    for (int s = 0; s < 16; ++s) {
      const int low = (b->scales[s % 8] >> (4 * (s / 8))) & 15;
      const int top = (b->scales[8 + s % 4] >> (2 * (s / 4))) & 3;
      sc[s] = static_cast<uint8_t>(low | (top << 4));
    }
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < 4; ++t)
        for (int l = 0; l < 32; ++l) {
          const int q = (b->qs[32 * h + l] >> (2 * t)) & 3;
          u.q[128 * h + 32 * t + l] = q - (((b->hmask[l] >> (4 * h + t)) & 1) ? 0 : 4);
        }
    u.g = 16;
    u.dh = b->d;
    for (int s = 0; s < 16; ++s) {
      u.sc[s] = static_cast<int>(sc[s]) - 32;
      u.d[s] = half(b->d) * static_cast<float>(u.sc[s]);
    }
  } else {
    throw std::invalid_argument("unpack: not a block type of its own");
  }
}

int64_t block_size(int64_t type) {
  switch (type) {
    case Q4_0: case Q4_1: case Q8_0: case Q4_0_X16: case Q4_1_X16: case Q8_0_X16: return 32;
    case Q5_0: case Q5_1: case IQ4_NL: case S8_X16: return 32;
    case Q4_K: case Q6_K: case Q4_K_X16: case Q6_K_X16: return 256;
    case Q3_K: case Q5_K: case IQ4_XS: return 256;
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
    case Q5_0: return sizeof(BlockQ5_0);
    case Q5_1: return sizeof(BlockQ5_1);
    case Q3_K: return sizeof(BlockQ3_K);
    case Q5_K: return sizeof(BlockQ5_K);
    case IQ4_NL: return sizeof(BlockIQ4_NL);
    case IQ4_XS: return sizeof(BlockIQ4_XS);
    case F32: return 4;
    case F16: case BF16: return 2;
    default: return 0;
  }
}

bool is_quantized(int64_t type) { return block_size(type) > 1; }

int cpu_isa() {
#if ANYSPEC_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
    return 2;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
#else
  return 0;
#endif
}

int best_isa() { return standin || amx_hw_usable() ? 3 : cpu_isa(); }

// The tiles are taken only when asked for (ANYSPEC_ISA=amx, or the stand-in): their speed and their
// grant from the OS are not yet measured on a machine that has them.
int isa() {
  if (level < 0) level = standin ? 3 : cpu_isa();
  return level;
}

void set_isa(int wanted) { level = std::min(std::max(wanted, 0), best_isa()); }

bool amx_standin() { return standin; }

void set_amx_standin(bool on) {
  standin = on;
  if (level > best_isa()) level = best_isa();
}

int64_t amx_rows() { return tile_rows; }

void set_amx_rows(int64_t rows) { tile_rows = std::max<int64_t>(rows, 1); }

void prepare(Act& a, int64_t M, int64_t K, int64_t blk) {
  a.M = M, a.K = K, a.blk = blk;
  a.q.resize(M * K);
  a.d.resize(M * K / blk);
  a.bsum.resize(M * K / 16);
  a.bsum32.resize(M * K / 32);
  a.b16x32.resize(M * K / 16);
  a.sx.resize(blk == 32 ? M * K / 32 : 0);
}

namespace {

#if ANYSPEC_X86

inline int32_t hsum8(__m256i v) {  // exact
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

// 32 values times id, rounded to int8 (q), and the sums of each 16 of them (wrapping, as int32)
inline void round32(const float* v, F8 id, int8_t* q, int32_t* sums) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i t[4];
  for (int k = 0; k < 4; ++k) t[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * k), id));
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(t[0], t[1]), _mm256_packs_epi32(t[2], t[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(packed, order));
  sums[0] = hsum8(_mm256_add_epi32(t[0], t[1]));
  sums[1] = hsum8(_mm256_add_epi32(t[2], t[3]));
}

#else

// As cvtps2dq: to nearest, ties to even; INT32_MIN for a NaN or a value out of range
inline int32_t cvt(float x) {
  return x >= -2147483648.0f && x < 2147483648.0f ? static_cast<int32_t>(std::nearbyint(x)) : INT32_MIN;
}

inline void round32(const float* v, F8 id, int8_t* q, int32_t* sums) {
  uint32_t total[2] = {0, 0};
  for (int i = 0; i < 32; ++i) {
    const int32_t t = cvt(v[i] * id.v[i % 8]);
    q[i] = static_cast<int8_t>(std::min(std::max(t, -128), 127));  // the two saturating packs
    total[i / 16] += static_cast<uint32_t>(t);
  }
  for (int h = 0; h < 2; ++h) sums[h] = static_cast<int32_t>(total[h]);
}

#endif

}  // namespace

// Each value is nearbyint(x * 127 / amax) (round half to even, as cvtps2dq does), which is within
// [-127, 127] since |x| <= amax, so the saturating packs never clip.
void quantize_rows(const float* x, Act& a, int64_t r0, int64_t r1) {
  const int64_t K = a.K, blk = a.blk, nb = K / blk;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float* v = x + r * K + b * blk;
      F8 mx = zero8();
      for (int64_t i = 0; i < blk; i += 8) mx = max8(mx, abs8(load8(v + i)));
      const float amax = hmax(mx);
      const F8 id = set8(amax > 0 ? 127.0f / amax : 0.0f);
      a.d[r * nb + b] = amax / 127.0f;
      for (int64_t i = 0; i < blk; i += 32) {
        int32_t sums[2];
        round32(v + i, id, a.q.data() + r * K + b * blk + i, sums);
        const int64_t j = (r * K + b * blk + i) / 16;  // the two sums of 16 in these 32 values
        a.bsum[j] = static_cast<int16_t>(sums[0]);
        a.bsum[j + 1] = static_cast<int16_t>(sums[1]);
        a.bsum32[j / 2] = static_cast<int16_t>(a.bsum[j] + a.bsum[j + 1]);
        a.b16x32[j] = 32 * a.bsum[j];
        a.b16x32[j + 1] = 32 * a.bsum[j + 1];
      }
      if (blk == 32) a.sx[r * nb + b] = a.d[r * nb + b] * static_cast<float>(a.bsum32[r * nb + b]);
    }
}

void qmatmul_rows(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                  int64_t ldy, int64_t n0, int64_t n1) {
  if (!x16_group_bytes(type)) throw std::invalid_argument("quantized products take rows interleaved by repack_x16");
  x16_rows(type, w, K, a, bias, y, ldy, n0, n1);
}

void dequant_row(int64_t type, const uint8_t* row, int64_t K, float* out) {
  if (type == F32) {
    std::memcpy(out, row, K * 4);
    return;
  }
  if (type == F16 || type == BF16) {
    const uint16_t* v = reinterpret_cast<const uint16_t*>(row);
    for (int64_t i = 0; i < K; ++i) out[i] = type == F16 ? half(v[i]) : bf16_to_float(v[i]);
    return;
  }
  const int64_t bs = block_size(type), nb = K / bs, bb = block_bytes(type);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * bb;
    float* o = out + b * bs;
    if (type == Q5_0 || type == Q5_1 || type == Q3_K || type == Q5_K || type == IQ4_NL || type == IQ4_XS) {
      Unpacked u;
      unpack(type, p, u);
      for (int e = 0; e < bs; ++e) o[e] = u.d[e / u.g] * static_cast<float>(u.q[e]) + u.m[e / u.g];
    } else if (bs == 256) {
      KBlock kb;
      if (type == Q4_K) decode(reinterpret_cast<const BlockQ4_K*>(p), kb);
      else decode(reinterpret_cast<const BlockQ6_K*>(p), kb);
      if (type == Q4_K)
        for (int e = 0; e < 256; ++e) o[e] = kb.d * kb.sc[e / 16] * kb.q[e] - kb.k * kb.mu[e / 16];
      else
        for (int e = 0; e < 256; ++e) o[e] = kb.d * kb.sc[e / 16] * (kb.q[e] - 32);
    } else {
      uint16_t d, m = 0;
      std::memcpy(&d, p, 2);
      if (type == Q4_1) std::memcpy(&m, p + 2, 2);
      const uint8_t* qs = p + (type == Q4_1 ? 4 : 2);
      for (int e = 0; e < 32; ++e) {
        if (type == Q8_0) {
          o[e] = half(d) * static_cast<int8_t>(qs[e]);
          continue;
        }
        const int q = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
        o[e] = type == Q4_1 ? half(d) * q + half(m) : half(d) * (q - 8);
      }
    }
  }
}

}  // namespace anyspec
