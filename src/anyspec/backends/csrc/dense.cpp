// The fp32 arithmetic of the kernel outside the quantized products, over vec8.h's eight lanes.
//
// A row-wise product y[m, n] = x[m, :] . w[n, :] is the same sequence of operations whatever M is
// and whichever rows are computed together: 8 fp32 lanes accumulate k in order, then a fixed
// horizontal sum and a scalar tail. So scoring k+1 tokens at once gives bit-identical rows to
// scoring them one by one, which speculative decoding needs for its output to equal the target's.
// The weights are read from memory once per call however many rows there are, which is what makes
// a multi-token forward cost about as much as a one-token forward.
#include "dense.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "vec8.h"

namespace anyspec {
namespace {

constexpr int64_t MAX_RX = 6;  // input rows per pass
constexpr int64_t PREFETCH = 8192;  // bytes ahead of the weight stream: keeps DRAM busy while FMAs run
constexpr int64_t LINE = 64;

inline float scalar(uint16_t v) { return bf16_to_float(v); }
inline float scalar(int8_t v) { return static_cast<float>(v); }
inline float scalar(float v) { return v; }

// RW weight rows times RX input rows, each weight vector converted once and used RX times.
template <typename T, int RW, int RX>
inline void block(const float* x, const T* w, int64_t K, const float* scale, const float* bias,
                  float* y, int64_t N) {
  F8 acc[RW][RX];
  for (int i = 0; i < RW; ++i)
    for (int j = 0; j < RX; ++j) acc[i][j] = zero8();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    F8 wv[RW];
    if ((k & (LINE / sizeof(T) - 1)) == 0)
      for (int i = 0; i < RW; ++i) prefetch_l1(reinterpret_cast<const char*>(w + i * K + k) + PREFETCH);
    for (int i = 0; i < RW; ++i) wv[i] = load8(w + i * K + k);
    for (int j = 0; j < RX; ++j) {
      F8 xv = load8(x + j * K + k);
      for (int i = 0; i < RW; ++i) acc[i][j] = fmadd8(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < RW; ++i)
    for (int j = 0; j < RX; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t t = k; t < K; ++t) s += scalar(w[i * K + t]) * x[j * K + t];
      if (scale) s *= scale[i];
      if (bias) s += bias[i];
      y[j * N + i] = s;
    }
}

// rows weight rows against RX input rows; RW keeps the accumulators in registers.
template <typename T, int RX>
inline void chunk(const float* x, const T* w, int64_t rows, int64_t K, const float* scale,
                  const float* bias, float* y, int64_t N) {
  constexpr int RW = RX <= 2 ? 4 : RX <= 4 ? 3 : 2;  // RW * RX accumulators, at most 12 registers
  for (int64_t n = 0; n < rows;) {
    const float* sn = scale ? scale + n : nullptr;
    const float* bn = bias ? bias + n : nullptr;
    if (n + RW <= rows) {
      block<T, RW, RX>(x, w + n * K, K, sn, bn, y + n, N);
      n += RW;
    } else if (RW > 2 && n + 2 <= rows) {  // 8 rows as 3 + 3 + 2
      block<T, 2, RX>(x, w + n * K, K, sn, bn, y + n, N);
      n += 2;
    } else {
      block<T, 1, RX>(x, w + n * K, K, sn, bn, y + n, N);
      n += 1;
    }
  }
}

template <typename T>
void rows_of(const float* x, int64_t M, const T* w, int64_t rows, int64_t K, const float* scale,
             const float* bias, float* y, int64_t ldy) {
  for (int64_t m = 0; m < M; m += MAX_RX) {
    const float* xm = x + m * K;
    float* ym = y + m * ldy;
    switch (std::min(MAX_RX, M - m)) {
      case 6: chunk<T, 6>(xm, w, rows, K, scale, bias, ym, ldy); break;
      case 5: chunk<T, 5>(xm, w, rows, K, scale, bias, ym, ldy); break;
      case 4: chunk<T, 4>(xm, w, rows, K, scale, bias, ym, ldy); break;
      case 3: chunk<T, 3>(xm, w, rows, K, scale, bias, ym, ldy); break;
      case 2: chunk<T, 2>(xm, w, rows, K, scale, bias, ym, ldy); break;
      default: chunk<T, 1>(xm, w, rows, K, scale, bias, ym, ldy); break;
    }
  }
}

// exp of 8 floats (Cephes' expf: 2^n times a degree-6 polynomial of the remainder), arguments
// clamped to [-87.3, 88.4] so the result stays finite and normal.
inline F8 exp8(F8 x) {
  x = min8(max8(x, set8(-87.33654f)), set8(88.37626f));
  F8 n = round8(mul8(x, set8(1.44269504f)));
  x = fnmadd8(n, set8(0.693359375f), x);
  x = fnmadd8(n, set8(-2.12194440e-4f), x);
  F8 p = set8(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = fmadd8(p, x, set8(c));
  p = fmadd8(p, mul8(x, x), add8(x, set8(1.0f)));
  return mul8(p, exp2i8(n));
}

// SiLU(g) = g * sigmoid(g); GELU with the tanh approximation, 0.5 g (1 + tanh(y)), is g * sigmoid(2y)
// for y = sqrt(2 / pi) (g + 0.044715 g^3).
template <bool GELU>
inline F8 gated8(F8 gate, F8 up) {
  F8 z = gate;
  if (GELU) {
    const F8 cube = mul8(mul8(gate, gate), gate);
    z = mul8(set8(2 * 0.7978845608028654f), fmadd8(set8(0.044715f), cube, gate));
  }
  const F8 sig = add8(set8(1.0f), exp8(sub8(zero8(), z)));
  return mul8(div8(gate, sig), up);
}

// out[i] = act(gate[i]) * up[i] for i < n, eight at a time (a short tail through a padded copy).
template <bool GELU>
void gated_n(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(out + i, gated8<GELU>(load8(gate + i), load8(up + i)));
  if (i < n) {
    float g[8] = {}, u[8] = {}, o[8];
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    store8(o, gated8<GELU>(load8(g), load8(u)));
    std::copy(o, o + (n - i), out + i);
  }
}

}  // namespace

void rowwise_rows(const float* x, int64_t M, const uint16_t* w, int64_t rows, int64_t K, const float* scale,
                  const float* bias, float* y, int64_t ldy) {
  rows_of(x, M, w, rows, K, scale, bias, y, ldy);
}

void rowwise_rows(const float* x, int64_t M, const int8_t* w, int64_t rows, int64_t K, const float* scale,
                  const float* bias, float* y, int64_t ldy) {
  rows_of(x, M, w, rows, K, scale, bias, y, ldy);
}

void rowwise_rows(const float* x, int64_t M, const float* w, int64_t rows, int64_t K, const float* scale,
                  const float* bias, float* y, int64_t ldy) {
  rows_of(x, M, w, rows, K, scale, bias, y, ldy);
}

// N keys' scores at once: q against each key in 8 fp32 lanes over d, a fixed horizontal sum (eight
// keys' side by side, hsum8), then a scalar tail; N is a constant, so the N sums stay in registers.
// Keys of fp16 are widened exactly, so they score as their fp32 values would.
template <int N, typename C>
inline void score_keys(const float* q, const C* keys, int64_t D, int64_t D8, float scaling, float* out) {
  F8 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = zero8();
  for (int64_t d = 0; d < D8; d += 8) {
    const F8 qv = load8(q + d);
    for (int i = 0; i < N; ++i) acc[i] = fmadd8(qv, load8(keys + i * D + d), acc[i]);
  }
  if (N == 8 && D8 == D) {
    store8(out, mul8(hsum8(acc), set8(scaling)));
    return;
  }
  for (int i = 0; i < N; ++i) {
    float s = hsum(acc[i]);
    for (int64_t d = D8; d < D; ++d) s += q[d] * widen(keys[i * D + d]);
    out[i] = s * scaling;
  }
}

// Each block of eight keys against every row's every head in turn, so a key is read from memory once
// for all of them; then the last keys one at a time (each key's sum in the same order either way).
template <typename C>
void scores_of(const float* q, int64_t rows, int64_t q_stride, int64_t n, const C* keys, int64_t len, int64_t D,
               float scaling, float* out, int64_t out_stride) {
  const int64_t D8 = D - D % 8;
  int64_t j = 0;
  for (; j + 8 <= len; j += 8)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < n; ++h)
        score_keys<8>(q + r * q_stride + h * D, keys + j * D, D, D8, scaling, out + (r * n + h) * out_stride + j);
  for (; j < len; ++j)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < n; ++h)
        score_keys<1>(q + r * q_stride + h * D, keys + j * D, D, D8, scaling, out + (r * n + h) * out_stride + j);
}

