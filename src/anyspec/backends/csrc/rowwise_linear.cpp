// y[M, N] = x[M, K] . W[N, K]^T for few rows M (the k+1 tokens of a verify), AVX2 + FMA.
//
// W is stored as bf16 (the top half of an fp32) or as int8 with one fp32 scale per output row;
// x and y are fp32. Every output y[m, n] is the same sequence of operations whatever M is and
// whichever rows are computed together: 8 fp32 lanes accumulate k in order, then a fixed
// horizontal sum and a scalar tail. So scoring k+1 tokens at once gives bit-identical rows to
// scoring them one by one, which speculative decoding needs for its output to equal the
// target's. The weights are read from memory once per call however many rows there are, which
// is what makes a multi-token forward cost about as much as a one-token forward.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <vector>

#include "quant.h"

namespace {

constexpr int64_t CHUNK = 8;  // weight rows per parallel task
constexpr int64_t MAX_RX = 6;  // input rows per pass
constexpr int64_t PREFETCH = 8192;  // bytes ahead of the weight stream: keeps DRAM busy while FMAs run
constexpr int64_t LINE = 64;

inline __m256 load8(const uint16_t* p) {  // bf16 -> fp32: widen and shift into the high half
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 load8(const int8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

inline float scalar(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float scalar(int8_t v) { return static_cast<float>(v); }

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline float scalar(float v) { return v; }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// RW weight rows times RX input rows, each weight vector converted once and used RX times.
template <typename T, int RW, int RX>
inline void block(const float* x, const T* w, int64_t K, const float* scale, const float* bias,
                  float* y, int64_t N) {
  __m256 acc[RW][RX];
  for (int i = 0; i < RW; ++i)
    for (int j = 0; j < RX; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[RW];
    if ((k & (LINE / sizeof(T) - 1)) == 0)
      for (int i = 0; i < RW; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(w + i * K + k) + PREFETCH, _MM_HINT_T0);
    for (int i = 0; i < RW; ++i) wv[i] = load8(w + i * K + k);
    for (int j = 0; j < RX; ++j) {
      __m256 xv = _mm256_loadu_ps(x + j * K + k);
      for (int i = 0; i < RW; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
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

// rows weight rows (at most CHUNK) against RX input rows; RW keeps the accumulators in registers.
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

// Set while decoder_forward's parallel region runs (calls come in under the GIL, one at a time).
bool in_stack = false;

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

template <typename T>
void matmul(const float* x, int64_t M, const T* w, int64_t N, int64_t K, const float* scale,
            const float* bias, float* y, int64_t ldy) {
  int64_t chunks = (N + CHUNK - 1) / CHUNK;
  split(chunks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      int64_t n = c * CHUNK, rows = std::min(CHUNK, N - n);
      for (int64_t m = 0; m < M; m += MAX_RX) {
        const float* xm = x + m * K;
        const float* sn = scale ? scale + n : nullptr;
        const float* bn = bias ? bias + n : nullptr;
        float* ym = y + m * ldy + n;
        switch (std::min(MAX_RX, M - m)) {
          case 6: chunk<T, 6>(xm, w + n * K, rows, K, sn, bn, ym, ldy); break;
          case 5: chunk<T, 5>(xm, w + n * K, rows, K, sn, bn, ym, ldy); break;
          case 4: chunk<T, 4>(xm, w + n * K, rows, K, sn, bn, ym, ldy); break;
          case 3: chunk<T, 3>(xm, w + n * K, rows, K, sn, bn, ym, ldy); break;
          case 2: chunk<T, 2>(xm, w + n * K, rows, K, sn, bn, ym, ldy); break;
          default: chunk<T, 1>(xm, w + n * K, rows, K, sn, bn, ym, ldy); break;
        }
      }
    }
  });
}

// ---- a whole Llama-family decoder stack for a few new tokens (the lean forward's hot loop) ----

using Tensors = std::vector<torch::Tensor>;

const float* ptr_or_null(const torch::Tensor& t) { return t.numel() ? t.data_ptr<float>() : nullptr; }

// A matrix of the stack: a GGUF block type (quant.h) or BF16 / I8S / F32 row-wise weights [N, K].
struct Mat {
  int64_t type = anyspec::F32, N = 0, K = 0;
  const void* w = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;
};

Mat mat(const torch::Tensor& w, const torch::Tensor& scale, const torch::Tensor& bias, int64_t type, int64_t K) {
  Mat m;
  m.type = type, m.K = K, m.N = w.numel() ? w.size(0) : 0;
  m.w = w.numel() ? w.data_ptr() : nullptr;
  m.scale = ptr_or_null(scale);
  m.bias = ptr_or_null(bias);
  return m;
}

// The activation rows quantized once per product, for the block size each quantized type needs.
// They are sized before the stack's parallel region (size_for), so that its threads only fill them.
struct Acts {
  anyspec::Act by32, by256;
  const anyspec::Act& of(int64_t type) const { return anyspec::block_size(type) == 32 ? by32 : by256; }
};

// Room in acts for M rows of the inputs of product m.
void size_for(Acts& acts, const Mat& m, int64_t M) {
  if (!m.N || !anyspec::is_quantized(m.type)) return;
  anyspec::Act& a = anyspec::block_size(m.type) == 32 ? acts.by32 : acts.by256;
  anyspec::prepare(a, M, m.K, anyspec::block_size(m.type));
}

// y[M, sum of N] = x[M, K] . [W_0; W_1; ...]^T: the outputs of `mats` side by side (row stride ldy).
// Inside the stack's parallel region every thread calls it. Quantized weights first need the
// activation rows quantized (each row by itself, the rows split across the threads), then all their
// products are one split, so one barrier for the lot; row-wise weights (bf16, int8, fp32) take x as
// it is, with no barrier before.
void apply(const float* x, int64_t M, const Mat* mats, int count, float* y, int64_t ldy, Acts& acts) {
  constexpr int MOST = 4;  // products a call takes: its callers pass 1 to 3
  bool need32 = false, need256 = false;
  int64_t offset[MOST], groups[MOST], rows[MOST], total = 0;
  for (int i = 0, at = 0; i < count; at += mats[i].N, ++i) {
    const Mat& m = mats[i];
    const bool quantized = m.N && anyspec::is_quantized(m.type);
    need32 |= quantized && anyspec::block_size(m.type) == 32;
    need256 |= quantized && anyspec::block_size(m.type) == 256;
    rows[i] = anyspec::x16_group_bytes(m.type) ? 16 : CHUNK;  // interleaved: whole groups
    offset[i] = at;
    groups[i] = quantized ? (m.N + rows[i] - 1) / rows[i] : 0;
    total += groups[i];
  }
  if (need32 || need256) {  // the same on every thread, so every thread meets the same barriers
    split(M, 1, [&](int64_t r0, int64_t r1) {
      if (need32) anyspec::quantize_rows(x, acts.by32, r0, r1);
      if (need256) anyspec::quantize_rows(x, acts.by256, r0, r1);
    });
  }
  if (total) {
    split(total, 4, [&](int64_t begin, int64_t end) {
      for (int i = 0, first = 0; i < count; first += groups[i], ++i) {
        const Mat& m = mats[i];
        const uint8_t* w = static_cast<const uint8_t*>(m.w);
        for (int64_t c = std::max<int64_t>(begin, first); c < std::min<int64_t>(end, first + groups[i]); ++c)
          anyspec::qmatmul_rows(m.type, w, m.K, acts.of(m.type), m.bias, y + offset[i], ldy,
                                (c - first) * rows[i], std::min(m.N, (c - first + 1) * rows[i]));
      }
    });
  }
  for (int i = 0; i < count; ++i) {
    const Mat& m = mats[i];
    if (!m.N || anyspec::is_quantized(m.type)) continue;
    float* out = y + offset[i];
    if (m.type == anyspec::BF16) {
      matmul(x, M, static_cast<const uint16_t*>(m.w), m.N, m.K, m.scale, m.bias, out, ldy);
    } else if (m.type == anyspec::I8S) {
      matmul(x, M, static_cast<const int8_t*>(m.w), m.N, m.K, m.scale, m.bias, out, ldy);
    } else {
      matmul(x, M, static_cast<const float*>(m.w), m.N, m.K, m.scale, m.bias, out, ldy);
    }
  }
}

void rms_norm(const float* x, int64_t M, int64_t H, const float* weight, float eps, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    double sum = 0;
    for (int64_t i = 0; i < H; ++i) sum += x[m * H + i] * x[m * H + i];
    float inv = 1.0f / std::sqrt(static_cast<float>(sum / H) + eps);
    for (int64_t i = 0; i < H; ++i) y[m * H + i] = x[m * H + i] * inv * weight[i];
  }
}

// transformers' rotary layout: the two halves of a head rotate together.
void rotate(float* v, const float* cos, const float* sin, int64_t D) {
  int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) {
    float a = v[d], b = v[d + half];
    v[d] = a * cos[d] - b * sin[d];
    v[d + half] = b * cos[d + half] + a * sin[d + half];
  }
}

// ggml's "normal" rotary layout (GGUF llama models): adjacent pairs rotate together.
void rotate_pairs(float* v, const float* cos, const float* sin, int64_t D) {
  for (int64_t i = 0; i < D / 2; ++i) {
    float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * cos[i] - b * sin[i];
    v[2 * i + 1] = b * cos[i] + a * sin[i];
  }
}

// out[j] = q . k_j * scaling for the len keys k_j (rows of D), eight keys at a time; each key's sum
// runs in a fixed order (8 fp32 lanes over d, a fixed horizontal sum, then a scalar tail).
void scores(const float* q, const float* keys, int64_t len, int64_t D, float scaling, float* out) {
  const int64_t D8 = D - D % 8;
  for (int64_t j0 = 0; j0 < len; j0 += 8) {
    const int64_t n = std::min<int64_t>(8, len - j0);
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t d = 0; d < D8; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      for (int64_t i = 0; i < n; ++i) acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + (j0 + i) * D + d), acc[i]);
    }
    for (int64_t i = 0; i < n; ++i) {
      float s = hsum(acc[i]);
      for (int64_t d = D8; d < D; ++d) s += q[d] * keys[(j0 + i) * D + d];
      out[j0 + i] = s * scaling;
    }
  }
}

// o[d] = sum over j in order of p[j] * v_j[d] for the len value rows v_j, 64 d at a time in registers
// (a narrower tail: 8 d at a time, then one by one).
void weighted_sum(const float* p, const float* values, int64_t len, int64_t D, float* o) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t j = 0; j < len; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(values + j * D + d0 + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + d0 + 8 * i, acc[i]);
  }
  for (; d0 + 8 <= D; d0 += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < len; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(values + j * D + d0), acc);
    _mm256_storeu_ps(o + d0, acc);
  }
  for (int64_t d = d0; d < D; ++d) {
    float s = 0;
    for (int64_t j = 0; j < len; ++j) s = std::fma(p[j], values[j * D + d], s);
    o[d] = s;
  }
}

