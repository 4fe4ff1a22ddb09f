"""Clock alignment: one offset per host, applied before any cross-rank comparison (docs/DESIGN.md).

Ranks on one host share a clock, hosts do not. Each host starts from the online estimate that
the rank agent measured at start-up (rank.json "clock": NTP-style pings of rank 0, good to half
a round trip through the store, often milliseconds). It is then refined from matched
collectives, whose exits are near simultaneous on all participants: the host's correction is the
weighted median, over instances, of how much later its ranks exit than the already aligned
ranks, weighted towards short collectives (their exits are the tightest). It is kept inside the
bounds causality sets (no rank leaves a collective before every rank has entered it). The
residual, the median distance of the exits from simultaneous after alignment, is reported.

Where exits are not that simultaneous (Gloo on busy CPUs: a rank's thread may wake up
milliseconds late, and ring algorithms finish one hop apart) the causality bounds can be the
tighter evidence: small collectives enter and leave within a few hundred microseconds of each
other. When the bounds' half-width is smaller than the exits' residual, the middle of the bounds
is taken instead (it assumes the same entry-to-exit latency both ways, as two-way time transfer
does); `estimator` says which was used.

Uncertainty: `residual_ns` is the median spread of the exits after alignment, a measure of how
simultaneous exits are, not of the offset's error (a held-out check recovered shifted clocks
within 6-16 µs where the residual said 1.2-1.7 ms). The honest figure is `error_bound_ns`: the
true offset lies within the causality bounds, so the estimate is off by at most its distance to
the farther bound (the bounds' half-width with the "bounds" estimator). Without bounds it is
the start-up estimate's stated uncertainty (method "online"), 0 for the reference, and None when
nothing bounds it. `error_bound_basis` names which.

Hosts that share no collective with the aligned ones keep the online estimate; with neither,
their offset is 0 and the method says "none". Traces that do not name their host are each
their own clock domain ("rank<r>"), aligned the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables.collectives import Matched
from uberprof.analysis.tables.context import RunContext

__all__ = [
    "MIN_INSTANCES",
    "Alignment",
    "HostClock",
    "align_clocks",
    "clock_domain",
    "weighted_median",
]

MIN_INSTANCES = 3  # matched instances needed to refine a host's offset from collectives


@dataclass
class HostClock:
    """The clock of one host (or of one rank whose host is unknown)."""

    host: str
    ranks: list[int]
    offset_ns: int  # add to this host's timestamps to get the reference host's clock
    method: str  # reference | collectives | online | none
    online_offset_ns: int | None = None  # the start-up estimate (rank.json), when there is one
    online_uncertainty_ns: int | None = None
    correction_ns: int | None = None  # offset_ns - online estimate (or - 0 without one)
    residual_ns: int | None = None  # median |exit skew| left after alignment
    instances: int = 0  # matched instances the refinement used
    bounds_ns: tuple[int, int] | None = None  # causality bounds on the offset
    estimator: str | None = None  # exits (weighted median) | bounds (middle of the bounds)
    note: str | None = None
    error_bound_ns: int | None = None  # |offset error| is at most this (module docstring)
    error_bound_basis: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "ranks": self.ranks, "offset_ns": self.offset_ns,
            "method": self.method, "online_offset_ns": self.online_offset_ns,
            "online_uncertainty_ns": self.online_uncertainty_ns,
            "correction_ns": self.correction_ns, "residual_ns": self.residual_ns,
            "instances": self.instances,
            "bounds_ns": list(self.bounds_ns) if self.bounds_ns else None,
            "estimator": self.estimator, "note": self.note,
            "error_bound_ns": self.error_bound_ns, "error_bound_basis": self.error_bound_basis,
        }


@dataclass
class Alignment:
    """Per-host offsets and the per-rank view of them."""

    reference: str | None
    hosts: list[HostClock] = field(default_factory=list)

    def offset_of(self, rank: int) -> int:
        for h in self.hosts:
            if rank in h.ranks:
                return h.offset_ns
        return 0

    def offsets(self) -> dict[int, int]:
        return {r: h.offset_ns for h in self.hosts for r in h.ranks}

    def error_bounds(self) -> dict[int, int | None]:
        """Per rank, the bound on its host's offset error (None: unbounded)."""
        return {r: h.error_bound_ns for h in self.hosts for r in h.ranks}

    def apply(self, table: pa.Table, columns: tuple[str, ...]) -> pa.Table:
        """`table` (with a `rank` column) with each of `columns` moved onto the reference clock."""
        if table.num_rows == 0:
            return table
        offs = self.offsets()
        ranks = table.column("rank").to_numpy(zero_copy_only=False)
        shift = pa.array(np.array([offs.get(int(r), 0) for r in ranks], dtype=np.int64))
        for col in columns:
            i = table.schema.get_field_index(col)
            table = table.set_column(i, col, pc.add(table.column(col), shift))
        return table

    def as_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "hosts": [h.as_dict() for h in self.hosts]}


