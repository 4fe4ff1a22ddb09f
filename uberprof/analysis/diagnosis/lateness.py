"""Lateness at the collectives: the statistics every straggler reading shares. A leaf module.

Per matched instance and rank, lateness is its start minus the earliest start among the
participants (aligned clocks); its time in the collective splits into waiting for peers (before
the last arrival) and transfer (after it). The same table is made from step timelines (each
step one instance: `matrix_lateness`) for the live indications and the busy-time test. The
tests that decide on these numbers (`stragglers/`, `busy.py`, `step_signals.py`) import them
from here, so none of them imports another to share a statistic.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.evidence import poisson_binomial_sf

__all__ = [
    "ARRIVAL_FIELDS",
    "LATENESS_SCHEMA",
    "Series",
    "lateness",
    "later_than_most",
    "lead_and_noise",
    "matrix_lateness",
    "others_lateness",
    "pooled_lateness",
    "rank_frequency",
    "rank_lead",
    "robust_sigma",
    "sole_last_frequency",
]

Series = tuple[int, np.ndarray, np.ndarray]  # (rank, steps, values in ns): one rank's series

# a rank in one matched instance of a collective: the keys of every per-arrival table
ARRIVAL_FIELDS = [("instance", pa.int64()), ("rank", pa.int64()), ("step", pa.int64()),
                  ("name", pa.string()), ("participants", pa.int64())]

LATENESS_SCHEMA = pa.schema([
    *ARRIVAL_FIELDS,
    ("lateness_ns", pa.int64()),  # start - earliest start of the instance (aligned clocks)
    ("last", pa.bool_()),  # the latest to arrive (ties: all of them)
    ("sole_last", pa.bool_()),  # the only latest to arrive: a tie for last is nobody's fault
    ("delay_ns", pa.int64()),  # if last: its lateness beyond the second-latest; else 0
    ("transfer_ns", pa.int64()),  # its end - the last arrival: time in the collective proper
    ("wait_ns", pa.int64()),  # time inside the collective before the last arrival (peers)
])



def lateness(instances: pa.Table) -> pa.Table:
    """Lateness of every rank in every matched instance (`instances` on aligned clocks)."""
    if instances.num_rows == 0:
        return LATENESS_SCHEMA.empty_table()
    # imported where used: 45-90 ms that a start reading saved tables (the dashboard's) never needs
    import duckdb

    con = duckdb.connect()
    con.register("i", instances)
    t = con.sql("""
        WITH w AS (
            SELECT instance, rank, step, name, participants, start_ns, end_ns,
                   start_ns - min(start_ns) OVER (PARTITION BY instance) AS lateness_ns,
                   max(start_ns) OVER (PARTITION BY instance) AS last_start,
                   row_number() OVER (PARTITION BY instance ORDER BY start_ns DESC) AS pos
            FROM i
        ), second AS (
            SELECT instance, max(lateness_ns) FILTER (WHERE pos = 2) AS second_late,
                   count(*) FILTER (WHERE start_ns = last_start) AS n_last
            FROM w GROUP BY instance
        )
        SELECT w.instance, w.rank, w.step, w.name, w.participants, w.lateness_ns,
               w.start_ns = w.last_start AS last,
               w.start_ns = w.last_start AND s.n_last = 1 AS sole_last,
               CASE WHEN w.pos = 1 THEN w.lateness_ns - coalesce(s.second_late, 0) ELSE 0 END
                   AS delay_ns,
               w.end_ns - w.last_start AS transfer_ns,
               greatest(least(w.last_start, w.end_ns) - w.start_ns, 0) AS wait_ns
        FROM w JOIN second s USING (instance)
        ORDER BY w.instance, w.rank
    """).to_arrow_table()
    con.close()
    return t.cast(LATENESS_SCHEMA)


def matrix_lateness(ranks: list[int], steps: np.ndarray, m: np.ndarray, name: str) -> pa.Table:
    """LATENESS_SCHEMA with each step as one instance and `m` (ns per rank and step) as the
    arrival: lateness beyond the fastest rank; the latest rank's delay is its lead over the
    second latest (what the others waited). The live step-timeline test's basis
    (analysis/diagnosis/step_signals.py) and the busy-time test's (analysis/diagnosis/busy.py)."""
    n_r, n_s = m.shape
    late = m - m.min(axis=0)
    top = m.max(axis=0)
    last = m == top
    sole = last & (last.sum(axis=0) == 1)
    second = np.partition(m, -2, axis=0)[-2] if n_r > 1 else top
    delay = np.where(np.arange(n_r)[:, None] == m.argmax(axis=0), top - second, 0)
    zeros = np.zeros(n_r * n_s, np.int64)
    return pa.table({
        "instance": np.tile(np.arange(n_s), n_r), "rank": np.repeat(ranks, n_s),
        "step": np.tile(steps, n_r), "name": pa.array([name] * (n_r * n_s), pa.string()),
        "participants": np.full(n_r * n_s, n_r), "lateness_ns": late.ravel().astype(np.int64),
        "last": last.ravel(), "sole_last": sole.ravel(),
        "delay_ns": delay.ravel().astype(np.int64), "transfer_ns": zeros, "wait_ns": zeros,
    }, schema=LATENESS_SCHEMA)