// exp of 8 floats (Cephes' expf: 2^n times a degree-6 polynomial of the remainder), arguments
// clamped to [-87.3, 88.4] so the result stays finite and normal.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.37626f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(c));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n));
}

// v[i] = exp(v[i] - shift) for i < n, eight at a time (a short tail through a padded copy).
void exp_shifted(float* v, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), s)));
  if (i < n) {
    float tail[8] = {};
    std::copy(v + i, v + n, tail);
    _mm256_storeu_ps(tail, exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), s)));
    std::copy(tail, tail + (n - i), v + i);
  }
}

inline __m256 silu_times(__m256 gate, __m256 up) {
  const __m256 sig = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gate)));
  return _mm256_mul_ps(_mm256_div_ps(gate, sig), up);
}

// out[i] = SiLU(gate[i]) * up[i] for i < n, eight at a time (a short tail through a padded copy).
void silu_times(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, silu_times(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    float g[8] = {}, u[8] = {}, o[8];
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    _mm256_storeu_ps(o, silu_times(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
    std::copy(o, o + (n - i), out + i);
  }
}

// Where one query row attends: its sequence's cache of keys and values [kv_heads, cap, D] and its
// position there (the row attends to positions 0..pos, its own key and value already written).
struct RowCache {
  const float* k;
  const float* v;
  int64_t cap, pos;
};

// Causal attention for M query rows, row m over rows[m]'s cache; query row m, head h at
// q + m * q_stride + h * D; out is [M, heads * D]. Each (row, head) is computed alone in a fixed
// order, so a row's result depends neither on M nor on the other rows' sequences.
void attend(const float* q_all, int64_t q_stride, int64_t M, int64_t heads, int64_t kv_heads, int64_t D,
            const RowCache* rows, float scaling, float* out) {
  const int64_t group = heads / kv_heads;
  int64_t longest = 0;
  for (int64_t m = 0; m < M; ++m) longest = std::max(longest, rows[m].pos + 1);
  split(heads * M, 1, [&](int64_t begin, int64_t stop) {
    std::vector<float> p(longest);
    for (int64_t task = begin; task < stop; ++task) {
      const int64_t hd = task / M, m = task % M, g = hd / group, len = rows[m].pos + 1;
      const int64_t offset = g * rows[m].cap * D;
      scores(q_all + m * q_stride + hd * D, rows[m].k + offset, len, D, scaling, p.data());
      exp_shifted(p.data(), len, *std::max_element(p.data(), p.data() + len));
      float total = 0;
      for (int64_t j = 0; j < len; ++j) total += p[j];
      for (int64_t j = 0; j < len; ++j) p[j] /= total;
      weighted_sum(p.data(), rows[m].v + offset, len, D, out + m * heads * D + hd * D);
    }
  });
}

// transformers' attention interface: query [heads, M, D], key/value [kv_heads, L, D] with the new
// rows last; returns [M, heads, D] in fp32.
torch::Tensor attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, double scaling) {
  auto q = query.to(torch::kFloat32).transpose(0, 1).contiguous();
  auto k = key.to(torch::kFloat32).contiguous();
  auto v = value.to(torch::kFloat32).contiguous();
  const int64_t M = q.size(0), heads = q.size(1), D = q.size(2), kv_heads = k.size(0), L = k.size(1);
  TORCH_CHECK(L >= M && heads % kv_heads == 0 && k.size(2) == D, "attention: shape mismatch");
  auto out = torch::empty({M, heads, D}, q.options());
  std::vector<RowCache> rows(M);
  for (int64_t m = 0; m < M; ++m) rows[m] = {k.data_ptr<float>(), v.data_ptr<float>(), L, L - M + m};
  attend(q.data_ptr<float>(), heads * D, M, heads, kv_heads, D, rows.data(), static_cast<float>(scaling),
         out.data_ptr<float>());
  return out;
}

// Each layer: attn_norm, mlp_norm, then 7 matrices q, k, v, o, gate, up, down as (weight, scale, bias)
// (an empty tensor for a missing one; q may hold q, k and v fused, and gate may hold gate and up);
// types and Ks: 7 per layer. x: [M, H] embeddings of new tokens of one or more sequences: row m
// belongs to sequence seqs[m] at position positions[m], and keys / values hold each sequence's
// cache, one tensor [kv_heads, capacity, head_dim] per layer, sequence after sequence. cos and sin
// are the rows' rotary angles [M, head_dim]. A sequence's rows come in order of position. Returns
// the hidden states after the last layer.
torch::Tensor decoder_forward(torch::Tensor x, torch::Tensor positions, torch::Tensor seqs, Tensors layers,
                              std::vector<int64_t> types, std::vector<int64_t> ks, Tensors keys, Tensors values,
                              torch::Tensor cos, torch::Tensor sin, int64_t heads, int64_t kv_heads,
                              int64_t head_dim, double eps_d, bool rope_pairs) {
  x = x.to(torch::kFloat32).contiguous().clone();
  const int64_t M = x.size(0), H = x.size(1), D = head_dim, L = layers.size() / 23;
  const int64_t q_size = heads * D, kv_size = kv_heads * D, qkv_size = q_size + 2 * kv_size;
  TORCH_CHECK(static_cast<int64_t>(layers.size()) == 23 * L && static_cast<int64_t>(types.size()) == 7 * L &&
              static_cast<int64_t>(ks.size()) == 7 * L, "decoder_forward: 23 tensors and 7 types per layer");
  const int64_t S = L ? keys.size() / L : 0;
  TORCH_CHECK(L && S && static_cast<int64_t>(keys.size()) == S * L && keys.size() == values.size(),
              "decoder_forward: a key and a value tensor per layer and sequence");
  positions = positions.to(torch::kLong).contiguous();
  seqs = seqs.to(torch::kLong).contiguous();
  TORCH_CHECK(positions.numel() == M && seqs.numel() == M && cos.size(0) == M && sin.size(0) == M,
              "decoder_forward: a position, a sequence and rotary angles per row");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* seq = seqs.data_ptr<int64_t>();
  for (int64_t r = 0; r < M; ++r)
    TORCH_CHECK(seq[r] >= 0 && seq[r] < S && pos[r] >= 0 && pos[r] < keys[seq[r] * L].size(1),
                "decoder_forward: row ", r, " is outside its sequence's cache");
  const float eps = static_cast<float>(eps_d), inv_sqrt = 1.0f / std::sqrt(static_cast<float>(D));
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* xp = x.data_ptr<float>();
  std::vector<Mat> mats(7 * L);
  for (int64_t i = 0; i < 7 * L; ++i) {
    const torch::Tensor* t = &layers[23 * (i / 7) + 2 + 3 * (i % 7)];
    mats[i] = mat(t[0], t[1], t[2], types[i], ks[i]);
  }
  const int64_t inter = (mats[4].N + mats[5].N) / 2;  // the same in every layer
  std::vector<float> h(M * H), qkv(M * qkv_size), attn(M * q_size), out(M * H);
  std::vector<float> gate_up(M * 2 * inter), act(M * inter);
  Acts acts[4];  // the inputs of q, k, v; of o; of gate and up; of down
  for (int64_t i = 0; i < 7 * L; ++i) size_for(acts[(i % 7 > 2) + (i % 7 > 3) + (i % 7 > 5)], mats[i], M);
  // One parallel region for the whole stack: the products and attention split across its
  // threads (split), the small serial steps run on one thread between barriers.
  in_stack = true;
#pragma omp parallel
  {
#pragma omp single
    rms_norm(xp, M, H, layers[0].data_ptr<float>(), eps, h.data());
    for (int64_t l = 0; l < L; ++l) {
      const Mat* m = &mats[7 * l];
      std::vector<RowCache> rows(M);
      for (int64_t r = 0; r < M; ++r) {
        const torch::Tensor& k = keys[seq[r] * L + l];
        rows[r] = {k.data_ptr<float>(), values[seq[r] * L + l].data_ptr<float>(), k.size(1), pos[r]};
      }
      apply(h.data(), M, m, 3, qkv.data(), qkv_size, acts[0]);
#pragma omp single
      for (int64_t r = 0; r < M; ++r) {
        float* row = qkv.data() + r * qkv_size;
        auto turn = [&](float* v) {
          if (rope_pairs) rotate_pairs(v, cp + r * D, sp + r * D, D);
          else rotate(v, cp + r * D, sp + r * D, D);
        };
        for (int64_t hd = 0; hd < heads; ++hd) turn(row + hd * D);
        for (int64_t g = 0; g < kv_heads; ++g) {
          float* k = row + q_size + g * D;
          turn(k);
          const int64_t at = (g * rows[r].cap + pos[r]) * D;
          std::memcpy(const_cast<float*>(rows[r].k) + at, k, D * sizeof(float));
          std::memcpy(const_cast<float*>(rows[r].v) + at, row + q_size + kv_size + g * D, D * sizeof(float));
        }
      }
      attend(qkv.data(), qkv_size, M, heads, kv_heads, D, rows.data(), inv_sqrt, attn.data());
      apply(attn.data(), M, m + 3, 1, out.data(), H, acts[1]);
#pragma omp single
      {
        for (int64_t i = 0; i < M * H; ++i) xp[i] += out[i];
        rms_norm(xp, M, H, layers[23 * l + 1].data_ptr<float>(), eps, h.data());
      }
      apply(h.data(), M, m + 4, 2, gate_up.data(), 2 * inter, acts[2]);
      const int64_t blocks = (inter + 63) / 64;  // SiLU(gate) * up, 64 values a task
      split(M * blocks, 4, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const int64_t r = b / blocks, i = b % blocks * 64;
          silu_times(&gate_up[r * 2 * inter + i], &gate_up[r * 2 * inter + inter + i], &act[r * inter + i],
                     std::min<int64_t>(64, inter - i));
        }
      });
      apply(act.data(), M, m + 6, 1, out.data(), H, acts[3]);
#pragma omp single
      {
        for (int64_t i = 0; i < M * H; ++i) xp[i] += out[i];
        if (l + 1 < L) rms_norm(xp, M, H, layers[23 * (l + 1)].data_ptr<float>(), eps, h.data());
      }
    }
  }
  in_stack = false;
  return x;
}

