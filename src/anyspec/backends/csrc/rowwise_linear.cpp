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
#include <cstdint>
#include <cstring>

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
  constexpr int RW = RX == 1 ? 4 : RX == 2 ? 4 : RX == 3 ? 3 : 2;
  for (int64_t n = 0; n < rows;) {
    const float* sn = scale ? scale + n : nullptr;
    const float* bn = bias ? bias + n : nullptr;
    if (n + RW <= rows) {
      block<T, RW, RX>(x, w + n * K, K, sn, bn, y + n, N);
      n += RW;
    } else {
      block<T, 1, RX>(x, w + n * K, K, sn, bn, y + n, N);
      n += 1;
    }
  }
}

template <typename T>
void matmul(const float* x, int64_t M, const T* w, int64_t N, int64_t K, const float* scale,
            const float* bias, float* y) {
  int64_t chunks = (N + CHUNK - 1) / CHUNK;
  at::parallel_for(0, chunks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      int64_t n = c * CHUNK, rows = std::min(CHUNK, N - n);
      for (int64_t m = 0; m < M; m += MAX_RX) {
        const float* xm = x + m * K;
        const float* sn = scale ? scale + n : nullptr;
        const float* bn = bias ? bias + n : nullptr;
        float* ym = y + m * N + n;
        switch (std::min(MAX_RX, M - m)) {
          case 6: chunk<T, 6>(xm, w + n * K, rows, K, sn, bn, ym, N); break;
          case 5: chunk<T, 5>(xm, w + n * K, rows, K, sn, bn, ym, N); break;
          case 4: chunk<T, 4>(xm, w + n * K, rows, K, sn, bn, ym, N); break;
          case 3: chunk<T, 3>(xm, w + n * K, rows, K, sn, bn, ym, N); break;
          case 2: chunk<T, 2>(xm, w + n * K, rows, K, sn, bn, ym, N); break;
          default: chunk<T, 1>(xm, w + n * K, rows, K, sn, bn, ym, N); break;
        }
      }
    }
  });
}

torch::Tensor linear(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> scale,
                     c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "shape mismatch");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "CPU tensors only");
  x = x.to(torch::kFloat32).contiguous();
  weight = weight.contiguous();
  int64_t M = x.size(0), N = weight.size(0), K = weight.size(1);
  torch::Tensor s, b;
  if (scale.has_value()) s = scale->to(torch::kFloat32).contiguous();
  if (bias.has_value()) b = bias->to(torch::kFloat32).contiguous();
  const float* sp = s.defined() ? s.data_ptr<float>() : nullptr;
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto y = torch::empty({M, N}, x.options());
  if (weight.scalar_type() == torch::kBFloat16) {
    matmul(x.data_ptr<float>(), M, reinterpret_cast<const uint16_t*>(weight.data_ptr()), N, K, sp, bp,
           y.data_ptr<float>());
  } else {
    TORCH_CHECK(weight.scalar_type() == torch::kInt8 && sp, "weights must be bf16, or int8 with a scale");
    matmul(x.data_ptr<float>(), M, weight.data_ptr<int8_t>(), N, K, sp, bp, y.data_ptr<float>());
  }
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("linear", &linear, "few-row linear, AVX2"); }
