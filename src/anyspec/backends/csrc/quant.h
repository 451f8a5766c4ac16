// GGUF block formats and row-invariant quantized matrix products (quant.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "vec8.h"

namespace anyspec {

// ggml's type numbers for the formats kept as they are; F32 and BF16 matrices use the row-wise
// kernel in rowwise_linear.cpp, and I8S is anyspec's int8 with an fp32 scale per row.
enum Type : int64_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q3_K = 11, Q4_K = 12,
                      Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30,
                      I8S = 1000, Q4_0_X16 = 1002, Q4_1_X16 = 1003, Q8_0_X16 = 1008, Q4_K_X16 = 1012,
                      Q6_K_X16 = 1014, S8_X16 = 1100 };

// ggml's blocks (little-endian; d, m, dmin are fp16), described in quant.cpp.
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };
struct BlockIQ4_XS { uint16_t d, scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockQ3_K) == 110 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136, "ggml's sizes");

// Every block as integer weights and the float scale and offset of each group of them:
// weight i = d[i / g] * q[i] + m[i / g], with g = 16 or 32 (quant.cpp's `unpack`).
struct Unpacked {
  int32_t q[256];
  float d[16], m[16];
  int g;  // weights per scale
  int32_t sc[16];  // Q3_K: its integer scales (d[s] = fp16 dh * sc[s])
  uint16_t dh;
};
void unpack(int64_t type, const uint8_t* block, Unpacked& u);

// A K-quant block's 256 weights (unsigned: 0..15 for Q4_K, 0..63 for Q6_K), its scales and mins.
struct KBlock {
  alignas(64) uint8_t q[256];
  alignas(32) int16_t sc[16];  // per 16 weights
  alignas(32) int16_t mu[16];  // per 16 weights: Q4_K's mins, Q6_K's scales
  float d, k;
};
void decode(const BlockQ4_K* b, KBlock& o);
void decode(const BlockQ6_K* b, KBlock& o);

int64_t block_size(int64_t type);   // weights per block
int64_t block_bytes(int64_t type);  // bytes per block
bool is_quantized(int64_t type);

// Each activation row is quantized alone: int8 values in blocks of `blk` (32 for the 32-weight
// formats, 256 for the K-quants), one fp32 scale per block (max |x| / 127, rounded to nearest even)
// and the sums of each 16 and each 32 values.
struct Act {
  int64_t M = 0, K = 0, blk = 0;
  std::vector<int8_t> q;       // [M, K]
  std::vector<float> d;        // [M, K / blk]
  std::vector<int16_t> bsum;   // [M, K / 16]
  std::vector<int16_t> bsum32; // [M, K / 32]
  std::vector<float> sx;       // 32-blocks: d * (sum of the block's 32 values), [M, K / 32]
  std::vector<int32_t> b16x32; // 32 * the sums of 16, [M, K / 16] (Q6_K's offset)
};

void prepare(Act& act, int64_t M, int64_t K, int64_t blk);           // sizes the buffers
void quantize_rows(const float* x, Act& act, int64_t r0, int64_t r1);  // rows r0..r1-1 of x [M, K]

// Instruction sets of the quantized products: 0 plain C++ (the reference), 1 AVX2, 2 AVX-512 VNNI, 3
// AMX tiles. The best one this CPU has is chosen at first use; every level computes the same bits. A
// build without x86 flags (vec8.h's ANYSPEC_X86 is 0, as on every machine that is not x86) has
// level 0 only, unless the tiles' stand-in is on.
int isa();
int best_isa();
void set_isa(int level);
int cpu_isa();  // the best of levels 0-2
// Level 3 takes products of at least amx_rows() activation rows to the tiles (x16_amx.h) and fewer
// to level cpu_isa(). The tiles are the CPU's where it has amx_int8 and the OS grants them
// (amx_hw_usable), or, with set_amx_standin(true), a plain C++ stand-in on any CPU (tiles.h).
bool amx_hw_usable();
bool amx_standin();
void set_amx_standin(bool on);
int64_t amx_rows();
void set_amx_rows(int64_t rows);

// y[m, n] (row stride ldy) for output rows [n0, n1) of the quantized matrix w ([N, row bytes]).
void qmatmul_rows(int64_t type, const uint8_t* w, int64_t K, const Act& act, const float* bias, float* y,
                  int64_t ldy, int64_t n0, int64_t n1);

// The fp32 values of row n of a quantized (or F16/F32/BF16) matrix.
void dequant_row(int64_t type, const uint8_t* row, int64_t K, float* out);

// ---- blocks interleaved 16 rows at a time (x16.cpp) ----
// Q5_0 and IQ4_NL are regrouped as Q8_0_X16 (their integer weights fit int8 with the same fp16 d),
// Q3_K as Q6_K_X16 (its 3-bit weights and 6-bit scales fit Q6_K's), and Q5_1, Q5_K and IQ4_XS as
// S8_X16: 32-weight blocks of int8 weights with an fp32 scale and offset each, which hold every
// product of their fp16 scales and small integer scales exactly.
// The same weights, scales and mins, regrouped so that SIMD lanes are 16 output rows: a product
// then sums each block's integers exactly per row, with no horizontal reductions.
int64_t x16_type(int64_t type);          // Q4_K -> Q4_K_X16, ..., Q8_0 -> Q8_0_X16; else 0
int64_t x16_group_bytes(int64_t type);   // bytes of one group of 16 rows x one block
void repack_x16(int64_t type, const uint8_t* src, int64_t N, int64_t K, uint8_t* dst);
void x16_rows(int64_t type, const uint8_t* w, int64_t K, const Act& act, const float* bias, float* y,
              int64_t ldy, int64_t n0, int64_t n1);  // n0 a multiple of 16
void x16_dequant_row(int64_t type, const uint8_t* w, int64_t K, int64_t n, float* out);

}  // namespace anyspec
