"""`uberprof export` without `--steps` when the events it never drops (steps, collectives,
synchronisations, uberprof's marks) exceed the size budget: it writes the contiguous traced
steps around the slowest that fit (present/export/autosteps.py, stepfit.py) and says so.

The budgets are derived from the traces: what all steps' never-dropped events come to (an
export of every step at a 1-byte budget writes only those) and what the slowest step's do."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests._export_check import load, validate_tef
from tests._export_traces import kineto_trace
from uberprof.analysis.read import OpenedRun, open_run
from uberprof.cli import main
from uberprof.ingest.gz import json_size
from uberprof.present.export import ExportOptions, export_trace
from uberprof.present.export.plan import _measure
from uberprof.present.export.stepfit import step_weights
from uberprof.present.export.window import select_window

STEPS, SLOW = 20, 12
NOTE = re.compile(r"(\d+) of (\d+) traced steps written \((?:steps (\d+)-(\d+), around step "
                  r"(\d+)|step (\d+)), the slowest\): all (\d+) would need about ([\d.,]+) MB "
                  r"against the ([\d.,]+) MB budget")


def _slowed(rank: int) -> dict[str, Any]:
    """A rank's trace of STEPS steps of 1 ms in which step SLOW takes 1.5 ms (what follows it
    is shifted by 0.5 ms)."""
    trace = kineto_trace(rank, 2, ("host-a", "host-b")[rank], steps=STEPS, small_ops=40)
    evs = trace["traceEvents"]
    t0 = next(e["ts"] for e in evs if e.get("name") == f"ProfilerStep#{SLOW}")
    for e in evs:
        if e.get("name") == f"ProfilerStep#{SLOW}" or e.get("name") == "PyTorch Profiler (0)":
            e["dur"] += 500
        elif e.get("ph") != "M" and e.get("ts", 0) >= t0 + 1000:
            e["ts"] += 500
    return trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OpenedRun]:
    root = tmp_path_factory.mktemp("autosteps")
    src = root / "traces"
    src.mkdir()
    for r in range(2):
        (src / f"rank-{r}.pt.trace.json.gz").write_bytes(
            gzip.compress(json.dumps(_slowed(r)).encode()))
    return src, open_run(src, out=root / "derived")


def _export(opened: OpenedRun, out: Path, **kw: Any) -> tuple[Any, dict[str, Any]]:
    res = export_trace(opened, out, ExportOptions(gzip=False, **kw))
    return res, load(res.path)


def _never_dropped(opened: OpenedRun, tmp: Path, steps: tuple[int, int]) -> int:
    """The bytes of an export of `steps` that keeps only what is never dropped."""
    res, _ = _export(opened, tmp / f"floor-{steps[0]}-{steps[1]}.json", steps=steps,
                     max_bytes=1)
    return os.path.getsize(res.path)


def _step_names(doc: dict[str, Any]) -> set[int]:
    return {int(e["name"].split("#")[1]) for e in doc["traceEvents"]
            if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")}


def _note(res: Any) -> re.Match[str]:
    [m] = [m for n in res.notes if (m := NOTE.search(n))]
    return m


def test_the_traces_slowest_step_is_the_slowed_one(traces: tuple[Path, OpenedRun]) -> None:
    """The premise of the tests below: the analysis times step SLOW as the longest."""
    rows = [r for r in traces[1].ctx.steps().to_pylist() if r["traced"]]
    assert max(rows, key=lambda r: r["step_time_ns"])["step"] == SLOW


def test_an_over_budget_export_writes_contiguous_steps_around_the_slowest_within_the_budget(
        traces: tuple[Path, OpenedRun], tmp_path: Path) -> None:
    _, opened = traces
    all_floor = _never_dropped(opened, tmp_path, (1, STEPS))
    one_floor = _never_dropped(opened, tmp_path, (SLOW, SLOW))
    limit = (all_floor + one_floor) // 2
    res, doc = _export(opened, tmp_path / "auto.json", max_bytes=limit)
    assert validate_tef(doc) == []
    a, b = res.summary["steps"]
    assert a <= SLOW <= b and 1 < b - a + 1 < STEPS
    assert os.path.getsize(res.path) <= limit  # the file as written fits
    written = _step_names(doc)
    assert set(range(a, b + 1)) <= written  # every chosen step, whole
    assert written <= set(range(a - 1, b + 2))  # and at most the steps touching its edges
    # grown on the side with fewer steps: centred unless an end of the trace is reached
    if a > 1 and b < STEPS:
        assert abs((SLOW - a) - (b - SLOW)) <= 1
    assert doc["uberprof_export"]["budget"]["steps_chosen"]["steps"] == [a, b]


def test_the_note_says_which_steps_of_how_many_and_what_all_would_need(
        traces: tuple[Path, OpenedRun], tmp_path: Path) -> None:
    _, opened = traces
    all_floor = _never_dropped(opened, tmp_path, (1, STEPS))
    limit = int(all_floor * 0.6)
    res, doc = _export(opened, tmp_path / "auto.json", max_bytes=limit)
    m = _note(res)
    n, total = int(m[1]), int(m[2])
    a, b = int(m[3]), int(m[4])
    assert (a, b) == tuple(res.summary["steps"]) and n == b - a + 1 < STEPS
    assert total == STEPS and int(m[7]) == STEPS and int(m[5]) == SLOW
    # what all steps would need: the size of an export of only their never-dropped events
    assert 0.8 * all_floor / 1e6 <= float(m[8]) <= 1.25 * all_floor / 1e6
    assert float(m[9]) == pytest.approx(limit / 1e6, rel=0.01)
    note = m.string
    assert note.endswith("--steps or --max-mb to choose") and "over the budget" not in note
    assert note in doc["uberprof_export"]["notes"]  # the file says it too


def test_a_budget_below_the_slowest_steps_own_events_writes_that_step_and_says_so(
        traces: tuple[Path, OpenedRun], tmp_path: Path) -> None:
    _, opened = traces
    one_floor = _never_dropped(opened, tmp_path, (SLOW, SLOW))
    limit = one_floor // 2
    res, doc = _export(opened, tmp_path / "one.json", max_bytes=limit)
    assert res.summary["steps"] == [SLOW, SLOW]
    assert SLOW in _step_names(doc) and _step_names(doc) <= {SLOW - 1, SLOW, SLOW + 1}
    m = _note(res)
    assert (int(m[1]), int(m[6])) == (1, SLOW)
    alone = float(m.string.split(f"even step {SLOW} alone comes to about ")[1].split(" MB")[0])
    size = os.path.getsize(res.path)
    assert size > limit and 0.8 * size / 1e6 <= alone <= 1.25 * size / 1e6
    assert "--ranks" in m.string


def test_given_steps_are_written_whole_even_over_the_budget(
        traces: tuple[Path, OpenedRun], tmp_path: Path) -> None:
    """--steps keeps the behaviour it had: the steps asked for, and a note that they do not
    fit and what would."""
    _, opened = traces
    limit = int(_never_dropped(opened, tmp_path, (1, STEPS)) * 0.6)
    res, doc = _export(opened, tmp_path / "given.json", max_bytes=limit, steps=(1, STEPS))
    assert res.summary["steps"] == [1, STEPS]
    assert set(range(1, STEPS + 1)) <= _step_names(doc)
    assert "steps_chosen" not in doc["uberprof_export"]["budget"]
    assert not [n for n in res.notes if NOTE.search(n)]
    assert [n for n in res.notes if n.startswith("over the size budget")]
    assert os.path.getsize(res.path) > limit


def test_an_export_within_its_budget_is_what_it_is_without_a_budget(
        traces: tuple[Path, OpenedRun], tmp_path: Path) -> None:
    """A budget the traces' text could exceed (so the measuring pass and its per-step tally
    run) but the export does not: the same events, in the same order, as with no budget."""
    src, opened = traces
    free, doc_free = _export(opened, tmp_path / "free.json", max_bytes=None)
    limit = int(free.bytes_uncompressed * 1.1)
    assert sum(json_size(str(p)) for p in src.iterdir()) > 0.9 * limit  # the pass runs
    res, doc = _export(opened, tmp_path / "budget.json", max_bytes=limit)
    assert doc["traceEvents"] == doc_free["traceEvents"]
    assert {k: v for k, v in doc["uberprof_export"].items() if k != "budget"} == \
        {k: v for k, v in doc_free["uberprof_export"].items() if k != "budget"}
    assert res.summary["steps"] is None and res.dropped == free.dropped


@pytest.mark.parametrize("window", [(0, 0), (3, 7), (11, 11), (0, STEPS - 1), (15, 19)])
def test_the_per_step_tally_weighs_a_window_as_measuring_those_steps_does(
        traces: tuple[Path, OpenedRun], window: tuple[int, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tally of the whole run's measuring pass gives, for steps a-b, what a measuring
    pass of an export of --steps a-b weighs, tier by tier and duration bucket by bucket
    (byte for byte on the source's sizes: each pass samples its own output ratios)."""
    import uberprof.present.export.plan as plan_mod

    monkeypatch.setattr(plan_mod, "output_ratios", lambda scan, keep: {-1: 1.0})
    _, opened = traces
    ctx, d = opened.ctx, opened.diagnosis
    assert ctx is not None and d is not None
    opts = ExportOptions(gzip=False)
    sel = select_window(ctx, d, opts, [])
    tally = step_weights(ctx.steps(), sel.ranks)
    assert tally is not None and tally.steps == list(range(1, STEPS + 1))
    whole = _measure(sel, opts, 10**9, [], tally)
    assert whole is not None
    i, j = window
    steps = (tally.steps[i], tally.steps[j])
    wopts = ExportOptions(gzip=False, steps=steps)
    measured = _measure(select_window(ctx, d, wopts, []), wopts, 10**9, [])
    assert measured is not None
    from uberprof.present.export.budget import Budget

    est = Budget.from_categories(10**9, tally.weights(i, j))
    assert est.other_bytes == measured.other_bytes
    assert set(est.hist) == set(measured.hist)
    for t, h in measured.hist.items():
        assert est.hist[t].tolist() == h.tolist(), t


