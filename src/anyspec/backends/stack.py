"""The KV cache and rotary angles of anyspec's C++ decoder stack (lean and GGUF models)."""

from __future__ import annotations

import torch


class KVCache:
    """One preallocated fp32 tensor per layer for keys and one for values, ``[kv_heads, capacity, head_dim]``.

    It grows by doubling; positions past the model's ``num_cached`` are simply overwritten by the
    next forward, so cropping costs nothing.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, theta: float, capacity: int = 256):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        self.inv_freq = 1.0 / theta ** exponents
        self.keys, self.values = self._allocate(capacity), self._allocate(capacity)

    def _allocate(self, length: int) -> list[torch.Tensor]:
        return [torch.zeros(self.kv_heads, length, self.head_dim) for _ in range(self.layers)]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    def prepare(self, start: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for positions up to ``start + m``, and their rotary cos and sin ``[m, head_dim]``."""
        end = start + m
        if end > self.capacity:
            size = max(end, 2 * self.capacity)
            for old in (self.keys, self.values):
                new = self._allocate(size)
                for tensor, before in zip(new, old, strict=True):
                    tensor[:, :start] = before[:, :start]
                old[:] = new
        positions = torch.arange(start, end, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos(), angles.sin()
