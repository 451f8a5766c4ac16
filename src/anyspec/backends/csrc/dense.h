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

struct Half;  // an fp16 value (vec8.h): attention reads a KV cache of fp32 or of fp16

// out[(r * n + h) * out_stride + j] = q_rh . k_j * scaling for the len keys k_j (rows of D) and the n
// heads of each of `rows` query rows (row r's head h at q + r * q_stride + h * D). Each score is
// computed alone in a fixed order, whatever rows, n and len; an fp16 key scores as its fp32 value.
void scores_rows(const float* q, int64_t rows, int64_t q_stride, int64_t n, const float* keys, int64_t len, int64_t D,
                 float scaling, float* out, int64_t out_stride);
void scores_rows(const float* q, int64_t rows, int64_t q_stride, int64_t n, const Half* keys, int64_t len, int64_t D,
                 float scaling, float* out, int64_t out_stride);

// o[d] = sum over j in order of p[j] * v_j[d] for the len value rows v_j (rows of D); with `add`, the
// sum goes on from o's values, so that sums in pieces give the same bits as one sum over all rows.
void weighted_sum(const float* p, const float* values, int64_t len, int64_t D, float* o, bool add = false);
void weighted_sum(const float* p, const Half* values, int64_t len, int64_t D, float* o, bool add = false);
// The same for the n heads of `rows` rows over the same values (row r's head h: weights
// p + (r * n + h) * p_stride, output o + r * o_stride + h * D), without `add`: the bits of one
// weighted_sum each. len == 0 leaves o as it is.
void weighted_sum_rows(const float* p, int64_t rows, int64_t n, int64_t p_stride, const float* values, int64_t len,
                       int64_t D, float* o, int64_t o_stride);
void weighted_sum_rows(const float* p, int64_t rows, int64_t n, int64_t p_stride, const Half* values, int64_t len,
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
