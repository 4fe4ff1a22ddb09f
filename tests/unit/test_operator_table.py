"""The operator and kernel tables (`derived/operators.parquet`, `tables/operators.py`) and the
report's views of them (`run.operators`, `diagnosis/top_ops.py`).

Host operators are checked against torch.profiler's own `key_averages()` on a small real
profiled CPU job (in this process: no job is started), kernels against sums taken straight from
the JSON of real GPU traces in ../shared/traces.
"""

from __future__ import annotations

import gzip
import html
import io
import json
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from rich.console import Console

from tests._traces import op, step, trace
from uberprof.analysis.diagnosis.advisor import analysed_steps, diagnose
from uberprof.analysis.diff.profile import _ops
from uberprof.analysis.tables.context import load_context
from uberprof.analysis.tables.derived import read_operators
from uberprof.analysis.tables.operators import by_name, rank_ops
from uberprof.analysis.tables.rank import analyze_trace
from uberprof.present.report_html import render_html
from uberprof.present.report_terminal import render_report

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
TOLERANCE = 0.01  # the bar: within 1% of key_averages
TOP = 12
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")


# --- a real profiled CPU job --------------------------------------------------------------------

@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny MLP trained 6 steps under torch.profiler (1 warm-up, 4 active steps, input
    shapes recorded as `uberprof run` records them on CPU ranks), its trace exported, and
    key_averages() of the same window, by name and by name and input shapes."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    folder = tmp_path_factory.mktemp("profiled")
    path = folder / "rank-0.pt.trace.json"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=4, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(6):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    averages = {e.key: e for e in prof.key_averages()}
    by_shape = {(e.key, json.dumps(e.input_shapes)): e
                for e in prof.key_averages(group_by_input_shape=True)}
    return {"folder": folder, "path": path, "averages": averages, "by_shape": by_shape}


