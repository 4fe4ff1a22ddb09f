"""Findings ranked by what fixing them gains (issue 26 item 5; one ranking, issue 48), on the
hand graph of test_whatif_changes.py: each finding's remedy replayed as a what-if change, the
report's order (severity, then projected gain or own time at stake on one scale), a gain
bounded by the time at stake, and the top two fixed together in one replay (gains do not
add)."""

from __future__ import annotations

from tests.unit.test_whatif_changes import _with_allreduce_bytes
from tests.unit.test_whatif_graph import traced_steps
from uberprof.analysis.diagnosis.advisor import account
from uberprof.analysis.diagnosis.gains import Projector, attach_gains, finding_change, top_two
from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.diagnosis.whatif import replay_doc
from uberprof.analysis.tables.replay import replay

WALL_NS = 100_000_000


def _finding(kind: str, stake_ms: float, severity: str, cause: str | None = None,
             **evidence: object) -> Finding:
    from uberprof.analysis.diagnosis.findings import declare

    return declare([Finding(kind, severity, f"{kind} finding", [0, 1], [0], cause, stake_ms,
                            dict(evidence), "fix it")])[0]


def _projector(fit: bool = True) -> Projector:
    g = _with_allreduce_bytes(1_250_000)
    r = replay(g)
    doc = replay_doc(g, traced_steps(), r)
    if not fit:
        doc = {**doc, "fit_for_projection": False, "why": "clocks disagree"}
    return Projector(g, r, traced_steps(), doc)


def _findings() -> list[Finding]:
    """Exposed communication (hidden: 100 -> 90 ms), the all-reduce's class at half its
    link's peak (twice as fast: 100 -> 95 ms), idle host work (no change models it) with the
    largest time at stake, and a saturated host (stakes nothing)."""
    return [_finding("idle", 50.0, "high", "host"),
            _finding("bandwidth", 8.0, "medium", "latency-bound", peak_gbit_s=2.0,
                     busbw_gbit_s=1.0, bytes=1_250_000),
            _finding("exposed_comm", 12.0, "medium"),
            _finding("host_cpu", 0.0, "high")]


def test_each_finding_carries_the_gain_of_its_remedy_replayed() -> None:
    fs = _findings()
    attach_gains(fs, _projector(), "unfit")
    by = {f.kind: f for f in fs}
    ex = by["exposed_comm"].as_dict()["projected_gain"]
    assert (ex["baseline_step_ms"], ex["projected_step_ms"], ex["gain_pct"]) == (100.0, 90.0,
                                                                                 10.0)
    assert ex["sentence"] == "fixing this: step 100.0 -> 90.0 ms, -10.0%"
    assert by["bandwidth"].projected_gain["projected_step_ms"] == 95.0
    for kind in ("idle", "host_cpu"):
        assert by[kind].projected_gain is None and by[kind].projected_gain_why


def test_the_report_ranks_by_severity_then_gain_or_time_at_stake_on_one_scale() -> None:
    """Idle host work (50 ms at stake, high, no change models it) leads the medium findings
    that have projections; within medium, the larger projected gain (10 ms) first."""
    fs = _findings()
    attach_gains(fs, _projector(), "unfit")
    ranked = account(fs, WALL_NS)
    assert [f.kind for f in ranked] == ["idle", "host_cpu", "exposed_comm", "bandwidth"]


def test_a_projected_gain_beyond_the_time_at_stake_is_bounded_by_it_and_says_so() -> None:
    fs = [_finding("exposed_comm", 4.0, "low")]  # the replay gains 10 ms hiding it
    attach_gains(fs, _projector(), "unfit")
    g = fs[0].projected_gain
    assert (g["gain_ms"], g["replay_gain_ms"], g["projected_step_ms"]) == (4.0, 10.0, 96.0)
    assert "more than this finding's own 4.0 ms at stake" in g["note"]
    assert g["sentence"] == "fixing this: step 100.0 -> 96.0 ms, -4.0%"


def test_a_change_that_gains_nothing_says_why() -> None:
    """CPU ranks have no launches: `--remove launch` finds nothing to remove."""
    fs = [_finding("launch_bound", 30.0, "high", "launch")]
    attach_gains(fs, _projector(), "unfit")
    assert fs[0].projected_gain["gain_ms"] <= 0
    assert fs[0].projected_gain_why.startswith("the replay projects no shorter step: nothing "
                                               "launch-bound")


def test_fixing_the_top_two_together_is_one_replay_not_a_sum() -> None:
    proj = _projector()
    fs = _findings()
    attach_gains(fs, proj, "unfit")
    ranked = account(fs, WALL_NS)
    both = top_two(ranked, proj)
    # hidden, the all-reduce's transfer no longer matters: a faster link adds nothing to it
    assert both["findings"] == [2, 3] and both["kinds"] == ["exposed_comm", "bandwidth"]
    assert both["projected_step_ms"] == 90.0 and both["gain_ms"] == 10.0
    assert both["sum_of_separate_gain_ms"] == 15.0
    assert "gains do not add" in both["sentence"]


def test_an_unfit_replay_projects_no_gain_and_ranks_by_time_at_stake() -> None:
    fs = _findings()
    attach_gains(fs, _projector(fit=False), "the replay is unfit for projection: clocks")
    assert all(f.projected_gain is None for f in fs)
    assert fs[2].projected_gain_why.startswith("the replay is unfit")
    ranked = account(fs, WALL_NS)
    assert [f.kind for f in ranked] == ["idle", "host_cpu", "exposed_comm", "bandwidth"]
    assert top_two(ranked, None) is None


def test_each_remedied_kind_maps_to_its_change() -> None:
    cases = {("straggler", None): "straggler", ("data_stall", None): "data",
             ("exposed_comm", None): "exposed-comm", ("launch_bound", "launch"): "launch",
             ("idle", "sync"): "sync", ("pipeline_imbalance", "imbalance"): "balance"}
    for (kind, cause), change in cases.items():
        c, why = finding_change(_finding(kind, 1.0, "low", cause))
        assert c is not None and c.kind == change and not why
    c, _ = finding_change(_finding("straggler", 1.0, "low"))
    assert c.rank == 0  # the finding's own rank
    for kind, cause in (("hang", None), ("throttle", None), ("idle", "other")):
        c, why = finding_change(_finding(kind, 1.0, "low", cause))
        assert c is None and why


def test_a_finding_that_explains_others_says_so_instead_of_zero_ms_at_stake() -> None:
    by = {f.kind: f for f in _findings()}
    assert by["host_cpu"].stake_words() == "no time of its own: it explains other findings"
    assert by["host_cpu"].stake_words(short=True) == "explains others"
    assert by["exposed_comm"].stake_words() == "12.0 ms at stake"
    assert by["exposed_comm"].stake_words(short=True) == "12.0 ms"
    assert _finding("idle", 1500.0, "high").stake_words() == "1.50 s at stake"
    assert _finding("idle", 0.0, "low").stake_words() == "0.0 ms at stake"  # not a context kind
