"""Write a synthetic uberprof run directory: many GPU ranks, many steps, no GPU needed.

Used to measure the dashboard (benchmarks/dashboard.py) and the analysis at scale on a laptop.
What it writes is what `uberprof run` writes on a real NCCL job (see uberprof/rundir.py):

- `ranks/<r>/rank.json` and `ranks/<r>/steps.jsonl` (one row per step) for every rank;
- small but realistic Kineto traces (`ranks/<r>/traces/steps-A-B.pt.trace.json.gz`) for the
  trace windows: ProfilerStep spans, data-loader fetches, aten operators with their CUDA launches
  and kernels, DDP's bucketed NCCL all-reduces on their own stream with nccl-tests metadata,
  the optimizer, and the closing `cudaStreamSynchronize`;
- per node (8 GPUs each by default) NVML, host and InfiniBand counters (`nodes/<node>/counters`).

The job is a simulated DDP step (data wait, forward, backward with 4 gradient buckets reduced
while backward runs, optimizer): every rank waits for the last one at each all-reduce, so one
slow rank slows all. `--straggler R` makes rank R slower: `--straggler-cause throttle` (default)
lowers its GPU clocks with thermal slowdown set in its counters; `compute` gives it more work on
normal clocks. Hosts get different clock offsets (with an online estimate in rank.json) so clock
alignment has something to do. The output is deterministic for a given `--seed`.

    python benchmarks/synth_run.py /tmp/synth64 --ranks 64 --steps 2000
    python benchmarks/synth_run.py /tmp/synth8 --ranks 8 --steps 200 --trace-steps 50-52 \\
        --straggler 5 --straggler-cause compute
    python benchmarks/synth_run.py /tmp/synth64ops --ranks 64 --steps 2000 --op-names 200
        # a model of many operators: ~200 host operator and ~100 kernel names per rank
"""

from __future__ import annotations

import argparse
import gzip
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

# _common (found here also when this file is imported by path, as the tests do) puts the
# repository on sys.path for the uberprof imports below.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import doc_parser, synth_options

from uberprof.collect.config import TraceSchedule
from uberprof.collect.counters.store import CounterStore
from uberprof.rundir import (
    COUNTERS_DIR,
    NODE_FILE,
    RANK_FILE,
    STEPS_FILE,
    TRACES_DIR,
    RunDir,
    trace_file_name,
    write_json_atomic,
)

BASE_NS = 1_795_000_000_000_000_000  # baseTimeNanoseconds: the same in every process
START_NS = BASE_NS + 3_600_000_000_000  # the job starts an hour after it
MAIN_TID = 1000
BUCKETS = 4
FWD_KERNELS = 24
BWD_KERNELS = 48
OPT_KERNELS = 4
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_HELD_BYTES = 22 * 2**30  # what a rank holds between steps (synthetic)
GPU_ACTIVATION_BYTES = 30 * 2**30  # a step's peak above that
BUCKET_NELEMS = 6_553_600  # 25 MiB of fp32 gradients per bucket
SM_CLOCK_MAX = 1980.0
SAMPLE_HZ = 2.0


@dataclass(frozen=True)
class Config:
    out: Path
    ranks: int
    steps: int
    gpus_per_node: int
    windows: list[tuple[int, int]]
    straggler: int | None
    cause: str
    slow: float
    counters: bool
    seed: int
    step_ms: float
    layers: int = 1  # model depth: kernels per step (and trace size) grow with it
    op_names: int = 0  # distinct host operator names (and half as many kernel variants): 0 keeps 4