@pytest.fixture(scope="module")
def cpu_report(profiled: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("cpu-derived")
    d = diagnose(profiled["folder"], out=out, workers=1)
    return {"diagnosis": d, "table": read_operators(out), "derived": out}


def test_operator_self_times_and_calls_agree_with_key_averages(
        profiled: dict[str, Any], cpu_report: dict[str, Any]) -> None:
    table = cpu_report["table"].filter(pc.equal(cpu_report["table"]["kind"], "operator"))
    ours = {r["name"]: r for r in by_name(table).to_pylist()}
    averages = profiled["averages"]
    top = sorted((e for k, e in averages.items() if k in ours),
                 key=lambda e: -e.self_cpu_time_total)[:TOP]
    assert len(top) == TOP, sorted(averages)
    for e in top:
        mine = ours[e.key]
        assert mine["calls"] == e.count, e.key
        assert mine["self_ns"] / 1e3 == pytest.approx(e.self_cpu_time_total, rel=TOLERANCE), \
            e.key
        assert mine["incl_ns"] / 1e3 == pytest.approx(e.cpu_time_total, rel=TOLERANCE), e.key
    # every aten operator key_averages saw in the window is in the table (names, not shapes)
    assert {k for k in averages if k.startswith("aten::")} <= set(ours)


def test_operators_by_name_and_shapes_agree_with_key_averages_grouped_by_input_shape(
        profiled: dict[str, Any], cpu_report: dict[str, Any]) -> None:
    """The saved rows keep input shapes: they are key_averages(group_by_input_shape=True)'s
    groups, with its calls, self and total time within 1%, for the top operators."""
    table = cpu_report["table"].filter(pc.equal(cpu_report["table"]["kind"], "operator"))
    ours = {(r["name"], json.dumps(json.loads(r["shapes"]))): r for r in table.to_pylist()
            if r["shapes"] is not None}
    by_shape = profiled["by_shape"]
    top = sorted((e for k, e in by_shape.items() if k in ours),
                 key=lambda e: -e.self_cpu_time_total)[:TOP]
    assert len(top) == TOP, sorted(by_shape)
    for e in top:
        mine = ours[(e.key, json.dumps(e.input_shapes))]
        assert mine["calls"] == e.count, (e.key, e.input_shapes)
        assert mine["self_ns"] / 1e3 == pytest.approx(e.self_cpu_time_total, rel=TOLERANCE), \
            (e.key, e.input_shapes)
        assert mine["incl_ns"] / 1e3 == pytest.approx(e.cpu_time_total, rel=TOLERANCE), \
            (e.key, e.input_shapes)
    # the MLP's three Linear layers: aten::linear with three input shapes, three rows
    linear = {k for k in by_shape if k[0] == "aten::linear"}
    assert len(linear) == 3 and linear <= set(ours)
    doc = cpu_report["diagnosis"].to_json()["run"]["operators"]
    assert doc["shapes_recorded"]
    assert doc["operators_by_shapes_total"] == table.num_rows > doc["operators_total"]
    names = [r["name"] for r in doc["operators_by_shapes"]]
    assert any(names.count(n) >= 2 for n in names)  # one operator, rows for its shapes


def test_report_html_offers_operators_by_name_and_by_name_and_input_shapes(
        cpu_report: dict[str, Any]) -> None:
    d = cpu_report["diagnosis"]
    shaped = d.run["operators"]["operators_by_shapes"]
    page = render_html(d)
    assert "by name and input shapes" in page and "Operators by name and input shapes" in page
    assert html.escape(shaped[0]["shapes"] or "(not recorded)") in page


def test_report_document_ranks_operators_by_self_time_with_shares_of_step_time(
        profiled: dict[str, Any], cpu_report: dict[str, Any]) -> None:
    d = cpu_report["diagnosis"]
    doc = d.to_json()["run"]["operators"]
    rows = doc["operators"]
    assert rows and doc["operators_total"] >= len(rows)
    assert [r["self_ms"] for r in rows] == sorted((r["self_ms"] for r in rows), reverse=True)
    steps = analysed_steps(load_context(profiled["folder"], out=cpu_report["derived"]))
    step_ms = sum(steps.column("step_time_ns").to_pylist()) / 1e6
    assert doc["step_time_ms"] == pytest.approx(step_ms, abs=1e-3)
    assert doc["rank_steps"] == steps.num_rows == 4
    first = rows[0]
    # both numbers are rounded in the document: the share to 0.01 %, the time to 1 us
    rounding = 0.005 + 100 * 0.0005 / step_ms
    assert first["self_pct"] == pytest.approx(100 * first["self_ms"] / step_ms, abs=rounding)
    assert first["self_ms_per_step"]["max"] == pytest.approx(first["self_ms"] / 4, abs=1e-3)
    # a CPU run has no device activity: no kernel lists, no device time
    assert doc["kernels"] == [] and doc["comm_kernels"] == [] and doc["device_time_ms"] is None


def test_terminal_and_html_reports_show_the_saved_top_operators(
        cpu_report: dict[str, Any]) -> None:
    d = cpu_report["diagnosis"]
    top = d.run["operators"]["operators"][0]["name"]
    buf = io.StringIO()
    render_report(d, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "top operators by self time" in text and top in text
    page = render_html(d)
    assert "Operators by self time" in page and top in page


# --- self time and the step window ----------------------------------------------------------------

def test_an_operator_keeps_its_self_time_when_its_child_starts_after_the_last_step(
        tmp_path: Path) -> None:
    """key_averages subtracts a child however the steps fall, so does the table: the child,
    outside every step, is left out, and its parent's self time still excludes it."""
    doc = trace([step(1, 0, 100), step(2, 100, 100),
                 op(150, 100, "aten::outer"), op(210, 20, "aten::inner"),
                 op(20, 10, "aten::first")])
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(doc))
    rows = {r["name"]: r for r in analyze_trace(p).operators.to_pylist()}
    assert rows["aten::outer"]["self_ns"] == 80_000  # 100 µs less its child's 20
    assert rows["aten::outer"]["incl_ns"] == 100_000
    assert "aten::inner" not in rows  # it starts after step 2
    assert rows["aten::first"]["calls"] == 1 and rows["aten::first"]["self_ns"] == 10_000


# --- real GPU traces: kernels -----------------------------------------------------------------

def _kernel_sums_from_json(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(kind, name) -> (calls, ns) of device activity launched inside a ProfilerStep span,
    straight from the trace's JSON: the reference the kernel table must match."""
    with gzip.open(path) if path.suffix == ".gz" else open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    spans = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {})}
    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for e in events:
        if e.get("cat") not in kinds:
            continue
        t = launches.get((e.get("args") or {}).get("correlation"), e["ts"])
        if not any(s["ts"] <= t < s["ts"] + s["dur"] for s in spans):
            continue
        kind = kinds[e["cat"]]
        if kind == "kernel" and "nccl" in e["name"].lower():
            kind = "comm_kernel"
        calls, ns = out.get((kind, e["name"]), (0, 0))
        out[(kind, e["name"])] = (calls + 1, ns + round(e["dur"] * 1000))
    return out