def clock_domain(ctx: RunContext, rank: int) -> str:
    """The clock a rank's timestamps are on: its host, or the rank itself when that is unknown."""
    host = ctx.host_of(rank)
    return host if host else f"rank{rank}"


def align_clocks(ctx: RunContext, matched: Matched) -> Alignment:
    """Estimate every host's offset to the reference host (see the module docstring)."""
    domains: dict[str, list[int]] = {}
    for r in ctx.rank_ids:
        domains.setdefault(clock_domain(ctx, r), []).append(r)
    if not domains:
        return Alignment(reference=None)
    ref = clock_domain(ctx, min(ctx.rank_ids))
    clocks = {d: _online(ctx, d, ranks) for d, ranks in domains.items()}
    clocks[ref].offset_ns, clocks[ref].method = 0, "reference"
    clocks[ref].correction_ns = 0
    clocks[ref].error_bound_ns, clocks[ref].error_bound_basis = 0, "reference clock"

    inst = matched.instances
    if inst.num_rows and len(domains) > 1:
        _refine(clocks, ref, inst, ctx)
    for c in clocks.values():
        if c.method == "pending":
            if c.online_offset_ns is not None:
                c.offset_ns, c.method = c.online_offset_ns, "online"
                if c.online_uncertainty_ns is not None:
                    c.error_bound_ns = c.online_uncertainty_ns
                    c.error_bound_basis = "start-up estimate's uncertainty"
            else:
                c.offset_ns, c.method = 0, "none"
                c.note = c.note or ("no clock estimate and too few collectives shared with the "
                                    "other hosts: left unaligned")
    order = sorted(clocks.values(), key=lambda c: (c.method != "reference", min(c.ranks)))
    return Alignment(reference=ref, hosts=order)


def _online(ctx: RunContext, domain: str, ranks: list[int]) -> HostClock:
    """The start-up estimate of a host: from whichever of its ranks measured (or inherited) it."""
    offset = unc = None
    for r in ranks:
        clock = ctx.ranks[r].clock
        if isinstance(clock.get("offset_to_rank0_ns"), int):
            offset = clock["offset_to_rank0_ns"]
            unc = clock.get("offset_uncertainty_ns")
            break
    return HostClock(host=domain, ranks=sorted(ranks), offset_ns=0, method="pending",
                     online_offset_ns=offset,
                     online_uncertainty_ns=unc if isinstance(unc, int) else None)


def _refine(clocks: dict[str, HostClock], ref: str, inst: pa.Table, ctx: RunContext) -> None:
    """Align hosts one at a time, each against every host aligned before it (largest overlap
    first), so that hosts linked only through a third one still get an offset."""
    agg = _per_domain_exits(inst, ctx)
    if agg is None:
        return
    iid, dom, med_end, min_end, max_start, tmin = agg
    names = sorted(set(dom.tolist()))
    aligned = {ref}
    while True:
        is_a = np.isin(dom, list(aligned))
        inst_a = np.unique(iid[is_a])
        best, best_ids = None, np.zeros(0, dtype=np.int64)
        for d in names:
            if d in aligned:
                continue
            both = np.intersect1d(iid[dom == d], inst_a)
            if both.size > best_ids.size:
                best, best_ids = d, both
        if best is None or best_ids.size < MIN_INSTANCES:
            break
        c = clocks[best]
        base = c.online_offset_ns or 0
        off = np.array([clocks[d].offset_ns for d in dom], dtype=np.int64)
        # the aligned side of each shared instance, on the reference clock
        a = is_a & np.isin(iid, best_ids)
        _, first = np.unique(iid[a], return_index=True)
        ends_a = (med_end[a] + off[a]).astype(np.float64)
        cnt = np.add.reduceat(np.ones(ends_a.size), first)
        ea = np.add.reduceat(ends_a, first) / cnt
        sa_max = np.maximum.reduceat(max_start[a] + off[a], first)
        ea_min = np.minimum.reduceat(min_end[a] + off[a], first)
        # the host being aligned, on its online clock (one row per instance)
        dsel = (dom == best) & np.isin(iid, best_ids)
        order = np.argsort(iid[dsel])
        ed = (med_end[dsel][order] + base).astype(np.float64)
        ed_min = min_end[dsel][order] + base
        sd_max = max_start[dsel][order] + base
        skew = ed - ea
        lo_b = int((sa_max - ed_min).max())  # correction >= this: its ranks leave after all enter
        hi_b = int((ea_min - sd_max).min())  # correction <= this: the others leave after it enters
        w = 1.0 / np.maximum(tmin[dsel][order].astype(np.float64), 1_000.0)
        _set_offset(c, base, skew, w, lo_b, hi_b, int(best_ids.size))
        aligned.add(best)


