"""Memory per rank (issue 27): the step timeline's GPU memory saved with the analysis, the
per-rank summary the diagnosis saves as `run.memory`, the report's section (terminal, `--json`,
`--html`) and the dashboard's `/memory` page, checked on a real H100 run (`samples/gpu/gloo2`:
two ranks on one GPU, samples/gpu/README.md) against what each rank's own
`torch.cuda.max_memory_allocated()` said at the end (`gloo2.memory.<rank>`), and on small
synthetic timelines for the rules (a leak, the row read at exit, the step of the RSS peak)."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from tests.unit.test_dashboard import _client, _component, _ids, _route, _text
from uberprof.analysis.diagnosis.memory import rank_memory
from uberprof.cli import main
from uberprof.units import fmt_bytes

GPU = Path(__file__).resolve().parents[2] / "samples" / "gpu"


def _steps_jsonl(run: Path, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in
            (run / "ranks" / str(rank) / "steps.jsonl").read_text().splitlines() if line]


@pytest.fixture(scope="module")
def gloo2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(shutil.copytree(GPU / "gloo2", tmp_path_factory.mktemp("mem") / "gloo2"))


@pytest.fixture(scope="module")
def opened(gloo2: Path) -> Any:
    from uberprof.analysis import read

    return read.open_run(gloo2, workers=1)


@pytest.fixture(scope="module")
def doc(gloo2: Path, opened: Any) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["report", str(gloo2), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _by_rank(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in doc["run"]["memory"]["ranks"]}


# --- the saved step timeline -------------------------------------------------------------------

def test_saved_step_timeline_holds_each_steps_gpu_memory_as_steps_jsonl_has_it(
        gloo2: Path, opened: Any) -> None:
    t = opened.step_timelines(["gpu_mem_peak_bytes", "gpu_mem_bytes"])
    assert t.column_names == ["rank", "step", "gpu_mem_peak_bytes", "gpu_mem_bytes"]
    for rank in (0, 1):
        gpu = {r["step"]: r for r in _steps_jsonl(gloo2, rank) if r["kind"] == "gpu"}
        rows = [r for r in t.to_pylist() if r["rank"] == rank]
        assert len(rows) == 40 and len(gpu) == 40
        for r in rows:
            assert r["gpu_mem_peak_bytes"] == gpu[r["step"]]["gpu_mem_peak_bytes"]
            assert r["gpu_mem_bytes"] == gpu[r["step"]]["gpu_mem_bytes"]


# --- run.memory ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [0, 1])
def test_gpu_peak_is_the_ranks_own_max_memory_allocated(doc: dict[str, Any], rank: int
                                                        ) -> None:
    truth = json.loads((GPU / f"gloo2.memory.{rank}").read_text())
    m = _by_rank(doc)[rank]
    assert m["gpu_peak_bytes"] == truth["max_memory_allocated"]
    rank_json = json.loads((GPU / "gloo2" / "ranks" / str(rank) / "rank.json").read_text())
    assert m["device_total_bytes"] == rank_json["device"]["total_memory_bytes"] == 85017493504
    assert m["gpu_peak_pct"] == pytest.approx(100 * m["gpu_peak_bytes"] / 85017493504, abs=0.01)
    assert 0 <= m["gpu_peak_step"] < 40
    # reached during or before that step: the first row that reads it
    rows = [r for r in _steps_jsonl(GPU / "gloo2", rank) if r["kind"] == "gpu"]
    first = min(r["step"] for r in rows if r["gpu_mem_peak_bytes"] == m["gpu_peak_bytes"])
    assert m["gpu_peak_step"] == first


def test_in_use_between_steps_is_steady_and_below_the_peak(doc: dict[str, Any]) -> None:
    """Steady DDP training holds its weights, gradients and optimizer state at every step
    boundary: ~460 MiB, against a peak of ~1 GiB inside the step. The final row, read at exit
    after rank 0 freed its tensors (68 MB), is not taken for the last step."""
    for m in _by_rank(doc).values():
        assert 400e6 < m["gpu_in_use_median_bytes"] < m["gpu_peak_bytes"]
        assert (m["gpu_first_step"], m["gpu_last_step"], m["gpu_steps"]) == (0, 38, 39)
        assert abs(m["gpu_growth_bytes"]) < 4 << 20  # no leak
        assert m["gpu_growth_bytes"] == m["gpu_in_use_last_bytes"] - m["gpu_in_use_first_bytes"]


def test_host_rss_is_the_rank_process_and_below_the_hosts_memory(doc: dict[str, Any]) -> None:
    steps = {r["step"]: r for r in _steps_jsonl(GPU / "gloo2", 0) if r["kind"] == "step"}
    for m in _by_rank(doc).values():
        assert m["host"] == "vm"
        assert 0 < m["rss_median_bytes"] <= m["rss_peak_bytes"] < m["host_mem_total_bytes"]
        assert m["host_mem_total_bytes"] == 135148564480
        assert m["rss_peak_bytes"] > 500e6  # a CUDA process: its context alone is ~500 MB
        assert m["rss_samples"] > 100  # 10 Hz over ~15 s of the process's life
        assert m["rss_peak_step"] is None or m["rss_peak_step"] in steps


def test_rss_samples_of_an_exited_process_are_left_out(doc: dict[str, Any]) -> None:
    """The counters read 0 for rank 1's last two samples (the process had exited)."""
    from uberprof.rundir.counters import counters_table

    t = counters_table(GPU / "gloo2", sources=["proc"], metrics=["mem.rss"]).to_pylist()
    zeros = 0
    for r, m in _by_rank(doc).items():
        values = [x["value"] for x in t if x["device"] == f"rank:{r}"]
        zeros += values.count(0)
        assert m["rss_samples"] == sum(v > 0 for v in values)
        assert m["rss_peak_bytes"] == max(values)
    assert zeros == 2


