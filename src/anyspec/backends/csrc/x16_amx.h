// The interleaved products on AMX tiles (the layout and the arithmetic: x16.cpp). This file is the
// code of two translation units: x16_amx.cpp compiles it with the tile instructions, and
// x16_amx_standin.cpp with their plain C++ stand-in (tiles.h), each into its own namespace.
//
// A group block's weights are already a tile's B operand: row k of B is 64 bytes, 4 consecutive
// weights of each of the 16 output rows, which is the layout vpdpbusd reads. So for one block of a
// group and up to 16 activation rows:
//   A (tmm1): the activation rows, `depth` consecutive int8 values each, read in place from Act
//   B (tmm2): depth / 4 rows of 64 bytes, the group's int8 weights (4-bit and 6-bit ones unpacked)
//   C (tmm0): tdpbssd gives, for each activation row and output row, the integer dot of one
//             sub-block (Q4_K: 32 weights, Q6_K: 16) or 32-weight block
// Each sub-block's C is stored and scaled as the vector levels scale it (its sub-block scale, the
// offsets), then the float steps run per activation row in their order. The integers are exact,
// so every output is the bits of the vector levels. Weights of all types are unsigned below 128 or
// signed int8, so one instruction, tdpbssd, serves them all.
#pragma once
#include <cmath>

#include "tiles.h"
#include "x16.h"