// y[M, N] = x[M, K] . W^T for one matrix of any type (the lm_head, tests).
torch::Tensor typed_linear(torch::Tensor x, torch::Tensor weight, int64_t type, int64_t K,
                           c10::optional<torch::Tensor> scale, c10::optional<torch::Tensor> bias) {
  x = x.to(torch::kFloat32).contiguous();
  weight = weight.contiguous();
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && weight.dim() == 2, "typed_linear: shape mismatch");
  torch::Tensor s = scale.has_value() ? scale->to(torch::kFloat32).contiguous() : torch::Tensor();
  torch::Tensor b = bias.has_value() ? bias->to(torch::kFloat32).contiguous() : torch::Tensor();
  const torch::Tensor none = torch::empty(0);
  Mat m = mat(weight, s.defined() ? s : none, b.defined() ? b : none, type, K);
  auto y = torch::empty({x.size(0), m.N}, x.options());
  Acts acts;
  size_for(acts, m, x.size(0));
  apply(x.data_ptr<float>(), x.size(0), &m, 1, y.data_ptr<float>(), m.N, acts);
  return y;
}

// RowwiseLinear's product: bf16 weights, or int8 weights with a scale per row.
torch::Tensor linear(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> scale,
                     c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "shape mismatch");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "CPU tensors only");
  const bool bf16 = weight.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(bf16 || (weight.scalar_type() == torch::kInt8 && scale.has_value()),
              "weights must be bf16, or int8 with a scale");
  return typed_linear(x, weight, bf16 ? anyspec::BF16 : anyspec::I8S, weight.size(1), scale, bias);
}

