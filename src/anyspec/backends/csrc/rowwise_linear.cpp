// The kernel's Python module: row-wise products (bf16, or int8 with a scale per row), products of
// GGUF-quantized weights of any type, and how one matrix product is split across the threads.
//
// W is stored as bf16 (the top half of an fp32) or as int8 with one fp32 scale per output row;
// x and y are fp32. Each output row is computed alone (dense.cpp, x16.cpp), so scoring k+1 tokens
// at once gives the same bits as scoring them one by one.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <vector>

#include "dense.h"
#include "quant.h"
#include "stack.h"
#include "x16.h"

namespace {

constexpr int64_t CHUNK = 8;  // weight rows per parallel task

}  // namespace

namespace anyspec {

thread_local bool in_stack = false;

namespace {

template <typename T>
void matmul(const float* x, int64_t M, const T* w, int64_t N, int64_t K, const float* scale,
            const float* bias, float* y, int64_t ldy) {
  int64_t chunks = (N + CHUNK - 1) / CHUNK;
  split(chunks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      int64_t n = c * CHUNK, rows = std::min(CHUNK, N - n);
      rowwise_rows(x, M, w + n * K, rows, K, scale ? scale + n : nullptr, bias ? bias + n : nullptr, y + n, ldy);
    }
  });
}

}  // namespace

const float* ptr_or_null(const torch::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }

Mat mat(const torch::Tensor& w, const torch::Tensor& scale, const torch::Tensor& bias, int64_t type, int64_t K) {
  Mat m;
  const bool given = w.defined() && w.numel();
  m.type = type, m.K = K, m.N = given ? w.size(0) : 0;
  m.w = given ? w.data_ptr() : nullptr;
  m.scale = ptr_or_null(scale);
  m.bias = ptr_or_null(bias);
  return m;
}

void size_for(Acts& acts, const Mat& m, int64_t M) {
  if (!m.N || !anyspec::is_quantized(m.type)) return;
  anyspec::Act& a = anyspec::block_size(m.type) == 32 ? acts.by32 : acts.by256;
  anyspec::prepare(a, M, m.K, anyspec::block_size(m.type));
}