def parse_windows(text: str) -> list[tuple[int, int]]:
    """'100-102,1500-1502' -> [(100, 102), (1500, 1502)], as `uberprof run --trace-steps`."""
    try:
        return list(TraceSchedule.parse_steps(text).windows)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def default_windows(steps: int) -> list[tuple[int, int]]:
    """Two 3-step windows, early and late in the run (like `--trace-every`)."""
    firsts = sorted({min(max(steps // 20, 2), max(steps - 3, 0)),
                     min(max(3 * steps // 4, 2), max(steps - 3, 0))})
    return [(f, min(f + 2, steps - 1)) for f in firsts]


# --- the simulated job --------------------------------------------------------------------------

@dataclass
class Timeline:
    """Per step and rank (global clock, ns): step start/end, data wait, and device milestones."""

    start: np.ndarray  # [steps, ranks] host step start
    end: np.ndarray  # host step end
    data: np.ndarray  # data-loader wait at the start of the step
    fwd: np.ndarray  # forward compute time
    bwd: np.ndarray  # backward compute time
    ready: np.ndarray  # [steps, ranks, buckets] device time each gradient bucket is ready
    nccl_start: np.ndarray  # [steps, ranks, buckets]
    nccl_end: np.ndarray  # [steps, buckets] (the same on every rank)
    opt_start: np.ndarray  # [steps, ranks]


def simulate(cfg: Config, rng: np.random.Generator) -> Timeline:
    n, s_count = cfg.ranks, cfg.steps
    nodes = math.ceil(n / cfg.gpus_per_node)
    slow = np.ones(n)
    if cfg.straggler is not None:
        slow[cfg.straggler] = cfg.slow
    scale = cfg.step_ms / 200.0
    fwd_base, bwd_base, opt_ns, h2d_ns = 60e6 * scale, 120e6 * scale, 6e6 * scale, 0.5e6
    xfer = 2.6e6 * scale  # all-reduce of one bucket once everyone is there
    shape = (s_count, n)
    start = np.zeros(shape, np.int64)
    end = np.zeros(shape, np.int64)
    data = (1.2e6 * rng.lognormal(0.0, 0.35, shape)).astype(np.int64)
    # Now and then one node's data loaders stall (a slow file system read): visible in the
    # heatmap and as `data` gaps.
    stalls = rng.random(s_count) < 0.01
    for s in np.flatnonzero(stalls):
        node = rng.integers(nodes)
        lo, hi = node * cfg.gpus_per_node, min((node + 1) * cfg.gpus_per_node, n)
        data[s, lo:hi] += int(rng.uniform(20e6, 60e6) * scale)
    jitter = rng.normal(1.0, 0.012, shape)
    fwd = (fwd_base * jitter * slow).astype(np.int64)
    bwd = (bwd_base * jitter * slow).astype(np.int64)
    ready = np.zeros((s_count, n, BUCKETS), np.int64)
    nccl_start = np.zeros((s_count, n, BUCKETS), np.int64)
    nccl_end = np.zeros((s_count, BUCKETS), np.int64)
    opt_start = np.zeros(shape, np.int64)
    t = np.full(n, START_NS, np.int64) + rng.integers(0, 200_000, n)
    frac = (np.arange(1, BUCKETS + 1) / BUCKETS)
    for s in range(s_count):
        start[s] = t
        bwd_start = t + data[s] + h2d_ns + fwd[s]
        ready[s] = bwd_start[:, None] + (bwd[s][:, None] * frac[None, :]).astype(np.int64)
        prev = np.zeros(n, np.int64)
        for b in range(BUCKETS):
            st = np.maximum(ready[s, :, b], prev)
            nccl_start[s, :, b] = st
            e = int(st.max() + xfer * rng.uniform(0.97, 1.05))
            nccl_end[s, b] = e
            prev = np.full(n, e, np.int64)
        opt_start[s] = np.maximum(ready[s, :, -1], nccl_end[s, -1])
        end[s] = opt_start[s] + int(opt_ns) + rng.integers(50_000, 150_000, n)
        t = end[s]
    return Timeline(start, end, data, fwd, bwd, ready, nccl_start, nccl_end, opt_start)


# --- traces -------------------------------------------------------------------------------------

class TraceBuilder:
    """Kineto events of one rank, on its host's clock (µs relative to BASE_NS)."""

    def __init__(self, rank: int, offset_ns: int) -> None:
        self.rank = rank
        self.offset_ns = offset_ns  # host clock = global clock - offset
        self.events: list[dict[str, Any]] = []
        self.corr = rank * 10_000_000
        self.seq = 0

    def us(self, global_ns: float) -> float:
        return round(float(global_ns - self.offset_ns - BASE_NS) / 1000.0, 3)

    def span(self, cat: str, name: str, t0: float, t1: float, tid: int = MAIN_TID,
             pid: int | None = None, args: dict[str, Any] | None = None) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid or 100 + self.rank,
                            "tid": tid, "ts": self.us(t0),
                            "dur": round(float(max(t1 - t0, 0)) / 1000.0, 3), "args": args or {}})

    def kernel(self, name: str, host_t: float, dev_t0: float, dev_t1: float, op: str,
               stream: int = 7, cat: str = "kernel", **kargs: Any) -> None:
        """A host operator launching a device activity (linked by correlation id)."""
        self.corr += 1
        self.span("cpu_op", op, host_t, host_t + 18_000, args={"External id": self.corr})
        launch = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        self.span("cuda_runtime", launch, host_t + 4_000, host_t + 11_000,
                  args={"correlation": self.corr, "cbid": 211})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                            "ts": self.us(dev_t0), "dur": round(float(dev_t1 - dev_t0) / 1000.0, 3),
                            "args": {"device": 0, "stream": stream, "correlation": self.corr,
                                     **kargs}})


_FWD_OPS = ("aten::linear", "aten::layer_norm", "aten::scaled_dot_product_attention",
            "aten::gelu")
_FWD_KERNELS = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
                "void at::native::vectorized_layer_norm_kernel<c10::BFloat16, float>",
                "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>",
                "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>")


_ATEN = ("add", "mul", "view", "reshape", "t", "transpose", "empty", "copy_", "fill_", "sum",
         "mean", "div", "sub", "clone", "cat", "slice", "select", "expand", "permute",
         "contiguous", "to", "_to_copy", "unsqueeze", "squeeze", "matmul", "mm", "bmm", "addmm",
         "softmax", "_softmax", "dropout", "native_dropout", "where", "masked_fill", "zeros",
         "ones", "arange", "index_select", "embedding", "rsqrt", "pow", "exp", "log", "neg",
         "abs", "clamp", "max", "min", "argmax", "topk")
_OVERLOADS = ("", ".Tensor", ".Scalar", "_", ".out", ".int", ".dim_IntList", ".self")


def op_name(i: int) -> str:
    """The i-th of the host operator names `--op-names` adds (aten names and overloads)."""
    return f"aten::{_ATEN[i % len(_ATEN)]}{_OVERLOADS[i // len(_ATEN) % len(_OVERLOADS)]}" + \
        (f"_{i // (len(_ATEN) * len(_OVERLOADS))}" if i >= len(_ATEN) * len(_OVERLOADS) else "")


def _variety(tb: TraceBuilder, host: int, i: int, names: int) -> str:
    """With `names` (--op-names), a short host-only operator after the launch at `host` (in
    the host's gap before the next launch), named by position `i`; the kernel's name suffix."""
    if not names:
        return ""
    tb.span("cpu_op", op_name(i % names), host + 19_000, host + 22_000 + (i % 7) * 1_000)
    return f"_v{i % max(1, names // 2)}"


def add_step(tb: TraceBuilder, tl: Timeline, s: int, r: int, world: int,
             layers: int = 1, op_names: int = 0) -> None:
    """One traced step of rank r: host spans, launches and device activity. `layers` scales
    the kernels per step (a deeper model: more, shorter kernels in the same step time);
    `op_names` adds host-only operators and kernel variants (a model of many operators: the
    operator table has that many host rows and half as many kernel rows per rank)."""
    at = s * (FWD_KERNELS + BWD_KERNELS) * layers  # position of this step's launches
    t0, t1 = int(tl.start[s, r]), int(tl.end[s, r])
    d = int(tl.data[s, r])
    tb.span("user_annotation", f"ProfilerStep#{s}", t0, t1)
    tb.span("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            t0 + 5_000, t0 + d)
    host = t0 + d + 20_000
    dev = host + 30_000
    tb.kernel("Memcpy HtoD (Pinned -> Device)", host, dev, dev + 500_000, "aten::copy_",
              cat="gpu_memcpy")
    host += 40_000
    dev += 500_000
    # forward: kernels back to back, the host running ahead of the device
    fwd_n = FWD_KERNELS * layers
    fwd_k = tl.fwd[s, r] / fwd_n
    for k in range(fwd_n):
        j = k % len(_FWD_OPS)
        v = _variety(tb, host, at + k, op_names)
        tb.kernel(_FWD_KERNELS[j] + v, host, dev + 3_000, dev + fwd_k, _FWD_OPS[j])
        host += 35_000
        dev += fwd_k
    # backward: buckets become ready as their gradients are computed
    bwd_k = tl.bwd[s, r] / (BWD_KERNELS * layers)
    per_bucket = BWD_KERNELS * layers // BUCKETS
    ranks_text = "[" + ", ".join(map(str, range(world))) + "]"
    for b in range(BUCKETS):
        for k in range(per_bucket):
            j = k % len(_FWD_OPS)
            v = _variety(tb, host, at + fwd_n + b * per_bucket + k, op_names)
            tb.kernel(_FWD_KERNELS[j].replace("fwd", "bwd") + v, host, dev + 3_000,
                      dev + bwd_k, "autograd::engine::evaluate_function: " + _FWD_OPS[j])
            host += 30_000
            dev += bwd_k
        tb.seq = s * BUCKETS + b + 1  # NCCL counts collectives per group from the start
        meta = {"Collective name": "allreduce", "In msg nelems": BUCKET_NELEMS,
                "Out msg nelems": BUCKET_NELEMS, "Group size": world, "dtype": "Float",
                "Process Group Name": "0", "Process Group Description": "default_pg",
                "Process Group Ranks": ranks_text, "Seq": tb.seq}
        tb.span("cpu_op", "record_param_comms", host, host + 25_000,
                args={"External id": tb.corr + 1, **meta})
        tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                  host + 2_000, int(tl.nccl_start[s, r, b]), int(tl.nccl_end[s, b]),
                  "nccl:all_reduce", stream=20, **meta)
        host += 30_000
    # optimizer after the last bucket is reduced
    opt0 = int(tl.opt_start[s, r])
    tb.span("user_annotation", "Optimizer.step#AdamW.step", host, host + 400_000)
    opt_k = (t1 - 100_000 - opt0) / OPT_KERNELS
    for k in range(OPT_KERNELS):
        tb.kernel("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", host + 20_000,
                  opt0 + k * opt_k + 2_000, opt0 + (k + 1) * opt_k, "aten::_fused_adamw_")
        host += 90_000
    # loss.item(): the host waits for the device
    tb.span("cuda_runtime", "cudaStreamSynchronize", host, t1 - 40_000,
            args={"correlation": -1})


def write_trace(path: Path, tb: TraceBuilder, rank: int, world: int, host: str) -> None:
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": GPU_NAME, "totalGlobalMem": 85_520_809_984,
                              "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                           "backend_config": "cuda:nccl", "pg_size": world,
                                           "ranks": list(range(world))}]},
        "record_shapes": 0,
        "trace_id": f"synthetic-{rank}",
        "host_name": host,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 100 + rank, "tid": 0,
             "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": 100 + rank, "tid": MAIN_TID,
             "args": {"name": f"thread {MAIN_TID} (python)"}},
            *tb.events,
        ],
        "traceName": str(path),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=3))


