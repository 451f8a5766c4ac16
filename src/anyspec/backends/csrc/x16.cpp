// Products over GGUF blocks interleaved 16 rows at a time: the layout, the repacking and the choice
// of level (the levels: x16_ref.cpp, x16_avx2.cpp, x16_avx512.cpp, and the tiles of x16_amx.h).
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
//   acc = fma(d * dx, float(I), acc), then for Q4_1 and S8 acc = fma(m, dx * sum, acc);
// and y = acc + bias. With the lanes being rows, vpdpbusd multiplies 16 rows' 4 weights by 4
// broadcast activations at a time, and no lane ever needs summing with another.
// S8 has no AVX-512 code of its own: its products take the AVX2 path there too.
#include <algorithm>
#include <cstring>
#include <vector>

#include "x16.h"

namespace anyspec {

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
  int level = isa();
  if (level == 3) {
    if (a.M >= amx_rows()) {
      std::vector<float> acc(a.M * 16);
      if (amx_standin()) return standin_tiles::x16_rows_tiles(type, w, K, a, bias, y, ldy, n0, n1, acc.data());
#if ANYSPEC_AMX_HW
      return hw_tiles::x16_rows_tiles(type, w, K, a, bias, y, ldy, n0, n1, acc.data());
#endif
    }
    level = cpu_isa();
  }
  switch (level) {
#if ANYSPEC_X86
    case 2:
      if (type == S8_X16) x16_rows_avx2(type, w, K, a, bias, y, ldy, n0, n1);
      else x16_rows_avx512(type, w, K, a, bias, y, ldy, n0, n1);
      break;
    case 1: x16_rows_avx2(type, w, K, a, bias, y, ldy, n0, n1); break;
#endif
    default: x16_rows_ref(type, w, K, a, bias, y, ldy, n0, n1); break;
  }
}

}  // namespace anyspec
