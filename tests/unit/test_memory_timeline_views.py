"""The memory timeline of a trace window in the dashboard's `/memory` page and the `--html`
report, and the report's time per module in `--html` (issue 27 item 6): on synthetic traces
with torch.profiler's `[memory]` events and `module::` spans, read through the run's saved
tables and document, never recomputed by the view."""

from __future__ import annotations

import html as H
import re
from pathlib import Path
from typing import Any

import pytest

from tests import _traces as T
from tests.unit.test_dashboard import _component, _ids, _text
from tests.unit.test_ingest_modules_memory import mem, module

PEAKS = {0: 50_000, 1: 80_000}  # each rank's spike in step 2, under aten::mm


def _rank_trace(rank: int, spike: int, steps: int = 3, per_step: int = 6) -> dict[str, Any]:
    """`steps` 1000 µs steps: a model forward (module spans, two layers), a sawtooth of
    allocations and frees, and in step 2 one spike of `spike` bytes inside aten::mm; one event
    after the last step (outside every analysed step)."""
    ev: list[dict[str, Any]] = []
    for s in range(1, steps + 1):
        t0 = 1000.0 * s
        ev += [T.step(s, t0, 1000), module(t0 + 10, 600, "Net"),
               module(t0 + 20, 200, "layers.0"), T.op(t0 + 30, 100, "aten::addmm"),
               module(t0 + 300, 300, "layers.1"), T.op(t0 + 400, 100, "aten::mm")]
        for i in range(per_step):
            ev.append(mem(t0 + 40 + 100 * i, 1000, 10_000 + 1000 * (i % 3)))
        if s == 2:
            ev.append(mem(t0 + 450, spike, spike))
    ev.append(mem(1000.0 * (steps + 1) + 500, 5, 10**9))  # after the steps: left out
    return T.trace(ev, rank=rank, world=len(PEAKS))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from uberprof.dashboards.data import RunData

    d = tmp_path_factory.mktemp("memwin")
    for r, spike in PEAKS.items():
        T.write(d / "traces" / f"rank-{r}.json", _rank_trace(r, spike))
    return RunData(root=d / "traces", workers=1).load()


def test_each_ranks_line_is_its_saved_events_in_the_analysed_steps(data: Any) -> None:
    from uberprof.dashboards.queries import memory as q

    entries = {e["rank"]: e for e in q.timeline_entries(data)}
    assert set(entries) == set(PEAKS)
    series = {s.rank: s for s in q.timeline_series(data, sorted(PEAKS))}
    saved = data.ctx.memory_timeline().to_pylist()
    for r, s in series.items():
        e = entries[r]
        rows = sorted((x for x in saved if x["rank"] == r and x["step"] >= 0),
                      key=lambda x: x["ts"])
        assert s.allocated.tolist() == [x["total_allocated"] for x in rows]
        assert s.ms.tolist() == pytest.approx([(x["ts"] - e["start_ns"]) / 1e6 for x in rows])
        assert not s.thinned and 10**9 not in s.allocated  # the event after the steps
        # the peak marked is the document's, and it is the line's highest point
        assert s.peak_bytes == e["peak_allocated_bytes"] == PEAKS[r] == s.allocated.max()
        assert s.peak_ms == pytest.approx(s.ms[int(s.allocated.argmax())])
        assert s.peak_step == 2 and s.peak_operator == "aten::mm"
    assert q.timeline_series(data, []) == []


def test_a_long_window_is_thinned_keeping_the_peak_and_the_troughs(
        data: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from uberprof.dashboards.queries import memory as q

    full = {s.rank: s for s in q.timeline_series(data, sorted(PEAKS))}
    monkeypatch.setattr(q, "MAX_POINTS", 6)
    for s in q.timeline_series(data, sorted(PEAKS)):
        f = full[s.rank]
        assert s.thinned and len(s.allocated) < len(f.allocated)
        assert s.allocated.max() == f.allocated.max() and s.allocated.min() == f.allocated.min()
        assert list(s.ms) == sorted(s.ms)
        assert set(s.ms.tolist()) <= set(f.ms.tolist())  # points of the line, not new ones


def test_memory_page_draws_the_window_and_marks_the_peak(data: Any) -> None:
    from uberprof.dashboards.pages import memory
    from uberprof.dashboards.ui import Selection

    page = memory.layout(data, Selection())
    assert {"memory-window", "memory-window-table"} <= _ids(page)
    assert "memory-none" not in _ids(page)
    fig = _component(page, "memory-window").figure
    lines = [t for t in fig.data if t.mode == "lines"]
    peaks = [t for t in fig.data if t.name.endswith(" peak")]
    assert [t.name for t in lines] == ["rank 0 cpu", "rank 1 cpu"]
    assert [t.name for t in peaks] == ["rank 0 cpu peak", "rank 1 cpu peak"]
    for t, r in zip(peaks, sorted(PEAKS)):
        assert max(t.y) == pytest.approx(PEAKS[r] / (1 << 20))
        assert "step 2" in t.text[0] and "aten::mm" in t.text[0]
        assert "aten::mm" in t.hovertemplate
    # the highest peak is labelled in the plot, the other on hover; a selected rank's instead
    assert [t.mode for t in peaks] == ["markers", "markers+text"]
    fig0 = _component(memory.layout(data, Selection(rank=0)), "memory-window").figure
    assert [t.mode for t in fig0.data if t.name.endswith(" peak")] == ["markers+text",
                                                                       "markers"]
    table = _text(_component(page, "memory-window-table"))
    assert "aten::mm" in table and "78.1 KiB" in table  # rank 1's peak


def test_memory_page_without_any_memory_says_so(tmp_path: Path) -> None:
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.pages import memory
    from uberprof.dashboards.ui import Selection

    T.write(tmp_path / "traces" / "rank-0.json",
            T.trace([T.step(1, 1000, 1000), T.op(1010, 100)], rank=0, world=1))
    page = memory.layout(RunData(root=tmp_path / "traces", workers=1).load(), Selection())
    assert "memory-none" in _ids(page) and "memory-window" not in _ids(page)


def _table(page: str, table_id: str) -> str:
    m = re.search(rf"<table id='{table_id}'>.*?</table>", page, re.DOTALL)
    assert m is not None, table_id
    return m.group(0)


def test_html_report_has_the_module_and_memory_timeline_sections(data: Any) -> None:
    from uberprof.present.html_modules import memory_timeline_html, modules_html
    from uberprof.present.report_html import render_html

    d = data.diagnose()
    page = render_html(d)
    assert "<h2>Time per module (forward)</h2>" in page
    assert "<h2>Memory timeline (trace window)</h2>" in page
    mods = _table(page, "modules-table")
    names = re.findall(r"<tr><td class='l'>([^<]*)</td>", mods)
    assert names == [H.escape(m["module"]) for m in d.run["modules"]["modules"]]
    assert set(names) == {"Net", "layers.0", "layers.1"}
    timeline = _table(page, "memory-timeline-table")
    rows = re.findall(r"<tr><td class='l'>(\d+)</td>(.*?)</tr>", timeline)
    assert [int(r) for r, _ in rows] == sorted(PEAKS)
    assert all("aten::mm" in cells for _, cells in rows)
    # a run without them has neither section
    assert modules_html({"modules": None}) == ""
    assert memory_timeline_html({"memory_timeline": None}) == ""
