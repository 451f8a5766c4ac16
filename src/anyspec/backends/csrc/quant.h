// GGUF block formats and row-invariant quantized matrix products (quant.cpp).
#pragma once
#include <cstdint>
#include <vector>

namespace anyspec {

// ggml's type numbers for the formats kept as they are; F32 and BF16 matrices use the row-wise
// kernel in rowwise_linear.cpp, and I8S is anyspec's int8 with an fp32 scale per row.
enum Type : int64_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14, BF16 = 30,
                      I8S = 1000 };

int64_t block_size(int64_t type);   // weights per block
int64_t block_bytes(int64_t type);  // bytes per block
bool is_quantized(int64_t type);

// Each activation row is quantized alone: int8 values in blocks of `blk` (32 for the 32-weight
// formats, 256 for the K-quants), one fp32 scale per block (max |x| / 127, rounded to nearest even)
// and the sums of each 16 and each 32 values.
struct Act {
  int64_t M = 0, K = 0, blk = 0;
  bool permuted = false;       // K-quants at the AVX-512 level: values reordered within each block
  std::vector<int8_t> q;       // [M, K]
  std::vector<float> d;        // [M, K / blk]
  std::vector<int16_t> bsum;   // [M, K / 16]
  std::vector<int16_t> bsum32; // [M, K / 32]
  std::vector<float> sx;       // 32-blocks: d * (sum of the block's 32 values), [M, K / 32]
};

void quantize(const float* x, int64_t M, int64_t K, int64_t blk, Act& act);
int64_t act_block(int64_t type);  // the activation block that weights of `type` are multiplied with

// Instruction sets: 0 plain C++ (the reference), 1 AVX2, 2 AVX-512 VNNI. The best one this CPU has is
// chosen at first use; every level computes the same bits.
int isa();
int best_isa();
void set_isa(int level);

// y[m, n] (row stride ldy) for output rows [n0, n1) of the quantized matrix w ([N, row bytes]).
void qmatmul_rows(int64_t type, const uint8_t* w, int64_t K, const Act& act, const float* bias, float* y,
                  int64_t ldy, int64_t n0, int64_t n1);

// The fp32 values of row n of a quantized (or F16/F32/BF16) matrix.
void dequant_row(int64_t type, const uint8_t* row, int64_t K, float* out);

}  // namespace anyspec
