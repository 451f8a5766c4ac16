// Sampled rows' choices: Gumbel-max with counter-based noise, as algorithms/gumbel.py defines them
// (its docstring holds the noise and the bound used here). Each entry's integer is a few multiplies;
// its noise needs two logarithms, so they are taken only for entries whose bound reaches the best
// value found so far, and entries whose logit is too far below it are not hashed at all.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace anyspec {
namespace {

constexpr uint64_t GOLDEN = 0x9E3779B97F4A7C15ull;
constexpr double LN2 = 0.69314718055994530942;
constexpr double CEILING = 53 * LN2;

inline uint64_t bits(uint64_t key, uint64_t counter) {
  uint64_t x = (counter + 1) * GOLDEN + key;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x >> 12;
}

inline double value(uint64_t k) { return -std::log(-std::log(static_cast<double>(2 * k + 1) * 0x1p-53)); }

inline double bound(uint64_t k) {  // n = 2^53 - 2k - 1 >= 1: G <= (53 - floor(log2 n)) ln 2
  const uint64_t n = (1ull << 53) - 2 * k - 1;
  return (53 - (63 - __builtin_clzll(n))) * LN2;
}

int64_t pick(const float* row, int64_t V, uint64_t key, const int64_t* twins, uint64_t twin_key) {
  auto integer = [&](int64_t v) {
    return twins && twins[v] >= 0 ? bits(twin_key, static_cast<uint64_t>(twins[v])) : bits(key, v);
  };
  int64_t chosen = -1;
  float top = -std::numeric_limits<float>::infinity();
  double largest = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (row[v] > top) top = row[v], chosen = v;
    if (row[v] > -std::numeric_limits<float>::infinity()) largest = std::max(largest, std::fabs(double(row[v])));
  }
  if (chosen < 0) return 0;
  const double margin = 1e-9 * (CEILING + largest);  // float64 roundings, far below it
  double best = double(row[chosen]) + value(integer(chosen));
  for (int64_t v = 0; v < V; ++v) {
    const double logit = row[v];
    if (!(logit + CEILING + margin >= best)) continue;  // -inf too
    const uint64_t k = integer(v);
    if (logit + bound(k) + margin < best) continue;
    const double x = logit + value(k);
    if (x > best || (x == best && v < chosen)) best = x, chosen = v;
  }
  return chosen;
}

// Each row's choice from rows [R, V] (float32), row r with the noise of keys[r], and where twins (V
// entries or more) is given and twins[v] >= 0, entry twins[v] of the noise of twin_keys[r].
std::vector<int64_t> gumbel_choose(torch::Tensor rows, std::vector<uint64_t> keys,
                                   std::optional<torch::Tensor> twins, std::vector<uint64_t> twin_keys) {
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == torch::kFloat32, "gumbel_choose: rows [R, V] float32");
  TORCH_CHECK(static_cast<int64_t>(keys.size()) == rows.size(0), "gumbel_choose: one key a row");
  rows = rows.contiguous();
  torch::Tensor map;
  if (twins) {
    map = twins->contiguous();
    TORCH_CHECK(map.scalar_type() == torch::kInt64 && map.dim() == 1 && map.size(0) >= rows.size(1),
                "gumbel_choose: twins [V or more] int64");
    TORCH_CHECK(twin_keys.size() == keys.size(), "gumbel_choose: one twin key a row");
  }
  const int64_t R = rows.size(0), V = rows.size(1);
  std::vector<int64_t> out(R);
  const float* x = rows.data_ptr<float>();
  const int64_t* twin = twins ? map.data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) out[r] = pick(x + r * V, V, keys[r], twin, twin ? twin_keys[r] : 0);
  });
  return out;
}

}  // namespace

void bind_gumbel(pybind11::module_& m) {
  m.def("gumbel_choose", &gumbel_choose, "sampled rows' Gumbel-max choices (algorithms/gumbel.py)",
        pybind11::arg("rows"), pybind11::arg("keys"), pybind11::arg("twins") = std::nullopt,
        pybind11::arg("twin_keys") = std::vector<uint64_t>{}, pybind11::call_guard<pybind11::gil_scoped_release>());
}

}  // namespace anyspec
