"""Prompt lookup: a continuation copied from earlier in the context, proposed without a draft forward.

Where the last n tokens of the context (the prompt and the output so far, target ids) occurred
before, the tokens that followed that earlier occurrence are a guess for what comes next: code
repeats names and lines, and edits and answers quote their prompts. ``Index.find`` takes the latest
earlier occurrence of the longest such suffix, n from ``max_n`` down to ``min_n``, and proposes up
to ``limit`` of the tokens after it; where those run past the context's end, the copy goes on
repeating itself (a context that repeats with some period is guessed to go on repeating).

A prediction (a text the answer is expected to repeat, given with the request) is an index of its
own, static, matched against the generation's context the same way (``Index.match``). How much of
it the answer holds (``matched``) is counted from the two texts alone, after the answer, so that it
does not depend on which proposals were made.

The index maps each n-gram of the context to the end of its latest occurrence and grows with the
tokens appended, so a round's lookup costs ``max_n`` dictionary reads however long the context
is; each appended token adds ``max_n - min_n + 1`` entries.

The guess depends only on the committed context, never on the target's scores, and is verified by
exact match like any proposal (``slem``'s docstring says why that is lossless, greedy or sampled).
"""

from __future__ import annotations

import difflib

from anyspec.config import MAX_NGRAM as MAX_N


class Index:
    """The n-grams of a growing context, ``min_n`` to ``max_n`` tokens long, each with the end of its
    latest occurrence."""

    def __init__(self, min_n: int = 2, max_n: int = MAX_N):
        self.ids: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}
        self.min_n, self.max_n = min_n, max_n
        self.indexed = 1  # n-grams ending before this position are in ``ends``

    def extend(self, ids) -> None:
        self.ids.extend(int(t) for t in ids)

    def find(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of the longest suffix
        of the context; [] when none occurred."""
        return self.match(limit)[1]

    def match(self, limit: int, context: list[int] | None = None) -> tuple[int, list[int]]:
        """``(n, continuation)``: the longest suffix of ``context``, n tokens, that occurs in this
        index's text, and up to ``limit`` tokens that followed its latest occurrence; ``(0, [])``
        where none does. ``context`` None is the index's own text, whose suffix is matched against
        its earlier occurrences and whose copy repeats itself past the end; another context (what a
        generation has so far, against a prediction's text) gets the tokens up to the text's end."""
        ids, size = self.ids, len(self.ids)
        if limit <= 0 or self.min_n < 1:
            return 0, []
        for end in range(self.indexed, size):  # an occurrence ends before the suffix does
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.ends[tuple(ids[end - n:end])] = end
        self.indexed = max(self.indexed, size)
        query = ids if context is None else context
        for n in range(min(self.max_n, len(query) - (context is None)), self.min_n - 1, -1):
            end = self.ends.get(tuple(query[len(query) - n:]))
            if end is not None:
                out = ids[end:end + limit]
                while context is None and len(out) < limit:  # past the context's end it repeats itself
                    out.append(out[len(out) - (size - end)])
                return n, out
        return 0, []


def lookup(history, limit: int, min_n: int = 2, max_n: int = MAX_N) -> list[int]:
    """``Index.find`` on ``history`` at once."""
    index = Index(min_n, max_n)
    index.extend(history)
    return index.find(limit)


def matched(prediction: list[int], answer: list[int]) -> int:
    """How many of the prediction's tokens the answer holds, in order: the sizes of the matching
    blocks ``difflib.SequenceMatcher`` finds. It does not begin a match at a long prediction's
    commonest tokens (its ``autojunk``, which keeps this to a fraction of a second for 30k tokens
    each) but takes them in beside a match."""
    blocks = difflib.SequenceMatcher(None, answer, prediction).get_matching_blocks()
    return sum(block.size for block in blocks)
