"""The run's counters as the pages read them (part of `RunData`, `dashboards/data.py`): what each
node sampled (from its index, without reading the tables), which GPU and node a rank ran on,
and one metric over time per device, read through `uberprof.rundir.counters` (filtered while
read) and averaged into at most a few hundred time buckets for drawing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.read import sql_table

__all__ = ["CounterSeries", "Counters"]


@dataclass
class CounterSeries:
    """One metric of one source over time, per device, downsampled to at most `points`."""

    metric: str
    unit: str | None
    devices: dict[str, tuple[np.ndarray, np.ndarray]]  # device -> (t seconds, value)
    bucket_s: float


class Counters:
    """`RunData`'s counters: the catalog, a rank's node and GPU, rows and series."""

    root: Path
    once: Callable[..., Any]
    host_of: Callable[[int], str | None]
    time_origin_ns: Callable[[], int | None]

    def counter_catalog(self) -> dict[str, Any]:
        """Nodes with counters and, per node, the sources and metrics they hold (from each
        node's index, without reading the tables)."""
        return self.once("counter_catalog", self._counter_catalog)

    def _counter_catalog(self) -> dict[str, Any]:
        from uberprof.rundir import RunDir
        from uberprof.rundir.counters import counter_meta, counter_nodes, counter_series

        run = RunDir(self.root)
        nodes: dict[str, dict[str, Any]] = {}
        notes: list[str] = []
        gpu = False
        try:
            names = counter_nodes(run)
        except OSError:
            names = []
        for n in names:
            index = counter_series(run, n)
            meta = counter_meta(run, n)
            notes += [x for x in meta.get("notes") or [] if isinstance(x, str)]
            series: dict[str, dict[str, str]] = {}
            for s in index:
                series.setdefault(s["source"], {})[s["metric"]] = s.get("unit") or ""
            gpu = gpu or "nvml" in series or "dcgm" in series
            nodes[n] = {"host": meta.get("host") or n, "series": series,
                        "gpus": sorted((meta.get("gpus") or {}).keys(),
                                       key=lambda g: (len(g), g))}
        return {"nodes": nodes, "gpu": gpu, "notes": sorted(set(notes))}

    def node_of_rank(self, rank: int | None) -> str | None:
        """The counters node that sampled a rank's host."""
        cat = self.counter_catalog()
        if rank is None or not cat["nodes"]:
            return next(iter(cat["nodes"]), None)
        host = self.host_of(rank)
        for n, info in cat["nodes"].items():
            if info["host"] == host:
                return n
        return next(iter(cat["nodes"]), None)

    def rank_gpu(self, rank: int) -> tuple[str, str] | None:
        """(node, GPU label) of a rank, from GPU UUIDs."""
        def build() -> dict[int, tuple[str, str]]:
            from uberprof.rundir.counters import rank_gpus

            try:
                return rank_gpus(self.root)
            except Exception:  # noqa: BLE001 - counters are optional
                return {}
        return self.once("rank_gpus", build).get(rank)

    def counters(self, node: str, sources: list[str], metrics: list[str],
                 start_ns: int | None = None, end_ns: int | None = None) -> pa.Table | None:
        """Rows of a node's counters (`uberprof.rundir.counters.counters_table`), None when
        they cannot be read (counters are optional: nothing to draw)."""
        from uberprof.rundir.counters import counters_table

        try:
            return counters_table(self.root, node, sources=sources, metrics=metrics,
                                  start_ns=start_ns, end_ns=end_ns)
        except Exception:  # noqa: BLE001
            return None

    def counter_series(self, node: str, source: str, metric: str,
                       devices: list[str] | None = None, points: int = 600,
                       start_ns: int | None = None, end_ns: int | None = None
                       ) -> CounterSeries | None:
        """One metric over time per device, averaged into at most `points` time buckets."""
        key = f"series:{node}:{source}:{metric}:{devices}:{points}:{start_ns}:{end_ns}"
        return self.once(key, lambda: self._counter_series(node, source, metric, devices,
                                                           points, start_ns, end_ns))

    def counter_series_of(self, node: str, source: str, metrics: list[str],
                          devices: list[str] | None = None, points: int = 600
                          ) -> dict[str, CounterSeries | None]:
        """`counter_series` of several metrics of one source, read in one pass over the
        node's stream: a page with a panel per metric read it once per panel (at 64 nodes x
        10,000 steps each read of a node's NVML stream and its query took ~0.25 s)."""
        key = f"series-of:{node}:{source}:{sorted(metrics)}:{devices}:{points}"
        return self.once(key, lambda: self._series_of(node, source, list(metrics), devices,
                                                      points, None, None))

    def _counter_series(self, node: str, source: str, metric: str, devices: list[str] | None,
                        points: int, start_ns: int | None, end_ns: int | None
                        ) -> CounterSeries | None:
        return self._series_of(node, source, [metric], devices, points, start_ns,
                               end_ns)[metric]

    def _series_of(self, node: str, source: str, metrics: list[str], devices: list[str] | None,
                   points: int, start_ns: int | None, end_ns: int | None
                   ) -> dict[str, CounterSeries | None]:
        """Each metric's series, its own time span cut into `points` buckets."""
        out: dict[str, CounterSeries | None] = {m: None for m in metrics}
        t = self.counters(node, [source], metrics, start_ns, end_ns)
        if t is not None and devices is not None:
            t = t.filter(pc.is_in(t.column("device"), pa.array(devices, pa.string())))
        if t is None or t.num_rows == 0:
            return out
        origin = self.time_origin_ns() or pc.min(t.column("ts_ns")).as_py()
        q = sql_table(f"""
            WITH w AS (SELECT metric, min(ts_ns) AS lo,
                              (max(ts_ns) - min(ts_ns)) // {int(points)} + 1 AS width,
                              first(unit) AS unit
                       FROM t GROUP BY metric)
            SELECT metric, device, (ts_ns - lo) // width AS b, avg(ts_ns) AS ts, avg(value) AS v,
                   any_value(width) AS width, any_value(w.unit) AS unit
            FROM t JOIN w USING (metric) GROUP BY ALL ORDER BY metric, device, b
        """, t=t)
        met = np.array(q.column("metric").to_pylist(), dtype=object)
        dev = np.array(q.column("device").to_pylist(), dtype=object)
        ts = q.column("ts").to_numpy(zero_copy_only=False)
        v = q.column("v").to_numpy(zero_copy_only=False)
        width = q.column("width").to_numpy(zero_copy_only=False)
        units = q.column("unit").to_pylist()
        for metric in sorted(set(met.tolist()) & set(metrics)):
            mm = met == metric
            series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            for d in sorted(set(dev[mm].tolist()), key=lambda x: (len(x), x)):
                m = mm & (dev == d)
                series[d] = ((ts[m] - origin) / 1e9, v[m])
            first = int(np.flatnonzero(mm)[0])
            out[metric] = CounterSeries(metric=metric, unit=units[first], devices=series,
                                        bucket_s=float(width[first]) / 1e9)
        return out
