"""Branches in one verify: the draft's next choices beside its chain, as a trie of target tokens.

Where the draft doubts a token, a token it ranks second (or third) is often what the target picks.
A round may then propose, beside its chain t1..tm, branches that leave the chain at such a
position: the chain's tokens up to there and the other choice after them, in target tokens (for
SLEM, that text re-encoded; so a branch can differ from the chain before the position where the
draft's tokens did, and be longer than one token).

``trie`` merges the branches into one tree of target tokens, the chain first. The target scores
the root (the pending token) and every node in ONE forward, each row attending to its own
ancestors only (``StackModel.forward`` with parents), so each row's logits are exactly those the
target gives that branch alone. Verification is exact match, walking from the root:

* greedy (``verify_greedy``): at each node the target's argmax, if it is a child, is accepted and
  the walk goes on there; else it is the token the target adds. The accepted path is exactly what
  the target alone writes greedily, whatever the branches were. With one branch (the chain) it is
  ``tli.verify_greedy``.
* sampling: the same walk over the target's Gumbel-max choices, with noise fixed by the seed
  and the row's generated position (``gumbel.py``), so each row's choice x is the token the
  target alone would draw there. A child holding x is accepted and the walk goes on there, else
  x is the token the target adds. Each committed token is a draw from p given exactly the
  committed text, for any tree built independently of the noise the target uses (``slem.py``'s
  argument, over several candidates), for TLI and SLEM alike.

``gain`` scores a candidate branch by the draft's own probabilities: the chance that the target
gets to its position (the product of the draft's probabilities for the chain's tokens before it)
times the draft's probability of the other choice. A round adds a branch only when that many
expected tokens are worth its extra rows (``loop``: the measured cost of the wider verify against
the measured seconds per committed token).
"""

from __future__ import annotations

import torch

from anyspec.algorithms.sampling import argmax, top_ids


def next_choices(logits: torch.Tensor, top: int, mask: torch.Tensor | None = None,
                 m: int = 1) -> tuple[float, list[tuple[int, float]]]:
    """``(p(top), [(token, p(token))])``: the ``m`` tokens the draft ranks highest after ``top``,
    under its softmax of ``logits`` (confined to ``mask``)."""
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    p = torch.softmax(logits.float(), dim=-1)
    best = [t for t in top_ids(p, m + 1) if t != top][:m]
    return float(p[top]), [(t, float(p[t])) for t in best]


def gains(p_chain: list[float], p_others: list[list[float]]) -> list[list[float]]:
    """Expected extra tokens from a branch at position i through the draft's j-th other choice
    there: prod(p_chain[:i]) * p_others[i][j]."""
    out, reach = [], 1.0
    for p_top, p_alts in zip(p_chain, p_others, strict=True):
        out.append([reach * p for p in p_alts])
        reach *= p_top
    return out


def trie(branches: list[list[int]]) -> tuple[list[int], list[int]]:
    """The branches (target ids after the root; the first one the chain) as one tree: its nodes'
    ``(tokens, parents)``, each parent the index of an earlier node or -1 for the root. The chain's
    nodes come first, in order; a prefix two branches share is one path."""
    tokens, parents, children = [], [], {}
    for branch in branches:
        at = -1
        for token in branch:
            node = children.get((at, token))
            if node is None:
                node = children[(at, token)] = len(tokens)
                tokens.append(token)
                parents.append(at)
            at = node
    return tokens, parents


def new_nodes(branches: list[list[int]], branch: list[int]) -> int:
    """How many nodes ``branch`` adds to the trie of ``branches``."""
    return len(trie([*branches, branch])[0]) - len(trie(branches)[0])


def verify_greedy(logits: torch.Tensor, tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """``logits [1 + nodes, Vt]``: the root's row, then each node's -> ``(accepted path as node
    indices, the token the target adds)``."""
    return verify_exact(argmax(logits), tokens, parents)


def verify_exact(choice: list[int], tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """``choice``: the target's own token at the root's row, then at each node's (its argmax, or its
    Gumbel-max choice at the row's position) -> ``(accepted path as node indices, the token the
    target adds)``."""
    children = {(up, token): j for j, (up, token) in enumerate(zip(parents, tokens, strict=True))}
    path, at = [], -1
    while (node := children.get((at, choice[at + 1]))) is not None:
        path.append(node)
        at = node
    return path, choice[at + 1]


def paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Each trie node's tokens from the root down, its own last (``parents``: -1 under the root)."""
    out = []
    for j in range(len(tokens)):
        path, at = [], j
        while at >= 0:
            path.append(tokens[at])
            at = parents[at]
        out.append(path[::-1])
    return out


def depths(parents: list[int]) -> list[int]:
    """Each row's depth in a tree given by its ``parents`` (-1: the root, which follows the cache)."""
    if len(parents) and parents[0] != -1 or any(not 0 <= up < j for j, up in enumerate(parents) if j):
        raise ValueError("forward: a tree's first row is its root (-1), each other's parent an earlier row")
    out = []
    for up in parents:
        out.append(out[up] + 1 if up >= 0 else 0)
    return out
