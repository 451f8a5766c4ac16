"""Prompt lookup's place in a round (engine/lookup.py): alone while the text copies, and as many
tokens as pay at the measured costs."""

from anyspec.algorithms.adaptive_k import PassCosts
from anyspec.engine.lookup import SPAN, Lookup

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 4 + [1, 2]  # the text copies its first line


def costs(first: float, per_row: float) -> PassCosts:
    c = PassCosts()
    for rows in (1, 8, 40):
        c.record(rows, first + per_row * (rows - 1))
    return c


def test_copying_is_read_from_the_last_round_whether_proposed_or_not():
    lookup = Lookup(2, PROMPT, costs(1.0, 0.0), k=5)
    found = lookup.find(100)
    assert found[:3] == [3, 4, 5] and not lookup.copying
    lookup.commit([3, 4])  # the round committed what the continuation said: the text copies
    assert lookup.copying
    assert lookup.find(100)[:2] == [5, 6]
    lookup.commit([5, 99])  # the copy ends
    assert not lookup.copying
    assert lookup.find(100) == []  # "5 99" never occurred
    lookup.commit([7])
    assert not lookup.copying  # nothing was found to agree with
    once = Lookup(2, PROMPT, costs(1.0, 0.0), k=5)
    assert once.find(100)[0] == 3
    once.commit([3])
    assert not once.copying  # one token that agrees may be chance
    assert once.find(100)[0] == 4
    once.commit([4])
    assert once.copying  # a second one, the round after


def test_a_continuation_is_as_long_as_pays_at_the_measured_costs():
    cheap = Lookup(2, PROMPT, costs(1.0, 0.0), k=5)
    for _ in range(20):  # accepted in full, round after round
        cheap.commit(cheap.find(3))
    assert cheap.acceptance.rate > 0.95
    assert len(cheap.find(100)) == SPAN  # rows cost nothing: as many as it may
    dear = Lookup(2, PROMPT, costs(1.0, 1.0), k=5)
    assert dear.acceptance.rate == 0.25 and len(dear.find(100)) == 1  # each row costs a pass
    unknown = Lookup(2, PROMPT, PassCosts(), k=5)
    assert len(unknown.find(100)) == 5  # the draft's k until the costs are measured
    assert len(cheap.find(3)) == 3  # never past the limit (the tokens left to generate)


def test_the_continuation_goes_alone_where_it_beats_a_draft_round_with_its_catch_up():
    target = costs(0.05, 0.002)  # a verify: 50 ms and 2 ms a row
    draft = costs(0.005, 0.001)  # a draft pass: 5 ms and 1 ms a token it reads
    lookup = Lookup(2, PROMPT, target, k=5, draft_costs=draft)
    found = lookup.find(4)
    assert found and not lookup.alone_pays(found, behind=1)  # no draft round measured yet
    for _ in range(5):  # draft rounds: 3 tokens in 80 ms, 5 ms of it the catch-up on 1 token
        lookup.drafted(3, 0.080, behind=1)
    # alone: 1 + 0.25 + 0.0625 tokens (its prior acceptance, 2 tokens) in a verify of 3 rows, 54 ms,
    # against 3 tokens in 80 ms, plus the catch-up of the tokens the draft has not read
    assert len(found) == 2 and lookup.acceptance.rate == 0.25
    assert not lookup.alone_pays(found, behind=1)  # 3 / 80 ms beats 1.31 / 54 ms
    assert lookup.alone_pays(found, behind=60)  # 3 / 139 ms does not
    no_draft = Lookup(2, PROMPT, target, k=5)
    no_draft.drafted(3, 0.080, behind=1)
    assert not no_draft.alone_pays(found, behind=60)  # without a draft nothing is measured


def test_a_prediction_is_proposed_where_it_matches_as_long_a_suffix_and_counted():
    prediction = [1, 2, 3, 4, 50, 51, 52, 53, 54]  # the prompt's "1 2 3 4" goes on otherwise here
    lookup = Lookup(2, PROMPT, costs(1.0, 0.0), k=5, predicted=prediction)
    assert lookup.find(3) == [1, 2, 3] and lookup.from_prediction  # the answer starts where it does
    lookup.commit([1, 2, 3, 4])
    assert lookup.find(3) == [50, 51, 52] and lookup.from_prediction  # "1 2 3 4": a match as long
    lookup.commit([50, 51, 7])
    assert lookup.prediction_accepted == 3 + 2 and not lookup.find(3)  # "51 7" occurs nowhere
    longer = Lookup(2, PROMPT, costs(1.0, 0.0), k=5, predicted=[5, 6, 60, 61])
    assert longer.find(2) == [5, 6]
    longer.commit([3, 4, 5, 6])
    assert longer.find(2) == [7, 8] and not longer.from_prediction  # "3 4 5 6" against "5 6"
