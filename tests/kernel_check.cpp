// The kernel's arithmetic without torch (quant.cpp, x16*.cpp, dense.cpp), for test_portable.py: it
// reads cases from argv[1], computes each at instruction-set level argv[3] and writes the fp32
// results, one case after another, to argv[2]. Built for different machines and flags, the outputs
// must be the same bytes.
//
// A case is five int64 (op, type, N, K, M), then its inputs, each padded to a multiple of 8 bytes:
//   0 product of quantized rows: weights [N, row bytes of type], x [M, K], bias [N]   -> y [M, N]
//   1 row-wise product (type BF16, I8S or F32): weights [N, K], scale [N], bias [N], x [M, K] -> y [M, N]
//   2 attention of one row over N keys of K values: q [K], keys [N, K], values [N, K]
//       -> the scores, their exp less the largest, the sum of the values weighted by those  [N + N + K]
//       (type 1: the keys and values rounded to fp16 first, and read as an fp16 cache)
//   3 act(gate) * up (type 1: GELU, 0: SiLU): gate [K], up [K]                          -> [K]
//   4 RMS norm of M rows: x [M, K], weight [K]                                           -> [M, K]
//   5 de-quantization: rows [N, row bytes of type]                                      -> [N, K]
//   6 fp32 to fp16, as an fp16 KV cache stores a value: x [K]                  -> the fp16 bits [K]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dense.h"
#include "quant.h"
#include "vec8.h"

using namespace anyspec;

namespace {

struct Input {
  std::vector<uint8_t> bytes;
  size_t at = 0;
  template <typename T>
  const T* take(int64_t n) {
    const T* p = reinterpret_cast<const T*>(bytes.data() + at);
    at = (at + n * sizeof(T) + 7) / 8 * 8;  // every array starts on 8 bytes
    if (at > bytes.size()) {
      std::fprintf(stderr, "kernel_check: the input ends inside a case\n");
      std::exit(2);
    }
    return p;
  }
};

int64_t row_bytes(int64_t type, int64_t K) {
  if (type == I8S) return K;
  return K / block_size(type) * block_bytes(type);
}

std::vector<float> product(int64_t type, int64_t N, int64_t K, int64_t M, Input& in) {
  const uint8_t* w = in.take<uint8_t>(N * row_bytes(type, K));
  const float* x = in.take<float>(M * K);
  const float* bias = in.take<float>(N);
  const int64_t target = x16_type(type);
  std::vector<uint8_t> packed((N + 15) / 16 * (K / block_size(target)) * x16_group_bytes(target));
  repack_x16(type, w, N, K, packed.data());
  Act act;
  prepare(act, M, K, block_size(target));
  quantize_rows(x, act, 0, M);
  std::vector<float> y(M * N);
  x16_rows(target, packed.data(), K, act, bias, y.data(), N, 0, N);
  return y;
}

std::vector<float> rowwise(int64_t type, int64_t N, int64_t K, int64_t M, Input& in) {
  std::vector<float> y(M * N);
  const uint8_t* w = in.take<uint8_t>(N * K * (type == F32 ? 4 : type == BF16 ? 2 : 1));
  const float* scale = in.take<float>(N);
  const float* bias = in.take<float>(N);
  const float* x = in.take<float>(M * K);
  if (type == BF16) rowwise_rows(x, M, reinterpret_cast<const uint16_t*>(w), N, K, nullptr, bias, y.data(), N);
  else if (type == I8S) rowwise_rows(x, M, reinterpret_cast<const int8_t*>(w), N, K, scale, bias, y.data(), N);
  else rowwise_rows(x, M, reinterpret_cast<const float*>(w), N, K, nullptr, bias, y.data(), N);
  return y;
}

template <typename C>
void attend_one(const float* q, const C* keys, const C* values, int64_t N, int64_t K, float* out) {
  scores_rows(q, 1, 0, 1, keys, N, K, 0.125f, out, 0);
  std::copy(out, out + N, out + N);
  exp_shifted(out + N, N, *std::max_element(out, out + N));
  weighted_sum(out + N, values, N, K, out + 2 * N);
}

std::vector<float> attention(int64_t type, int64_t N, int64_t K, Input& in) {
  const float* q = in.take<float>(K);
  const float* keys = in.take<float>(N * K);
  const float* values = in.take<float>(N * K);
  std::vector<float> out(2 * N + K);
  if (type == 1) {
    std::vector<Half> k(N * K), v(N * K);
    for (int64_t i = 0; i < N * K; ++i) k[i] = to_half(keys[i]), v[i] = to_half(values[i]);
    attend_one(q, k.data(), v.data(), N, K, out.data());
  } else {
    attend_one(q, keys, values, N, K, out.data());
  }
  return out;
}

std::vector<float> one(int64_t op, int64_t type, int64_t N, int64_t K, int64_t M, Input& in) {
  switch (op) {
    case 0: return product(type, N, K, M, in);
    case 1: return rowwise(type, N, K, M, in);
    case 2: return attention(type, N, K, in);
    case 6: {
      const float* x = in.take<float>(K);
      std::vector<float> out(K);
      for (int64_t i = 0; i < K; ++i) out[i] = to_half(x[i]).bits;
      return out;
    }
    case 3: {
      const float* gate = in.take<float>(K);
      const float* up = in.take<float>(K);
      std::vector<float> out(K);
      gated(type == 1, gate, up, out.data(), K);
      return out;
    }
    case 4: {
      const float* x = in.take<float>(M * K);
      const float* weight = in.take<float>(K);
      std::vector<float> out(M * K);
      rms_norm(x, M, K, weight, 1e-6f, out.data());
      return out;
    }
    default: {
      const uint8_t* rows = in.take<uint8_t>(N * row_bytes(type, K));
      std::vector<float> out(N * K);
      for (int64_t n = 0; n < N; ++n) dequant_row(type, rows + n * row_bytes(type, K), K, out.data() + n * K);
      return out;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: kernel_check CASES OUT LEVEL\n");
    return 2;
  }
  Input in;
  FILE* f = std::fopen(argv[1], "rb");
  if (!f) return 2;
  for (int c; (c = std::fgetc(f)) != EOF;) in.bytes.push_back(static_cast<uint8_t>(c));
  std::fclose(f);
  set_isa(std::atoi(argv[3]));
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 2;
  while (in.at < in.bytes.size()) {
    const int64_t* h = in.take<int64_t>(5);
    const std::vector<float> y = one(h[0], h[1], h[2], h[3], h[4], in);
    std::fwrite(y.data(), sizeof(float), y.size(), out);
  }
  std::fclose(out);
  std::printf("level %d\n", isa());
  return 0;
}