// y[M, sum of N] = x[M, K] . [W_0; W_1; ...]^T: the outputs of `mats` side by side (row stride ldy).
// Inside the stack's parallel region every thread calls it. Quantized weights first need the
// activation rows quantized (each row by itself, the rows split across the threads, or all of them
// on every thread into its own Acts), then all their products are one split, so one barrier for the
// lot; row-wise weights (bf16, int8, fp32) take x as it is, with no barrier before.
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
  const auto quantize = [&](int64_t r0, int64_t r1) {
    if (need32) anyspec::quantize_rows(x, acts.by32, r0, r1);
    if (need256) anyspec::quantize_rows(x, acts.by256, r0, r1);
  };
  if (acts.each)
    quantize(0, M);
  else if (need32 || need256)  // the same on every thread, so every thread meets the same barriers
    split(M, 1, quantize);
  if (total) {
    split(total, 4, [&](int64_t begin, int64_t end) {
      for (int i = 0, first = 0; i < count; first += groups[i], ++i) {
        const Mat& m = mats[i];
        // this thread's groups of the matrix in one call: the tiles' configuration is loaded once a call
        const int64_t lo = std::max<int64_t>(begin, first), hi = std::min<int64_t>(end, first + groups[i]);
        if (lo < hi)
          anyspec::qmatmul_rows(m.type, static_cast<const uint8_t*>(m.w), m.K, acts.of(m.type), m.bias,
                                y + offset[i], ldy, (lo - first) * rows[i], std::min(m.N, (hi - first) * rows[i]));
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

}  // namespace anyspec

namespace {

using anyspec::Acts;
using anyspec::Mat;

// y[M, N] = x[M, K] . W^T for one matrix of any type (the lm_head, tests).
torch::Tensor typed_linear(torch::Tensor x, torch::Tensor weight, int64_t type, int64_t K,
                           c10::optional<torch::Tensor> scale, c10::optional<torch::Tensor> bias) {
  x = x.to(torch::kFloat32).contiguous();
  weight = weight.contiguous();
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && weight.dim() == 2, "typed_linear: shape mismatch");
  torch::Tensor s = scale.has_value() ? scale->to(torch::kFloat32).contiguous() : torch::Tensor();
  torch::Tensor b = bias.has_value() ? bias->to(torch::kFloat32).contiguous() : torch::Tensor();
  const int64_t N = weight.size(0), padding = b.defined() ? N - b.numel() : 0;
  TORCH_CHECK(padding == 0 || (anyspec::x16_group_bytes(type) && padding > 0 && padding < 16),
              "typed_linear: the bias must have one value per output");
  if (padding) b = torch::constant_pad_nd(b, {0, padding});  // a repacked weight's zero rows give 0
  const torch::Tensor none = torch::empty(0);
  Mat m = anyspec::mat(weight, s.defined() ? s : none, b.defined() ? b : none, type, K);
  auto y = torch::empty({x.size(0), m.N}, x.options());
  Acts acts;
  anyspec::size_for(acts, m, x.size(0));
  anyspec::apply(x.data_ptr<float>(), x.size(0), &m, 1, y.data_ptr<float>(), m.N, acts);
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
  anyspec::rms_norm(x.data_ptr<float>(), x.size(0), x.size(1), weight.data_ptr<float>(), static_cast<float>(eps),
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
              "repack_x16: rows of bytes of a quantized type");
  weight = weight.contiguous();
  const int64_t target = anyspec::x16_type(type), N = weight.size(0);
  const int64_t gbytes = anyspec::x16_group_bytes(target), nb = K / anyspec::block_size(target);
  TORCH_CHECK(weight.size(1) == K / anyspec::block_size(type) * anyspec::block_bytes(type),
              "repack_x16: row bytes do not match K");
  auto out = torch::empty({(N + 15) / 16 * 16, nb * gbytes / 16}, weight.options());
  const uint8_t* src = weight.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t row_bytes = weight.size(1), group_bytes = nb * gbytes;
  at::parallel_for(0, (N + 15) / 16, 64, [&](int64_t g0, int64_t g1) {  // groups are independent
    anyspec::repack_x16(type, src + 16 * g0 * row_bytes, std::min(N, 16 * g1) - 16 * g0, K,
                        dst + g0 * group_bytes);
  });
  return out;
}

// c [16, 16] int32 plus a [16, 64] . b [16, 64] (uint8) on tiles of `rows` rows, `depth` bytes of A a
// row and `cols` dwords of C a row: on the stand-in, or on the CPU's tiles (hw).
torch::Tensor tile_product(torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t rows, int64_t depth,
                           int64_t cols, bool a_signed, bool hw) {
  TORCH_CHECK(a.scalar_type() == torch::kUInt8 && b.scalar_type() == torch::kUInt8 && c.scalar_type() == torch::kInt32 &&
                  a.sizes() == b.sizes() && a.size(0) == 16 && a.size(1) == 64 && c.size(0) == 16 && c.size(1) == 16,
              "tile_product: a, b [16, 64] uint8 and c [16, 16] int32");
  TORCH_CHECK(rows >= 1 && rows <= 16 && depth >= 4 && depth <= 64 && depth % 4 == 0 && cols >= 1 && cols <= 16,
              "tile_product: a shape palette 1 cannot hold");
  TORCH_CHECK(!hw || anyspec::amx_hw_usable(), "tile_product: this CPU or OS gives no AMX tiles");
  a = a.contiguous(), b = b.contiguous();
  torch::Tensor out = c.contiguous().clone();
  auto run = anyspec::standin_tiles::tile_product;
#if ANYSPEC_AMX_HW
  if (hw) run = anyspec::hw_tiles::tile_product;
#endif
  run(a.data_ptr<uint8_t>(), b.data_ptr<uint8_t>(), out.data_ptr<int32_t>(), static_cast<int>(rows),
      static_cast<int>(depth), static_cast<int>(cols), a_signed);
  return out;
}

}  // namespace

// The long calls let go of the GIL: a server's other threads stream answers while a pass runs,
// instead of waiting for it and then holding up the next one.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using free_gil = py::call_guard<py::gil_scoped_release>;
  m.def("linear", &linear, "few-row linear, bf16 or int8 weights", free_gil());
  anyspec::bind_decoder(m);
  anyspec::bind_gumbel(m);
  m.def("typed_linear", &typed_linear, "few-row linear over weights of any supported type", free_gil());
  m.def("rms_norm_rows", &rms_norm_rows, "RMS norm of each row by itself");
  m.def("dequant_rows", &dequant_rows, "fp32 rows of a matrix of any supported type");
  m.def("repack_x16", &repack_x16, "quantized rows interleaved 16 at a time");
  m.def("isa", &anyspec::isa, "the instruction-set level in use: 0 plain C++, 1 AVX2, 2 AVX-512 VNNI, 3 AMX");
  m.def("best_isa", &anyspec::best_isa, "the best instruction-set level this CPU has");
  m.def("set_isa", &anyspec::set_isa, "use an instruction-set level (at most the best one)");
  m.def("cpu_isa", &anyspec::cpu_isa, "the best vector level this CPU has (0-2), which level 3 takes for few rows");
  m.def("amx_hw_usable", &anyspec::amx_hw_usable, "whether this CPU and OS give the process AMX tiles");
  m.def("amx_standin", &anyspec::amx_standin, "whether level 3 runs the tiles' plain C++ stand-in");
  m.def("set_amx_standin", &anyspec::set_amx_standin, "level 3 on the tiles' stand-in, on any CPU");
  m.def("amx_rows", &anyspec::amx_rows, "the fewest activation rows level 3 takes to the tiles");
  m.def("set_amx_rows", &anyspec::set_amx_rows, "set the fewest activation rows level 3 takes to the tiles");
  m.def("tile_product", &tile_product, "one tdpbssd or tdpbusd on the stand-in or the CPU's tiles (tests)");
}