// The AMX tile instructions the interleaved products use (x16_amx.h), as the real intrinsics or as a
// plain C++ stand-in with their architectural semantics, chosen by ANYSPEC_AMX_STANDIN when this
// header is included. The same tiling code then runs on any CPU (the stand-in, for tests) and on
// one with amx_int8 (the instructions), and both compute the same integers.
//
// Palette 1: eight tiles tmm0..tmm7 of at most 16 rows of 64 bytes. A tile's shape (rows, bytes a
// row) comes from the configuration loaded last on this thread; every instruction reads or writes
// only that part and zeroes the rest. tdpbssd C, A, B: for each row m of C and each dword n of it,
//   C[m].dword[n] += sum over k < A.colsb / 4 of the 4-byte dot of A[m].dword[k] and B[k].dword[n]
// in wrapping 32-bit arithmetic, both sides signed (tdpbusd: A's bytes unsigned).
// Tile numbers are literals: the real intrinsics paste them into the instruction's text.
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "vec8.h"

namespace anyspec {

// The 64 bytes ldtilecfg reads: palette, restart row, 14 reserved, 16 bytes-per-row, 16 row counts.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg's layout");

namespace standin {

constexpr int TILES = 8, ROWS = 16, ROW_BYTES = 64;

struct TileState {
  bool configured = false;
  uint8_t rows[TILES] = {};
  uint16_t colsb[TILES] = {};
  alignas(64) uint8_t data[TILES][ROWS][ROW_BYTES] = {};
};

// Tile state belongs to a thread, as the registers do.
inline TileState& state() {
  static thread_local TileState s;
  return s;
}

// ldtilecfg: a palette-0 configuration releases the tiles; a shape out of the palette's limits,
// or a reserved byte set, faults (#GP on the CPU; an exception here).
inline void load_config(const TileConfig* c) {
  TileState& s = state();
  s = TileState();
  if (c->palette == 0) return;
  bool bad = c->palette != 1;
  for (int i = 0; i < 14; ++i) bad |= c->reserved[i] != 0;
  for (int t = 0; t < 16; ++t) {
    const bool used = c->rows[t] || c->colsb[t];
    if (t >= TILES) bad |= used;
    else bad |= c->rows[t] > ROWS || c->colsb[t] > ROW_BYTES || (used && (!c->rows[t] || !c->colsb[t]));
  }
  if (bad) throw std::runtime_error("ldtilecfg: a configuration palette 1 cannot hold");
  s.configured = true;
  for (int t = 0; t < TILES; ++t) s.rows[t] = c->rows[t], s.colsb[t] = c->colsb[t];
}

inline void release() { state() = TileState(); }

inline TileState& configured(int t) {
  TileState& s = state();
  if (!s.configured || t < 0 || t >= TILES || !s.rows[t]) throw std::runtime_error("tile used unconfigured");
  return s;
}

// tileloadd: row r from base + r * stride, its first colsb bytes; the rest of the tile zeroed.
inline void load(int t, const void* base, int64_t stride) {
  TileState& s = configured(t);
  std::memset(s.data[t], 0, sizeof s.data[t]);
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(s.data[t][r], static_cast<const uint8_t*>(base) + r * stride, s.colsb[t]);
}

// tilestored: the configured rows and bytes only.
inline void store(int t, void* base, int64_t stride) {
  TileState& s = configured(t);
  for (int r = 0; r < s.rows[t]; ++r) std::memcpy(static_cast<uint8_t*>(base) + r * stride, s.data[t][r], s.colsb[t]);
}

inline void zero(int t) { std::memset(configured(t).data[t], 0, sizeof(TileState::data[0])); }

// tdpbssd (A signed) and tdpbusd (A unsigned); B signed. Shapes that do not chain fault (#UD).
template <bool A_SIGNED>
inline void dot(int c, int a, int b) {
  TileState& s = configured(c);
  configured(a), configured(b);
  const int M = s.rows[c], N = s.colsb[c] / 4, K = s.colsb[a] / 4;
  if (c == a || c == b || a == b || s.colsb[c] % 4 || s.colsb[a] % 4 || s.rows[a] != M || s.rows[b] != K ||
      s.colsb[b] != s.colsb[c])
    throw std::runtime_error("tdpb*d: tile shapes that do not chain");
  for (int m = 0; m < M; ++m) {
    uint32_t row[ROWS];
    std::memcpy(row, s.data[c][m], sizeof row);
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n)
        for (int i = 0; i < 4; ++i) {
          const uint8_t x = s.data[a][m][4 * k + i];
          const int32_t xa = A_SIGNED ? static_cast<int32_t>(static_cast<int8_t>(x)) : static_cast<int32_t>(x);
          row[n] += static_cast<uint32_t>(xa * static_cast<int8_t>(s.data[b][k][4 * n + i]));  // wraps
        }
    std::memset(s.data[c][m], 0, ROW_BYTES);
    std::memcpy(s.data[c][m], row, 4 * N);
  }
  for (int m = M; m < ROWS; ++m) std::memset(s.data[c][m], 0, ROW_BYTES);
}

}  // namespace standin

// The tiling code's own namespace for each variant: the two are compiled into one kernel.
#if ANYSPEC_AMX_STANDIN
#define ANYSPEC_AMX_NS standin_tiles
#else
#define ANYSPEC_AMX_NS hw_tiles
#endif

namespace ANYSPEC_AMX_NS {

#if ANYSPEC_AMX_STANDIN

inline void tile_config(const TileConfig* c) { standin::load_config(c); }
inline void tile_release() { standin::release(); }
#define TILE_LOAD(t, base, stride) standin::load(t, base, stride)
#define TILE_STORE(t, base, stride) standin::store(t, base, stride)
#define TILE_ZERO(t) standin::zero(t)
#define TILE_DPBSSD(c, a, b) standin::dot<true>(c, a, b)
#define TILE_DPBUSD(c, a, b) standin::dot<false>(c, a, b)

#else

// GCC's tile loads are asm that names only the address: the barrier makes the compiler finish the
// stores of what the tile reads first (its tile stores already say they write memory).
#define TILE_BARRIER() __asm__ volatile("" ::: "memory")
__attribute__((target("amx-tile"))) inline void tile_config(const TileConfig* c) {
  TILE_BARRIER();
  _tile_loadconfig(c);
}
__attribute__((target("amx-tile"))) inline void tile_release() { _tile_release(); }
#define TILE_LOAD(t, base, stride) \
  do {                             \
    TILE_BARRIER();                \
    _tile_loadd(t, base, stride);  \
  } while (0)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define TILE_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)

#endif

}  // namespace ANYSPEC_AMX_NS

}  // namespace anyspec
