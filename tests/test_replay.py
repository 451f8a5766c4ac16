"""The stop-rule replay's scoring (benchmarks/replay.py) on a recording small enough to work by hand."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "replay.py"
SPEC = importlib.util.spec_from_file_location("replay", SCRIPT)
replay = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(replay)


def recording():
    """Three rounds over 8 output tokens, each drafting without a stop; 0.6 s of decode against the
    target alone's 0.8 s."""
    rounds = [
        {"pos": 0, "probs": [0.9, 0.2, 0.9], "prefixes": [[1], [1, 2], [1, 2, 9]], "catch_up": 0.01},
        {"pos": 3, "probs": [0.95, 0.95, 0.95], "prefixes": [[4], [4, 5], [4, 5, 6]], "catch_up": 0.01},
        {"pos": 7, "probs": [0.5], "prefixes": [[8]], "catch_up": 0.01},
    ]
    run = {"id": "p", "set": "code", "ids": list(range(1, 9)), "decode": 0.6, "base_decode": 0.8,
           "rounds": rounds}
    return {"runs": [run], "verify": {1: 0.10, 2: 0.11, 3: 0.12, 4: 0.13}, "draft_forward": 0.01}


def test_the_recorded_rule_models_the_measured_speed_and_a_stop_saves_its_costs():
    table = {row["rule"]: row["code"] for row in replay.score(recording(), 3)}
    assert table["no stop, k = 3 (recorded)"] == pytest.approx((8 / 0.6) / (8 / 0.8), abs=1e-3)
    # round 1 stops after its doubted second token: the same 3 tokens, one draft forward and one
    # verified row (0.13 -> 0.12 s) less
    assert table["token < 0.5, k = 5"] == pytest.approx((8 / 0.58) / (8 / 0.8), abs=1e-3)
    assert table["hindsight"] >= max(table.values()) - 1e-9


def test_hindsight_takes_the_best_stop_of_each_round():
    table = {row["rule"]: row["code"] for row in replay.score(recording(), 3)}
    overhead = (0.6 - (0.01 + 0.02 + 0.13) * 2 - (0.01 + 0.11)) / 3
    # every stop of rounds 1 and 2 (round 3 has one): the best total is tokens / seconds at its best
    best = 0.0
    for j1 in (1, 2, 3):
        for j2 in (1, 2, 3):
            tokens = [2, 3, 3][j1 - 1] + [2, 3, 4][j2 - 1] + 1
            seconds = sum(0.01 + (j - 1) * 0.01 + [0.11, 0.12, 0.13][j - 1] for j in (j1, j2)) + 0.01 + 0.11
            best = max(best, tokens / (seconds + 3 * overhead))
    assert table["hindsight"] == pytest.approx(best / (8 / 0.8), abs=1e-3)
