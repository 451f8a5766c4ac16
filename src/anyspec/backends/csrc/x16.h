// What the files of the interleaved products share (x16.cpp: the layout and the repacking,
// x16_ref.cpp: the plain C++ reference, x16_avx2.cpp and x16_avx512.cpp: the SIMD levels,
// x16_amx.h: the tiles).
#pragma once
#include <cstdint>
#include <cstring>

#include "quant.h"

// The tile instructions are built where GCC 11 or later targets 64-bit x86 Linux (x16_amx.cpp).
#if ANYSPEC_X86 && defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 11
#define ANYSPEC_AMX_HW 1
#else
#define ANYSPEC_AMX_HW 0
#endif

namespace anyspec {

// Every section starts on a 64-byte line, so no vector load straddles two lines.
constexpr int64_t GB4 = 2368, GB6 = 3392, GB40 = 320, GB41 = 320, GB80 = 576, GB8S = 640;
constexpr int64_t SC6 = 64, QL6 = 320, QH6 = 2368;
constexpr int64_t QS = 64;  // where a 32-weight group block's weights start (S8: QS8)
constexpr int64_t QS8 = 128;
constexpr int64_t PREFETCH_BLOCKS = 4;  // how far ahead the weight stream is fetched, in group blocks

inline bool small(int64_t type) { return type == Q4_0_X16 || type == Q4_1_X16 || type == Q8_0_X16 || type == S8_X16; }
inline bool with_m(int64_t type) { return type == Q4_1_X16 || type == S8_X16; }

inline int32_t word(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Every line of the group block at p into L2: the weights stream from memory while the products run.
inline void fetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) prefetch_l2(p + i);
}

// Part i of `parts` of those lines: a large block's fetches spread over its sub-blocks keep a steady
// number of lines in flight, which lets the memory stream overlap the products of several rows.
inline void fetch_part(const uint8_t* p, int64_t bytes, int64_t i, int64_t parts) {
  const int64_t lines = (bytes + 63) / 64, from = lines * i / parts, to = lines * (i + 1) / parts;
  for (int64_t l = from; l < to; ++l) prefetch_l2(p + 64 * l);
}

// x16_rows at each level; the SIMD ones exist only in builds for x86 (ANYSPEC_X86).
void x16_rows_ref(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                  int64_t ldy, int64_t n0, int64_t n1);
void x16_rows_avx2(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                   int64_t ldy, int64_t n0, int64_t n1);
void x16_rows_avx512(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                     int64_t ldy, int64_t n0, int64_t n1);

// x16_rows on tiles (x16_amx.h): hw_tiles with the instructions (where ANYSPEC_AMX_HW), standin_tiles
// with their stand-in; acc has room for a.M * 16 floats.
namespace hw_tiles {
void x16_rows_tiles(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                    int64_t ldy, int64_t n0, int64_t n1, float* acc);
void tile_product(const uint8_t* a, const uint8_t* b, int32_t* c, int rows, int depth, int cols, bool a_signed);
}
namespace standin_tiles {
void x16_rows_tiles(int64_t type, const uint8_t* w, int64_t K, const Act& a, const float* bias, float* y,
                    int64_t ldy, int64_t n0, int64_t n1, float* acc);
void tile_product(const uint8_t* a, const uint8_t* b, int32_t* c, int rows, int depth, int cols, bool a_signed);
}

}  // namespace anyspec
