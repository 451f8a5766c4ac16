// What the decoder stack (decoder.cpp) shares with the products (rowwise_linear.cpp).
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <cstdint>

#include "dense.h"
#include "quant.h"

namespace anyspec {

// Set on each thread of decoder_forward's parallel region while it runs. Per thread: decoder_forward
// and the products (linear, typed_linear) let go of the GIL, so other threads may run products, or
// a stack of their own, at the same time.
extern thread_local bool in_stack;

// fn(begin, end) over [0, n) on all threads: inside the decoder stack's one parallel region each
// thread takes a contiguous share and waits for the others; elsewhere through at::parallel_for
// (which runs inline when called from inside someone else's parallel region).
template <typename F>
void split(int64_t n, int64_t grain, const F& fn) {
  if (!(in_stack && omp_in_parallel())) {
    at::parallel_for(0, n, grain, fn);
    return;
  }
  const int64_t tid = omp_get_thread_num(), threads = omp_get_num_threads();
  const int64_t begin = n * tid / threads, end = n * (tid + 1) / threads;
  if (begin < end) fn(begin, end);
#pragma omp barrier
}

const float* ptr_or_null(const torch::Tensor& t);

// A matrix of the stack: a GGUF block type (quant.h) or BF16 / I8S / F32 row-wise weights [N, K].
struct Mat {
  int64_t type = F32, N = 0, K = 0;
  const void* w = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;
};

Mat mat(const torch::Tensor& w, const torch::Tensor& scale, const torch::Tensor& bias, int64_t type, int64_t K);

// The activation rows quantized once per product, for the block size each quantized type needs.
// They are sized before the stack's parallel region (size_for), so that its threads only fill them.
struct Acts {
  Act by32, by256;
  bool each = false;  // this thread's own: it quantizes every row itself (no barrier before the products)
  const Act& of(int64_t type) const { return block_size(type) == 32 ? by32 : by256; }
};

void size_for(Acts& acts, const Mat& m, int64_t M);  // room in acts for M rows of m's inputs

// y[M, sum of N] = x[M, K] . [W_0; W_1; ...]^T: the outputs of `mats` side by side (row stride ldy).
void apply(const float* x, int64_t M, const Mat* mats, int count, float* y, int64_t ldy, Acts& acts);

void bind_decoder(pybind11::module_& m);  // decoder_forward, attention and their types
void bind_gumbel(pybind11::module_& m);   // gumbel_choose (gumbel.cpp)

}  // namespace anyspec
