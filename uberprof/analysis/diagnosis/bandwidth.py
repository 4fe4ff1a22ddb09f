"""Bandwidth of collectives, the link they cross, and whether that link limits them
(docs/DESIGN.md, §4).

For a matched instance: `S` bytes as nccl-tests defines them (the whole buffer: all-reduce,
broadcast, reduce and all-to-all their input; all-gather its output, reduce-scatter its input),
transfer time `t` = the first exit minus the last arrival on aligned clocks (`t_basis`
"after last arrival"): before the last participant arrives nothing can complete, so every
participant's time before it is waiting for peers (the late rank's cost, not the link's), and the
first participant to finish shows how long the transfer itself took. What comes after the first
exit on the other ranks is their wake-up (Gloo threads on busy CPUs), not transfer either. When
the clocks cannot support that split (the first exit before the last arrival: an alignment
error), `t` falls back to the shortest duration among participants (`t_basis` "shortest
participant", the definition of earlier versions; `t` is never longer than it). `t_bound_ns`
bounds `t`'s error from the clock alignment (twice the participants' largest offset error
bound; 0 on one host), and `busbw_lo_Bps`/`busbw_hi_Bps` are the busbw it allows.
`algbw = S/t`, `busbw = algbw * f` with the nccl-tests factor f. The link is the slowest the
group crosses, and its peak comes from `uberprof calibrate` when the run has one, else from the
node counters (links.py: `link_of`, `Peaks`).

Instances are summarised per class (group, collective, size). The class's busbw is the upper
quartile of its instances': a transfer cannot beat the link, but it can be slowed by other
things (a busy CPU, a concurrent collective), so the faster instances show what the link
allows while one lucky outlier does not decide. The class is `bandwidth-bound` when that busbw
is within 20% of the peak (or above it), `latency-bound` when its messages are small
(below 1 MiB, or below the size where the calibration sweep reaches half its peak) and their
busbw stays under half the peak, or when they are tiny (64 KiB or less: latency dominates on
any link) and no peak is known; `fine` otherwise, and `unknown` without a peak. A class of
fewer than `evidence.MIN_INSTANCES` instances is only `suspected` of its verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.evidence import MIN_INSTANCES
from uberprof.analysis.diagnosis.links import LinkPeak, Peaks, link_of
from uberprof.analysis.tables import intervals as iv
from uberprof.analysis.tables.context import RunContext

__all__ = [  # LinkPeak, Peaks and link_of are links.py's, kept importable from here
    "BANDWIDTH_BOUND",
    "LATENCY_BOUND_BUSBW",
    "SMALL_MESSAGE_BYTES",
    "BandwidthClass",
    "LinkPeak",
    "Peaks",
    "bandwidth_classes",
    "bus_factor",
    "exposed_ns",
    "instance_bandwidth",
    "link_of",
    "message_bytes",
]

BANDWIDTH_BOUND = 0.8  # median busbw within 20% of the peak: bandwidth-bound
LATENCY_BOUND_BUSBW = 0.5  # ... below which small messages are latency-bound
SMALL_MESSAGE_BYTES = 1 << 20
TINY_MESSAGE_BYTES = 64 << 10  # latency-bound on any link, peak known or not


def bus_factor(name: str, n: int) -> float:
    """nccl-tests' busbw factor for a collective of `n` ranks."""
    if n <= 1:
        return 1.0
    if name == "allreduce":
        return 2.0 * (n - 1) / n
    if name in ("allgather", "reducescatter", "alltoall", "alltoallv", "alltoallbase"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, send/recv, ...


def message_bytes(name: str, in_bytes: int | None, out_bytes: int | None, n: int) -> int | None:
    """`S` as nccl-tests counts it: the size of the whole buffer the collective moves."""
    if name == "allgather":
        if out_bytes:
            return out_bytes
        return in_bytes * n if in_bytes else None
    if name == "reducescatter":
        if in_bytes and out_bytes and in_bytes >= out_bytes:
            return in_bytes
        return out_bytes * n if out_bytes else in_bytes
    return in_bytes or out_bytes


def exposed_ns(compute: iv.Intervals, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How much of each collective `[start, end)` no compute overlaps (the exposed part)."""
    return (ends - starts) - iv.covered_in(compute, starts, ends)


BANDWIDTH_SCHEMA = pa.schema([
    ("instance", pa.int64()),
    ("grp", pa.string()),
    ("name", pa.string()),
    ("step", pa.int64()),
    ("n", pa.int64()),  # group size used for the bus factor
    ("bytes", pa.int64()),  # S
    ("t_ns", pa.int64()),  # transfer: first exit - last arrival (see t_basis)
    ("t_basis", pa.string()),  # after last arrival | shortest participant
    ("t_shortest_ns", pa.int64()),  # the shortest duration among participants
    ("t_bound_ns", pa.int64()),  # bound on t's error from clock alignment (None: unbounded)
    ("algbw_Bps", pa.float64()),
    ("busbw_Bps", pa.float64()),
    ("link", pa.string()),
    ("link_kind", pa.string()),
    ("peak_Bps", pa.float64()),
    ("peak_source", pa.string()),
    ("half_peak_bytes", pa.int64()),  # calibration: size reaching half the peak
    ("exposed_ns", pa.int64()),  # exposed transfer: the fastest participant's, at most t
    ("busbw_lo_Bps", pa.float64()),  # busbw allowed by t + t_bound
    ("busbw_hi_Bps", pa.float64()),  # ... by t - t_bound (None: unbounded)
])


def instance_bandwidth(ctx: RunContext, instances: pa.Table, exposed: dict[tuple[int, int], int],
                       peaks: Peaks, error_bounds: dict[int, int | None] | None = None
                       ) -> pa.Table:
    """One row per matched instance: bytes, transfer time, algbw, busbw, link and its peak.
    `instances` are on aligned clocks; `exposed[(instance, rank)]` is the exposed part of that
    rank's span; `error_bounds` per rank its clock offset's error bound (align.py)."""
    if instances.num_rows == 0:
        return BANDWIDTH_SCHEMA.empty_table()
    rows = _per_instance(instances)
    # Gloo moves even device tensors over the hosts' sockets (staged through host memory):
    # only other backends' collectives between GPUs of one host cross NVLink or PCIe.
    gpu_link = {r: info.mode == "device" and (info.backend or "").lower() != "gloo"
                for r, info in ctx.ranks.items()}
    out: dict[str, list[Any]] = {f.name: [] for f in BANDWIDTH_SCHEMA}
    bounds = error_bounds or {}
    for iid, grp, name, step, n, inb, outb, t_short, fastest, ranks, t_after in rows:
        n = int(n or len(ranks))
        # first exit - last arrival <= the shortest duration, always; <= 0: clocks disagree
        t, basis = (int(t_after), "after last arrival") if t_after > 0 else \
            (int(t_short), "shortest participant")
        size = message_bytes(name, inb, outb, n)
        hosts = {ctx.host_of(r) for r in ranks}
        link = link_of(hosts, "device" if any(gpu_link.get(r) for r in ranks) else "cpu")
        lp = peaks.peak(link, frozenset(h for h in hosts if h)) if link != "unknown" else \
            LinkPeak("unknown", None, None, None)
        alg = size / (t / 1e9) if size and t and t > 0 else None
        f = bus_factor(name, n)
        tb = _t_bound(ranks, bounds, ctx)
        out["t_basis"].append(basis)
        out["t_shortest_ns"].append(t_short)
        out["t_bound_ns"].append(tb)
        out["busbw_lo_Bps"].append(size / ((t + (tb or 0)) / 1e9) * f
                                   if size and tb is not None and t > 0 else None)
        out["busbw_hi_Bps"].append(size / ((t - tb) / 1e9) * f
                                   if size and tb is not None and t > tb else None)
        out["instance"].append(iid)
        out["grp"].append(grp)
        out["name"].append(name)
        out["step"].append(step)
        out["n"].append(n)
        out["bytes"].append(size)
        out["t_ns"].append(t)
        out["algbw_Bps"].append(alg)
        out["busbw_Bps"].append(alg * f if alg is not None else None)
        out["link"].append(link)
        out["link_kind"].append(lp.kind)
        out["peak_Bps"].append(lp.peak_Bps)
        out["peak_source"].append(lp.source)
        hp = lp.detail.get("half_peak_bytes")
        out["half_peak_bytes"].append(int(hp) if isinstance(hp, (int, float)) else None)
        x = exposed.get((iid, fastest))
        out["exposed_ns"].append(min(x, t) if x is not None else None)
    return pa.table(out, schema=BANDWIDTH_SCHEMA)


def _per_instance(instances: pa.Table) -> list[tuple[Any, ...]]:
    """Per matched instance: (instance, group, name, first step, size of the group, largest
    input and output bytes, shortest duration, the rank that had it, the ranks, first exit
    less last arrival), by instance."""
    # imported where used: 45-90 ms that a start reading saved tables (the dashboard's) never needs
    import duckdb

    con = duckdb.connect()
    try:
        con.register("i", instances)
        return con.sql("""
            SELECT instance, any_value(grp) AS grp, any_value(name) AS name, min(step) AS step,
                   any_value(group_size) AS n, max(in_bytes) AS in_bytes,
                   max(out_bytes) AS out_bytes, min(end_ns - start_ns) AS t_short,
                   arg_min(rank, end_ns - start_ns) AS fastest, list(DISTINCT rank) AS ranks,
                   min(end_ns) - max(start_ns) AS t_after
            FROM i GROUP BY instance ORDER BY instance
        """).fetchall()
    finally:
        con.close()


def _t_bound(ranks: list[int], bounds: dict[int, int | None], ctx: RunContext) -> int | None:
    """The error bound of a transfer time measured across `ranks`' clocks: 0 on one host,
    else twice the largest offset error bound (None when one is unbounded)."""
    if len({ctx.host_of(r) for r in ranks}) <= 1:
        return 0
    b = [bounds.get(r) for r in ranks]
    return None if any(x is None for x in b) else 2 * max(b)  # type: ignore[type-var]


@dataclass
class BandwidthClass:
    """The instances of one (group, collective, size) and their verdict."""

    grp: str
    name: str
    bytes: int
    link: str
    link_kind: str | None
    instances: int
    steps: list[int]
    busbw_Bps: float | None  # the upper quartile of the instances' busbw
    busbw_median_Bps: float | None
    busbw_max_Bps: float | None
    peak_Bps: float | None
    peak_source: str | None
    t_total_ns: int
    exposed_ns: int  # exposed transfer time over the instances
    verdict: str  # bandwidth-bound | latency-bound | fine | unknown
    t_shortest_ns: int = 0  # the instances' shortest durations, summed (waiting included)
    after_last_arrival: int = 0  # instances whose t is first exit - last arrival
    busbw_lo_Bps: float | None = None  # upper quartile of the clock-bounded busbw interval
    busbw_hi_Bps: float | None = None

    @property
    def confidence(self) -> str:
        return "confirmed" if self.instances >= MIN_INSTANCES else "suspected"

    @property
    def ratio(self) -> float | None:
        if self.busbw_Bps is None or not self.peak_Bps:
            return None
        return self.busbw_Bps / self.peak_Bps

    def as_dict(self) -> dict[str, Any]:
        def gbit(x: float | None) -> float | None:
            return round(x * 8 / 1e9, 3) if x else None

        return {
            "group": self.grp, "collective": self.name, "bytes": self.bytes, "link": self.link,
            "link_kind": self.link_kind, "instances": self.instances,
            "busbw_gbit_s": gbit(self.busbw_Bps),
            "busbw_median_gbit_s": gbit(self.busbw_median_Bps),
            "busbw_max_gbit_s": gbit(self.busbw_max_Bps),
            "peak_gbit_s": gbit(self.peak_Bps), "peak_source": self.peak_source,
            "busbw_of_peak_pct": round(100 * self.ratio, 1) if self.ratio is not None else None,
            "transfer_ms": round(self.t_total_ns / 1e6, 3),
            "exposed_ms": round(self.exposed_ns / 1e6, 3),
            "exposed_pct": round(100 * self.exposed_ns / self.t_total_ns, 1)
            if self.t_total_ns else None,
            "verdict": self.verdict,
            "confidence": self.confidence,
            "transfer_basis": "first exit - last arrival" if self.after_last_arrival ==
            self.instances else f"first exit - last arrival in {self.after_last_arrival} of "
            f"{self.instances} instances, else the shortest participant",
            "in_collective_ms": round(self.t_shortest_ns / 1e6, 3),
            "busbw_bound_gbit_s": [gbit(self.busbw_lo_Bps), gbit(self.busbw_hi_Bps)]
            if self.busbw_lo_Bps else None,
        }


def bandwidth_classes(bw: pa.Table) -> list[BandwidthClass]:
    """Per (group, collective, bytes, link) summary with its verdict (see the module doc)."""
    if bw.num_rows == 0:
        return []
    import duckdb

    con = duckdb.connect()
    con.register("b", bw)
    rows = con.sql("""
        SELECT grp, name, bytes, link, any_value(link_kind), count(*), list(DISTINCT step),
               quantile_cont(busbw_Bps, 0.75), median(busbw_Bps), max(busbw_Bps),
               max(peak_Bps), any_value(peak_source),
               max(half_peak_bytes), sum(t_ns), sum(coalesce(exposed_ns, 0)),
               sum(t_shortest_ns), count(*) FILTER (WHERE t_basis = 'after last arrival'),
               quantile_cont(busbw_lo_Bps, 0.75),
               CASE WHEN count(busbw_hi_Bps) = count(*) THEN quantile_cont(busbw_hi_Bps, 0.75) END
        FROM b WHERE bytes IS NOT NULL
        GROUP BY grp, name, bytes, link ORDER BY sum(t_ns) DESC
    """).fetchall()
    con.close()
    out = []
    for (grp, name, size, link, kind, n, steps, q75, med, mx, peak, source, half_peak, t, exp,
         t_short, after, lo, hi) in rows:
        small = size < (half_peak or SMALL_MESSAGE_BYTES)
        ratio = q75 / peak if q75 is not None and peak else None
        if ratio is not None and ratio >= BANDWIDTH_BOUND:
            verdict = "bandwidth-bound"
        elif (small and ratio is not None and ratio < LATENCY_BOUND_BUSBW) or \
                (ratio is None and size <= TINY_MESSAGE_BYTES):
            verdict = "latency-bound"
        elif ratio is None:
            verdict = "unknown"
        else:
            verdict = "fine"
        out.append(BandwidthClass(grp=grp, name=name, bytes=int(size), link=link,
                                  link_kind=kind, instances=int(n),
                                  steps=sorted(int(s) for s in steps if s is not None),
                                  busbw_Bps=q75, busbw_median_Bps=med, busbw_max_Bps=mx,
                                  peak_Bps=peak,
                                  peak_source=source, t_total_ns=int(t), exposed_ns=int(exp),
                                  verdict=verdict, t_shortest_ns=int(t_short or 0),
                                  after_last_arrival=int(after or 0), busbw_lo_Bps=lo,
                                  busbw_hi_Bps=hi))
    return out
