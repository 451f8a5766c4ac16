// The decoder stack: every layer of a decoder for a few new rows, in one parallel region.
//
// One row of arch.py's table (Arch) and each layer's tensors (Layer) say what a layer computes:
//
//   h = norm(x) . attn_norm
//   q, k, v = h W_q, h W_k, h W_v (+ biases; or one fused W_qkv)
//   q, k = per-head norm . q_norm, k_norm (Qwen3, Gemma 3); rotary on the first rope_dim values of
//          each head, in adjacent pairs (ggml's "normal" layout) or in halves (neox), with the
//          layer's table of angles (Gemma 3: local and global bases; none in SmolLM3's NoPE layers)
//   a = softmax(cap tanh(q k^T scale / cap)) v over the row's positions (the last `window` in a
//       sliding-window layer; cap only where the architecture soft-caps, Gemma 2)
//   x += residual_scale * post_attn_norm(a W_o)        (the post norm only in sandwich layers)
//   h = norm(x) . ffn_norm
//   x += residual_scale * post_ffn_norm((act(h W_gate) * h W_up) W_down)   (act: SiLU or GELU-tanh)
//
// Every step is computed row by row in a fixed order, so a row's result is the same bits whatever
// other rows (of its own sequence or of others) are computed with it.
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention.h"
#include "quant.h"
#include "stack.h"