# --- counters -----------------------------------------------------------------------------------

def write_counters(cfg: Config, node: str, host: str, ranks: list[int], tl: Timeline,
                   offset_ns: int, rng: np.random.Generator) -> None:
    """NVML (per GPU), host and InfiniBand counters of one node at SAMPLE_HZ."""
    store = CounterStore(cfg.out / "nodes" / node / COUNTERS_DIR)
    t_lo = int(tl.start[0].min())
    t_hi = int(tl.end[-1].max())
    period = int(1e9 / SAMPLE_HZ)
    ticks = np.arange(t_lo - 2 * period, t_hi + 2 * period, period)
    hot = {r: cfg.straggler == r and cfg.cause == "throttle" for r in ranks}
    for i, t in enumerate(ticks.tolist()):
        running = t_lo <= t <= t_hi
        gpu_rows = []
        for local, r in enumerate(ranks):
            g = f"gpu{local}"
            util = (97.0 + rng.normal(0, 1.5)) if running else 0.0
            throttled = hot[r] and running and (i % 7 != 0)  # now and then it recovers
            clock = (1410.0 if throttled else SM_CLOCK_MAX) + rng.normal(0, 8) if running \
                else 345.0
            temp = (88.0 if hot[r] else 68.0 + local) + rng.normal(0, 0.6) if running else 35.0
            power = (560.0 if throttled else 640.0) + rng.normal(0, 12) if running else 75.0
            reasons = {"gpu_idle": 0.0 if running else 1.0, "sw_power_cap": 0.0,
                       "hw_slowdown": 0.0, "sw_thermal_slowdown": 1.0 if throttled else 0.0,
                       "hw_thermal_slowdown": 1.0 if throttled else 0.0}
            gpu_rows += [(g, "util.gpu", min(util, 100.0), "%"),
                         (g, "util.mem", 0.55 * util, "%"),
                         (g, "clock.sm", clock, "MHz"), (g, "clock.sm_max", SM_CLOCK_MAX, "MHz"),
                         (g, "temp.gpu", temp, "C"), (g, "power", power, "W"),
                         (g, "power.limit", 700.0, "W"),
                         (g, "mem.used", 61e9 if running else 1e9, "B"),
                         (g, "clocks_slowdown", 1.0 if throttled else 0.0, "bool")]
            gpu_rows += [(g, f"clocks_event.{k}", v, "bool") for k, v in reasons.items()]
        ts = int(t - offset_ns)
        store.add("nvml", ts, gpu_rows)
        store.add("host", ts, [("cpu", "cpu.util", 35.0 + rng.normal(0, 3) if running else 2.0,
                                "%"),
                               ("mem", "mem.used", 420e9 if running else 40e9, "B"),
                               ("mem", "mem.total", 2048e9, "B")])
        rate = 18e9 + rng.normal(0, 1e9) if running else 0.0
        store.add("ib", ts, [("mlx5_0/1", "tx_rate", max(rate, 0.0), "B/s"),
                             ("mlx5_0/1", "rx_rate", max(rate, 0.0), "B/s")])
        if i % 16 == 15:
            store.flush()
    gpus = {f"gpu{local}": {"index": local, "name": GPU_NAME, "uuid": f"GPU-{_uuid(r)}",
                            "uuid_normalized": _uuid(r)} for local, r in enumerate(ranks)}
    store.write_meta({"host": host, "node": node, "settings": {"mode": "auto",
                                                               "sample_hz": SAMPLE_HZ},
                      "gpus": gpus, "nics": {},
                      "ib_ports": {"mlx5_0/1": {"rate": 50e9, "state": "4: ACTIVE",
                                                "link_layer": "InfiniBand"}},
                      "notes": ["synthetic counters (benchmarks/synth_run.py)"]})
    store.close()