def test_memory_is_in_every_document_and_none_where_a_run_has_none() -> None:
    from uberprof.analysis.diagnosis.document import empty_diagnosis

    d = empty_diagnosis(Path("/nonexistent-run"), [])
    assert "memory" in d.run and d.run["memory"] is None


# --- the rules on small timelines ---------------------------------------------------------------

def _timeline(in_use: list[int], peak: list[int] | None = None) -> pa.Table:
    n = len(in_use)
    return pa.table({
        "step": pa.array(range(n), pa.int64()),
        "host_start_ns": pa.array([1000 * i for i in range(n)], pa.int64()),
        "host_end_ns": pa.array([1000 * (i + 1) for i in range(n)], pa.int64()),
        "gpu_mem_peak_bytes": pa.array(peak or [max(in_use[:i + 1]) * 2 for i in range(n)],
                                       pa.int64()),
        "gpu_mem_bytes": pa.array(in_use, pa.int64())})


def test_a_leak_grows_from_the_first_step_to_the_last_and_the_exit_row_is_left_out() -> None:
    leak = [100 + 10 * i for i in range(10)] + [5]  # the last row: read at exit
    m = rank_memory(3, _timeline(leak), None, 10_000)
    assert m is not None and m["rank"] == 3
    assert (m["gpu_in_use_first_bytes"], m["gpu_in_use_last_bytes"]) == (100, 190)
    assert m["gpu_growth_bytes"] == 90 and m["gpu_last_step"] == 9 and m["gpu_steps"] == 10
    assert m["gpu_peak_bytes"] == 380 and m["gpu_peak_step"] == 9
    assert m["gpu_peak_pct"] == 3.8
    assert m["rss_peak_bytes"] is None and m["rss_peak_step"] is None


def test_rss_peak_names_the_step_whose_host_window_holds_it() -> None:
    ts = np.array([500, 2500, 3999, 20_000], np.int64)
    m = rank_memory(0, _timeline([1, 1, 1, 1, 1]), (ts, np.array([1., 2., 9., 3.])), None)
    assert m is not None
    assert (m["rss_peak_bytes"], m["rss_peak_step"], m["rss_median_bytes"]) == (9, 3, 2)
    m = rank_memory(0, _timeline([1, 1]), (ts, np.array([1., 2., 3., 9.])), None)
    assert m is not None and m["rss_peak_step"] is None  # after the last step
    assert m["gpu_peak_pct"] is None  # no device total