namespace anyspec {
namespace {

// Passes of at most this many rows take serial steps on every thread at once (serial, Own).
constexpr int64_t EACH_ROWS = 2;

// One model family's choices for the whole stack.
struct Arch {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  double eps = 1e-6;
  bool rope_pairs = false;     // adjacent pairs rotate together (ggml "normal"); else the two halves
  int64_t rope_dim = 0;        // how many leading values of a head rotate (partial rotary); 0: all
  bool gelu = false;           // the gate's activation: GELU (tanh approximation), else SiLU
  double attn_scale = 0;       // the scores' scale; 0: 1 / sqrt(head_dim)
  double attn_softcap = 0;     // cap * tanh(score / cap) before the softmax; 0: none
  double residual_scale = 1;   // each branch's output times this before it is added (Granite)
};

// One matrix of a layer: weights of a GGUF block type (quant.h) or row-wise bf16 / int8 / fp32.
struct Product {
  torch::Tensor weight, scale, bias;  // empty where there is none
  int64_t type = 0, K = 0;
};

// One layer's tensors; an empty norm is not applied. q may hold q, k and v fused (k and v then
// empty), gate may hold gate and up fused.
struct Layer {
  torch::Tensor attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffn_norm;
  Product q, k, v, o, gate, up, down;
  int64_t rope = 0;    // which table of rotary angles; -1: no rotary in this layer
  int64_t window = 0;  // sliding-window attention over the last `window` positions; 0: all of them
};

Mat mat_of(const Product& p) { return mat(p.weight, p.scale, p.bias, p.type, p.K); }

// A layer's seven matrices as the stack holds them, one layer after another (stack_mats), and the
// four inputs they read: q, k and v read the normed hidden state; o the attention; gate and up the
// normed hidden state after attention; down the gated activation.
enum Matrix : int { Q, K, V, O, GATE, UP, DOWN, PER_LAYER };
enum Input : int { QKV_IN, O_IN, GATE_UP_IN, DOWN_IN, INPUTS };

constexpr Input input_of(int matrix) {
  return matrix <= V ? QKV_IN : matrix == O ? O_IN : matrix <= UP ? GATE_UP_IN : DOWN_IN;
}

std::vector<Mat> stack_mats(const std::vector<Layer>& layers) {
  std::vector<Mat> mats(PER_LAYER * layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& y = layers[l];
    Mat* m = &mats[PER_LAYER * l];
    m[Q] = mat_of(y.q), m[K] = mat_of(y.k), m[V] = mat_of(y.v), m[O] = mat_of(y.o);
    m[GATE] = mat_of(y.gate), m[UP] = mat_of(y.up), m[DOWN] = mat_of(y.down);
  }
  return mats;
}

// Marks the calling thread as one of the stack's parallel region (split), for as long as it lives.
struct InStack {
  InStack() { in_stack = true; }
  ~InStack() { in_stack = false; }
};


// Rotate the first R values of a head: pairs (2i, 2i+1) or halves (i, i + R/2) by angle i, whose
// cos and sin are cos[i], sin[i] for i < R/2.
void rotate(float* v, const float* cos, const float* sin, int64_t R, bool pairs) {
  const int64_t half = R / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t j = pairs ? 2 * i : i, k = pairs ? 2 * i + 1 : i + half;
    const float a = v[j], b = v[k];
    v[j] = a * cos[i] - b * sin[i];
    v[k] = b * cos[i] + a * sin[i];
  }
}

// x [M, H] += scale * y, each row of y first RMS-normed by `post` where there is one (into normed,
// which may be y).
void add_branch(float* x, const float* y, int64_t M, int64_t H, const float* post, float eps, float scale,
                float* normed) {
  if (post) {
    rms_norm(y, M, H, post, eps, normed);
    y = normed;
  }
  for (int64_t i = 0; i < M * H; ++i) x[i] += scale == 1.0f ? y[i] : y[i] * scale;
}

// A serial step of the stack's parallel region: on one thread while the others wait, or, where
// `each` is set, on every thread at once into buffers of its own (the same bits on each), no wait.
template <typename F>
void serial(bool each, const F& fn) {
  if (each) {
    fn();
    return;
  }
#pragma omp single
  fn();
}

// A small pass's buffers of one thread (decoder_forward): its own copy of the residual rows x, their
// norm h, a normed branch output and the quantized inputs of the products.
struct Own {
  std::vector<float> x, h, branch;
  Acts acts[INPUTS];
};

// Room in acts[INPUTS] for M rows of every product's inputs (size_for).
void size_inputs(Acts* acts, const std::vector<Mat>& mats, int64_t M) {
  for (size_t i = 0; i < mats.size(); ++i) size_for(acts[input_of(i % PER_LAYER)], mats[i], M);
}

// Each row's cache in layer l of L.
std::vector<RowCache> row_caches(int64_t M, int64_t l, int64_t L, int64_t window, const int64_t* pos,
                                 const int64_t* seq, const std::vector<torch::Tensor>& keys,
                                 const std::vector<torch::Tensor>& values,
                                 const std::vector<std::vector<int64_t>>& paths, bool half) {
  std::vector<RowCache> rows(M);
  for (int64_t r = 0; r < M; ++r) {
    const torch::Tensor& k = keys[seq[r] * L + l];
    const int64_t first = window > 0 ? std::max<int64_t>(0, pos[r] - window + 1) : 0;
    rows[r] = {k.data_ptr(), values[seq[r] * L + l].data_ptr(), k.size(1), pos[r], first, paths[r].data(),
               static_cast<int64_t>(paths[r].size()), half};
  }
  return rows;
}

// The shapes decoder_forward relies on, each a one-line error.
void check_inputs(int64_t M, const Arch& arch, const std::vector<Layer>& layers, const torch::Tensor& positions,
                  const torch::Tensor& seqs, const std::vector<torch::Tensor>& keys,
                  const std::vector<torch::Tensor>& values, const std::vector<torch::Tensor>& cos,
                  const std::vector<torch::Tensor>& sin) {
  const int64_t L = layers.size(), D = arch.head_dim, R = arch.rope_dim ? arch.rope_dim : D;
  const int64_t S = L ? keys.size() / L : 0;
  TORCH_CHECK(L && S && static_cast<int64_t>(keys.size()) == S * L && keys.size() == values.size(),
              "decoder_forward: a key and a value tensor per layer and sequence");
  for (size_t i = 0; i < keys.size(); ++i)
    TORCH_CHECK(half_cache(keys[i]) == half_cache(keys[0]) && half_cache(values[i]) == half_cache(keys[0]),
                "decoder_forward: every key and value tensor of one type");
  TORCH_CHECK(arch.heads > 0 && arch.kv_heads > 0 && arch.heads % arch.kv_heads == 0 && R <= D && R % 2 == 0 &&
                  cos.size() == sin.size(),
              "decoder_forward: bad attention shape");
  TORCH_CHECK(positions.numel() == M && seqs.numel() == M, "decoder_forward: a position and a sequence per row");
  for (size_t t = 0; t < cos.size(); ++t)
    TORCH_CHECK(cos[t].size(0) == M && cos[t].size(1) == R / 2 && sin[t].sizes() == cos[t].sizes(),
                "decoder_forward: rotary tables of [rows, rope_dim / 2]");
  for (const Layer& layer : layers)
    TORCH_CHECK(layer.rope < static_cast<int64_t>(cos.size()), "decoder_forward: a layer's rotary table is missing");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* seq = seqs.data_ptr<int64_t>();
  for (int64_t r = 0; r < M; ++r)
    TORCH_CHECK(seq[r] >= 0 && seq[r] < S && pos[r] >= 0 && pos[r] < keys[seq[r] * L].size(1),
                "decoder_forward: row ", r, " is outside its sequence's cache");
}

// Each row's path in a tree of rows (decoder_forward): the cache slots of its ancestors that have
// a parent, and its own, in order of position; empty without a tree and for a row without a parent.
std::vector<std::vector<int64_t>> tree_paths(int64_t M, const int64_t* pos, const int64_t* seq,
                                             const std::vector<torch::Tensor>& keys, int64_t L,
                                             const std::vector<int64_t>& slots, const std::vector<int64_t>& parents) {
  std::vector<std::vector<int64_t>> paths(M);
  if (slots.empty() && parents.empty()) return paths;
  TORCH_CHECK(static_cast<int64_t>(slots.size()) == M && static_cast<int64_t>(parents.size()) == M,
              "decoder_forward: a slot and a parent per row of a tree");
  for (int64_t r = 0; r < M; ++r) {
    const int64_t up = parents[r];
    TORCH_CHECK(slots[r] >= 0 && slots[r] < keys[seq[r] * L].size(1), "decoder_forward: row ", r,
                "'s slot is outside its sequence's cache");
    if (up < 0) {
      TORCH_CHECK(slots[r] == pos[r], "decoder_forward: row ", r, " has no parent, so its slot is its position");
      continue;
    }
    TORCH_CHECK(up < r && seq[up] == seq[r] && pos[up] + 1 == pos[r] && slots[up] < slots[r],
                "decoder_forward: row ", r, "'s parent must be an earlier row of its sequence, one position before it");
    paths[r] = paths[up];
    paths[r].push_back(slots[r]);
  }
  return paths;
}

// One row's q and k after its products: per-head norms, rotary with angles cos / sin; then its keys and
// values into its cache.
void queries_and_keys(float* row, const Layer& layer, const Arch& arch, const float* cos, const float* sin,
                      const RowCache& cache, float eps) {
  const int64_t D = arch.head_dim, R = arch.rope_dim ? arch.rope_dim : D;
  const int64_t q_size = arch.heads * D, kv_size = arch.kv_heads * D;
  if (const float* w = ptr_or_null(layer.q_norm)) rms_norm(row, arch.heads, D, w, eps, row);
  if (const float* w = ptr_or_null(layer.k_norm)) rms_norm(row + q_size, arch.kv_heads, D, w, eps, row + q_size);
  if (layer.rope >= 0)
    for (int64_t i = 0; i < arch.heads + arch.kv_heads; ++i) rotate(row + i * D, cos, sin, R, arch.rope_pairs);
  for (int64_t g = 0; g < arch.kv_heads; ++g) {
    const int64_t at = (g * cache.cap + cache.slot()) * D;
    const float *k = row + q_size + g * D, *v = row + q_size + kv_size + g * D;
    if (cache.half) {
      for (int64_t d = 0; d < D; ++d) {
        static_cast<Half*>(cache.k)[at + d] = to_half(k[d]);
        static_cast<Half*>(cache.v)[at + d] = to_half(v[d]);
      }
    } else {
      std::memcpy(static_cast<float*>(cache.k) + at, k, D * sizeof(float));
      std::memcpy(static_cast<float*>(cache.v) + at, v, D * sizeof(float));
    }
  }
}

// x: [M, H] embeddings of new tokens of one or more sequences: row m belongs to sequence seqs[m] at
// position positions[m], and keys / values hold each sequence's cache, one tensor
// [kv_heads, capacity, head_dim] per layer, sequence after sequence. cos[t] and sin[t] are table t's
// rotary angles for the rows, [M, rope_dim / 2]. A sequence's rows come in order of position.
// A tree of rows (empty: none): row m's key and value go to cache slot slots[m] and it attends to
// its parent row parents[m]'s path and itself; a row without a parent (-1) sits at the slot of its
// position and attends to the positions before it. Returns the hidden states after the last layer.
torch::Tensor decoder_forward(torch::Tensor x, torch::Tensor positions, torch::Tensor seqs, const Arch& arch,
                              const std::vector<Layer>& layers, std::vector<torch::Tensor> keys,
                              std::vector<torch::Tensor> values, std::vector<torch::Tensor> cos,
                              std::vector<torch::Tensor> sin, std::vector<int64_t> slots,
                              std::vector<int64_t> parents) {
  x = x.to(torch::kFloat32).contiguous().clone();
  const int64_t M = x.size(0), H = x.size(1), D = arch.head_dim, L = layers.size();
  const int64_t heads = arch.heads, kv_heads = arch.kv_heads, R = arch.rope_dim ? arch.rope_dim : D;
  const int64_t q_size = heads * D, kv_size = kv_heads * D, qkv_size = q_size + 2 * kv_size;
  positions = positions.to(torch::kLong).contiguous();
  seqs = seqs.to(torch::kLong).contiguous();
  check_inputs(M, arch, layers, positions, seqs, keys, values, cos, sin);
  const bool half = half_cache(keys[0]);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* seq = seqs.data_ptr<int64_t>();
  const std::vector<std::vector<int64_t>> paths = tree_paths(M, pos, seq, keys, L, slots, parents);
  const float eps = static_cast<float>(arch.eps), residual = static_cast<float>(arch.residual_scale);
  const float scaling = arch.attn_scale > 0 ? static_cast<float>(arch.attn_scale) : 1.0f / std::sqrt(static_cast<float>(D));
  float* xp = x.data_ptr<float>();
  const std::vector<Mat> mats = stack_mats(layers);
  const int64_t inter = (mats[GATE].N + mats[UP].N) / 2;  // the same in every layer
  std::vector<float> h(M * H), qkv(M * qkv_size), attn(M * q_size), out(M * H);
  std::vector<float> gate_up(M * 2 * inter), act(M * inter);
  const bool each = M <= EACH_ROWS;
  Acts acts[INPUTS];
  if (!each) size_inputs(acts, mats, M);
  // One parallel region for the whole stack: the products, attention and the gate's activation split
  // across its threads (split), the small serial steps between them (serial).
#pragma omp parallel
  {
    const InStack member;
    Own own;
    if (each) {
      own.x.assign(xp, xp + M * H), own.h.resize(M * H), own.branch.resize(M * H);
      size_inputs(own.acts, mats, M);
      for (Acts& a : own.acts) a.each = true;
    }
    float *xs = each ? own.x.data() : xp, *hs = each ? own.h.data() : h.data();
    float* branch = each ? own.branch.data() : out.data();
    Acts* as = each ? own.acts : acts;
    serial(each, [&] { rms_norm(xs, M, H, layers[0].attn_norm.data_ptr<float>(), eps, hs); });
    for (int64_t l = 0; l < L; ++l) {
      const Layer& layer = layers[l];
      const Mat* m = &mats[PER_LAYER * l];
      const std::vector<RowCache> rows = row_caches(M, l, L, layer.window, pos, seq, keys, values, paths, half);
      apply(hs, M, m + Q, 3, qkv.data(), qkv_size, as[QKV_IN]);
#pragma omp single
      for (int64_t r = 0; r < M; ++r) {
        const int64_t t = std::max<int64_t>(layer.rope, 0);
        const float* c = layer.rope >= 0 ? cos[t].data_ptr<float>() + r * (R / 2) : nullptr;
        const float* s = layer.rope >= 0 ? sin[t].data_ptr<float>() + r * (R / 2) : nullptr;
        queries_and_keys(qkv.data() + r * qkv_size, layer, arch, c, s, rows[r], eps);
      }
      attend(qkv.data(), qkv_size, M, heads, kv_heads, D, rows.data(), scaling, static_cast<float>(arch.attn_softcap),
             attn.data());
      apply(attn.data(), M, m + O, 1, out.data(), H, as[O_IN]);
      serial(each, [&] {
        add_branch(xs, out.data(), M, H, ptr_or_null(layer.post_attn_norm), eps, residual, branch);
        rms_norm(xs, M, H, layer.ffn_norm.data_ptr<float>(), eps, hs);
      });
      apply(hs, M, m + GATE, 2, gate_up.data(), 2 * inter, as[GATE_UP_IN]);
      const int64_t blocks = (inter + 63) / 64;  // act(gate) * up, 64 values a task
      split(M * blocks, 4, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const int64_t r = b / blocks, i = b % blocks * 64, n = std::min<int64_t>(64, inter - i);
          const float* g = &gate_up[r * 2 * inter + i];
          gated(arch.gelu, g, g + inter, &act[r * inter + i], n);
        }
      });
      apply(act.data(), M, m + DOWN, 1, out.data(), H, as[DOWN_IN]);
      serial(each, [&] {
        add_branch(xs, out.data(), M, H, ptr_or_null(layer.post_ffn_norm), eps, residual, branch);
        if (l + 1 < L) rms_norm(xs, M, H, layers[l + 1].attn_norm.data_ptr<float>(), eps, hs);
      });
    }
    if (each && omp_get_thread_num() == 0) std::memcpy(xp, xs, M * H * sizeof(float));
  }
  return x;
}

}  // namespace