def _uuid(rank: int) -> str:
    return f"00000000-0000-4000-8000-{rank:012d}"


# --- the run directory --------------------------------------------------------------------------

def write_run(cfg: Config, log: Any = print) -> Path:
    """Write the whole run directory; returns its path."""
    rng = np.random.default_rng(cfg.seed)
    if cfg.out.exists():
        shutil.rmtree(cfg.out)
    run = RunDir(cfg.out)
    run.create(cfg.out.name)
    tl = simulate(cfg, rng)
    n = cfg.ranks
    nodes = math.ceil(n / cfg.gpus_per_node)
    offsets = [0] + [int(rng.uniform(-3e6, 3e6)) for _ in range(nodes - 1)]  # host clocks
    t_begin = time.time()
    traced = {s for lo, hi in cfg.windows for s in range(lo, hi + 1) if 0 <= s < cfg.steps}
    for node in range(nodes):
        host = f"gpu-node-{node:02d}"
        ranks = list(range(node * cfg.gpus_per_node, min((node + 1) * cfg.gpus_per_node, n)))
        off = offsets[node]
        nd = cfg.out / "nodes" / host
        nd.mkdir(parents=True, exist_ok=True)
        write_json_atomic(nd / NODE_FILE, {
            "run_id": cfg.out.name, "node": host, "host": host, "pid": 4000 + node,
            "command": ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={len(ranks)}",
                        "train.py"],
            "start_ns": int(tl.start[0].min() - off - 5e9),
            "end_ns": int(tl.end[-1].max() - off + 2e9), "exit_code": 0,
            "options": {"trace": ",".join(f"{a}-{b}" for a, b in cfg.windows)},
            "synthetic": True})
        for r in ranks:
            rd = cfg.out / "ranks" / str(r)
            rd.mkdir(parents=True, exist_ok=True)
            est = 0 if node == 0 else off + int(rng.normal(0, 40_000))  # online estimate
            write_json_atomic(rd / RANK_FILE, {
                "rank": r, "local_rank": r - ranks[0], "world_size": n,
                "local_world_size": len(ranks), "group_rank": node, "backend": "nccl",
                "launcher": "torchrun", "run_id": cfg.out.name, "node": host, "host": host,
                "pid": 10_000 + r, "argv": ["python", "train.py"],
                "uberprof_version": "synthetic",
                "start_ns": int(tl.start[0, r] - off - 4e9), "end_ns": int(tl.end[-1, r] - off),
                "exit": "exit",
                "device": {"type": "cuda", "index": r - ranks[0], "name": GPU_NAME,
                           "uuid": _uuid(r)},
                "clock": {"host": host, "offset_to_rank0_ns": est,
                          "offset_uncertainty_ns": 0 if node == 0 else 60_000,
                          "method": "reference" if node == 0 else "store-ping"},
                "trace": {"schedule": ",".join(f"steps {a}-{b}" for a, b in cfg.windows),
                          "windows": [list(w) for w in cfg.windows]},
                "process_groups": [{"name": "default", "ranks": list(range(n)),
                                    "backend": "nccl"}],
                "steps": cfg.steps})
            lines = []
            # the GPU memory the step timeline records: in use between steps (weights and
            # optimizer state), the step's peak above it (activations), a little noise
            held = int(GPU_HELD_BYTES * (1 + 0.02 * (r % 7)))
            noise = np.random.default_rng(r).uniform(0.97, 1.03, cfg.steps)  # not the run's rng
            peaks = held + (GPU_ACTIVATION_BYTES * noise).astype(np.int64)
            for s in range(cfg.steps):
                lines.append(orjson.dumps({
                    "kind": "step", "step": s,
                    "host_start_ns": int(tl.start[s, r] - off),
                    "host_end_ns": int(tl.end[s, r] - off),
                    "data_wait_ns": int(tl.data[s, r]), "uberprof_ns": 0,
                    "gpu_mem_peak_bytes": int(peaks[s]), "gpu_mem_bytes": held,
                    "source": "optimizer"}))
            (rd / STEPS_FILE).write_bytes(b"\n".join(lines) + b"\n")
            for lo, hi in cfg.windows:
                if lo >= cfg.steps:
                    continue
                hi = min(hi, cfg.steps - 1)
                tb = TraceBuilder(r, off)
                for s in range(lo, hi + 1):
                    add_step(tb, tl, s, r, n, cfg.layers, cfg.op_names)
                write_trace(rd / TRACES_DIR / (trace_file_name(lo, hi) + ".gz"), tb, r, n, host)
        if cfg.counters:
            write_counters(cfg, host, host, ranks, tl, off, rng)
        log(f"  node {node + 1}/{nodes} ({host}: ranks {ranks[0]}-{ranks[-1]}) "
            f"{time.time() - t_begin:.1f} s")
    log(f"wrote {cfg.out}: {n} ranks, {cfg.steps} steps, {len(traced)} traced steps"
        + (f", straggler rank {cfg.straggler} ({cfg.cause}, x{cfg.slow})"
           if cfg.straggler is not None else ""))
    return cfg.out