def _set_offset(c: HostClock, base: int, skew: np.ndarray, w: np.ndarray, lo_b: int, hi_b: int,
                instances: int) -> None:
    """Host `c`'s offset from its exits' skew against the aligned hosts (`skew`, weighted by
    `w`), its online offset `base`, and the causality bounds [lo_b, hi_b] on its correction:
    the weighted median, kept inside the bounds (or their middle when they are tighter than the
    exits agree), with its error bound; a note when the bounds cross."""
    corr = -weighted_median(skew, w)
    c.estimator = "exits"
    if lo_b <= hi_b:
        spread = float(np.median(np.abs(skew + corr)))
        if (hi_b - lo_b) / 2 < spread:
            # the bounds pin the offset down more tightly than the exits agree: take
            # their middle (symmetric entry-to-exit latency, as in two-way time transfer)
            corr, c.estimator = (lo_b + hi_b) / 2, "bounds"
        corr = min(max(corr, lo_b), hi_b)
        c.bounds_ns = (base + lo_b, base + hi_b)
        c.error_bound_ns = round(max(corr - lo_b, hi_b - corr))
        c.error_bound_basis = ("half-width of the causality bounds" if c.estimator == "bounds"
                               else "distance to the farther causality bound")
    else:
        c.note = ("exits and entries of the shared collectives disagree by "
                  f"{(lo_b - hi_b) / 1e3:.0f} µs (a clock that drifts during the window?)")
    c.offset_ns = round(base + corr)
    c.correction_ns = round(corr)
    c.residual_ns = round(float(np.median(np.abs(skew + corr))))
    c.instances = instances
    c.method = "collectives"


def _per_domain_exits(inst: pa.Table, ctx: RunContext) -> tuple[np.ndarray, ...] | None:
    """Per (instance, clock domain): median and first exit, last entry, and the instance's
    shortest duration. Times are relative to the earliest start, so float medians stay exact."""
    import duckdb

    rank = inst.column("rank").to_numpy()
    start = inst.column("start_ns").to_numpy()
    end = inst.column("end_ns").to_numpy()
    if not rank.size:
        return None
    t0 = int(start.min())
    dom_of = {int(r): clock_domain(ctx, int(r)) for r in np.unique(rank)}
    t = pa.table({
        "instance": inst.column("instance"),
        "dom": pa.array([dom_of[int(r)] for r in rank], pa.string()),
        "s": pa.array(start - t0, pa.int64()),
        "e": pa.array(end - t0, pa.int64()),
    })
    con = duckdb.connect()
    con.register("t", t)
    res = con.sql("""
        WITH tm AS (SELECT instance, min(e - s) AS tmin FROM t GROUP BY instance)
        SELECT t.instance, dom, median(e) AS med_end, min(e) AS min_end, max(s) AS max_start,
               any_value(tm.tmin) AS tmin
        FROM t JOIN tm USING (instance)
        GROUP BY t.instance, dom ORDER BY t.instance, dom
    """).fetchnumpy()
    con.close()
    return (np.asarray(res["instance"], dtype=np.int64), np.asarray(res["dom"], dtype=object),
            np.rint(np.asarray(res["med_end"], dtype=np.float64)).astype(np.int64) + t0,
            np.asarray(res["min_end"], dtype=np.int64) + t0,
            np.asarray(res["max_start"], dtype=np.int64) + t0,
            np.asarray(res["tmin"], dtype=np.int64))


def weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    """The value below which half the total weight lies (the lower one on a tie)."""
    order = np.argsort(x, kind="stable")
    xs, cw = x[order], np.cumsum(w[order])
    return float(xs[int(np.searchsorted(cw, cw[-1] / 2.0))])
