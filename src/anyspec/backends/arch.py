"""The architecture table: what each model family's decoder layers compute, one row a family.

A row names the choices a family makes (the norms, the gate's activation, the rotary layout,
sliding windows, scales); the numbers (sizes, rotary bases, windows, caps) come from the GGUF
file's metadata. ``describe`` turns a file into what the C++ stack takes (``csrc/decoder.cpp``'s
``Arch`` and ``Layer``), and ``arch_problem`` says why a file cannot run there. ``describe_hf`` and
``hf_problem`` do the same for a transformers config (the lean forward, ``backends/lean.py``).
Adding a family is adding a row, if its layers are made of the same steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True)
class Family:
    """One model family's decoder, as the GGUF files of llama.cpp's converter store it."""

    rope_pairs: bool = False  # q and k rotate in adjacent pairs (ggml "normal"); else in halves (neox)
    qk_norm: bool = False  # an RMS norm over each head of q and of k (attn_q_norm, attn_k_norm)
    sandwich: bool = False  # norms after attention and after the feed-forward too
    gelu: bool = False  # the gate's activation: GELU with the tanh approximation, else SiLU
    embed_scale: bool = False  # embeddings times sqrt(hidden size)
    fused: bool = False  # one attn_qkv matrix, and ffn_up holding gate and up
    swa_pattern: int = 0  # every n-th layer attends to all positions, the others to a sliding window
    swa_base: float | None = None  # the sliding-window layers' rotary base, if the file gives none
    nope_every: int = 0  # every n-th layer has no rotary embedding (SmolLM3)
    scales: bool = False  # Granite's embedding, residual, attention and logit scales from the metadata


ARCHITECTURES: dict[str, Family] = {
    "llama": Family(rope_pairs=True),
    "mistral": Family(rope_pairs=True),
    "granite": Family(rope_pairs=True, scales=True),
    "smollm3": Family(rope_pairs=True, nope_every=4),
    "qwen2": Family(),
    "qwen3": Family(qk_norm=True),
    "phi3": Family(fused=True),
    "gemma2": Family(sandwich=True, gelu=True, embed_scale=True, swa_pattern=2),
    "gemma3": Family(qk_norm=True, sandwich=True, gelu=True, embed_scale=True, swa_pattern=6,
                     swa_base=10000.0),
}
# llama.cpp's per-family tensor names where they differ from the common ones
POST_NORMS = ("post_attention_norm", "post_ffw_norm")
MOE_KEYS = ("expert_count", "expert_used_count")


@dataclass
class Rotary:
    """One table of rotary angles: ``inv_freq`` per pair of rotated values, times ``mscale``."""

    inv_freq: torch.Tensor
    mscale: float = 1.0

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[len(positions), rope_dim / 2]``."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if self.mscale != 1.0:
            cos, sin = cos * self.mscale, sin * self.mscale
        return cos.contiguous(), sin.contiguous()


@dataclass
class Description:
    """A GGUF decoder as the stack runs it: sizes, choices, per-layer rotary table and window."""

    arch: str
    family: Family
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    n_layers: int
    eps: float
    context_length: int
    rope_dim: int
    rotary: list[Rotary]  # table 0 for full-attention layers, table 1 for sliding-window ones
    layer_rope: list[int]  # each layer's table, -1 for none
    layer_window: list[int]  # each layer's sliding window, 0 for none
    attn_scale: float = 0.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    embed_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    notes: list[str] = field(default_factory=list)


MISSING_METADATA = "missing attention metadata (head_count, embedding_length, block_count)"


def field_of(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    value = f.contents()
    return value if value is not None else default


def arch_problem(reader) -> str | None:
    """Why the stack cannot run this file's architecture (None: it can), from the metadata alone."""
    arch = field_of(reader, "general.architecture", "?")
    if arch not in ARCHITECTURES:
        return f"architecture {arch} (GGUF kernels: {', '.join(ARCHITECTURES)})"
    meta = lambda key, default=None: field_of(reader, f"{arch}.{key}", default)  # noqa: E731
    if any(meta(key, 0) for key in MOE_KEYS):
        return f"a mixture of experts ({meta('expert_count')} experts), which the GGUF kernels do not run"
    scaling = meta("rope.scaling.type", "none")
    names = {t.name for t in reader.tensors}
    if scaling == "linear" and float(meta("rope.scaling.factor", 1.0)) != 1.0:
        return f"linear rope scaling by {meta('rope.scaling.factor')}"
    longrope = scaling == "longrope" and "rope_factors_short.weight" in names
    if scaling not in ("none", "linear") and not longrope:
        return f"rope scaling {scaling}"
    heads, dim = meta("attention.head_count"), meta("embedding_length")
    if not isinstance(heads, int) or not heads or not dim or not meta("block_count"):
        return MISSING_METADATA
    head_dim = meta("attention.key_length", dim // heads)
    if meta("attention.value_length", head_dim) != head_dim:
        return "keys and values of different lengths"
    rope_dim = meta("rope.dimension_count", head_dim)
    if rope_dim > head_dim or rope_dim % 2:
        return f"rotary dimension {rope_dim} for heads of {head_dim}"
    return None


def inv_freq(rope_dim: int, base: float, factors: torch.Tensor | None = None) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim)
    return inv if factors is None else inv / factors