void bind_decoder(pybind11::module_& m) {
  namespace py = pybind11;
  using free_gil = py::call_guard<py::gil_scoped_release>;
  py::class_<Arch>(m, "Arch", "one model family's choices for the decoder stack (arch.py)")
      .def(py::init<>())
      .def_readwrite("heads", &Arch::heads).def_readwrite("kv_heads", &Arch::kv_heads)
      .def_readwrite("head_dim", &Arch::head_dim).def_readwrite("eps", &Arch::eps)
      .def_readwrite("rope_pairs", &Arch::rope_pairs).def_readwrite("rope_dim", &Arch::rope_dim)
      .def_readwrite("gelu", &Arch::gelu).def_readwrite("attn_scale", &Arch::attn_scale)
      .def_readwrite("attn_softcap", &Arch::attn_softcap).def_readwrite("residual_scale", &Arch::residual_scale);
  py::class_<Product>(m, "Product", "one matrix of a layer: weight, scale, bias, type, K")
      .def(py::init<>())
      .def_readwrite("weight", &Product::weight).def_readwrite("scale", &Product::scale)
      .def_readwrite("bias", &Product::bias).def_readwrite("type", &Product::type).def_readwrite("K", &Product::K);
  py::class_<Layer>(m, "Layer", "one decoder layer's norms, products, rotary table and window")
      .def(py::init<>())
      .def_readwrite("attn_norm", &Layer::attn_norm).def_readwrite("q_norm", &Layer::q_norm)
      .def_readwrite("k_norm", &Layer::k_norm).def_readwrite("post_attn_norm", &Layer::post_attn_norm)
      .def_readwrite("ffn_norm", &Layer::ffn_norm).def_readwrite("post_ffn_norm", &Layer::post_ffn_norm)
      .def_readwrite("q", &Layer::q).def_readwrite("k", &Layer::k).def_readwrite("v", &Layer::v)
      .def_readwrite("o", &Layer::o).def_readwrite("gate", &Layer::gate).def_readwrite("up", &Layer::up)
      .def_readwrite("down", &Layer::down).def_readwrite("rope", &Layer::rope).def_readwrite("window", &Layer::window);
  m.def("attention", &attention, "causal attention, each query row alone", free_gil());
  m.def("decoder_forward", &decoder_forward, "the decoder stack for a few new tokens", py::arg("x"),
        py::arg("positions"), py::arg("seqs"), py::arg("arch"), py::arg("layers"), py::arg("keys"), py::arg("values"),
        py::arg("cos"), py::arg("sin"), py::arg("slots") = std::vector<int64_t>(),
        py::arg("parents") = std::vector<int64_t>(), free_gil());
}

}  // namespace anyspec
