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


def _off_cpu_truth(rank: int) -> Any:
    want = S.Expect("straggler:off_cpu", (S.Claim("straggler", "off_cpu", frozenset({rank})),))
    return S.Truth((want,), (STRAGGLER, DATA), frozenset({rank}))


INJECTED = {"compute-1.3x": "straggler:compute", "off-cpu": "straggler:off_cpu"}


def test_scenario_of_strips_the_hog_suffix() -> None:
    assert S.scenario_of("off-cpu+hog") == "off-cpu"
    assert S.scenario_of("healthy") == "healthy"


def test_off_cpu_straggler_named_compute_is_a_miss_not_a_false_straggler() -> None:
    s = S.score_run("off-cpu", _off_cpu_truth(1), _report(_f("straggler", "compute", [1])))
    assert s.met == {"straggler:off_cpu": False} and s.fp == {"straggler:compute": 1}
    assert not s.false_straggler
    hit = S.score_run("off-cpu", _off_cpu_truth(1), _report(_f("straggler", "off_cpu", [1])))
    assert hit.met == {"straggler:off_cpu": True}


def test_condition_targets_keep_hog_and_plain_apart_and_count_each_kind() -> None:
    healthy = S.Truth(forbid=(STRAGGLER, DATA))
    runs = [
        S.score_run("healthy", healthy, _report()),
        S.score_run("healthy+hog", healthy, _report(_f("straggler", "host_launch", [1]))),
        S.score_run("healthy+hog", healthy,
                    _report(_f("straggler", "compute", [2], confidence="suspected"))),
        S.score_run("grad-accum", healthy, _report()),
        S.score_run("off-cpu+hog", _off_cpu_truth(3), _report(_f("straggler", "off_cpu", [3]))),
        S.score_run("off-cpu+hog", _off_cpu_truth(3), _report(_f("straggler", "compute", [3]))),
        S.score_run("off-cpu+hog", _off_cpu_truth(3), _report()),
        S.RunScore("off-cpu+hog", error="uberprof run exited 1"),
        S.score_run("slow-data", S.Truth(), _report()),  # neither healthy nor injected
    ]
    got = {t.condition: t for t in S.condition_targets(runs, ("healthy", "grad-accum"),
                                                       INJECTED)}
    assert list(got) == ["healthy", "healthy+hog", "grad-accum", "off-cpu+hog"]
    assert (got["healthy"].runs, got["healthy"].false) == (1, 0)
    hog = got["healthy+hog"]
    assert (hog.healthy, hog.runs, hog.false, hog.suspected) == (True, 2, 1, 1)
    off = got["off-cpu+hog"]
    assert (off.healthy, off.key, off.runs, off.failed) == (False, "straggler:off_cpu", 3, 1)
    assert (off.found, off.other_straggler) == (1, 1)
    assert not any(t.met for t in got.values())  # far fewer than 20 runs each


def _many(condition: str, truth: Any, hits: int, misses: int) -> list[Any]:
    rank = next(iter(truth.slow_ranks), 0)
    found = _report(_f("straggler", "compute", [rank]))
    return [S.score_run(condition, truth, found) for _ in range(hits)] + \
        [S.score_run(condition, truth, _report()) for _ in range(misses)]


def test_injected_target_needs_19_of_20_with_the_right_cause() -> None:
    (met,) = S.condition_targets(_many("compute-1.3x", _compute_truth(0), 19, 1), (), INJECTED)
    assert met.met and met.found == 19 and met.line().endswith("-> MET")
    (missed,) = S.condition_targets(_many("compute-1.3x", _compute_truth(0), 18, 2), (),
                                    INJECTED)
    assert not missed.met and missed.line().endswith("-> not met")
    (few,) = S.condition_targets(_many("compute-1.3x", _compute_truth(0), 5, 0), (), INJECTED)
    assert not few.met and few.line().endswith("not met (only 5 run(s))")
    assert "named in 5 of 5 run(s); target >= 19 of 20" in few.line()


def test_healthy_target_needs_20_runs_without_a_confirmed_straggler() -> None:
    truth = S.Truth(forbid=(STRAGGLER,))
    clean = [S.score_run("grad-accum", truth, _report()) for _ in range(20)]
    (ok,) = S.condition_targets(clean, ("grad-accum",), INJECTED)
    assert ok.met and ok.as_dict()["met"] is True
    soft = clean[:19] + [S.score_run("grad-accum", truth, _report(
        _f("straggler", "compute", [1], confidence="suspected")))]
    (still,) = S.condition_targets(soft, ("grad-accum",), INJECTED)
    assert still.met and still.suspected == 1  # suspected ones are counted apart
    firm = clean[:19] + [S.score_run("grad-accum", truth,
                                     _report(_f("straggler", "compute", [1])))]
    (bad,) = S.condition_targets(firm, ("grad-accum",), INJECTED)
    assert not bad.met and bad.false == 1
    assert bad.line().startswith("grad-accum: 1 false confirmed straggler(s) in 20 run(s)")


def _accuracy() -> Any:
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    return load_script(ROOT / "benchmarks" / "accuracy.py", "_accuracy_bench")


def test_cpu_hog_spins_while_the_block_runs_and_is_gone_after_it_even_on_an_error() -> None:
    import os

    acc = _accuracy()
    pids: list[int] = []
    with pytest.raises(KeyError), acc.cpu_hog(2):
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_hog(p)]
        assert len(pids) >= 2
        raise KeyError("the benchmark fails mid-run")
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]


def _is_hog(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return False
    import os

    return b"os.getppid() == parent" in cmd and ppid == os.getpid()


def test_kept_runs_are_found_per_hog_condition(tmp_path: Any) -> None:
    acc = _accuracy()
    for name in ("healthy-r4-s0", "healthy-r4-s3", "healthy_hog-r4-s1", "off-cpu_hog-r4-s2",
                 "healthy-r2-s0", "healthy-r4-sx"):
        (tmp_path / name).mkdir()
    (tmp_path / "healthy-r4-s5.report.json").write_text("{}")
    found = [(sc.name, n, seed, hog) for sc, n, seed, hog in
             acc.kept_cases(tmp_path, ["healthy", "off-cpu"], [4])]
    assert found == [("healthy", 4, 0, False), ("healthy", 4, 1, True),
                     ("off-cpu", 4, 2, True), ("healthy", 4, 3, False)]
    assert [c[3] for c in acc.kept_cases(tmp_path, ["healthy"], [4], (False,))] == [False, False]