// 64 d at a time in registers (a narrower tail: 8 d at a time, then one by one).
template <typename C>
void sum_of(const float* p, const C* values, int64_t len, int64_t D, float* o, bool add) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    F8 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = add ? load8(o + d0 + 8 * i) : zero8();
    for (int64_t j = 0; j < len; ++j) {
      const F8 pj = set8(p[j]);
      for (int i = 0; i < 8; ++i) acc[i] = fmadd8(pj, load8(values + j * D + d0 + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) store8(o + d0 + 8 * i, acc[i]);
  }
  for (; d0 + 8 <= D; d0 += 8) {
    F8 acc = add ? load8(o + d0) : zero8();
    for (int64_t j = 0; j < len; ++j) acc = fmadd8(set8(p[j]), load8(values + j * D + d0), acc);
    store8(o + d0, acc);
  }
  for (int64_t d = d0; d < D; ++d) {
    float s = add ? o[d] : 0.0f;
    for (int64_t j = 0; j < len; ++j) s = std::fma(p[j], widen(values[j * D + d]), s);
    o[d] = s;
  }
}

// Values in pieces of 64, each piece summed for every row's every head in turn: sum_of's pieces are
// the same bits as one sum, and a piece stays in L1 for all of them.
template <typename C>
void sums_of(const float* p, int64_t rows, int64_t n, int64_t p_stride, const C* values, int64_t len, int64_t D,
             float* o, int64_t o_stride) {
  constexpr int64_t PIECE = 64;
  for (int64_t j = 0; j < len; j += PIECE)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < n; ++h)
        sum_of(p + (r * n + h) * p_stride + j, values + j * D, std::min(PIECE, len - j), D, o + r * o_stride + h * D,
               j > 0);
}