def test_the_command_line_prints_the_chosen_steps(traces: tuple[Path, OpenedRun],
                                                  tmp_path: Path) -> None:
    src, opened = traces
    limit = int(_never_dropped(opened, tmp_path, (1, STEPS)) * 0.6)
    out = tmp_path / "cli.json"
    r = CliRunner().invoke(main, ["export", str(src), "-o", str(out), "--no-gzip",
                                  "--max-mb", str(limit / 1e6),
                                  "--derived", str(tmp_path / "derived")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())  # the console wraps long lines
    m = NOTE.search(text)
    assert m and int(m[5]) == SLOW and "--steps or --max-mb to choose" in text
    assert out.stat().st_size <= limit


SHARED_NCCL = Path(__file__).resolve().parents[3] / "shared" / "traces" / "hta" / \
    "nccl_parser_config"


@pytest.mark.skipif(not SHARED_NCCL.is_dir(), reason="the shared traces are not here")
def test_a_real_nccl_trace_gets_the_steps_that_fit(tmp_path: Path) -> None:
    """A real NCCL trace (3 traced steps) at a budget between one step's never-dropped
    events and all three's: fewer steps, the slowest among them, the file within budget."""
    opened = open_run(SHARED_NCCL, out=tmp_path / "derived")
    assert opened.ctx is not None
    rows = [r for r in opened.ctx.steps().to_pylist() if r["traced"]]
    slowest = max(rows, key=lambda r: r["step_time_ns"])["step"]
    first, last = min(r["step"] for r in rows), max(r["step"] for r in rows)
    all_floor = _never_dropped(opened, tmp_path, (first, last))
    one_floor = _never_dropped(opened, tmp_path, (slowest, slowest))
    limit = (all_floor + one_floor) // 2
    res, doc = _export(opened, tmp_path / "auto.json", max_bytes=limit)
    assert validate_tef(doc) == []
    a, b = res.summary["steps"]
    assert a <= slowest <= b and (a, b) != (first, last)
    assert os.path.getsize(res.path) <= limit
    assert _note(res)


def test_a_perfetto_export_gets_a_window_that_fits_its_protobuf(
        traces: tuple[Path, OpenedRun], tmp_path: Path) -> None:
    pytest.importorskip("perfetto")
    _, opened = traces
    limit = int(_never_dropped(opened, tmp_path, (1, STEPS)) * 0.6 * 0.55)
    res = export_trace(opened, tmp_path / "auto.pftrace",
                       ExportOptions(gzip=False, max_bytes=limit, fmt="perfetto"))
    a, b = res.summary["steps"]
    assert a <= SLOW <= b and b - a + 1 < STEPS
    assert os.path.getsize(res.path) <= limit
