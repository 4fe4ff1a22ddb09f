"""Memory per rank: `run.memory` of the report document (docs/json.md), made once per diagnosis
so that the terminal and HTML reports, the dashboard's `/memory` page and the export print the
same numbers.

From two records the run directory already holds:

- **GPU**, the step timeline's `gpu` rows (`collect/rank/timeline.py`), as the analysis saved
  them (`TIMELINE_SCHEMA`: `gpu_mem_peak_bytes`, the caching allocator's peak allocated bytes
  since the process started, and `gpu_mem_bytes`, allocated now; both read when a step's GPU
  time is collected, right after its boundary). The run's peak is the largest peak read; its
  step is the first step whose row shows it (the peak was reached during or before it). The
  bytes in use between steps are the median of `gpu_mem_bytes`; its first and last values, and
  their difference (`gpu_growth_bytes`), tell a leak: steady training holds the same tensors at
  every boundary. The final step's row is left out of these (not of the peak) where there are
  three or more: it is read when the process closes its timeline at exit, after the training
  loop may have freed its tensors (a 2-rank H100 run read 68 MB there against 481 MB at every
  boundary before). The device's total is the rank's `rank.json` (`device.total_memory_bytes`).
- **Host**, the counters' `proc` source (`collect/counters/processes.py`): each rank process's
  resident set size (`mem.rss`, bytes) every sample, labelled `rank:<r>` by the reader. Peak,
  median, and the step whose host window holds the peak's sample (None when it came before the
  first step or after the last); the host's memory (`host` source `mem.total`) beside them.
  Samples of 0 are left out: the process had exited (an H100 run's ranks read 0 for their last
  two samples, after 1.4 GB the sample before).

A rank with neither has no row; a run whose ranks all have none has `run.memory` None.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables.schemas import TIMELINE_SCHEMA
from uberprof.rundir import RunDir, ranks_by_id
from uberprof.rundir.step_table import read_step_table

__all__ = ["BASIS", "memory_doc", "rank_memory", "run_memory"]

BASIS = ("GPU: the caching allocator's allocated bytes read at each step boundary (peak: "
         "torch.cuda.max_memory_allocated since the start; in use: memory_allocated); host: "
         "each rank process's resident set size sampled by the counters (proc mem.rss)")

Timeline = Callable[[Path], "pa.Table | None"]


def run_memory(ctx: Any) -> dict[str, Any] | None:
    """`run.memory` of a diagnosed run (`ctx`: its RunContext): each rank's timeline as the
    analysis saved it, read from the JSON lines only where it has none."""
    if not ctx.is_run_dir:
        return None
    saved = ctx.run.timeline if ctx.run is not None else None
    return memory_doc(Path(ctx.root), saved)


def memory_doc(root: Path, saved: Timeline | None = None) -> dict[str, Any] | None:
    """`run.memory` of the run directory `root` (module docstring); never raises for what the
    files hold (counters are optional, an unreadable timeline gives no GPU numbers)."""
    run = RunDir(root)
    if not run.is_run():
        return None
    metas = ranks_by_id(run)
    hosts = {r: m.host for r, m in metas.items()}
    rss, host_total = _host_memory(root, hosts)
    rows = []
    for r, m in sorted(metas.items()):
        table = saved(m.folder) if saved is not None else None
        if table is None:
            try:
                table = read_step_table(m.folder, TIMELINE_SCHEMA.names).table
            except (OSError, ValueError, pa.ArrowException):
                table = None
        total = (m.device or {}).get("total_memory_bytes")
        row = rank_memory(r, table, rss.get(r), total if isinstance(total, int) else None)
        if row is not None:
            row["host"] = m.host
            row["host_mem_total_bytes"] = host_total.get(m.host or "")
            rows.append(row)
    if not rows:
        return None
    return {"basis": BASIS, "ranks": rows}


def rank_memory(rank: int, timeline: pa.Table | None,
                rss: tuple[np.ndarray, np.ndarray] | None,
                device_total: int | None) -> dict[str, Any] | None:
    """One rank's row of `run.memory.ranks`: its timeline (TIMELINE_SCHEMA columns, one row per
    step in step order), its RSS samples (epoch ns, bytes) and its device's total; None when it
    has neither GPU nor host memory."""
    gpu = _gpu(timeline)
    host = _rss(rss, timeline)
    if gpu is None and host is None:
        return None
    peak = (gpu or {}).get("gpu_peak_bytes")
    return {
        "rank": rank,
        "device_total_bytes": device_total,
        **(gpu or dict.fromkeys(_GPU_KEYS)),
        "gpu_peak_pct": round(100 * peak / device_total, 2) if peak and device_total else None,
        **(host or dict.fromkeys(_HOST_KEYS)),
    }


_GPU_KEYS = ("gpu_peak_bytes", "gpu_peak_step", "gpu_in_use_median_bytes", "gpu_first_step",
             "gpu_in_use_first_bytes", "gpu_last_step", "gpu_in_use_last_bytes",
             "gpu_growth_bytes", "gpu_steps")
_HOST_KEYS = ("rss_peak_bytes", "rss_peak_step", "rss_median_bytes", "rss_samples")


def _gpu(t: pa.Table | None) -> dict[str, Any] | None:
    if t is None or "gpu_mem_peak_bytes" not in t.schema.names or not t.num_rows:
        return None
    steps = t.column("step").to_numpy(zero_copy_only=False)
    peak_c, now_c = t.column("gpu_mem_peak_bytes"), t.column("gpu_mem_bytes")
    has_peak = peak_c.is_valid().to_numpy(zero_copy_only=False)
    has_now = now_c.is_valid().to_numpy(zero_copy_only=False)
    if not has_peak.any() and not has_now.any():
        return None
    out: dict[str, Any] = dict.fromkeys(_GPU_KEYS)
    if has_peak.any():
        peaks = pc.fill_null(peak_c, -1).to_numpy()
        at = int(np.argmax(peaks))  # the first row with the largest value
        out["gpu_peak_bytes"], out["gpu_peak_step"] = int(peaks[at]), int(steps[at])
    if has_now.any():
        now = pc.fill_null(now_c, 0).to_numpy()[has_now]
        s = steps[has_now]
        if now.size >= 3:  # the final row is read at exit, not between steps (docstring)
            now, s = now[:-1], s[:-1]
        out.update(gpu_in_use_median_bytes=int(np.median(now)), gpu_first_step=int(s[0]),
                   gpu_in_use_first_bytes=int(now[0]), gpu_last_step=int(s[-1]),
                   gpu_in_use_last_bytes=int(now[-1]), gpu_growth_bytes=int(now[-1] - now[0]),
                   gpu_steps=int(now.size))
    return out


def _rss(rss: tuple[np.ndarray, np.ndarray] | None, t: pa.Table | None
         ) -> dict[str, Any] | None:
    if rss is None or not rss[0].size:
        return None
    ts, v = rss
    at = int(np.argmax(v))
    return {"rss_peak_bytes": int(v[at]), "rss_peak_step": _step_at(t, int(ts[at])),
            "rss_median_bytes": int(np.median(v)), "rss_samples": int(v.size)}


def _step_at(t: pa.Table | None, ts_ns: int) -> int | None:
    """The step whose host window [start, end) holds `ts_ns`, or None."""
    if t is None or not t.num_rows:
        return None
    start = pc.fill_null(t.column("host_start_ns"), 2**62).to_numpy()
    end = pc.fill_null(t.column("host_end_ns"), -(2**62)).to_numpy()
    hit = np.flatnonzero((start <= ts_ns) & (ts_ns < end))
    return int(t.column("step")[int(hit[0])].as_py()) if hit.size else None


def _host_memory(root: Path, hosts: dict[int, str | None]
                 ) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], dict[str, int]]:
    """Per rank its RSS samples (epoch ns, bytes), and per host its memory, from the counters;
    empty where there are none or they cannot be read."""
    try:
        from uberprof.rundir.counters import counter_meta, counter_nodes, counters_table

        nodes = counter_nodes(root)
    except Exception:  # noqa: BLE001 - counters are optional evidence
        return {}, {}
    rss: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    totals: dict[str, int] = {}
    for n in nodes:
        try:
            host = counter_meta(root, n).get("host") or n
            t = counters_table(root, n, sources=["proc", "host"],
                               metrics=["mem.rss", "mem.total"])
        except Exception:  # noqa: BLE001, S112 - one node's damaged counters: the others
            continue
        tot = t.filter(pc.and_(pc.equal(t.column("source"), "host"),
                               pc.equal(t.column("metric"), "mem.total")))
        if tot.num_rows:
            totals[host] = int(pc.max(tot.column("value")).as_py())
        p = t.filter(pc.and_(pc.equal(t.column("source"), "proc"),
                             pc.equal(t.column("metric"), "mem.rss")))
        dev = np.array(p.column("device").to_pylist(), dtype=object)
        ts = p.column("ts_ns").to_numpy(zero_copy_only=False)
        val = p.column("value").to_numpy(zero_copy_only=False)
        for r, h in hosts.items():
            if h is not None and h != host:
                continue
            mask = (dev == f"rank:{r}") & (val > 0)  # NaN, and 0: an exited process's
            if mask.any() and r not in rss:
                rss[r] = (ts[mask].astype(np.int64), val[mask])
    return rss, totals
