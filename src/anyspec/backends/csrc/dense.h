// The kernel's fp32 arithmetic outside the quantized products (dense.cpp): row-wise products over
// bf16, int8 and fp32 weights, attention's scores and weighted sums, exp, the gates and RMS norms.
// No torch and no threads here: each call computes what it is given, in a fixed order.
#pragma once
#include <cstdint>

namespace anyspec {

// y[m, n] (row stride ldy) = x[m, :] . w[n, :] (* scale[n]) (+ bias[n]) for m < M and n < rows, where
// w holds `rows` rows of K values (bf16, int8 or fp32); scale and bias may be null.
void rowwise_rows(const float* x, int64_t M, const uint16_t* w, int64_t rows, int64_t K, const float* scale,
                  const float* bias, float* y, int64_t ldy);
void rowwise_rows(const float* x, int64_t M, const int8_t* w, int64_t rows, int64_t K, const float* scale,
                  const float* bias, float* y, int64_t ldy);
void rowwise_rows(const float* x, int64_t M, const float* w, int64_t rows, int64_t K, const float* scale,
                  const float* bias, float* y, int64_t ldy);

// out[j] = q . k_j * scaling for the len keys k_j (rows of D).
void scores(const float* q, const float* keys, int64_t len, int64_t D, float scaling, float* out);
// The same for n heads at once (query h at q + h * D, its scores at out + h * out_stride): the bits
// of n calls of scores.
void scores_heads(const float* q, int64_t n, const float* keys, int64_t len, int64_t D, float scaling, float* out,
                  int64_t out_stride);
// The same for `rows` rows of n heads over the same keys (row r's head h at q + r * q_stride + h * D,
// its scores at out + (r * n + h) * out_stride): the bits of rows * n calls of scores.
void scores_rows(const float* q, int64_t rows, int64_t q_stride, int64_t n, const float* keys, int64_t len, int64_t D,
                 float scaling, float* out, int64_t out_stride);

// o[d] = sum over j in order of p[j] * v_j[d] for the len value rows v_j (rows of D); with `add`, the
// sum goes on from o's values, so that sums in pieces give the same bits as one sum over all rows.
void weighted_sum(const float* p, const float* values, int64_t len, int64_t D, float* o, bool add = false);
// n heads' sums over the same values (head h: weights p + h * p_stride, output o + h * D), without
// `add`: the bits of n calls of weighted_sum. len == 0 leaves o as it is.
void weighted_sum_heads(const float* p, int64_t n, int64_t p_stride, const float* values, int64_t len, int64_t D,
                        float* o);
// The same for `rows` rows of n heads (row r's head h: weights p + (r * n + h) * p_stride, output
// o + r * o_stride + h * D).
void weighted_sum_rows(const float* p, int64_t rows, int64_t n, int64_t p_stride, const float* values, int64_t len,
                       int64_t D, float* o, int64_t o_stride);

// v[i] = exp(v[i] - shift) for i < n.
void exp_shifted(float* v, int64_t n, float shift);
// v[i] = exp(v[i] - max) / sum for i < n (n >= 1): the sum in 8 lanes, then across them, then the tail.
void softmax(float* v, int64_t n);

// out[i] = act(gate[i]) * up[i] for i < n; act: GELU (tanh approximation) or SiLU.
void gated(bool gelu, const float* gate, const float* up, float* out, int64_t n);

// RMS norm of each of M rows of H values by itself (the sum of squares in double, in order), times weight;
// y may be x (each value is read before it is written).
void rms_norm(const float* x, int64_t M, int64_t H, const float* weight, float eps, float* y);

}  // namespace anyspec