namespace anyspec {
namespace ANYSPEC_AMX_NS {
namespace {

constexpr int TILE_ROWS = 16;

// A block as tile products: `dots` of them, each over `depth` activations.
struct Shape {
  int dots, depth;
};

inline Shape shape_of(int64_t type) {
  if (type == Q4_K_X16) return {8, 32};
  if (type == Q6_K_X16) return {16, 16};
  return {1, 32};
}

// 64 bytes of nibbles as two B rows: the low nibbles and the high ones.
inline void nibbles(const uint8_t* v, int8_t* lo, int8_t* hi) {
  for (int i = 0; i < 64; ++i) {
    lo[i] = static_cast<int8_t>(v[i] & 15);
    hi[i] = static_cast<int8_t>(v[i] >> 4);
  }
}

// Q6_K's sub-block s as 4 B rows: row t holds weights 16s + 4t .. 16s + 4t + 3 of each output row.
inline void six_bits(const uint8_t* gb, int s, int8_t* out) {
  const uint8_t* v0 = gb + QL6 + (2 * s) * 64;
  const uint8_t* v1 = v0 + 64;
  const uint8_t* h = gb + QH6 + s * 64;
  for (int i = 0; i < 64; ++i) {
    out[i] = static_cast<int8_t>((v0[i] & 15) | (h[i] & 3) << 4);
    out[64 + i] = static_cast<int8_t>((v1[i] & 15) | (h[i] >> 2 & 3) << 4);
    out[128 + i] = static_cast<int8_t>((v0[i] >> 4) | (h[i] >> 4 & 3) << 4);
    out[192 + i] = static_cast<int8_t>((v1[i] >> 4) | (h[i] >> 6 & 3) << 4);
  }
}

// The B rows of one group block, dot after dot (into buf, 4096 bytes, unless stored as int8).
const int8_t* weights(int64_t type, const uint8_t* gb, int8_t* buf) {
  if (type == Q8_0_X16) return reinterpret_cast<const int8_t*>(gb + QS);
  if (type == S8_X16) return reinterpret_cast<const int8_t*>(gb + QS8);
  if (type == Q6_K_X16) {
    for (int s = 0; s < 16; ++s) six_bits(gb, s, buf + 256 * s);
  } else if (type == Q4_K_X16) {  // sub-block j: chunks (j, 0..3), low nibbles then high
    for (int j = 0; j < 8; ++j)
      for (int c = 0; c < 4; ++c) nibbles(gb + 320 + (4 * j + c) * 64, buf + 512 * j + 64 * c, buf + 512 * j + 64 * (4 + c));
  } else {  // Q4_0, Q4_1: weights 4c + i low, 16 + 4c + i high
    for (int c = 0; c < 4; ++c) nibbles(gb + QS + 64 * c, buf + 64 * c, buf + 64 * (4 + c));
  }
  return buf;
}

// Activation rows r0 + from .. r0 + R - 1 against block b: I, the scaled integer sums of each row's
// 16 outputs (Q6_K: less its offset of 32; Q4_0: of 8), and Q4_K's min sums M.
void block_sums(int64_t type, const uint8_t* gb, const int8_t* B, const Act& a, int64_t r0, int R, int from,
                int64_t b, int32_t (*I)[16], int32_t (*M)[16]) {
  const Shape sh = shape_of(type);
  const int64_t K = a.K, blk = small(type) ? 32 : 256;
  const int32_t offset = type == Q4_0_X16 ? 8 : 0;
  alignas(64) int32_t C[TILE_ROWS][16];
  for (int m = from; m < R; ++m)
    for (int n = 0; n < 16; ++n) I[m][n] = 0;
  for (int s = 0; s < sh.dots; ++s) {
    TILE_LOAD(1, a.q.data() + r0 * K + b * blk + s * sh.depth, K);
    TILE_LOAD(2, B + s * sh.depth * 16, 64);
    TILE_ZERO(0);
    TILE_DPBSSD(0, 1, 2);
    TILE_STORE(0, C, 64);
    for (int m = from; m < R; ++m) {
      const int64_t r = r0 + m;
      if (type == Q4_K_X16) {
        const uint8_t* sc = gb + 64 + 16 * s;
        for (int n = 0; n < 16; ++n) I[m][n] += C[m][n] * sc[n];
      } else if (type == Q6_K_X16) {
        const int8_t* sc = reinterpret_cast<const int8_t*>(gb + SC6 + 16 * s);
        const int32_t off = a.b16x32[r * (K / 16) + 16 * b + s];
        for (int n = 0; n < 16; ++n) I[m][n] += (C[m][n] - off) * sc[n];
      } else {
        const int32_t off = offset * a.bsum32[r * (K / 32) + b];
        for (int n = 0; n < 16; ++n) I[m][n] = C[m][n] - off;
      }
    }
  }
  if (type != Q4_K_X16) return;
  for (int m = from; m < R; ++m) {
    const int16_t* bs = a.bsum32.data() + (r0 + m) * (K / 32) + 8 * b;
    for (int n = 0; n < 16; ++n) {
      int32_t sum = 0;
      for (int j = 0; j < 8; ++j) sum += gb[192 + 32 * (j / 2) + 2 * n + j % 2] * bs[j];
      M[m][n] = sum;
    }
  }
}

// acc, the 16 outputs of activation row r, after block b: the float steps of every level, in their
// order (x16.cpp). Only the integers may be summed in another order; these may not.
void scale(int64_t type, const uint8_t* gb, const Act& a, int64_t r, int64_t b, const int32_t* I,
           const int32_t* M, float* acc) {
  float d[16], m[16];
  for (int n = 0; n < 16; ++n) {
    uint16_t h[2];
    std::memcpy(h, gb + 2 * n, 2);
    std::memcpy(h + 1, gb + 32 + 2 * n, 2);
    d[n] = half(h[0]);
    m[n] = half(h[1]);  // Q4_1's m, Q4_K's dmin; unused by the others
    if (type == S8_X16) {
      std::memcpy(&d[n], gb + 4 * n, 4);
      std::memcpy(&m[n], gb + 64 + 4 * n, 4);
    }
  }
  const int64_t i = r * (a.K / a.blk) + b;
  const float dx = a.d[i];
  for (int n = 0; n < 16; ++n) acc[n] = std::fma(d[n] * dx, static_cast<float>(I[n]), acc[n]);
  if (type == Q4_K_X16)
    for (int n = 0; n < 16; ++n) acc[n] = std::fma(-(m[n] * dx), static_cast<float>(M[n]), acc[n]);
  if (with_m(type))
    for (int n = 0; n < 16; ++n) acc[n] = std::fma(m[n], a.sx[i], acc[n]);
}

// One group's 16 outputs for all a.M activation rows into acc [a.M][16]. The rows go 16 to a tile;
// when a.M is not a multiple of 16, the last tile ends at row a.M - 1 and overlaps the one before,
// whose rows it leaves as they are (`from`), so every tile has the configured R rows.
void group_tiles(int64_t type, const uint8_t* group, const Act& a, int R, float* acc) {
  const int64_t nb = a.K / block_size(type), gbytes = x16_group_bytes(type), rows = a.M;
  alignas(64) int8_t buf[4096];
  alignas(64) int32_t I[TILE_ROWS][16], M[TILE_ROWS][16];
  for (int64_t i = 0; i < rows * 16; ++i) acc[i] = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* gb = group + b * gbytes;
    fetch_ahead(gb + (small(type) ? 4 : 1) * PREFETCH_BLOCKS * gbytes, gbytes);
    const int8_t* B = weights(type, gb, buf);
    for (int64_t done = 0; done < rows;) {
      const int64_t r0 = done < rows - R ? done : rows - R;
      const int from = static_cast<int>(done - r0);
      block_sums(type, gb, B, a, r0, R, from, b, I, M);
      for (int m = from; m < R; ++m) scale(type, gb, a, r0 + m, b, I[m], M[m], acc + (r0 + m) * 16);
      done = r0 + R;
    }
  }
}

}  // namespace

// x16_rows on tiles, for a.M >= 1 activation rows; acc has room for a.M * 16 floats. The tile
// configuration is this thread's: it is loaded here, on the thread that runs the products, and
// released at the end, so that whatever else uses tiles on this thread finds them free.
void x16_rows_tiles(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                    int64_t ldy, int64_t n0, int64_t n1, float* acc) {
  const Shape sh = shape_of(type);
  const int R = a.M < TILE_ROWS ? static_cast<int>(a.M) : TILE_ROWS;
  TileConfig cfg;
  cfg.rows[0] = static_cast<uint8_t>(R), cfg.colsb[0] = 64;                // C: R x 16 int32
  cfg.rows[1] = static_cast<uint8_t>(R), cfg.colsb[1] = static_cast<uint16_t>(sh.depth);  // A
  cfg.rows[2] = static_cast<uint8_t>(sh.depth / 4), cfg.colsb[2] = 64;     // B
  tile_config(&cfg);
  const int64_t gbytes = x16_group_bytes(type), nb = K / block_size(type);
  for (int64_t g = n0 / 16; g * 16 < n1; ++g) {
    group_tiles(type, w + g * nb * gbytes, a, R, acc);
    const int64_t first = n0 > 16 * g ? n0 : 16 * g, last = n1 < 16 * g + 16 ? n1 : 16 * g + 16;
    for (int64_t r = 0; r < a.M; ++r)
      for (int64_t n = first; n < last; ++n) y[r * ldy + n] = acc[r * 16 + n - 16 * g] + (bias ? bias[n] : 0.0f);
  }
  tile_release();
}

// One tile product, for tests of the tiles themselves: C (rows x cols int32) += A (rows x depth bytes)
// . B (depth / 4 x 4 * cols bytes), all three rows 64 bytes apart; A's bytes signed or not.
void tile_product(const uint8_t* a, const uint8_t* b, int32_t* c, int rows, int depth, int cols, bool a_signed) {
  TileConfig cfg;
  cfg.rows[0] = static_cast<uint8_t>(rows), cfg.colsb[0] = static_cast<uint16_t>(4 * cols);
  cfg.rows[1] = static_cast<uint8_t>(rows), cfg.colsb[1] = static_cast<uint16_t>(depth);
  cfg.rows[2] = static_cast<uint8_t>(depth / 4), cfg.colsb[2] = static_cast<uint16_t>(4 * cols);
  tile_config(&cfg);
  TILE_LOAD(0, c, 64);
  TILE_LOAD(1, a, 64);
  TILE_LOAD(2, b, 64);
  if (a_signed) TILE_DPBSSD(0, 1, 2);
  else TILE_DPBUSD(0, 1, 2);
  TILE_STORE(0, c, 64);
  tile_release();
}

}  // namespace ANYSPEC_AMX_NS
}  // namespace anyspec
