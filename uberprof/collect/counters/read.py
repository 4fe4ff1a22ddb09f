"""Reading a run's counters: the accessor that analysis, the report and the dashboard share.

Filters (sources, metrics, time range) apply batch by batch while reading, so memory stays
bounded by what was asked for, not by the length of the run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from uberprof.collect.counters.nvml import normalize_gpu_uuid
from uberprof.collect.counters.store import iter_batches, read_meta, source_files
from uberprof.rundir import COUNTERS_DIR, RANK_FILE, RunDir, read_json

COLUMNS = ["node", "ts_ns", "source", "device", "metric", "value", "unit"]


def _run(run_dir: str | Path | RunDir) -> RunDir:
    return run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))


def counter_nodes(run_dir: str | Path | RunDir) -> list[str]:
    """Nodes (folder names under nodes/) that hold counters."""
    return [p.name for p in _run(run_dir).node_dirs() if source_files(p / COUNTERS_DIR)]


def rank_pids(run_dir: str | Path | RunDir, host: str | None) -> dict[int, int]:
    """pid -> rank for the ranks that ran on `host` (from their rank.json)."""
    out: dict[int, int] = {}
    for rd in _run(run_dir).rank_dirs():
        try:
            meta = read_json(rd / RANK_FILE)
        except (OSError, ValueError):
            continue
        if isinstance(meta.get("pid"), int) and isinstance(meta.get("rank"), int) and (
                host is None or meta.get("host") == host):
            out[meta["pid"]] = meta["rank"]
    return out


def counters_table(run_dir: str | Path | RunDir, node: str | None = None,
                   sources: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
                   start_ns: int | None = None, end_ns: int | None = None,
                   label_ranks: bool = True) -> Any:
    """The counters as a pyarrow Table (columns: node, ts_ns, source, device, metric, value,
    unit); `node=None` reads every node of the run. With `label_ranks`, process rows of rank
    processes read `rank:<r>` instead of `pid:<pid>`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    run = _run(run_dir)
    nodes = [node] if node is not None else counter_nodes(run)
    want_sources = set(sources) if sources is not None else None
    want_metrics = pa.array(sorted(set(metrics)), pa.string()) if metrics is not None else None
    parts = []
    ranks_by_node: dict[str, dict[str, str]] = {}
    for n in nodes:
        for source, path in source_files(run.nodes_dir / n / COUNTERS_DIR).items():
            if want_sources is not None and source not in want_sources:
                continue
            for batch in iter_batches(path):
                mask = None
                if want_metrics is not None:
                    mask = pc.is_in(batch.column("metric"), value_set=want_metrics)
                if start_ns is not None:
                    m = pc.greater_equal(batch.column("ts_ns"), start_ns)
                    mask = m if mask is None else pc.and_(mask, m)
                if end_ns is not None:
                    m = pc.less_equal(batch.column("ts_ns"), end_ns)
                    mask = m if mask is None else pc.and_(mask, m)
                if mask is not None:
                    batch = batch.filter(mask)
                if batch.num_rows == 0:
                    continue
                rows = batch.num_rows
                device = batch.column("device")
                if source == "proc" and label_ranks:
                    if n not in ranks_by_node:
                        host = read_meta(run.nodes_dir / n / COUNTERS_DIR).get("host")
                        ranks_by_node[n] = {f"pid:{pid}": f"rank:{r}"
                                            for pid, r in rank_pids(run, host).items()}
                    names = ranks_by_node[n]
                    device = pa.array([names.get(d, d) for d in device.to_pylist()], pa.string())
                parts.append(pa.table({
                    "node": pa.array([n] * rows, pa.string()),
                    "ts_ns": batch.column("ts_ns"),
                    "source": pa.array([source] * rows, pa.string()),
                    "device": device,
                    "metric": batch.column("metric"),
                    "value": batch.column("value"),
                    "unit": batch.column("unit"),
                }))
    if not parts:
        return pa.table({c: pa.array([], t) for c, t in zip(
            COLUMNS, [pa.string(), pa.int64(), pa.string(), pa.string(), pa.string(),
                      pa.float64(), pa.string()])})
    return pa.concat_tables(parts).sort_by([("ts_ns", "ascending")])


def read_counters(run_dir: str | Path | RunDir, node: str | None = None,
                  sources: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
                  start_ns: int | None = None, end_ns: int | None = None,
                  label_ranks: bool = True) -> Any:
    """A node's counters as a pandas DataFrame in long format, sorted by time:
    node, ts_ns (epoch ns, comparable with steps and traces), source, device, metric, value, unit.

    Sources: host (cpu.*, load*, mem.*), nic (rx_rate, tx_rate, link_speed, tc_rate), ib, proc
    (`rank:<r>`, other processes `pid:<pid>`, and `job`), nvml (per `gpu<N>`), gpm, dcgm.
    See the README's Counters section.
    """
    return counters_table(run_dir, node, sources, metrics, start_ns, end_ns,
                          label_ranks).to_pandas()


def counter_meta(run_dir: str | Path | RunDir, node: str) -> dict[str, Any]:
    """meta.json of a node's counters: settings, GPUs with UUIDs, NICs with link speed and tc cap
    (bytes/s, None where unknown), InfiniBand ports, processes, unsupported metrics, notes."""
    return read_meta(_run(run_dir).nodes_dir / node / COUNTERS_DIR)


def link_caps(run_dir: str | Path | RunDir, node: str) -> dict[str, float | None]:
    """Per NIC (and IB port), the ceiling a rate can reach in bytes/s: the tc cap when one is
    set, else the link speed, else None (veth and other virtual links report no speed)."""
    meta = counter_meta(run_dir, node)
    caps: dict[str, float | None] = {}
    for nic, info in (meta.get("nics") or {}).items():
        candidates = [v for v in (info.get("tc_rate"), info.get("link_speed")) if v]
        caps[nic] = min(candidates) if candidates else None
    for port, info in (meta.get("ib_ports") or {}).items():
        caps[port] = info.get("rate")
    return caps


def rank_gpus(run_dir: str | Path | RunDir) -> dict[int, tuple[str, str]]:
    """rank -> (node, GPU label such as `gpu3`), matched on GPU UUID between the rank's
    rank.json (torch's view, after CUDA_VISIBLE_DEVICES) and the node's NVML devices."""
    run = _run(run_dir)
    by_uuid: dict[tuple[str, str], tuple[str, str]] = {}
    for nd in run.node_dirs():
        meta = read_meta(nd / COUNTERS_DIR)
        for label, gpu in (meta.get("gpus") or {}).items():
            uuid = normalize_gpu_uuid(gpu.get("uuid"))
            if uuid:
                by_uuid[(meta.get("host") or "", uuid)] = (nd.name, label)
    out: dict[int, tuple[str, str]] = {}
    for rd in run.rank_dirs():
        try:
            meta = read_json(rd / RANK_FILE)
        except (OSError, ValueError):
            continue
        uuid = normalize_gpu_uuid((meta.get("device") or {}).get("uuid"))
        hit = by_uuid.get((meta.get("host") or "", uuid)) if uuid else None
        if hit is None and uuid:  # host names written differently: UUIDs are unique anyway
            hit = next((v for (h, u), v in by_uuid.items() if u == uuid), None)
        if hit is not None and isinstance(meta.get("rank"), int):
            out[meta["rank"]] = hit
    return out
