// Attention over a sequence's KV cache, fp32 or fp16 (attention.h): the scores, the softmax and the
// weighted sums of dense.cpp, tasks split across the stack's threads.
#include "attention.h"

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dense.h"
#include "stack.h"
#include "vec8.h"

namespace anyspec {
namespace {

// A row's scores p[0..len) into its attention weights: capped (softcap > 0), then the softmax.
void capped_softmax(float* p, int64_t len, float softcap) {
  if (softcap > 0)
    for (int64_t j = 0; j < len; ++j) p[j] = softcap * std::tanh(p[j] / softcap);
  softmax(p, len);
}

// Heads hd .. hd + n - 1 (of key-value head g) of one row, query q, output o, scores in p (stride
// apart). A path's slots are scored and summed one at a time, in the order of their positions:
// each score is a dot product by itself and the weighted sum goes on from where it was, so a
// branch's row is the same bits as the row at its position in a sequence that holds only its
// ancestors.
template <typename C>
void attend_row(const float* q, const RowCache& row, int64_t g, int64_t n, int64_t D, float scaling, float softcap,
                float* o, float* p, int64_t stride) {
  const int64_t len = row.pos + 1 - row.first, tail = row.pos + 1 - row.path_len;
  const int64_t flat = std::max<int64_t>(0, tail - row.first);  // positions at their own slots
  const int64_t offset = (g * row.cap + row.first) * D, head = g * row.cap * D;
  const C *keys = row.keys<C>(), *values = row.values<C>();
  scores_rows(q, 1, 0, n, keys + offset, flat, D, scaling, p, stride);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = flat; j < len; ++j)
      scores_rows(q + i * D, 1, 0, 1, keys + head + row.path[row.first + j - tail] * D, 1, D, scaling,
                  &p[i * stride + j], 0);
    capped_softmax(p + i * stride, len, softcap);
  }
  weighted_sum_rows(p, 1, n, stride, values + offset, flat, D, o, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = flat; j < len; ++j)
      weighted_sum(p + i * stride + j, values + head + row.path[row.first + j - tail] * D, 1, D, o + i * D, j > 0);
}

// How many of rows[0..most) from the first on read the same cache from the same first position,
// none of them through a path.
int64_t rows_together(const RowCache* rows, int64_t most) {
  int64_t R = 0;
  while (R < most && !rows[R].path_len && rows[R].k == rows[0].k && rows[R].first == rows[0].first) ++R;
  return rows[0].path_len ? 0 : R;
}

// All n heads of key-value head g in R rows that rows_together found: the keys and values every
// one of them attends to are scored and summed for each row and head in turn while they are in L1,
// the rest row by row; each (row, head) is the same bits as attend_row's.
template <typename C>
void attend_rows(const float* q, int64_t q_stride, const RowCache* rows, int64_t R, int64_t g, int64_t n, int64_t D,
                 float scaling, float softcap, float* o, int64_t o_stride, float* p, int64_t stride) {
  int64_t shared = rows[0].pos + 1 - rows[0].first;
  for (int64_t r = 1; r < R; ++r) shared = std::min(shared, rows[r].pos + 1 - rows[r].first);
  const int64_t offset = (g * rows[0].cap + rows[0].first) * D, scored = shared - shared % 8;
  const int64_t summed = shared - shared % 64;
  const C *keys = rows[0].keys<C>() + offset, *values = rows[0].values<C>() + offset;
  scores_rows(q, R, q_stride, n, keys, scored, D, scaling, p, stride);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t len = rows[r].pos + 1 - rows[r].first;
    float* pr = p + r * n * stride;
    scores_rows(q + r * q_stride, 1, 0, n, keys + scored * D, len - scored, D, scaling, pr + scored, stride);
    for (int64_t i = 0; i < n; ++i) capped_softmax(pr + i * stride, len, softcap);
  }
  weighted_sum_rows(p, R, n, stride, values, summed, D, o, o_stride);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < n; ++i)
      weighted_sum(p + (r * n + i) * stride + summed, values + summed * D, rows[r].pos + 1 - rows[r].first - summed,
                   D, o + r * o_stride + i * D, summed > 0);
}

