"""A sampled generation's choices (``algorithms/gumbel.py``): the target's token at each generated
position, and the draft's guesses coupled to the same noise.

The target's choice at position i depends on its logits row and on ``(seed, i)`` alone, so verifying
is exact match, and what is committed does not depend on the draft. The draft reads the target's
noise on the tokens both vocabularies share (each draft token takes its target twin's value), and
noise of its own elsewhere; its position is the round's first plus the draft tokens before it, which
is the target position where the two tokenizers cut the text alike.
"""

from __future__ import annotations

import secrets

import numpy as np
import torch

from anyspec.algorithms import gumbel
from anyspec.algorithms.sampling import filtered_logits
from anyspec.algorithms.tli import constrain
from anyspec.backends.linear import rowwise_available, rowwise_kernel
from anyspec.config import SamplingParams


def request_seed(params: SamplingParams) -> int:
    """The request's seed, or a fresh one: every answer reports the seed that reproduces it. A fresh
    one is below 2**53, so that a client that reads JSON numbers as doubles (JavaScript) sends back
    the seed it was shown."""
    return params.seed if params.seed is not None else secrets.randbits(53)


def chooser():
    """What makes the choices: anyspec's kernel where it runs (``gumbel_choose``, the same choices as
    ``gumbel.choose`` in a fraction of the time), else ``gumbel.choose``."""
    if not rowwise_available():
        return gumbel.choose
    kernel = rowwise_kernel()

    def choose(filtered, keys, twins=None, twin_keys=None):
        twins = None if twins is None else torch.from_numpy(twins)
        return kernel.gumbel_choose(filtered.detach().to(torch.float32), keys, twins, twin_keys or [])
    return choose


class Sampler:
    def __init__(self, params: SamplingParams, seed: int, bridge=None):
        self.params, self.seed = params, seed
        self.choose = chooser()
        self.twins = None
        if bridge is not None:  # each draft id's target twin in the intersection, -1 for none
            self.twins = np.full(len(bridge.draft_to_target), -1, dtype=np.int64)
            self.twins[np.asarray(bridge.inter_draft_ids)] = np.asarray(bridge.inter_target_ids)

    def filtered(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        p = self.params
        return filtered_logits(constrain(logits, mask), p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p,
                               p.top_n_sigma)

    def choices(self, logits: torch.Tensor, positions: list[int]) -> list[int]:
        """The target's token for each row of ``logits [R, V]``, row r at generated ``positions[r]``."""
        return self.choose(self.filtered(logits), [gumbel.key(self.seed, i) for i in positions])

    def draft_choice(self, logits: torch.Tensor, position: int,
                     mask: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        """The draft's token from its ``logits [Vd]`` (confined to ``mask``) at ``position``, and its
        distribution there (the softmax of what it chose from): its own noise, and on each token the
        target has, the target's noise of its twin."""
        filtered = self.filtered(logits, mask)
        token = self.choose(filtered[None], [gumbel.key(self.seed, position, stream=1)], self.twins,
                            [gumbel.key(self.seed, position)])[0]
        return token, torch.softmax(filtered, dim=-1)
