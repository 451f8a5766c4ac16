"""Branches in one verify (algorithms/tree.py): the trie, greedy and sampled exact match over it."""

from __future__ import annotations

import itertools

import torch
from test_sampling import chi_square_pvalue, gumbel_draws

from anyspec.algorithms import tli, tree


def test_the_trie_keeps_the_chain_first_and_merges_shared_prefixes():
    tokens, parents = tree.trie([[5, 6, 7], [5, 9], [5, 6, 8, 1], [3]])
    assert tokens == [5, 6, 7, 9, 8, 1, 3]
    assert parents == [-1, 0, 1, 0, 1, 4, -1]
    assert tree.new_nodes([[5, 6, 7]], [5, 6, 8, 1]) == 2
    assert tree.new_nodes([[5, 6, 7]], [5, 6]) == 0


def test_greedy_over_a_chain_alone_is_the_chain_rule():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        logits = torch.randn(5, 6, generator=g)
        chain = logits.argmax(-1)[:4].tolist()
        cut = int(torch.randint(0, 5, (1,), generator=g))
        chain[cut:] = [(t + 1) % 6 for t in chain[cut:]]  # disagree from position cut on
        tokens, parents = tree.trie([chain])
        path, token = tree.verify_greedy(logits, tokens, parents)
        n, want = tli.verify_greedy(logits, chain)
        assert [tokens[j] for j in path] == chain[:n] and token == want


def test_greedy_walks_into_the_branch_the_target_picks():
    tokens, parents = tree.trie([[1, 2, 3], [1, 4, 5]])  # nodes 1, 2, 3, 4, 5
    logits = torch.full((6, 8), -1.0)
    for row, best in enumerate([1, 4, 0, 0, 5, 7]):  # root -> 1 -> 4 (the branch) -> 5 -> adds 7
        logits[row, best] = 1.0
    path, token = tree.verify_greedy(logits, tokens, parents)
    assert [tokens[j] for j in path] == [1, 4, 5] and token == 7


def test_the_gain_of_a_branch_is_the_chance_to_get_there_times_the_other_choice():
    assert tree.gains([0.9, 0.5, 0.6], [[0.1], [0.4, 0.2], [0.3]]) == [
        [0.1], [0.9 * 0.4, 0.9 * 0.2], [0.9 * 0.5 * 0.3]]
    logits = torch.tensor([2.0, 1.0, 3.0, 0.0])
    p = torch.softmax(logits, -1)
    assert tree.next_choices(logits, 2) == (float(p[2]), [(0, float(p[0]))])
    assert tree.next_choices(logits, 2, m=2) == (float(p[2]), [(0, float(p[0])), (1, float(p[1]))])
    assert tree.next_choices(logits, 0, m=2) == (float(p[0]), [(2, float(p[2])), (1, float(p[1]))])
    mask = torch.tensor([False, True, True, True])
    inside = torch.softmax(torch.tensor([1.0, 3.0, 0.0]), -1)  # tokens 1, 2, 3
    assert tree.next_choices(logits, 2, mask) == (float(inside[1]), [(1, float(inside[0]))])


def _target(vocab: int = 4, seed: int = 0):
    """A target with its own distribution after each context of up to two tokens."""
    g = torch.Generator().manual_seed(seed)
    table = {}
    for n in range(3):
        for ctx in itertools.product(range(vocab), repeat=n):
            table[ctx] = torch.softmax(2 * torch.randn(vocab, generator=g), -1)
    return table


def test_sampling_over_a_tree_draws_the_first_two_tokens_from_the_targets_distribution():
    """Each round verifies a tree of both the likeliest and unlikely branches by exact match; the
    committed tokens' joint law is the target's own (chi-square), whatever the tree."""
    p, vocab = _target(), 4
    trees = [[[0, 1], [0, 2], [3]], [[2, 2], [1]], [[1, 3, 0], [1, 0], [2, 1]]]
    counts = torch.zeros(vocab * vocab)
    through_branch = 0
    for i in range(6000):
        branches = trees[i % len(trees)]
        tokens, parents = tree.trie(branches)
        paths = [()] + [tuple(tokens[a] for a in _ancestry(j, parents)) for j in range(len(tokens))]
        probs = torch.stack([p[path[:2]] if len(path) <= 2 else p[path[-2:]] for path in paths])
        positions = [len(path) for path in paths]  # the generated position each row chooses
        path, token = tree.verify_exact(gumbel_draws(probs, positions, seed=i), tokens, parents)
        out = [tokens[j] for j in path] + [token]
        through_branch += out[:len(path)] != branches[0][:len(path)]
        while len(out) < 2:  # the next round: the target alone
            out += gumbel_draws(p[tuple(out)][None], [len(out)], seed=i)
        counts[out[0] * vocab + out[1]] += 1
    want = torch.stack([p[()][a] * p[(a,)][b] for a in range(vocab) for b in range(vocab)])
    assert through_branch > 500
    assert chi_square_pvalue(counts, want) > 1e-3


def test_the_tree_check_sees_a_walk_that_ignores_the_targets_draw():
    """The same chi-square rejects a rule that accepts the chain without drawing (so it can fail)."""
    p, vocab = _target(), 4
    g = torch.Generator().manual_seed(2)
    counts = torch.zeros(vocab * vocab)
    for _ in range(6000):
        first = 0 if torch.rand(1, generator=g) < 0.5 else int(torch.multinomial(p[()], 1, generator=g))
        second = int(torch.multinomial(p[(first,)], 1, generator=g))
        counts[first * vocab + second] += 1
    want = torch.stack([p[()][a] * p[(a,)][b] for a in range(vocab) for b in range(vocab)])
    assert chi_square_pvalue(counts, want) < 1e-6


def _ancestry(j: int, parents: list[int]) -> list[int]:
    out = []
    while j >= 0:
        out.append(j)
        j = parents[j]
    return out[::-1]


def test_branches_are_the_likeliest_other_choices_at_any_position_that_pay():
    from types import SimpleNamespace

    from anyspec.engine.proposers import choose_branches

    same = SimpleNamespace(to_target=lambda ctx, ids, limit: list(ids))
    others = [[(5, 0.3), (6, 0.25)], [(7, 0.05)]]  # gains 0.3, 0.25 at position 0; 0.015 at 1

    def branches(width, least):  # chain [1, 2], the draft doubting its first token
        pays = lambda gain, rows, added: gain > least  # noqa: E731
        return choose_branches(same, None, [1, 2], [1, 2], [0.3, 0.9], others, 2, width, pays)

    assert branches(2, 0.1) == [[5], [6]]
    assert branches(1, 0.1) == [[5]]
    assert branches(3, 0.1) == [[5], [6]]
    assert branches(3, 0.0) == [[5], [6], [1, 7]]