// RMS norm of each row of x [M, H] by itself (the sum of squares in double, in order), times weight.
torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor weight, double eps) {
  x = x.to(torch::kFloat32).contiguous();
  weight = weight.to(torch::kFloat32).contiguous();
  TORCH_CHECK(x.dim() == 2 && weight.numel() == x.size(1), "rms_norm_rows: shape mismatch");
  auto y = torch::empty_like(x);
  rms_norm(x.data_ptr<float>(), x.size(0), x.size(1), weight.data_ptr<float>(), static_cast<float>(eps),
           y.data_ptr<float>());
  return y;
}

// The fp32 rows `ids` of a matrix of any type (embedding lookups, tests).
torch::Tensor dequant_rows(torch::Tensor weight, int64_t type, int64_t K, torch::Tensor ids) {
  weight = weight.contiguous();
  ids = ids.to(torch::kLong).contiguous();
  const int64_t n = ids.numel(), row_bytes = weight.numel() * weight.element_size() / weight.size(0);
  auto out = torch::empty({n, K}, torch::kFloat32);
  const uint8_t* base = static_cast<const uint8_t*>(weight.data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = ids.data_ptr<int64_t>()[i];
    TORCH_CHECK(row >= 0 && row < weight.size(0), "dequant_rows: row out of range");
    if (anyspec::x16_group_bytes(type))
      anyspec::x16_dequant_row(type, base, K, row, out.data_ptr<float>() + i * K);
    else
      anyspec::dequant_row(type, base + row * row_bytes, K, out.data_ptr<float>() + i * K);
  }
  return out;
}

