"""Small synthetic Kineto traces for the export tests: a host thread with nested operators,
launches and their flows, a GPU stream, Python function events, spans that do not nest (as
Kineto writes Optimizer.step across a step boundary), profiler-wide instants."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

BASE_NS = 1_790_000_000_000_000_000


def kineto_trace(rank: int, world: int = 2, host: str = "host-a", steps: int = 3,
                 small_ops: int = 0, start_us: float = 5_000_000.0) -> dict[str, Any]:
    """One rank's trace: `steps` ProfilerSteps of 1000 µs, each with a forward op that launches
    a kernel (with its ac2g flow), `small_ops` 1-µs operators, a Python function span, and an
    Optimizer.step that crosses into the next step."""
    pid, main, gpu_pid, stream = 4000 + rank, 4000 + rank, 0, 7
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "process_labels", "pid": gpu_pid, "tid": 0,
         "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": main,
         "args": {"name": f"thread {main} (python)"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": main,
         "args": {"name": f"thread {main} (pt_main_thread)"}},
        {"ph": "M", "name": "thread_name", "pid": gpu_pid, "tid": stream,
         "args": {"name": "stream 7 "}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": start_us - 50, "dur": steps * 1000 + 300.0},
        {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
         "tid": "Trace PyTorch Profiler", "ts": start_us - 50},
    ]
    corr = 100
    for s in range(steps):
        t0 = start_us + s * 1000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}",
                   "pid": pid, "tid": main, "ts": t0, "dur": 1000.0,
                   "args": {"External id": 1 + s}})
        ev.append({"ph": "X", "cat": "python_function", "name": "nn.Module: Linear_0",
                   "pid": pid, "tid": main, "ts": t0 + 5, "dur": 300.0,
                   "args": {"Python id": s}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": pid,
                   "tid": main, "ts": t0 + 10.5, "dur": 190.25, "args": {"External id": 10}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": pid, "tid": main,
                   "ts": t0 + 20.123, "dur": 150.0, "args": {"Input Dims": [[8, 8]]}})
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid,
                   "tid": main, "ts": t0 + 30.0, "dur": 10.0,
                   "args": {"correlation": corr, "External id": 10}})
        ev.append({"ph": "s", "id": corr, "pid": pid, "tid": main, "ts": t0 + 30.0,
                   "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": gpu_pid,
                   "tid": stream, "ts": t0 + 50.0, "dur": 70.777,
                   "args": {"stream": stream, "correlation": corr, "device": 0}})
        ev.append({"ph": "f", "id": corr, "pid": gpu_pid, "tid": stream, "ts": t0 + 50.0,
                   "cat": "ac2g", "name": "ac2g", "bp": "e"})
        for k in range(small_ops):
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": pid,
                       "tid": main, "ts": t0 + 400 + k * 2, "dur": 1.0, "args": {"k": k}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step",
                   "pid": pid, "tid": main, "ts": t0 + 900, "dur": 200.0, "args": {}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "negative", "pid": pid, "tid": main,
               "ts": start_us, "dur": -5.0})
    return {
        "schemaVersion": 1, "deviceProperties": [],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "host_name": host, "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS,
        "traceEvents": ev,
    }


def write_traces(folder: Path, world: int = 2, hosts: tuple[str, ...] = ("host-a", "host-b"),
                 **kw: Any) -> dict[int, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for r in range(world):
        p = folder / f"rank-{r}.pt.trace.json.gz"
        p.write_bytes(gzip.compress(json.dumps(
            kineto_trace(r, world, hosts[r % len(hosts)], **kw)).encode()))
        out[r] = p
    return out


@pytest.fixture(scope="session")
def counters_run(ddp_runs: dict[int, Path]) -> Path:
    """A real 4-rank DDP run (CPU, Gloo), traced on steps 4-6, with its node's counters (host
    and NIC here) at 10 Hz: the session's 4-rank run of tests/_runs.py (both fixtures are
    registered in tests/jobs/conftest.py)."""
    return ddp_runs[4]


def run_sources(run: Path) -> dict[int, list[Path]]:
    """rank -> its trace files, in a run directory."""
    return {int(d.name): sorted((d / "traces").glob("*.json.gz"))
            for d in (run / "ranks").iterdir()}


def write_gpu_run(root: Path, world: int = 2, hosts: tuple[str, ...] = ("host-a", "host-b"),
                  windows: int = 1, **kw: Any) -> Path:
    """A run directory of synthetic GPU ranks, each on its own node, with that node's NVML
    and NIC counters (the GPU matched to its rank by UUID, as `uberprof run` records them)."""
    import json as _json

    from uberprof.collect.counters.store import CounterStore
    from uberprof.rundir import RunDir, trace_file_name

    run = RunDir(root)
    run.create("gpu-run")
    for r in range(world):
        host = hosts[r % len(hosts)]
        uuid = f"GPU-{r:08d}-aaaa-bbbb-cccc-0000000000{r:02d}"
        rd = run.ranks_dir / str(r)
        (rd / "traces").mkdir(parents=True)
        (rd / "rank.json").write_text(_json.dumps({
            "rank": r, "world_size": world, "local_rank": 0, "host": host, "node": host,
            "pid": 4000 + r, "backend": "nccl",
            "device": {"type": "cuda", "index": 0, "uuid": uuid, "name": "H100"}}))
        for w in range(windows):  # windows of 3 steps, 10 steps (and 10 s) apart
            trace = kineto_trace(r, world, host, start_us=5_000_000.0 + w * 10_000_000, **kw)
            for e in trace["traceEvents"]:
                if str(e.get("name", "")).startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + 10 * w}"
            (rd / "traces" / (trace_file_name(1 + 10 * w, 3 + 10 * w) + ".gz")).write_bytes(
                gzip.compress(_json.dumps(trace).encode()))
        store = CounterStore(run.nodes_dir / host / "counters")
        t0 = BASE_NS + 4_000_000_000
        for k in range(12):  # 2 Hz from 1 s before the trace to its end
            ts = t0 + k * 500_000_000
            store.add("nvml", ts, [("gpu3", "clock.sm", 1980.0 - 10 * k, "MHz"),
                                   ("gpu3", "power", 300.0 + k, "W"),
                                   ("gpu3", "util.gpu", 90.0, "%"),
                                   ("gpu5", "clock.sm", 1980.0, "MHz")])
            store.add("nic", ts, [("eth0", "tx_rate", 1.25e9, "B/s"),
                                  ("eth0", "rx_rate", 1.0e9, "B/s")])
        store.write_meta({"host": host, "gpus": {"gpu3": {"index": 3, "uuid": uuid},
                                                 "gpu5": {"index": 5, "uuid": "GPU-other"}}})
        store.close()
    return root
