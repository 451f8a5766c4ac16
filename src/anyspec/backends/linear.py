"""Faster CPU matrix products for the transformers backend, swapped in for ``nn.Linear``.

Speculative decoding pays off only when scoring k+1 tokens costs little more than scoring one.
On CPUs without native bf16 (AVX2 only), MKL's fp32 GEMM behind ``nn.Linear`` grows almost
linearly with the number of rows at small M; two kernels that torch ships keep it nearly flat:

* ``onednn``: fp32 weights prepacked once for oneDNN (``torch.ops.mkldnn``), exactly the model's
  numbers (fp32 rounding differences only). Used for fp32 models on the CPU.
* ``int8``: weight-only int8 (one symmetric scale per output channel) through
  ``torch._weight_int8pack_mm``. The inputs are rounded to bf16; the rest of the model stays
  fp32. A *different model* from the fp32 one (quantized weights), so it is opt-in for a target
  (``--dtype int8``) and the default for the draft, whose numbers never change the output.

Both kernels compute every row the same way however many rows come in (checked by the tests),
so verifying k tokens gives the same logits as decoding them one by one, up to the fp32/bf16
rounding of the attention.
"""

from __future__ import annotations

import os

import torch
from torch import nn

PREPACK_ROWS = 5  # oneDNN picks its weight layout for this many rows: k+1 at the default k=4


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
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch._weight_int8pack_mm(rows, self.weight_int8, self.scale).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


KERNELS = {"onednn": OneDNNLinear, "int8": Int8Linear}


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