def context_of(reader) -> tuple[int, str | None]:
    """The most tokens the file's model reads, and why it is less than the file declares (None:
    it is not): Phi-3's short rope factors hold it to the original context."""
    arch = field_of(reader, "general.architecture")
    context = int(field_of(reader, f"{arch}.context_length", 4096))
    original = int(field_of(reader, f"{arch}.rope.scaling.original_context_length", context))
    if "rope_factors_short.weight" in {t.name for t in reader.tensors} and original < context:
        return original, f"context held to {original} tokens, the range of its short rope factors"
    return context, None


def describe(reader, vector) -> Description:
    """The file's decoder for the stack; ``vector(name)`` reads a small fp32 tensor (rope factors)."""
    arch = field_of(reader, "general.architecture")
    family = ARCHITECTURES[arch]
    meta = lambda key, default=None: field_of(reader, f"{arch}.{key}", default)  # noqa: E731
    names = {t.name for t in reader.tensors}
    heads, hidden, n_layers = meta("attention.head_count"), meta("embedding_length"), meta("block_count")
    head_dim = meta("attention.key_length", hidden // heads)
    rope_dim = meta("rope.dimension_count", head_dim)
    base = float(meta("rope.freq_base", 10000.0))
    context, held = context_of(reader)
    notes: list[str] = [held] if held else []
    factors, mscale = None, 1.0
    if "rope_freqs.weight" in names:  # Llama 3.x: each frequency divided by its factor
        factors = vector("rope_freqs.weight")
    elif "rope_factors_short.weight" in names:  # Phi-3 LongRoPE, within the original context
        factors = vector("rope_factors_short.weight")
        mscale = float(meta("rope.scaling.attn_factor", 1.0))
    rotary = [Rotary(inv_freq(rope_dim, base, factors), mscale)]
    window = int(meta("attention.sliding_window", 0) or 0)
    swa = [False] * n_layers
    if window and family.swa_pattern:
        pattern = meta("attention.sliding_window_pattern", family.swa_pattern)
        if isinstance(pattern, list):
            swa = [bool(p) for p in pattern][:n_layers]
        else:
            swa = [pattern == 0 or i % pattern < pattern - 1 for i in range(n_layers)]
        local_base = float(meta("rope.freq_base_swa", family.swa_base or base))
        rotary.append(Rotary(inv_freq(rope_dim, local_base, factors), mscale))
    elif window and not family.swa_pattern:
        swa = [True] * n_layers  # one window for every layer (Mistral, Phi-3)
    layer_rope = [1 if s and len(rotary) > 1 else 0 for s in swa]
    if family.nope_every:
        layer_rope = [-1 if (i + 1) % family.nope_every == 0 else r for i, r in enumerate(layer_rope)]
    d = Description(
        arch, family, heads, meta("attention.head_count_kv") or heads, head_dim, hidden, n_layers,
        float(meta("attention.layer_norm_rms_epsilon", 1e-6)), context, rope_dim, rotary, layer_rope,
        [window if s else 0 for s in swa], notes=notes)
    if arch in ("gemma2", "gemma3"):  # the 27B models scale queries by 1 / sqrt(hidden / heads)
        d.attn_scale = 1.0 / math.sqrt(hidden // heads if n_layers in (46, 62) else head_dim)
    d.attn_softcap = float(meta("attn_logit_softcapping", 0.0) or 0.0)
    d.final_softcap = float(meta("final_logit_softcapping", 0.0) or 0.0)
    if family.embed_scale:
        d.embed_scale = math.sqrt(hidden)
    if family.scales:
        d.embed_scale = float(meta("embedding_scale", 1.0))
        d.residual_scale = float(meta("residual_scale", 1.0))
        d.attn_scale = float(meta("attention.scale", 0.0))
        d.logit_scale = float(meta("logit_scale", 1.0))
    return d


def hf_family(model_type: str) -> Family | None:
    """A family as transformers stores it (q and k rotate in halves), where the lean forward runs
    its layers: those made of the plain steps alone (no extra norms, scales, windows or fusions)."""
    family = ARCHITECTURES.get(model_type)
    plain = family is not None and replace(family, rope_pairs=False) == Family()
    return replace(family, rope_pairs=False) if plain else None


def hf_problem(config) -> str | None:
    """Why the lean forward cannot run a transformers ``config`` (None: it can), from the config alone."""
    if hf_family(config.model_type) is None:
        families = [name for name in ARCHITECTURES if hf_family(name) is not None]
        return f"architecture {config.model_type} (lean forward: {', '.join(families)})"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"rope type {rope.get('rope_type')}"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act}"
    return None


def describe_hf(config) -> Description:
    """A transformers config's decoder for the stack (one that ``hf_problem`` passes)."""
    heads, hidden, n_layers = config.num_attention_heads, config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    context = getattr(config, "max_position_embeddings", None) or 4096
    return Description(
        config.model_type, hf_family(config.model_type), heads,
        getattr(config, "num_key_value_heads", None) or heads, head_dim, hidden, n_layers,
        float(config.rms_norm_eps), context, head_dim, [Rotary(inv_freq(head_dim, theta))], [0] * n_layers,
        [0] * n_layers)


def shape_problem(reader, d: Description) -> str | None:
    """A tensor whose shape contradicts the metadata (None: all agree), before the stack reads any."""
    tensors = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    q, kv, hidden = d.heads * d.head_dim, d.kv_heads * d.head_dim, d.hidden
    listed = reader.fields.get("tokenizer.ggml.tokens")
    for name in ("token_embd.weight", "output.weight"):
        rows = tensors.get(name, [0, 0])[1]
        if listed is not None and name in tensors and rows != len(listed.data):
            return (f"tensor {name} has {rows} rows but the vocabulary lists {len(listed.data)} tokens; "
                    "the file is inconsistent (convert it again)")
    # the stack takes every layer's feed-forward width from the first one
    inter = tensors.get(layer_tensors(d.family, 0)["gate"], [0, 0])[1] // (2 if d.family.fused else 1)
    for i in range(d.n_layers):
        names = layer_tensors(d.family, i)
        want = {"q": [hidden, q + 2 * kv]} if d.family.fused else {"q": [hidden, q], "k": [hidden, kv],
                                                                   "v": [hidden, kv]}
        want.update({"attn_norm": [hidden], "ffn_norm": [hidden], "o": [q, hidden], "q_norm": [d.head_dim],
                     "k_norm": [d.head_dim], "post_attn_norm": [hidden], "post_ffn_norm": [hidden],
                     "gate": [hidden, 2 * inter if d.family.fused else inter], "up": [hidden, inter],
                     "down": [inter, hidden]})
        for key, shape in want.items():
            if key in names and tensors.get(names[key]) != shape:
                return f"tensor {names[key]} is {tensors.get(names[key])}, its metadata says {shape}"
    return None


def kernel_arch(kernel, d: Description):
    """The C++ stack's ``Arch`` for a description."""
    a = kernel.Arch()
    a.heads, a.kv_heads, a.head_dim, a.eps = d.heads, d.kv_heads, d.head_dim, d.eps
    a.rope_pairs, a.rope_dim, a.gelu = d.family.rope_pairs, d.rope_dim, d.family.gelu
    a.attn_scale, a.attn_softcap, a.residual_scale = d.attn_scale, d.attn_softcap, d.residual_scale
    return a


def layer_tensors(family: Family, i: int) -> dict[str, str]:
    """The GGUF names of layer ``i``'s tensors, by the stack's ``Layer`` field."""
    b = f"blk.{i}."
    names = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "o": "attn_output", "down": "ffn_down"}
    if family.fused:
        names.update(q="attn_qkv", gate="ffn_up")
    else:
        names.update(q="attn_q", k="attn_k", v="attn_v", gate="ffn_gate", up="ffn_up")
    if family.qk_norm:
        names.update(q_norm="attn_q_norm", k_norm="attn_k_norm")
    if family.sandwich:
        names.update(post_attn_norm=POST_NORMS[0], post_ffn_norm=POST_NORMS[1])
    return {key: f"{b}{name}.weight" for key, name in names.items()}
