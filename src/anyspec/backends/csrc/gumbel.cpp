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

#include "quant.h"

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

struct Best {
  double value;
  int64_t at;
  void consider(double logit, uint64_t k, int64_t v) {  // exact: ties go to the first entry
    const double x = logit + anyspec::value(k);
    if (x > value || (x == value && v < at)) value = x, at = v;
  }
};

// Entries [begin, end) of a row against the best so far: skipped unhashed where the logit is too far
// below it, skipped hashed where the integer's bound is, computed where neither.
void scan(const float* row, int64_t begin, int64_t end, uint64_t key, const int64_t* twins, uint64_t twin_key,
          double margin, Best& best) {
  for (int64_t v = begin; v < end; ++v) {
    const double logit = row[v];
    if (!(logit + CEILING + margin >= best.value)) continue;  // -inf too
    const uint64_t k = twins && twins[v] >= 0 ? bits(twin_key, static_cast<uint64_t>(twins[v])) : bits(key, v);
    if (logit + bound(k) + margin >= best.value) best.consider(logit, k, v);
  }
}

#if ANYSPEC_X86
#define AVX512_DQ_CD __attribute__((target("avx512f,avx512dq,avx512cd")))

// scan() of a row without twins, 8 entries a step: their logits, integers (vpmullq) and bounds
// (vplzcntq) in vector registers; the few entries that reach the best go through Best::consider in
// order, so the choice is scan()'s.
AVX512_DQ_CD void scan512(const float* row, int64_t V, uint64_t key, double margin, Best& best) {
  const __m512i golden = _mm512_set1_epi64(static_cast<int64_t>(GOLDEN)), step = _mm512_set1_epi64(8);
  const __m512i mul1 = _mm512_set1_epi64(static_cast<int64_t>(0xBF58476D1CE4E5B9ull));
  const __m512i mul2 = _mm512_set1_epi64(static_cast<int64_t>(0x94D049BB133111EBull));
  const __m512i top = _mm512_set1_epi64((1ll << 53) - 1), ten = _mm512_set1_epi64(10);
  const __m512i start = _mm512_set1_epi64(static_cast<int64_t>(key));
  const __m512d ceiling = _mm512_set1_pd(CEILING), ln2 = _mm512_set1_pd(LN2);
  __m512i counter = _mm512_setr_epi64(1, 2, 3, 4, 5, 6, 7, 8);  // entry v's counter + 1
  int64_t v = 0;
  alignas(64) uint64_t ks[8];
  for (; v + 8 <= V; v += 8, counter = _mm512_add_epi64(counter, step)) {
    const __m512d logit = _mm512_cvtps_pd(_mm256_loadu_ps(row + v));
    const __m512d need = _mm512_set1_pd(best.value - margin);
    const __mmask8 near = _mm512_cmp_pd_mask(_mm512_add_pd(logit, ceiling), need, _CMP_GE_OQ);
    if (!near) continue;
    __m512i x = _mm512_add_epi64(_mm512_mullo_epi64(counter, golden), start);
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)), mul1);
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)), mul2);
    const __m512i k = _mm512_srli_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 31)), 12);
    const __m512i lz = _mm512_lzcnt_epi64(_mm512_sub_epi64(top, _mm512_add_epi64(k, k)));  // of n
    const __m512d bound = _mm512_mul_pd(_mm512_cvtepi64_pd(_mm512_sub_epi64(lz, ten)), ln2);
    __mmask8 reach = _mm512_mask_cmp_pd_mask(near, _mm512_add_pd(logit, bound), need, _CMP_GE_OQ);
    if (!reach) continue;
    _mm512_store_si512(ks, k);
    for (; reach; reach &= reach - 1) {
      const int lane = __builtin_ctz(reach);
      best.consider(row[v + lane], ks[lane], v + lane);
    }
  }
  scan(row, v, V, key, nullptr, 0, margin, best);
}

bool vector_scan() {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512cd");
  return cpu && std::min(isa(), cpu_isa()) >= 2;  // ANYSPEC_ISA=avx2 or plain: scan()
}
#endif

int64_t pick(const float* row, int64_t V, uint64_t key, const int64_t* twins, uint64_t twin_key) {
  int64_t chosen = -1;
  float top = -std::numeric_limits<float>::infinity();
  double largest = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (row[v] > top) top = row[v], chosen = v;
    if (row[v] > -std::numeric_limits<float>::infinity()) largest = std::max(largest, std::fabs(double(row[v])));
  }
  if (chosen < 0) return 0;
  const double margin = 1e-9 * (CEILING + largest);  // float64 roundings, far below it
  const uint64_t k = twins && twins[chosen] >= 0 ? bits(twin_key, static_cast<uint64_t>(twins[chosen]))
                                                 : bits(key, chosen);
  Best best{double(row[chosen]) + value(k), chosen};
#if ANYSPEC_X86
  if (!twins && vector_scan()) {
    scan512(row, V, key, margin, best);
    return best.at;
  }
#endif
  scan(row, 0, V, key, twins, twin_key, margin, best);
  return best.at;
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
