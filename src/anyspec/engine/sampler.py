"""A sampled generation's choices (``algorithms/gumbel.py``): the target's token at each generated
position, and the draft's guesses coupled to the same noise.

The target's choice at position i depends on its logits row and on ``(seed, i)`` alone, so verifying
is exact match, and what is committed does not depend on the draft. The draft reads the target's
noise on the tokens both vocabularies share (each draft token takes its target twin's value), and
noise of its own elsewhere; its position is the round's first plus the draft tokens before it, which
is the target position where the two tokenizers cut the text alike.
"""

from __future__ import annotations

import functools
import secrets

import numpy as np
import torch

from anyspec.algorithms import gumbel
from anyspec.algorithms.sampling import filtered_logits
from anyspec.algorithms.tli import constrain
from anyspec.config import SamplingParams


def request_seed(params: SamplingParams) -> int:
    """The request's seed, or a fresh one: every answer reports the seed that reproduces it."""
    return params.seed if params.seed is not None else secrets.randbits(63)


class Sampler:
    def __init__(self, params: SamplingParams, seed: int, vocab_size: int, bridge=None):
        self.params = params
        self.seed, self.vocab_size = seed, vocab_size
        self.target = gumbel.Noises(lambda position: gumbel.noise(seed, position, vocab_size))
        self.draft = gumbel.Noises(self._coupled) if bridge is not None else None
        if bridge is not None:  # each draft id's target twin in the intersection, -1 for none
            self.twins = np.full(len(bridge.draft_to_target), -1, dtype=np.int64)
            self.twins[np.asarray(bridge.inter_draft_ids)] = np.asarray(bridge.inter_target_ids)

    def filtered(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        p = self.params
        return filtered_logits(constrain(logits, mask), p.temperature, p.top_k, p.top_p, p.min_p)

    def choices(self, logits: torch.Tensor, positions: list[int]) -> list[int]:
        """The target's token for each row of ``logits [R, V]``, row r at generated ``positions[r]``."""
        noises = [functools.partial(self._target_noise, i) for i in positions]
        return gumbel.choose(self.filtered(logits), noises)

    def draft_choice(self, logits: torch.Tensor, position: int,
                     mask: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        """The draft's token from its ``logits [Vd]`` (confined to ``mask``) at ``position``, and its
        distribution there (the softmax of what it chose from)."""
        filtered = self.filtered(logits, mask)
        token = gumbel.choose(filtered[None], [functools.partial(self._draft_noise, position)])[0]
        return token, torch.softmax(filtered, dim=-1)

    def _target_noise(self, position: int, ids: np.ndarray | None) -> torch.Tensor:
        if ids is None:
            return self.target.at(position)
        return gumbel.noise(self.seed, position, self.vocab_size, ids=ids)

    def _draft_noise(self, position: int, ids: np.ndarray | None) -> torch.Tensor:
        return self.draft.at(position) if ids is None else self._coupled(position, ids)

    def _coupled(self, position: int, ids: np.ndarray | None = None) -> torch.Tensor:
        """The draft's noise at ``position``, of ``ids`` alone or whole (None): its own stream, with
        each shared token's target twin's (taken from the target's whole noise when it is whole)."""
        twins = self.twins if ids is None else self.twins[ids]
        shared = twins >= 0
        noise = gumbel.noise(self.seed, position, len(self.twins), stream=1, ids=ids)
        if ids is None:
            noise[torch.from_numpy(shared)] = self.target.at(position)[torch.from_numpy(twins[shared])]
        else:
            noise[torch.from_numpy(shared)] = self._target_noise(position, twins[shared])
        return noise