@needs_shared
@pytest.mark.parametrize("trace_file", [
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
])
def test_kernel_table_sums_match_the_trace_json(trace_file: str) -> None:
    path = SHARED / trace_file
    want = _kernel_sums_from_json(path)
    table = analyze_trace(path).operators
    got = {(r["kind"], r["name"]): (r["calls"], r["incl_ns"]) for r in table.to_pylist()
           if r["kind"] != "operator"}
    assert want and set(got) == set(want)
    for key, (calls, ns) in want.items():
        assert got[key][0] == calls, key
        assert got[key][1] == pytest.approx(ns, rel=1e-6, abs=2 * calls), key
    if "nccl" in trace_file:
        assert any(k == "comm_kernel" for k, _ in got)


@needs_shared
def test_kernel_report_keeps_communication_kernels_apart_with_device_shares(
        tmp_path: Path) -> None:
    d = diagnose(SHARED / "hta/nccl_parser_config", out=tmp_path, workers=1)
    doc = d.run["operators"]
    assert doc["comm_kernels"] and all(r["kind"] == "comm_kernel" for r in doc["comm_kernels"])
    assert all(r["kind"] != "comm_kernel" for r in doc["kernels"])
    t = read_operators(tmp_path)
    device = [r for r in t.to_pylist() if r["kind"] != "operator"]
    assert doc["device_time_ms"] == pytest.approx(sum(r["incl_ns"] for r in device) / 1e6,
                                                  abs=1e-3)
    for r in doc["kernels"][:5] + doc["comm_kernels"]:
        assert r["device_pct"] == pytest.approx(100 * r["time_ms"] / doc["device_time_ms"],
                                                abs=0.01)


# --- across ranks, and diff ---------------------------------------------------------------------

@needs_shared
def test_spread_across_ranks_is_each_ranks_time_per_analysed_step(tmp_path: Path) -> None:
    d = diagnose(SHARED / "hta/trace_filter", out=tmp_path, workers=1)
    doc = d.run["operators"]
    assert doc["ranks"] == 2
    table = read_operators(tmp_path).to_pylist()
    steps = {r: sum(1 for x in d.steps.column("rank").to_pylist() if x == r) for r in (0, 1)}
    for row in doc["operators"][:5]:
        per = {r: sum(x["self_ns"] for x in table if x["rank"] == r and x["name"] == row["name"]
                      and x["kind"] == "operator") / steps[r] / 1e6 for r in (0, 1)}
        s = row["self_ms_per_step"]
        assert (s["min"], s["max"]) == pytest.approx((min(per.values()), max(per.values())),
                                                     abs=1e-3)
        assert s["max_rank"] == max(per, key=per.get)