def test_a_rank_with_no_memory_read_has_no_row() -> None:
    t = _timeline([1, 2]).set_column(4, "gpu_mem_bytes", pa.nulls(2, pa.int64())) \
        .set_column(3, "gpu_mem_peak_bytes", pa.nulls(2, pa.int64()))
    assert rank_memory(0, t, None, None) is None
    assert rank_memory(0, None, (np.zeros(0, np.int64), np.zeros(0)), None) is None


# --- the report -----------------------------------------------------------------------------------

def test_terminal_report_prints_one_memory_line_per_rank(gloo2: Path, doc: dict[str, Any]
                                                         ) -> None:
    res = CliRunner().invoke(main, ["report", str(gloo2)], terminal_width=160)
    assert res.exit_code == 0, res.output
    text = res.output
    all_lines = text.splitlines()
    at = next(i for i, ln in enumerate(all_lines) if ln.strip() == "memory")
    lines = [ln for ln in all_lines[at:at + 6] if ln.strip()[:1].isdigit()]
    assert [ln.split()[0] for ln in lines] == ["0", "1"]
    for line, m in zip(lines, doc["run"]["memory"]["ranks"]):
        assert fmt_bytes(m["gpu_peak_bytes"]) in line and fmt_bytes(m["rss_peak_bytes"]) in line
        assert "(0→38)" in line


def test_terminal_report_cuts_many_ranks_to_the_highest_and_lowest_peaks() -> None:
    from uberprof.present.terminal.memory import MAX_MEMORY_ROWS, memory_rows

    ranks = [{"rank": r, "gpu_peak_bytes": 1000 + r} for r in range(20)]
    kept = [r["rank"] for r in memory_rows(ranks)]
    assert len(kept) == MAX_MEMORY_ROWS and kept == [0, 1, 14, 15, 16, 17, 18, 19]


def test_terminal_report_has_no_memory_section_without_memory() -> None:
    from rich.console import Console

    from uberprof.present.terminal.memory import render_memory

    console = Console(record=True, width=120)
    render_memory({"memory": None}, console, lambda c, t: c.print(t))
    assert console.export_text() == ""


