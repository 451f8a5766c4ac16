"""Faster CPU matrix products for the transformers backend, swapped in for ``nn.Linear``.

Speculative decoding pays off only when scoring k+1 tokens costs little more than scoring one.
MKL's fp32 GEMM behind ``nn.Linear`` grows almost linearly with the number of rows at small M,
torch's bf16 matmul is emulated on CPUs without native bf16, and where bf16 is native it rounds a
row differently when other rows come with it. These kernels keep the cost nearly flat and each
row's numbers fixed:

* ``bf16`` and ``int8`` (``RowwiseLinear``): anyspec's own kernel (``csrc/dense.cpp``, built once
  with the system's C++ compiler into the cache: AVX2 on x86, plain C++ on other machines). The
  weights stay bf16 (or int8 with a scale per output channel) in memory and are widened to fp32 in
  registers; every input row is accumulated in fp32 in a fixed order. Reading the weights once per
  call is the cost. Used for bf16 and int8 models on every x86 CPU with AVX2, and on every CPU that
  is not x86.
* ``onednn``: fp32 weights prepacked once for oneDNN (``torch.ops.mkldnn``), exactly the model's
  numbers (fp32 rounding differences only). Used for fp32 models on the CPU.
* ``int8-torch``: the same int8 weights through ``torch._weight_int8pack_mm``, where anyspec's
  kernel cannot be built; the inputs are rounded to bf16.

int8 (one symmetric scale per output channel, the rest of the model fp32) is a *different model*
from the fp32 one, so it is opt-in for a target (``--dtype int8``) and the default for the draft,
whose numbers never change the output.

Every kernel computes a row the same way however many rows come in (tested), so verifying k
tokens gives the logits of decoding them one by one: bit for bit for the row-wise kernel (with
``rowwise_attention`` in place of torch's bf16 attention, which is not), up to fp32 rounding for
oneDNN.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from anyspec.backends.build import build_kernel, is_x86, limit_isa

PREPACK_ROWS = 5  # oneDNN picks its weight layout for this many rows: k+1 at k=4


class OneDNNLinear(nn.Module):
    """fp32 ``nn.Linear`` with its weight prepacked for oneDNN's inner product."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, PREPACK_ROWS))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class Int8Linear(nn.Module):
    """Weight-only int8 ``nn.Linear``: int8 weights, one bf16 scale per output channel."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scale = int8_weights(linear.weight)
        self.register_buffer("weight_int8", weight)
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch._weight_int8pack_mm(rows, self.weight_int8, self.scale).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def int8_weights(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: ``weight ~= q * scale[:, None]``."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    return torch.round(weight / scale[:, None]).to(torch.int8), scale


class RowwiseLinear(nn.Module):
    """``nn.Linear`` on anyspec's kernel: bf16 or int8 weights, fp32 accumulation."""

    def __init__(self, linear: nn.Linear, weights: str = "bf16"):
        super().__init__()
        if weights == "bf16":
            weight, scale = linear.weight.detach().to(torch.bfloat16).contiguous(), None
        else:
            weight, scale = int8_weights(linear.weight)
        self._store(weight, scale, None if linear.bias is None else linear.bias.detach().float())

    @classmethod
    def from_parts(cls, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None):
        """A kernel over stored weights (bf16, or int8 with ``scale``), e.g. several concatenated."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module._store(weight, scale, bias)
        return module

    def _store(self, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self.kernel = rowwise_kernel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = self.kernel.linear(rows, self.weight, self.scale, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


KERNELS = {"onednn": OneDNNLinear, "int8-torch": Int8Linear,
           "bf16": lambda linear: RowwiseLinear(linear, "bf16"),
           "int8": lambda linear: RowwiseLinear(linear, "int8")}
AVX2_OR_BETTER = ("AVX2", "AVX512", "AVX512_BF16", "AMX")  # torch's names for the CPU's capability
_ROWWISE: list = []  # the built extension, or the reason it could not be built


def rowwise_kernel():
    """anyspec's CPU kernel (row-wise and GGUF products, the decoder stack), compiled on first use
    into ``cache_dir()/kernels`` (about a minute; ``backends/build.py``)."""
    if not _ROWWISE:
        kernel = _build_rowwise()
        if not isinstance(kernel, str):
            limit_isa(kernel)  # a bad ANYSPEC_ISA raises, and nothing is kept
        _ROWWISE.append(kernel)
    if isinstance(_ROWWISE[0], str):
        raise RuntimeError(_ROWWISE[0])
    return _ROWWISE[0]


def _build_rowwise():
    return kernels_off() or build_kernel()


def rowwise_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface on anyspec's kernel: fp32, each query row computed alone.

    torch's CPU attention in bf16 (flash or eager matmuls) rounds a query row differently when
    other rows come with it, which flips near-ties between verification and one-by-one decoding.
    Batch size 1 and plain causal masks only (anyspec's engine); anything else goes to sdpa.
    """
    if query.shape[0] != 1 or kwargs.get("sliding_window") or dropout:
        from transformers import AttentionInterface

        return AttentionInterface()["sdpa"](module, query, key, value, attention_mask, scaling=scaling,
                                            dropout=dropout, **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = rowwise_kernel().attention(query[0], key[0], value[0], scaling)
    return out[None].to(query.dtype), None


def kernels_off() -> str | None:
    """Why anyspec's kernel is off here before any build (None: it may run): turned off, or an x86
    CPU without AVX2 (a CPU that is not x86 runs the kernel's plain C++ build)."""
    if os.environ.get("ANYSPEC_KERNELS", "1") == "0":
        return "turned off with ANYSPEC_KERNELS=0"
    if is_x86() and torch.backends.cpu.get_cpu_capability() not in AVX2_OR_BETTER:
        return f"this CPU has no AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    return None


def rowwise_possible() -> bool:
    """This CPU can run anyspec's kernel and it is not turned off (it may still fail to build)."""
    return kernels_off() is None


def rowwise_problem() -> str | None:
    """Why anyspec's kernel cannot run here (None: it is built, or builds now)."""
    try:
        rowwise_kernel()
    except RuntimeError as exc:
        return str(exc)
    return None


def rowwise_available() -> bool:
    """anyspec's kernel is built (or builds now) on this machine; off with ANYSPEC_KERNELS=0."""
    return rowwise_problem() is None


def onednn_available() -> bool:
    """oneDNN's prepacked fp32 linear exists in this torch build (off with ANYSPEC_ONEDNN=0)."""
    if os.environ.get("ANYSPEC_ONEDNN", "1") == "0":
        return False
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def swap_linears(model: nn.Module, kernel: str) -> int:
    """Replace every ``nn.Linear`` in ``model`` (lm_head included) in place; returns how many."""
    cls = KERNELS[kernel]
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, cls(child))
                count += 1
    return count