// Quantized rows [N, bytes] interleaved 16 at a time (x16.cpp): [N rounded up to 16, bytes of a
// group block / 16 * blocks]; the type of the result is x16_type(type).
torch::Tensor repack_x16(torch::Tensor weight, int64_t type, int64_t K) {
  TORCH_CHECK(anyspec::x16_type(type) && weight.dim() == 2 && weight.scalar_type() == torch::kUInt8,
              "repack_x16: rows of bytes of Q4_0, Q4_1, Q8_0, Q4_K or Q6_K");
  weight = weight.contiguous();
  const int64_t N = weight.size(0), nb = K / anyspec::block_size(type);
  const int64_t gbytes = anyspec::x16_group_bytes(anyspec::x16_type(type));
  TORCH_CHECK(weight.size(1) == nb * anyspec::block_bytes(type), "repack_x16: row bytes do not match K");
  auto out = torch::empty({(N + 15) / 16 * 16, nb * gbytes / 16}, weight.options());
  anyspec::repack_x16(type, weight.data_ptr<uint8_t>(), N, K, out.data_ptr<uint8_t>());
  return out;
}

}  // namespace

// The long calls let go of the GIL: a server's other threads stream answers while a pass runs,
// instead of waiting for it and then holding up the next one.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using free_gil = py::call_guard<py::gil_scoped_release>;
  m.def("linear", &linear, "few-row linear, AVX2", free_gil());
  m.def("attention", &attention, "causal attention, each query row alone", free_gil());
  m.def("decoder_forward", &decoder_forward, "a Llama-family decoder stack for a few new tokens", free_gil());
  m.def("typed_linear", &typed_linear, "few-row linear over weights of any supported type", free_gil());
  m.def("rms_norm_rows", &rms_norm_rows, "RMS norm of each row by itself");
  m.def("dequant_rows", &dequant_rows, "fp32 rows of a matrix of any supported type");
  m.def("repack_x16", &repack_x16, "quantized rows interleaved 16 at a time");
  m.def("isa", &anyspec::isa, "the instruction-set level in use: 0 plain C++, 1 AVX2, 2 AVX-512 VNNI");
  m.def("best_isa", &anyspec::best_isa, "the best instruction-set level this CPU has");
  m.def("set_isa", &anyspec::set_isa, "use an instruction-set level (at most the best one)");
}
