"""Ingest and tables of `uberprof run --modules` (`module::<path>` spans) and `--profile-memory`
(torch.profiler's `[memory]` instant events): kinds, the module table's nesting and self time,
the memory timeline's step and operator, the report's sections; and the module hooks' names
and spans on a real in-process profile."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console

from tests import _traces as T
from uberprof.analysis.diagnosis.memory_timeline import memory_timeline_doc
from uberprof.analysis.diagnosis.top_modules import modules_doc
from uberprof.analysis.tables.modules import module_table
from uberprof.analysis.tables.rank import analyze_trace
from uberprof.ingest import ingest_trace
from uberprof.ingest.classify import MODULE, OPERATOR, classify
from uberprof.present.terminal.modules import render_memory_timeline, render_modules


def mem(ts: float, nbytes: int, total: int, device_type: int = 0, device_id: int = -1,
        tid: int = T.MAIN) -> dict[str, Any]:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": T.PID,
            "tid": tid, "ts": ts, "args": {"Total Reserved": 0, "Total Allocated": total,
                                           "Bytes": nbytes, "Device Id": device_id,
                                           "Device Type": device_type, "Addr": 1234}}


def module(ts: float, dur: float, path: str) -> dict[str, Any]:
    return T.op(ts, dur, f"module::{path}")  # a C++ record function: category cpu_op


def _trace() -> dict[str, Any]:
    """Two steps; in each a model forward with two layers, the second with an attention."""
    ev: list[dict[str, Any]] = []
    for s, t0 in ((1, 1000.0), (2, 2000.0)):
        ev += [T.step(s, t0, 1000),
               module(t0 + 10, 600, "Net"),
               module(t0 + 20, 200, "layers.0"), T.op(t0 + 30, 100, "aten::addmm"),
               module(t0 + 300, 300, "layers.1"), module(t0 + 310, 150, "layers.1.attn"),
               T.op(t0 + 320, 50, "aten::mm"),
               mem(t0 + 35, 4096, 10_000 + s), mem(t0 + 330, 8192, 18_192 + s),
               mem(t0 + 700, -8192, 10_000)]
    ev.append(mem(3500, 16, 10_016))  # after the last step
    return T.trace(ev)


def test_module_spans_and_memory_events_are_ingested(tmp_path: Path) -> None:
    assert classify("cpu_op", "module::encoder.layers.0", False) == MODULE
    assert classify("user_annotation", "module::head", False) == MODULE  # record_function
    assert classify("cpu_op", "aten::mm", False) == OPERATOR
    t = ingest_trace(T.write(tmp_path / "a.json", _trace()))
    kinds = dict(zip(t.events.column("name").to_pylist(), t.events.column("kind").to_pylist()))
    assert kinds["module::layers.1.attn"] == MODULE and kinds["aten::mm"] == OPERATOR
    assert "[memory]" not in kinds  # instant events are no spans
    m = t.memory
    assert m is not None and m.num_rows == 7
    assert m.column("ts").to_pylist()[0] == T.BASE_NS + 1_035_000  # as the events' clock
    assert set(m.column("device").to_pylist()) == {"cpu"}
    assert m.column("bytes").to_pylist()[:3] == [4096, 8192, -8192]
    assert m.column("total_allocated").to_pylist()[:2] == [10_001, 18_193]
    assert set(m.column("tid").to_pylist()) == set(t.events.column("tid").to_pylist())
    gpu = ingest_trace(T.write(tmp_path / "g.json", T.trace(
        [T.op(1000, 10), mem(1001, 512, 512, device_type=1, device_id=3)])))
    assert gpu.memory is not None and gpu.memory.column("device").to_pylist() == ["cuda:3"]
    assert ingest_trace(T.write(tmp_path / "n.json", T.trace([T.op(1000, 10)]))).memory is None


def test_module_table_nests_and_self_time_leaves_out_child_modules(tmp_path: Path) -> None:
    tables = analyze_trace(T.write(tmp_path / "a.json", _trace()))
    rows = {r["module"]: r for r in tables.modules.to_pylist()}
    assert set(rows) == {"Net", "layers.0", "layers.1", "layers.1.attn"}
    assert all(r["calls"] == 2 and r["source"] == "hooks" for r in rows.values())
    assert rows["Net"]["total_ns"] == 2 * 600_000
    assert rows["Net"]["self_ns"] == 2 * (600_000 - 200_000 - 300_000)
    assert rows["layers.1"]["self_ns"] == 2 * 150_000  # the operator inside stays in it
    assert rows["layers.0"]["self_ns"] == rows["layers.0"]["total_ns"] == 2 * 200_000
    for parent, child in (("Net", "layers.0"), ("Net", "layers.1"), ("layers.1", "layers.1.attn")):
        assert rows[parent]["total_ns"] >= rows[child]["total_ns"]
    assert sum(r["self_ns"] for r in rows.values()) == rows["Net"]["total_ns"]
    # module spans are not operators: the operator table is unchanged by them
    assert not any(n.startswith("module::") for n in tables.operators.column("name").to_pylist())


def test_module_table_falls_back_to_what_the_trace_carries(tmp_path: Path) -> None:
    stack = [T.step(1, 1000, 1000),
             {"ph": "X", "cat": "python_function", "name": "nn.Module: Linear_0", "pid": T.PID,
              "tid": T.MAIN, "ts": 1010, "dur": 100, "args": {}},
             T.annotation(1005, 500, "DistributedDataParallel.forward")]
    t = analyze_trace(T.write(tmp_path / "s.json", T.trace(stack)))
    assert t.modules.to_pylist() == [{"module": "Linear_0", "source": "with_stack", "calls": 1,
                                      "total_ns": 100_000, "self_ns": 100_000}]
    t = analyze_trace(T.write(tmp_path / "w.json", T.trace(stack[:1] + stack[2:])))
    assert t.modules.column("module").to_pylist() == ["DistributedDataParallel"]
    assert t.modules.column("source").to_pylist() == ["wrapper"]
    empty = analyze_trace(T.write(tmp_path / "e.json", T.trace([T.step(1, 1000, 10)])))
    assert empty.modules.num_rows == 0 and module_table(empty.events).num_rows == 0


def test_memory_timeline_has_step_operator_and_the_peak(tmp_path: Path) -> None:
    tables = analyze_trace(T.write(tmp_path / "a.json", _trace()))
    m = tables.memory
    assert m.column("step").to_pylist() == [1, 1, 1, 2, 2, 2, -1]
    assert m.column("operator").to_pylist() == ["aten::addmm", "aten::mm", None] * 2 + [None]
    rank = pa.array([0] * m.num_rows, pa.int64())
    run_mem = m.add_column(0, "rank", rank).append_column("trace", pa.array(["a"] * m.num_rows))
    traced = pa.table({"rank": pa.array([0, 0], pa.int64()), "step": pa.array([1, 2], pa.int64()),
                       "host_start_ns": tables.steps.column("host_start_ns"),
                       "step_time_ns": pa.array([1_000_000] * 2, pa.int64())})
    doc = memory_timeline_doc(run_mem, traced)
    assert doc is not None and doc["categories"] is None and "no category" in doc[
        "categories_note"]
    (r,) = doc["ranks"]
    assert r["peak_allocated_bytes"] == 18_194 and r["peak_step"] == 2
    assert r["peak_operator"] == "aten::mm" and r["peak_in_step_ms"] == 0.33
    assert r["peak_ns"] == T.BASE_NS + 2_330_000  # the trace's clock, as the saved events
    assert r["start_ns"] == tables.steps.column("host_start_ns").to_pylist()[0]
    assert r["steps"] == [1, 2] and r["events"] == 6  # the event after the steps is left out
    assert r["first_allocated_bytes"] == 10_001 - 4096 and r["last_allocated_bytes"] == 10_000
    mods = tables.modules.add_column(0, "rank", pa.array([0] * tables.modules.num_rows,
                                                         pa.int64()))
    mdoc = modules_doc(mods, traced)
    assert mdoc is not None and mdoc["modules"][0]["module"] == "Net"
    assert mdoc["modules"][0]["total_ms"] == 1.2 and mdoc["sources"] == ["hooks"]
    out = io.StringIO()
    console = Console(file=out, width=120)
    run = {"modules": mdoc, "memory_timeline": doc}
    render_modules(run, console, lambda c, t: c.print(t))
    render_memory_timeline(run, console, lambda c, t: c.print(t))
    text = out.getvalue()
    assert "layers.1.attn" in text and "aten::mm" in text and "[memory]" in text
    quiet = io.StringIO()
    render_modules({"modules": None}, Console(file=quiet), lambda c, t: c.print(t))
    render_memory_timeline({"memory_timeline": None}, Console(file=quiet),
                           lambda c, t: c.print(t))
    assert quiet.getvalue() == ""


def test_module_hooks_name_paths_and_record_spans_only_while_on(tmp_path: Path) -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import ProfilerActivity, profile

    from uberprof.collect.rank.modules import ModuleMarks, module_paths
    from uberprof.collect.safety import AgentLog

    class Wrap(nn.Module):  # stands for DistributedDataParallel (no process group needed)
        def __init__(self, m: nn.Module) -> None:
            super().__init__()
            self.module = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.module(x)

    Wrap.__name__ = DistributedDataParallel.__name__
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          nn.Linear(8, 2))
    wrapped = Wrap(model)
    paths = module_paths(wrapped)
    assert paths[wrapped] == "DistributedDataParallel" and paths[model] == "Sequential"
    assert paths[model[0].layers[1].self_attn] == "0.layers.1.self_attn"
    marks = ModuleMarks(AgentLog("test"))
    x = torch.randn(2, 4, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        marks.start()
        wrapped(x).sum().backward()
        marks.stop()
        wrapped(x)  # after stop: no span
    assert not marks.active
    names = [e.name for e in prof.events() if e.name.startswith("module::")]
    assert names.count("module::0.layers.1.self_attn") == 1
    assert names.count("module::DistributedDataParallel") == 1
    assert "module::Sequential" in names and "module::1" in names
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    tables = module_table(ingest_trace(path).events)
    rows = {r["module"]: r for r in tables.to_pylist()}
    assert rows["0.layers.1"]["total_ns"] >= rows["0.layers.1.self_attn"]["total_ns"] > 0
    assert pc.sum(tables.column("self_ns")).as_py() <= rows["DistributedDataParallel"][
        "total_ns"]