def main(argv: list[str] | None = None) -> int:
    p = doc_parser(__doc__)
    p.add_argument("out", type=Path, help="the run directory to write (replaced if it exists)")
    synth_options(p, steps=2000)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--trace-steps", type=parse_windows, default=None, metavar="A-B[,C-D]",
                   help="traced windows (default: 3 steps at 5%% and at 75%% of the run)")
    p.add_argument("--straggler", type=int, default=None, metavar="RANK",
                   help="a slow rank (default: rank 2/3 of the way through; -1 for none)")
    p.add_argument("--straggler-cause", choices=["throttle", "compute"], default="throttle")
    p.add_argument("--slow", type=float, default=1.25, help="the straggler's compute factor")
    p.add_argument("--step-ms", type=float, default=200.0, help="a healthy step's length")
    p.add_argument("--layers", type=int, default=1,
                   help="model depth: kernels per step x this (bigger traces; default 1: "
                        "about 250 events per traced step)")
    p.add_argument("--op-names", type=int, default=0, metavar="N",
                   help="N distinct host operators (short host-only spans between launches) "
                        "and N/2 kernel name variants, for the /operators page at scale "
                        "(default 0: the 4 forward operators and their kernels)")
    p.add_argument("--no-counters", action="store_true", help="no node counters")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.ranks < 1 or a.steps < 1 or a.gpus_per_node < 1 or a.layers < 1:
        p.error("--ranks, --steps, --gpus-per-node and --layers must be positive")
    straggler = (2 * a.ranks) // 3 if a.straggler is None else a.straggler
    if straggler == -1 or a.ranks < 2:
        straggler = None
    elif not 0 <= straggler < a.ranks:
        p.error(f"--straggler {straggler}: not a rank of 0..{a.ranks - 1}")
    cfg = Config(out=a.out, ranks=a.ranks, steps=a.steps, gpus_per_node=a.gpus_per_node,
                 windows=a.trace_steps if a.trace_steps is not None else default_windows(a.steps),
                 straggler=straggler, cause=a.straggler_cause, slow=a.slow,
                 counters=not a.no_counters, seed=a.seed, step_ms=a.step_ms, layers=a.layers,
                 op_names=max(0, a.op_names))
    write_run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
