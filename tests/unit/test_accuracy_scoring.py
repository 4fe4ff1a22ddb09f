"""The accuracy benchmark's statistics (benchmarks/_scoring.py) on synthetic report documents:
what counts as a hit, a false alarm, a false straggler, and how precision and recall add up."""

from __future__ import annotations

from typing import Any

import pytest

from tests._jobs import ROOT, load_script

S = load_script(ROOT / "benchmarks" / "_scoring.py", "_scoring")


def _f(kind: str, cause: str | None = None, ranks: list[int] | None = None,
       stake: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "cause": cause, "ranks": ranks or [], "time_at_stake_ms": stake,
            **extra}


def _report(*findings: dict[str, Any], wall: float = 100.0) -> dict[str, Any]:
    return {"run": {"analysed_wall_ms": wall}, "findings": list(findings)}


STRAGGLER = S.Claim("straggler")
DATA = S.Claim("data_stall")


def _compute_truth(rank: int) -> Any:
    want = S.Expect("straggler:compute", (S.Claim("straggler", "compute", frozenset({rank})),))
    return S.Truth((want,), (STRAGGLER, DATA), frozenset({rank}))


def test_finding_key_keeps_the_cause_only_where_it_names_the_diagnosis() -> None:
    assert S.finding_key(_f("straggler", "network")) == "straggler:network"
    assert S.finding_key(_f("bandwidth", "latency-bound")) == "bandwidth:latency-bound"
    assert S.finding_key(_f("data_stall", "data")) == "data_stall"
    assert S.finding_key(_f("straggler")) == "straggler"


def test_right_straggler_is_a_hit() -> None:
    s = S.score_run("c", _compute_truth(2), _report(_f("straggler", "compute", [2]),
                                                    _f("idle", "host", [0, 1])))
    assert s.met == {"straggler:compute": True}
    assert s.tp == {"straggler:compute": 1} and not s.fp
    assert s.unjudged == {"idle": 1}  # neither expected nor forbidden
    assert not s.false_straggler


def test_wrong_cause_is_a_miss_and_a_false_positive_but_not_a_false_straggler() -> None:
    s = S.score_run("c", _compute_truth(2), _report(_f("straggler", "network", [2])))
    assert s.met == {"straggler:compute": False}
    assert s.fp == {"straggler:network": 1}
    assert not s.false_straggler  # rank 2 really is slow


def test_wrong_rank_is_a_false_straggler() -> None:
    s = S.score_run("c", _compute_truth(2), _report(_f("straggler", "compute", [1])))
    assert s.met == {"straggler:compute": False}
    assert s.fp == {"straggler:compute": 1} and s.false_straggler


def test_healthy_run_straggler_and_suspected_straggler() -> None:
    truth = S.Truth(forbid=(STRAGGLER, DATA))
    firm = S.score_run("healthy", truth, _report(_f("straggler", "network", [1])))
    assert firm.false_straggler and firm.fp == {"straggler:network": 1} and firm.met == {}
    soft = S.score_run("healthy", truth,
                       _report(_f("straggler", "network", [1], confidence="suspected")))
    assert not soft.false_straggler and soft.suspected_false_straggler
    assert not soft.fp and soft.suspected_fp == {"straggler:network": 1}
    clean = S.score_run("healthy", truth, _report(_f("exposed_comm")))
    assert not clean.false_straggler and not clean.fp and clean.unjudged == {"exposed_comm": 1}


def test_suspected_finding_does_not_meet_an_expectation() -> None:
    s = S.score_run("c", _compute_truth(0),
                    _report(_f("straggler", "compute", [0], confidence="suspected")))
    assert s.met == {"straggler:compute": False}
    assert s.met_suspected == {"straggler:compute": True}
    assert not s.tp and not s.fp


def test_alternatives_and_rank_sets() -> None:
    want = S.Expect("data_stall", (S.Claim("data_stall", ranks=frozenset({3})),
                                   S.Claim("straggler", "data", frozenset({3}))))
    truth = S.Truth((want,), (STRAGGLER, DATA), frozenset({3}))
    as_straggler = S.score_run("d", truth, _report(_f("straggler", "data", [3])))
    assert as_straggler.met == {"data_stall": True}
    assert as_straggler.tp == {"straggler:data": 1}
    elsewhere = S.score_run("d", truth, _report(_f("data_stall", "data", [0, 1])))
    assert elsewhere.met == {"data_stall": False} and elsewhere.fp == {"data_stall": 1}


def test_time_at_stake_over_wall_is_flagged() -> None:
    truth = S.Truth()
    assert S.score_run("h", truth, _report(_f("idle", stake=60), _f("exposed_comm", stake=50),
                                           wall=100)).stake_over_wall
    assert not S.score_run("h", truth, _report(_f("idle", stake=60), _f("exposed_comm",
                                                                         stake=40),
                                               wall=100)).stake_over_wall


def test_tally_precision_recall_and_false_straggler_rate() -> None:
    runs = [
        S.score_run("compute-1.3x", _compute_truth(1), _report(_f("straggler", "compute", [1]))),
        S.score_run("compute-1.3x", _compute_truth(1), _report(_f("straggler", "compute", [1]))),
        S.score_run("compute-1.3x", _compute_truth(1), _report(_f("straggler", "compute", [0]))),
        S.score_run("compute-1.3x", _compute_truth(1), _report()),
        S.score_run("healthy", S.Truth(forbid=(STRAGGLER,)),
                    _report(_f("straggler", "compute", [2]))),
        S.score_run("healthy", S.Truth(forbid=(STRAGGLER,)), _report()),
        S.RunScore("healthy", error="uberprof run exited 1"),
    ]
    rows = S.tally(runs)
    row = rows["straggler:compute"]
    assert (row.expected, row.found, row.tp, row.fp) == (4, 2, 2, 2)
    assert row.recall == pytest.approx(0.5) and row.precision == pytest.approx(0.5)
    assert S.false_stragglers(runs) == (2, 0, 6)  # the failed run is not scored
    assert S.false_stragglers(runs, {"healthy"}) == (1, 0, 2)
    assert row.as_dict()["recall"] == pytest.approx(0.5)


def test_empty_rows_have_no_ratio() -> None:
    row = S.KindRow("exposed_comm")
    assert row.recall is None and row.precision is None


def test_run_score_as_dict_is_json() -> None:
    import json

    s = S.score_run("c", _compute_truth(2), _report(_f("straggler", "compute", [2])))
    doc = json.loads(json.dumps(s.as_dict()))
    assert doc["tp"] == {"straggler:compute": 1} and doc["met"] == {"straggler:compute": True}
