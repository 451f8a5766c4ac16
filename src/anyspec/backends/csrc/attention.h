// Causal attention over KV caches of fp32 or fp16, each query row alone (attention.cpp): what the
// decoder stack (decoder.cpp) and transformers' attention interface run.
#pragma once
#include <torch/extension.h>

#include <cstdint>

namespace anyspec {

// Where one query row attends: its sequence's cache of keys and values [kv_heads, cap, D], fp32 or
// fp16 (`half`), and its position there. The row attends to positions first..pos (first > 0 in a
// sliding window), its own key and value already written. A row of a tree (a branch beside its
// siblings) attends to its own ancestors only: the last path_len of those positions are the cache
// slots path[0..path_len) (its own last), the others the slots of the same number; its own key
// and value are at its last slot.
struct RowCache {
  void* k;
  void* v;
  int64_t cap, pos, first = 0;
  const int64_t* path = nullptr;
  int64_t path_len = 0;
  bool half = false;

  int64_t slot() const { return path_len ? path[path_len - 1] : pos; }
  template <typename C>
  const C* keys() const { return static_cast<const C*>(k); }
  template <typename C>
  const C* values() const { return static_cast<const C*>(v); }
};

// Causal attention for M query rows, row m over rows[m]'s cache (all of fp32 or all of fp16); query
// row m, head h at q_all + m * q_stride + h * D; out is [M, heads * D]. Each (row, head) is computed
// alone in a fixed order, so a row's result depends neither on M nor on the other rows' sequences.
void attend(const float* q_all, int64_t q_stride, int64_t M, int64_t heads, int64_t kv_heads, int64_t D,
            const RowCache* rows, float scaling, float softcap, float* out);

// Whether a KV cache tensor is fp16 (else fp32; any other type is an error).
bool half_cache(const torch::Tensor& t);

// transformers' attention interface: query [heads, M, D], key/value [kv_heads, L, D] with the new
// rows last, fp16 keys and values read as an fp16 cache, any other type as fp32; returns
// [M, heads, D] in fp32.
torch::Tensor attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, double scaling);

}  // namespace anyspec