void scores_rows(const float* q, int64_t rows, int64_t q_stride, int64_t n, const float* keys, int64_t len, int64_t D,
                 float scaling, float* out, int64_t out_stride) {
  scores_of(q, rows, q_stride, n, keys, len, D, scaling, out, out_stride);
}

void scores_rows(const float* q, int64_t rows, int64_t q_stride, int64_t n, const Half* keys, int64_t len, int64_t D,
                 float scaling, float* out, int64_t out_stride) {
  scores_of(q, rows, q_stride, n, keys, len, D, scaling, out, out_stride);
}

void weighted_sum(const float* p, const float* values, int64_t len, int64_t D, float* o, bool add) {
  sum_of(p, values, len, D, o, add);
}

void weighted_sum(const float* p, const Half* values, int64_t len, int64_t D, float* o, bool add) {
  sum_of(p, values, len, D, o, add);
}

void weighted_sum_rows(const float* p, int64_t rows, int64_t n, int64_t p_stride, const float* values, int64_t len,
                       int64_t D, float* o, int64_t o_stride) {
  sums_of(p, rows, n, p_stride, values, len, D, o, o_stride);
}

void weighted_sum_rows(const float* p, int64_t rows, int64_t n, int64_t p_stride, const Half* values, int64_t len,
                       int64_t D, float* o, int64_t o_stride) {
  sums_of(p, rows, n, p_stride, values, len, D, o, o_stride);
}

void exp_shifted(float* v, int64_t n, float shift) {
  const F8 s = set8(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(v + i, exp8(sub8(load8(v + i), s)));
  if (i < n) {
    float tail[8] = {};
    std::copy(v + i, v + n, tail);
    store8(tail, exp8(sub8(load8(tail), s)));
    std::copy(tail, tail + (n - i), v + i);
  }
}

// The maximum in 8 lanes, then the tail (a maximum is the same in any order), exp_shifted by it;
// the sum in 8 lanes over the whole blocks, a fixed horizontal sum, then the tail in order.
void softmax(float* v, int64_t n) {
  const int64_t n8 = n - n % 8;
  float top = v[0];
  if (n8) {
    F8 m = load8(v);
    for (int64_t i = 8; i < n8; i += 8) m = max8(m, load8(v + i));
    top = hmax(m);
  }
  for (int64_t i = n8; i < n; ++i) top = std::max(top, v[i]);
  exp_shifted(v, n, top);
  F8 acc = zero8();
  for (int64_t i = 0; i < n8; i += 8) acc = add8(acc, load8(v + i));
  float total = hsum(acc);
  for (int64_t i = n8; i < n; ++i) total += v[i];
  const F8 t = set8(total);
  for (int64_t i = 0; i < n8; i += 8) store8(v + i, div8(load8(v + i), t));
  for (int64_t i = n8; i < n; ++i) v[i] /= total;
}

void gated(bool gelu, const float* gate, const float* up, float* out, int64_t n) {
  if (gelu) gated_n<true>(gate, up, out, n);
  else gated_n<false>(gate, up, out, n);
}

void rms_norm(const float* x, int64_t M, int64_t H, const float* weight, float eps, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    double sum = 0;
    for (int64_t i = 0; i < H; ++i) sum += x[m * H + i] * x[m * H + i];
    float inv = 1.0f / std::sqrt(static_cast<float>(sum / H) + eps);
    for (int64_t i = 0; i < H; ++i) y[m * H + i] = x[m * H + i] * inv * weight[i];
  }
}

}  // namespace anyspec