// Query rows attended together (attend_rows) at most: their keys are read once from beyond L1.
constexpr int64_t BLOCK_ROWS = 4;

// Causal attention for M query rows, row m over rows[m]'s cache (all of fp32, C = float, or all of
// fp16, C = Half); query row m, head h at q + m * q_stride + h * D; out is [M, heads * D]. Each
// (row, head) is computed alone in a fixed order, so a row's result depends neither on M nor on
// the other rows' sequences. The tasks go by key-value head, then row, then the heads that share
// it; a thread's run of such heads goes together (scores_rows, weighted_sum_rows: the same bits as
// one head at a time), so the keys and values are read once for them, and a run of whole rows of
// one sequence goes together too (attend_rows).
template <typename C>
void attend_as(const float* q_all, int64_t q_stride, int64_t M, int64_t heads, int64_t kv_heads, int64_t D,
               const RowCache* rows, float scaling, float softcap, float* out) {
  const int64_t group = heads / kv_heads;
  int64_t longest = 0;
  for (int64_t m = 0; m < M; ++m) longest = std::max(longest, rows[m].pos + 1 - rows[m].first);
  split(M * heads, 1, [&](int64_t begin, int64_t stop) {
    std::vector<float> scores_of(std::min(BLOCK_ROWS, M) * group * longest);
    for (int64_t task = begin; task < stop;) {
      const int64_t g = task / (M * group), m = task / group % M, hd = g * group + task % group;
      const float* q = q_all + m * q_stride + hd * D;
      float* o = out + m * heads * D + hd * D;
      const int64_t R = task % group ? 0 : rows_together(rows + m, std::min({BLOCK_ROWS, (stop - task) / group, M - m}));
      if (R > 1) {
        attend_rows<C>(q, q_stride, rows + m, R, g, group, D, scaling, softcap, o, heads * D, scores_of.data(),
                       longest);
        task += R * group;
        continue;
      }
      const int64_t n = std::min(stop - task, group - task % group);  // heads hd .. hd + n - 1
      attend_row<C>(q, rows[m], g, n, D, scaling, softcap, o, scores_of.data(), longest);
      task += n;
    }
  });
}

}  // namespace

void attend(const float* q_all, int64_t q_stride, int64_t M, int64_t heads, int64_t kv_heads, int64_t D,
            const RowCache* rows, float scaling, float softcap, float* out) {
  if (M && rows[0].half)
    attend_as<Half>(q_all, q_stride, M, heads, kv_heads, D, rows, scaling, softcap, out);
  else
    attend_as<float>(q_all, q_stride, M, heads, kv_heads, D, rows, scaling, softcap, out);
}

bool half_cache(const torch::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kFloat16,
              "a KV cache is fp32 or fp16, got ", t.scalar_type());
  return t.scalar_type() == torch::kFloat16;
}

torch::Tensor attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, double scaling) {
  auto q = query.to(torch::kFloat32).transpose(0, 1).contiguous();
  const auto kind = key.scalar_type() == torch::kFloat16 && value.scalar_type() == torch::kFloat16 ? torch::kFloat16
                                                                                                   : torch::kFloat32;
  auto k = key.to(kind).contiguous();
  auto v = value.to(kind).contiguous();
  const int64_t M = q.size(0), heads = q.size(1), D = q.size(2), kv_heads = k.size(0), L = k.size(1);
  TORCH_CHECK(L >= M && heads % kv_heads == 0 && k.size(2) == D, "attention: shape mismatch");
  auto out = torch::empty({M, heads, D}, q.options());
  std::vector<RowCache> rows(M);
  for (int64_t m = 0; m < M; ++m)
    rows[m] = {k.data_ptr(), v.data_ptr(), L, L - M + m, 0, nullptr, 0, kind == torch::kFloat16};
  attend(q.data_ptr<float>(), heads * D, M, heads, kv_heads, D, rows.data(), static_cast<float>(scaling), 0.0f,
         out.data_ptr<float>());
  return out;
}

}  // namespace anyspec