@needs_shared
def test_diff_reads_the_saved_table_with_the_same_numbers_as_the_events(tmp_path: Path) -> None:
    ctx = load_context(SHARED / "hta/trace_filter", out=tmp_path, workers=1)
    traced = analysed_steps(ctx)
    saved = _ops(ctx, traced, [0, 1], whole=True)
    from_events = _ops(ctx, traced, [0, 1], whole=False)
    assert saved.keys() == from_events.keys() and len(saved) > 50
    for key, st in from_events.items():
        assert (saved[key].calls, saved[key].self_ns, saved[key].incl_ns) == pytest.approx(
            (st.calls, st.self_ns, st.incl_ns)), key


# --- input shapes on a real trace ------------------------------------------------------------

@needs_shared
def test_by_shape_rows_sum_to_the_by_name_totals_and_split_one_operators_shapes() -> None:
    """tb_plugin's ResNet50 trace records `Input Dims`: its saved rows by name and shapes add
    up, per operator, to the by-name totals the events give (`rank_ops`, what diff compares),
    and aten::conv2d's calls of each input shape, counted straight from the JSON inside the
    ProfilerStep spans, are rows of their own."""
    path = SHARED / "tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
    tables = analyze_trace(path)
    saved = tables.operators
    summed = {(r["kind"], r["name"]): r for r in by_name(saved).to_pylist()}
    steps = set(tables.steps.column("step").to_pylist())
    want = rank_ops(tables.events, steps)
    assert summed.keys() == want.keys()
    for key, st in want.items():
        r = summed[key]
        assert (r["calls"], r["self_ns"], r["incl_ns"]) == (st.calls, st.self_ns, st.incl_ns), key
    assert saved.num_rows > len(want)  # some operators split by shapes
    assert all(r["shapes"] is None for r in saved.to_pylist() if r["kind"] != "operator")
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    spans = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    calls: dict[str, int] = {}
    for e in events:
        if e.get("name") == "aten::conv2d" and any(
                s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in spans):
            k = json.dumps(e["args"]["Input Dims"])
            calls[k] = calls.get(k, 0) + 1
    conv = {json.dumps(json.loads(r["shapes"])): r["calls"] for r in saved.to_pylist()
            if r["name"] == "aten::conv2d"}
    assert len(calls) >= 2 and conv == calls


def _self_times_by_stack(tid, ts, dur):  # type: ignore[no-untyped-def]
    """The rule one event at a time, as a reference: events in (thread, start, longer first)
    order, a stack of the open ones; each gives its time, up to its parent's end, to the
    innermost one still open at its start."""
    import numpy as np

    out = dur.astype(np.int64).copy()
    stack: list[int] = []
    last = None
    for i in np.lexsort((-dur, ts, tid)).tolist():
        if tid[i] != last:
            stack, last = [], tid[i]
        while stack and ts[stack[-1]] + dur[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            out[stack[-1]] -= min(dur[i], ts[stack[-1]] + dur[stack[-1]] - ts[i])
        stack.append(i)
    return np.maximum(out, 0)


def test_columnar_self_times_equal_the_one_event_at_a_time_rule_nested_or_not() -> None:
    import numpy as np

    from uberprof.analysis.tables.operators import self_times

    rng = np.random.default_rng(0)
    for _ in range(300):  # random threads, overlaps that nest and that do not, zero lengths
        n = int(rng.integers(1, 80))
        tid, ts, dur = (rng.integers(0, 3, n), rng.integers(0, 200, n), rng.integers(0, 60, n))
        assert np.array_equal(self_times(tid, ts, dur), _self_times_by_stack(tid, ts, dur))
    # properly nested: a parent with two children and a grandchild
    tid = np.zeros(4, np.int64)
    ts, dur = np.array([0, 10, 12, 50]), np.array([100, 30, 5, 20])
    assert self_times(tid, ts, dur).tolist() == [50, 25, 5, 20]
