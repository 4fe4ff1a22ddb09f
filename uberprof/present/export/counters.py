"""Node counters as counter tracks: each rank's GPU (clocks, power, utilisation, slowdown) in
the rank's own process, and each node's NICs, InfiniBand ports, CPU and unassigned GPUs in a
process of the node, all moved onto the aligned clock of the node's host.

Read through the counters accessor, one node and the export's time window at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CounterSeries", "NodeCounters", "read_node_counters"]

# metric -> (label, unit shown, factor applied to the stored value)
GPU_METRICS: dict[str, tuple[str, str, float]] = {
    "clock.sm": ("SM clock", "MHz", 1.0),
    "clock.mem": ("memory clock", "MHz", 1.0),
    "power": ("power", "W", 1.0),
    "util.gpu": ("utilisation", "%", 1.0),
    "util.mem": ("memory utilisation", "%", 1.0),
    "clocks_slowdown": ("clock slowdown", "on", 1.0),
    "temp.gpu": ("temperature", "C", 1.0),
    "nvlink.tx_rate": ("NVLink tx", "Gbit/s", 8e-9),
    "nvlink.rx_rate": ("NVLink rx", "Gbit/s", 8e-9),
}
LINK_METRICS: dict[str, tuple[str, str, float]] = {
    "rx_rate": ("rx", "Gbit/s", 8e-9),
    "tx_rate": ("tx", "Gbit/s", 8e-9),
}
HOST_METRICS: dict[str, tuple[str, str, float]] = {
    "cpu.util": ("CPU utilisation", "%", 1.0),
}
SOURCES = ("nvml", "nic", "ib", "host")


@dataclass
class CounterSeries:
    """One counter track: name, unit, and its samples (aligned epoch ns, value)."""

    name: str
    unit: str
    ts: list[int]
    values: list[float]
    gpu: str | None = None  # `gpu<N>` for GPU series (to place them in their rank's process)


@dataclass
class NodeCounters:
    node: str
    host: str | None
    series: list[CounterSeries] = field(default_factory=list)


def _label(gpu: str) -> str:
    return "GPU " + gpu[3:] if gpu.startswith("gpu") else gpu


def read_node_counters(run: Path, node: str, host_offset_ns: int, window: tuple[int, int],
                       floor_ns: int | None = None) -> NodeCounters:
    """A node's counter series within `window` (aligned ns), shifted onto the aligned clock.
    Samples before `floor_ns` are dropped except each series' last one, moved to `floor_ns`:
    a counter holds its value until the next sample, so the track starts with the value the
    counter had there."""
    from uberprof.rundir.counters import counter_meta, counters_table

    host = counter_meta(run, node).get("host")
    lo, hi = window
    metrics = set(GPU_METRICS) | set(LINK_METRICS) | set(HOST_METRICS)
    t = counters_table(run, node, sources=SOURCES, metrics=metrics,
                       start_ns=lo - host_offset_ns, end_ns=hi - host_offset_ns,
                       label_ranks=False)
    out = NodeCounters(node, host if isinstance(host, str) else None)
    if t.num_rows == 0:
        return out
    groups: dict[tuple[str, str, str], tuple[list[int], list[float]]] = {}
    for ts, source, device, metric, value in zip(*(t.column(c).to_pylist() for c in
                                                   ("ts_ns", "source", "device", "metric",
                                                    "value"))):
        if value is None or math.isnan(value):
            continue
        g = groups.setdefault((source, device, metric), ([], []))
        g[0].append(ts + host_offset_ns)
        g[1].append(value)
    for (source, device, metric), (ts_list, vals) in sorted(groups.items()):
        spec: tuple[str, str, float] | None
        gpu = None
        if source == "nvml":
            spec = GPU_METRICS.get(metric)
            gpu = device
            name = f"{_label(device)} {spec[0]}" if spec else ""
        elif source in ("nic", "ib"):
            spec = LINK_METRICS.get(metric)
            name = f"{'NIC' if source == 'nic' else 'IB'} {device} {spec[0]}" if spec else ""
        else:
            spec = HOST_METRICS.get(metric)
            name = spec[0] if spec else ""
        if spec is None:
            continue
        _, unit, factor = spec
        if floor_ns is not None:
            ts_list, vals = _from(ts_list, vals, floor_ns)
            if not ts_list:
                continue
        out.series.append(CounterSeries(name, unit, ts_list,
                                        [round(v * factor, 6) for v in vals], gpu))
    return out


def _from(ts: list[int], vals: list[float], floor_ns: int) -> tuple[list[int], list[float]]:
    k = 0
    while k < len(ts) and ts[k] < floor_ns:
        k += 1
    if k == 0:
        return ts, vals
    return [floor_ns, *ts[k:]], [vals[k - 1], *vals[k:]]


def rank_gpu_labels(run: Path) -> dict[int, tuple[str, str]]:
    """rank -> (node, `gpu<N>`) where the counters can tell (GPU UUIDs match)."""
    try:
        from uberprof.rundir.counters import rank_gpus

        return rank_gpus(run)
    except Exception:  # noqa: BLE001 - counters are optional: no mapping, no GPU tracks per rank
        return {}


def counter_nodes_of(run: Path) -> list[str]:
    try:
        from uberprof.rundir.counters import counter_nodes

        return counter_nodes(run)
    except Exception:  # noqa: BLE001
        return []


def series_events(series: CounterSeries, pid: int, tid: int, base_ns: int) -> list[dict[str, Any]]:
    """Chrome counter events ('C') of one series, ts in ns relative to `base_ns`."""
    return [{"ph": "C", "name": series.name, "cat": "uberprof.counters", "pid": pid, "tid": tid,
             "ts": ts - base_ns, "args": {series.unit: v}}
            for ts, v in zip(series.ts, series.values)]
