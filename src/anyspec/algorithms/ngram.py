"""Prompt lookup: a continuation copied from earlier in the context, proposed without a draft forward.

Where the last n tokens of the context (the prompt and the output so far, target ids) occurred
before, the tokens that followed that earlier occurrence are a guess for what comes next: code
repeats names and lines, and answers quote their prompts. ``lookup`` takes the latest earlier
occurrence of the longest such suffix, n from ``max_n`` down to ``min_n``, and proposes up to
``limit`` of the tokens after it.

The guess depends only on the committed context, never on the target's scores, and is verified by
exact match like any proposal (``slem``'s docstring says why that is lossless, greedy or sampled).
"""

from __future__ import annotations

import numpy as np

from anyspec.config import MAX_NGRAM as MAX_N


def lookup(history: list[int] | np.ndarray, limit: int, min_n: int = 2, max_n: int = MAX_N) -> list[int]:
    """Up to ``limit`` tokens that followed the latest earlier occurrence of the longest suffix of
    ``history`` (from ``max_n`` down to ``min_n`` tokens); [] when none occurred."""
    ids = np.asarray(history)
    size = len(ids)
    if limit <= 0 or min_n < 1:
        return []
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        starts = size - n  # candidate occurrences begin at 0 .. size - n - 1 (not the suffix itself)
        match = np.ones(starts, dtype=bool)
        for j in range(n):
            match &= ids[j:starts + j] == ids[size - n + j]
        found = np.flatnonzero(match)
        if len(found):
            at = int(found[-1]) + n
            return ids[at:at + limit].tolist()
    return []