def test_html_report_has_the_memory_table(gloo2: Path, doc: dict[str, Any],
                                          tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(gloo2), "--html", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "<h2>Memory</h2>" in page and "id='memory-table'" in page
    table = page[page.index("id='memory-table'"):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == 3
    for m in doc["run"]["memory"]["ranks"]:
        assert fmt_bytes(m["gpu_peak_bytes"]) in table and fmt_bytes(m["rss_peak_bytes"]) in table


# --- the dashboard --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(opened: Any) -> Any:
    from uberprof.dashboards.data import RunData

    return RunData.of(opened, workers=1)


def _layout(data: Any, rank: int | None = None) -> Any:
    from uberprof.dashboards.pages import memory
    from uberprof.dashboards.ui import Selection

    return memory.layout(data, Selection(rank=rank))


def _figure(layout: Any, graph_id: str) -> Any:
    return _component(layout, graph_id).figure


def test_memory_page_draws_each_ranks_gpu_memory_per_step_from_the_saved_timeline(
        data: Any, gloo2: Path) -> None:
    layout = _layout(data)
    ids = _ids(layout)
    assert {"memory-cards", "card-gpu-peak", "card-rss-peak", "memory-gpu", "memory-rss",
            "memory-table"} <= ids
    assert "memory-none" not in ids and "memory-drawn" not in ids
    fig = _figure(layout, "memory-gpu")
    lines = {t.name: t for t in fig.data}
    assert set(lines) == {"rank 0 in use", "rank 0 peak", "rank 1 in use", "rank 1 peak"}
    gpu = [r for r in _steps_jsonl(gloo2, 1) if r["kind"] == "gpu"]
    assert list(lines["rank 1 in use"].x) == [r["step"] for r in gpu]
    assert list(lines["rank 1 in use"].y) == pytest.approx(
        [r["gpu_mem_bytes"] / 2**30 for r in gpu])
    truth = json.loads((GPU / "gloo2.memory.1").read_text())["max_memory_allocated"]
    assert max(lines["rank 1 peak"].y) == pytest.approx(truth / 2**30)


def test_memory_page_draws_host_rss_over_time_and_the_summary_table(data: Any,
                                                                    doc: dict[str, Any]) -> None:
    layout = _layout(data, rank=1)
    rss = {t.name: t for t in _figure(layout, "memory-rss").data}
    assert set(rss) == {"rank 0", "rank 1"}
    for r, m in _by_rank(doc).items():
        y = np.array(rss[f"rank {r}"].y) * 2**30
        assert 0 < y.min() and y.max() <= m["rss_peak_bytes"] + 1  # bucket means, no exit 0
        assert len(y) > 20 and min(rss[f"rank {r}"].x) > -30
    text = _text(layout)
    for m in doc["run"]["memory"]["ranks"]:
        assert fmt_bytes(m["gpu_peak_bytes"]) in text and fmt_bytes(m["rss_median_bytes"]) in text
    assert "in use, last step" in text


def test_a_diagnosis_without_memory_says_so(data: Any, opened: Any) -> None:
    from uberprof.dashboards.data import RunData

    d = opened.diagnosis
    doc = {**copy.deepcopy(d.run), "memory": None}  # every document has the key (RunDoc)
    older = RunData.of(dataclasses.replace(opened, diagnosis=dataclasses.replace(d, run=doc)),
                       workers=1)
    layout = _layout(older)
    assert "memory-none" in _ids(layout) and "memory-gpu" not in _ids(layout)


def test_the_memory_page_is_routed_and_in_the_navigation(data: Any) -> None:
    status, body = _route(_client(data), "/memory", "?rank=0")
    assert status == 200 and "page-memory" in body and "nav-memory" in body
    assert "memory-table" in body and "This page failed" not in body


# --- the export -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["merged.json", "merged.pftrace"])
def test_export_has_each_ranks_gpu_memory_per_step_as_a_counter_track(
        gloo2: Path, opened: Any, tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    res = CliRunner().invoke(main, ["export", str(gloo2), "-o", str(out), "--no-gzip"])
    if name.endswith(".pftrace") and res.exit_code != 0 and "perfetto" in res.output:
        pytest.skip("the perfetto package is not installed")
    assert res.exit_code == 0, res.output
    if name.endswith(".pftrace"):
        assert b"GPU memory in use" in out.read_bytes()  # the counter track's name
        return
    events = json.loads(out.read_bytes())["traceEvents"]
    mem = [e for e in events if e.get("cat") == "uberprof.memory"]
    for rank in (0, 1):
        pid = next(e["pid"] for e in events if e.get("ph") == "M" and
                   e.get("name") == "process_name" and f"rank {rank}" in
                   str(e["args"].get("name", "")))
        in_use = [e for e in mem if e["pid"] == pid and e["name"] == "GPU memory in use"]
        # the boundary before the traced steps 10-12 and those inside the frame
        assert 3 <= len(in_use) <= 4, in_use
        gpu = {r["step"]: r for r in _steps_jsonl(gloo2, rank) if r["kind"] == "gpu"}
        want = {round(gpu[s]["gpu_mem_bytes"] / 2**20, 3) for s in range(9, 13)}
        assert {e["args"]["MiB"] for e in in_use} <= want
        assert all(e["ts"] >= 0 for e in in_use)
        tracks = [e for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
                  and e["pid"] == pid and e["args"].get("name") == "GPU memory"]
        assert len(tracks) == 1 and tracks[0]["tid"] == in_use[0]["tid"]