def pooled_lateness(tables: list[pa.Table]) -> pa.Table:
    """One LATENESS_SCHEMA table of several that cover different steps (the traced window's
    matched collectives and the Flight Recorder's untraced arrivals), every instance kept
    apart: each table's instance ids are moved past the previous table's."""
    out, base = [], 0
    for t in tables:
        if t.num_rows == 0:
            continue
        iid = t.column("instance").to_numpy()
        out.append(t.cast(LATENESS_SCHEMA).set_column(
            0, "instance", pa.array(iid - int(iid.min()) + base, pa.int64())))
        base += int(iid.max()) - int(iid.min()) + 1
    return pa.concat_tables(out) if out else LATENESS_SCHEMA.empty_table()


def robust_sigma(x: np.ndarray) -> float:
    """1.4826 x the median absolute deviation: the standard deviation of normal data, robust
    to the outliers (a descheduled thread, a cold cache) that a handful of steps always has."""
    if x.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def others_lateness(iid: np.ndarray, rank: np.ndarray, late: np.ndarray, r: int
            ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The other ranks' lateness in each instance rank `r` took part in: (instance ids, one
    array per id), ids increasing."""
    others = (rank != r) & np.isin(iid, iid[rank == r])
    o_iid, o_late = iid[others], late[others]
    order = np.argsort(o_iid, kind="stable")
    uniq, first = np.unique(o_iid[order], return_index=True)
    return uniq, np.split(o_late[order], first[1:]) if uniq.size else []


def lead_and_noise(iid: np.ndarray, rank: np.ndarray, late: np.ndarray, n_part: np.ndarray,
                    r: int) -> tuple[np.ndarray, float]:
    """Rank `r`'s lead over the others' median lateness in each of its instances, and the
    others' own spread (robust sigma around each instance's median; with two ranks, where the
    others are one rank, the spread of the lead itself: reported, never a criterion)."""
    mine = rank == r
    uniq, groups = others_lateness(iid, rank, late, r)
    med = [float(np.median(g)) for g in groups]
    med_of = dict(zip(uniq.tolist(), med))
    lead = np.array([lt - med_of.get(int(i), 0.0) for i, lt in zip(iid[mine], late[mine])])
    if float(np.median(n_part[mine])) >= 3 and groups:
        return lead, robust_sigma(np.concatenate([g - m for g, m in zip(groups, med)]))
    return lead, robust_sigma(lead)


def sole_last_frequency(mine: np.ndarray, sole_last: np.ndarray, n_part: np.ndarray
               ) -> tuple[int, int, float]:
    """(k, n, p): the instances a rank (`mine`) was alone last in, those it took part in, and
    the chance of k or more for a healthy rank (uncorrected; evidence.poisson_binomial_sf)."""
    k = int(sole_last[mine].sum())
    return k, int(mine.sum()), poisson_binomial_sf(k, 1.0 / np.maximum(n_part[mine], 1))


def later_than_most(iid: np.ndarray, rank: np.ndarray, late: np.ndarray,
                     n_part: np.ndarray, r: int) -> tuple[int, float]:
    """(k, p): the instances where rank `r` arrived after most of the others (more than half
    of them), and the chance of k or more for a healthy rank, whose place among n_i arrivals
    is uniform: floor(n_i/2) of the n_i places qualify (uncorrected)."""
    mine = rank == r
    uniq, groups = others_lateness(iid, rank, late, r)
    group_of = dict(zip(uniq.tolist(), groups))
    k = sum(1 for i, lt in zip(iid[mine].tolist(), late[mine].tolist())
            if (g := group_of.get(i)) is not None and int((g < lt).sum()) > g.size / 2)
    n_i = np.maximum(n_part[mine], 1)
    return k, poisson_binomial_sf(k, np.floor(n_i / 2) / n_i)


def rank_frequency(lat: pa.Table, r: int) -> tuple[int, int, float]:
    """Rank `r`'s sole-last frequency in `lat`: (alone last, instances, uncorrected p)."""
    return sole_last_frequency(lat.column("rank").to_numpy() == r,
                      lat.column("sole_last").to_numpy(zero_copy_only=False).astype(bool),
                      lat.column("participants").to_numpy())


def rank_lead(lat: pa.Table, r: int) -> tuple[np.ndarray, float]:
    """Rank `r`'s lead over the others' median lateness per instance of `lat`, and the
    others' spread (`_lead_and_noise`)."""
    return lead_and_noise(lat.column("instance").to_numpy(), lat.column("rank").to_numpy(),
                           lat.column("lateness_ns").to_numpy().astype(np.float64),
                           lat.column("participants").to_numpy(), r)
