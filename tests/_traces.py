"""Small synthetic Kineto traces for ingest and analysis tests (times in µs, like Kineto)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

BASE_NS = 1_790_857_026_000_000_000  # a baseTimeNanoseconds value as torch 2.x writes it
PID = 4242
MAIN = 4242
GLOO = 4250


def trace(events: list[dict[str, Any]], rank: int | None = 0, world: int = 2,
          base_ns: int | None = BASE_NS, **header: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [], **header}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    if base_ns is not None:
        doc["baseTimeNanoseconds"] = base_ns
    doc["traceEvents"] = [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN,
         "args": {"name": f"thread {MAIN} (python)"}},
        *events,
    ]
    return doc


def step(n: int, ts: float, dur: float, tid: int = MAIN) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": PID,
            "tid": tid, "ts": ts, "dur": dur, "args": {}}


def op(ts: float, dur: float, name: str = "aten::mm", tid: int = MAIN) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid, "ts": ts,
            "dur": dur, "args": {"External id": 1}}


def annotation(ts: float, dur: float, name: str, tid: int = MAIN) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": tid,
            "ts": ts, "dur": dur, "args": {}}


def launch(ts: float, corr: int, name: str = "cudaLaunchKernel", dur: float = 5,
           tid: int = MAIN) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts,
            "dur": dur, "args": {"correlation": corr, "cbid": 211}}


def kernel(ts: float, dur: float, corr: int, name: str = "void gemm_kernel<float>()",
           stream: int = 7, cat: str = "kernel", **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, **args}}


def memcpy(ts: float, dur: float, corr: int, stream: int = 7) -> dict[str, Any]:
    return kernel(ts, dur, corr, name="Memcpy HtoD (Pageable -> Device)", stream=stream,
                  cat="gpu_memcpy")


def gloo(ts: float, dur: float, numel: int, dtype: str = "float", tid: int = GLOO,
         name: str = "gloo:all_reduce") -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": tid,
            "ts": ts, "dur": dur,
            "args": {"Input type": [dtype], "Input Dims": [[numel]], "Input Strides": [[1]]}}


def gpu_step_trace(rank: int = 0, t0: float = 1000.0, **kw: Any) -> dict[str, Any]:
    """Two steps of 1000 µs: compute kernels, an NCCL kernel overlapping them, a memcpy."""
    ev = [
        step(1, t0, 1000), step(2, t0 + 1000, 1000),
        launch(t0 + 10, 1), kernel(t0 + 100, 300, 1),
        launch(t0 + 20, 2), kernel(t0 + 300, 400, 2, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                                   stream=20, **{"Collective name": "allreduce",
                                                 "In msg nelems": 1000, "Out msg nelems": 1000,
                                                 "Group size": 2, "dtype": "Float",
                                                 "Process Group Name": "0",
                                                 "Process Group Ranks": "[0, 1]", "Seq": 7}),
        launch(t0 + 30, 3, name="cudaMemcpyAsync"), memcpy(t0 + 800, 50, 3),
        launch(t0 + 1010, 4), kernel(t0 + 1100, 500, 4),
        launch(t0 + 1020, 5), kernel(t0 + 1700, 200, 5),
    ]
    return trace(ev, rank=rank, **kw)


def cpu_step_trace(rank: int = 0, t0: float = 1000.0, **kw: Any) -> dict[str, Any]:
    """Two Gloo steps: operators on the main thread, gloo:all_reduce on its worker thread."""
    ev = [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": GLOO,
         "args": {"name": f"thread {GLOO} (pt_gloo_runloop)"}},
        step(1, t0, 1000), step(2, t0 + 1000, 1000),
        annotation(t0, 100, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"),
        op(t0 + 20, 50, "aten::randint"),  # inside the data-loader fetch: not compute
        op(t0 + 100, 500), op(t0 + 650, 100, "c10d::allreduce_"),
        gloo(t0 + 660, 300, 1000),
        annotation(t0 + 900, 80, "Optimizer.step#AdamW.step"), op(t0 + 900, 80, "aten::add_"),
        op(t0 + 1000, 400), gloo(t0 + 1300, 500, 2000),
    ]
    doc = trace(ev, rank=rank, **kw)
    if "distributedInfo" in doc:
        doc["distributedInfo"]["backend"] = "gloo"
    return doc


def write(path: Path, doc: dict[str, Any] | list[Any] | str | bytes, gz: bool | None = None) -> Path:
    """Write a trace; gzip when the name ends in .gz (or `gz`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(doc, (dict, list)):
        data = json.dumps(doc).encode()
    elif isinstance(doc, str):
        data = doc.encode()
    else:
        data = doc
    if gz if gz is not None else path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path
