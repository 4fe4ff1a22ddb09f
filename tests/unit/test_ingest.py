"""Trace ingest: formats, timestamps, classification, collective metadata, rank discovery."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from tests import _traces as T
from uberprof.ingest import TraceError, ingest_trace
from uberprof.ingest.classify import classify
from uberprof.ingest.discover import discover, rank_from_name
from uberprof.ingest.events import TraceEvent, decode_events

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")


def kinds(t) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return dict(zip(t.events.column("name").to_pylist(), t.events.column("kind").to_pylist()))


def test_json_and_gzip_give_the_same_table(tmp_path: Path) -> None:
    doc = T.gpu_step_trace()
    a = ingest_trace(T.write(tmp_path / "a.json", doc))
    b = ingest_trace(T.write(tmp_path / "b.json.gz", doc))
    c = ingest_trace(T.write(tmp_path / "c.json", doc, gz=True))  # gzip told by magic bytes
    assert a.events.equals(b.events) and a.events.equals(c.events)


def test_table_layout(tmp_path: Path) -> None:
    t = ingest_trace(T.write(tmp_path / "a.json", T.gpu_step_trace()))
    schema = t.events.schema
    assert schema.field("ts").type == pa.int64() and schema.field("dur").type == pa.int64()
    assert pa.types.is_dictionary(schema.field("name").type)
    assert pa.types.is_dictionary(schema.field("kind").type)
    ts = t.events.column("ts").to_pylist()
    assert ts == sorted(ts)
    assert "thread_name" not in t.events.column("name").to_pylist()  # metadata is not an event


def test_relative_timestamps_become_epoch_ns(tmp_path: Path) -> None:
    doc = T.trace([T.op(1234.5678, 2.5)])
    t = ingest_trace(T.write(tmp_path / "a.json", doc))
    assert t.clock == "epoch" and t.sub_us
    assert t.events.column("ts").to_pylist() == [T.BASE_NS + 1_234_568]  # rounded to the ns
    assert t.events.column("dur").to_pylist() == [2500]


def test_absolute_epoch_microseconds_keep_sub_microsecond_precision(tmp_path: Path) -> None:
    doc = T.trace([T.op(1623212388426602.25, 7)], base_ns=None)
    t = ingest_trace(T.write(tmp_path / "a.json", doc))
    assert t.clock == "epoch"
    assert t.events.column("ts").to_pylist() == [1623212388426602250]


def test_timestamps_without_origin_are_relative(tmp_path: Path) -> None:
    t = ingest_trace(T.write(tmp_path / "a.json", T.trace([T.op(10, 5)], base_ns=None)))
    assert t.clock == "relative" and t.events.column("ts").to_pylist() == [10_000]


@pytest.mark.parametrize("cat,name,device,kind", [
    ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     True, "comm_kernel"),
    ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long)", True,
     "comm_kernel"),
    ("kernel", "rccl_AllGather_RING_SIMPLE", True, "comm_kernel"),
    ("kernel", "hcclAllReduceKernel", True, "comm_kernel"),
    ("Kernel", "volta_sgemm_128x64_nn", True, "kernel"),
    ("kernel", "Cijk_Alik_Bljk_SB_MT64x16x32", True, "kernel"),
    ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", True, "memcpy"),
    ("Memset", "Memset (Device)", True, "memset"),
    ("cuda_sync", "Stream Sync", True, "device_sync"),
    ("gpu_user_annotation", "ProfilerStep#3", False, "device_annotation"),
    ("cuda_runtime", "cudaStreamSynchronize", False, "sync"),
    ("cuda_runtime", "hipDeviceSynchronize", False, "sync"),
    ("cuda_runtime", "cudaLaunchKernel", False, "runtime"),
    ("Runtime", "cudaMemcpyAsync", False, "runtime"),
    ("cpu_op", "aten::mm", False, "operator"),
    ("Operator", "aten::conv2d", False, "operator"),
    ("user_annotation", "ProfilerStep#12", False, "step"),
    ("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", False,
     "dataloader"),
    ("user_annotation", "Optimizer.step#AdamW.step", False, "optimizer"),
    ("Operator", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", False,
     "dataloader"),  # 2021 traces
    ("Operator", "Optimizer.step#SGD.step", False, "optimizer"),
    ("user_annotation", "gloo:all_reduce", False, "host_comm"),
    ("user_annotation", "nccl:all_reduce", False, "comm_op"),
    ("cpu_op", "record_param_comms", False, "comm_op"),
    ("cpu_op", "c10d::allreduce_", False, "comm_op"),
    ("python_function", "train.py(12): step", False, "python"),
    ("mystery_accel_kernel", "fused_op", True, "device_other"),
    ("mystery_host_cat", "something", False, "other"),
])
def test_classification(cat: str, name: str, device: bool, kind: str) -> None:
    assert classify(cat, name, device) == kind


def test_old_format_streams_from_tid(tmp_path: Path) -> None:
    """2021 traces: `Kernel` category, no stream arg, the stream in the tid ("stream 16")."""
    ev = [{"ph": "X", "cat": "Kernel", "name": "ncclKernel_Broadcast_RING_LL_Sum_int8_t",
           "pid": 0, "tid": "stream 16", "ts": 16, "dur": 16, "args": {"device": 0}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 9, "tid": "9", "ts": 0,
           "dur": 20, "args": {}}]
    t = ingest_trace(T.write(tmp_path / "a.json", {"traceEvents": ev}))
    rows = t.events.to_pylist()
    k = next(r for r in rows if r["kind"] == "comm_kernel")
    assert k["stream"] == 16
    assert next(r for r in rows if r["kind"] == "operator")["tid"] == 9


def test_collective_metadata(tmp_path: Path) -> None:
    ev = [
        T.gloo(0, 10, 277736),
        T.gloo(20, 10, 1000, dtype="c10::BFloat16", name="gloo:broadcast"),
        T.kernel(40, 5, 1, name="ncclDevKernel_AllGather_RING_LL", stream=20,
                 **{"Collective name": "_allgather_base", "In msg nelems": 100,
                    "Out msg nelems": 800, "Group size": 8, "dtype": "Half",
                    "Process Group Name": "3", "Process Group Ranks": "[0, 1, 2, 3]",
                    "Seq": "12"}),
    ]
    t = ingest_trace(T.write(tmp_path / "a.json", T.trace(ev)))
    rows = {r["name"]: r for r in t.events.to_pylist()}
    g = rows["gloo:all_reduce"]
    assert (g["coll_name"], g["in_bytes"], g["dtype"]) == ("all_reduce", 277736 * 4, "float")
    assert rows["gloo:broadcast"]["in_bytes"] == 2000
    k = rows["ncclDevKernel_AllGather_RING_LL"]
    assert (k["in_bytes"], k["out_bytes"], k["group_size"], k["pg_name"], k["pg_ranks"],
            k["seq"]) == (200, 1600, 8, "3", "[0, 1, 2, 3]", 12)


def test_tolerates_odd_shapes(tmp_path: Path) -> None:
    """A bare JSON array of events and events whose args are not objects still ingest."""
    ev = [T.op(0, 5), {**T.op(10, 5, "aten::relu"), "args": ["weird"]}, "not an event"]
    t = ingest_trace(T.write(tmp_path / "a.json", ev))
    assert sorted(t.events.column("name").to_pylist()) == ["aten::mm", "aten::relu"]


def test_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not a Kineto trace"):
        ingest_trace(T.write(tmp_path / "a.json", "42"))
    with pytest.raises(TraceError, match="no trace events"):
        ingest_trace(T.write(tmp_path / "b.json", {"schemaVersion": 1}))


@pytest.mark.parametrize("name,rank", [
    ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34),
    ("sampled_rank-1.json.gz", 1),
    ("worker0.1623212756351.pt.trace.json.gz", 0),
    ("trainer/rank_12/trace.json", 12),
    ("rank3.json", 3),
    ("host_1234.1700000000.pt.trace.json", None),
    ("rank_not_found.json.gz", None),
])
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_discover_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "ranks" / "3" / "traces").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "x"}))
    (run / "ranks" / "3" / "rank.json").write_text(json.dumps({"rank": 3}))
    tr = run / "ranks" / "3" / "traces"
    T.write(tr / "steps-000010-000012.pt.trace.json.gz", T.trace([T.op(0, 1)], rank=None))
    # mid-compression: both files exist, the archive wins
    T.write(tr / "steps-000020-000022.pt.trace.json", T.trace([T.op(0, 1)], rank=None))
    T.write(tr / "steps-000020-000022.pt.trace.json.gz", T.trace([T.op(0, 1)], rank=None))
    (tr / "notes.json").write_text("{}")
    src = discover(run)
    assert src.kind == "run"
    assert [(i.rel, i.rank_hint, i.hint_source) for i in src.inputs] == [
        ("ranks/3/traces/steps-000010-000012.pt.trace.json.gz", 3, "run directory"),
        ("ranks/3/traces/steps-000020-000022.pt.trace.json.gz", 3, "run directory"),
    ]


def test_discover_folder_skips_derived_and_hidden(tmp_path: Path) -> None:
    T.write(tmp_path / "a" / "rank-0.json", T.trace([T.op(0, 1)]))
    T.write(tmp_path / "derived" / "summary.json", {"ranks": []})
    T.write(tmp_path / ".cache" / "x.json", {})
    (tmp_path / "README.md").write_text("hi")
    assert [i.rel for i in discover(tmp_path).inputs] == ["a/rank-0.json"]


def test_a_json_file_that_is_no_trace_is_a_companion_skipped_with_one_line(
        tmp_path: Path) -> None:
    """A folder of one trace and what the job wrote beside it (key_averages' rows, a config):
    the trace is the one input, each other file one line; an event array and a trace whose
    event list is empty stay inputs (the reader judges them)."""
    T.write(tmp_path / "job.pt.trace.json.gz", T.trace([T.op(0, 1)], rank=None))
    T.write(tmp_path / "job.key_averages.json",
            {"device": "x", "rows": {f"aten::op{i}": {"count": i} for i in range(5000)}})
    T.write(tmp_path / "config.json", {"lr": 0.1})
    T.write(tmp_path / "array.json", [{"name": "a", "ph": "X", "ts": 0, "dur": 1}])
    T.write(tmp_path / "empty.json", {"traceEvents": []})
    src = discover(tmp_path)
    assert [i.rel for i in src.inputs] == ["array.json", "empty.json", "job.pt.trace.json.gz"]
    assert len(src.skipped) == 2
    assert all("not a trace" in s and "\n" not in s for s in src.skipped)
    assert {Path(s.split(": ")[0]).name for s in src.skipped} == {"config.json",
                                                                   "job.key_averages.json"}


def test_a_trace_folder_with_a_companion_file_reads_as_one_rank(tmp_path: Path) -> None:
    """samples/gpu/profile: the trace and its key_averages JSON. Read before as two inputs,
    neither with a rank, so the trace was left out; now one rank, and the companion named."""
    from uberprof.analysis.tables.pipeline import analyze

    folder = Path(__file__).resolve().parents[2] / "samples" / "gpu" / "profile"
    a = analyze(folder, out=tmp_path / "out", workers=1)
    assert [r["rank"] for r in a.ranks] == [0]
    assert a.ranks[0]["steps"] >= 4
    notes = [p for p in a.summary["problems"] if "key_averages.json" in p]
    assert len(notes) == 1 and "not a trace" in notes[0], a.summary["problems"]
    assert not [p for p in a.summary["problems"] if "left out" in p]


@shared
def test_shared_rocm_trace() -> None:
    t = ingest_trace(SHARED / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert t.device_type == "rocm" and t.rank is None
    assert "kernel" in t.events.column("kind").to_pylist()


@shared
def test_shared_cuda_and_cpu_traces() -> None:
    t = ingest_trace(SHARED / "hta/nccl_parser_config/nccl_data.json.gz")
    assert (t.device_type, t.rank, t.world_size, t.backend) == ("cuda", 0, 2, "nccl")
    assert t.process_groups[0]["ranks"] == [0, 1]
    c = ingest_trace(SHARED / "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert (c.device_type, c.rank) == ("cpu", 34)
    assert c.threads[3553] == "thread 3553 (pt_main_thread)"


def test_gzip_member_of_plain_json_is_read(tmp_path: Path) -> None:
    p = tmp_path / "x.pt.trace.json.gz"
    p.write_bytes(gzip.compress(json.dumps(T.trace([T.op(0, 3)])).encode()))
    assert ingest_trace(p).events.num_rows == 1


class _FlowEvent(TraceEvent, gc=False):
    id: Any = None


def test_decode_events_keeps_what_fits_and_optionally_the_place_of_non_objects() -> None:
    Ev = _FlowEvent
    dec = msgspec.json.Decoder(list[Ev])
    raw = [msgspec.Raw(b) for b in (b'{"ph":"X","ts":1,"args":{"stream":7,"x":1}}',
                                    b'{"ph":"s","id":3,"args":"not an object"}', b'42')]
    kept = decode_events(raw, dec, Ev)
    assert [(e.ph, e.id, e.args and e.args.stream) for e in kept] == [("X", None, 7),
                                                                      ("s", 3, None)]
    placed = decode_events(raw, dec, Ev, keep_place=True)
    assert len(placed) == 3 and placed[2] == Ev()
    assert decode_events(raw[:1], dec, Ev)[0].args.stream == 7  # the one-call path
