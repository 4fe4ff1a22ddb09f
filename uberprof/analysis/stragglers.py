"""Stragglers: who arrives last at the collectives, persistently, and why (DESIGN.md).

- `lateness`: per matched instance and rank, its start minus the earliest start among the
  participants, on aligned clocks.
- `find_straggler`: the rank that is alone last in clearly more instances than chance (more
  than 1/2 + 1/(2n) of them with n participants; a tie for last counts for nobody) and whose
  lead over the others is large both absolutely (>= 100 µs and 3% of the median step) and
  against the others' own spread (>= 2x the robust sigma, 1.4826 MAD, of their lateness around
  each instance's median). Its cost is the delay it alone adds (its lateness beyond the
  second-latest rank), per step the largest over the step's collectives: every other
  participant waits that long.
- `straggler_cause`: from its per-step breakdown against the other ranks' median on the same
  steps (compute, data wait, host/launch idle, transfer time), and from its GPU counters: more
  compute with lower SM clocks or throttle reasons set is `clock_throttle`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from uberprof.analysis.causes import STRAGGLER_CAUSES as _CAUSES

__all__ = [
    "LATENESS_SCHEMA",
    "STRAGGLER_CAUSES",
    "Straggler",
    "find_straggler",
    "lateness",
    "robust_sigma",
    "straggler_cause",
]

STRAGGLER_CAUSES = tuple(_CAUSES)
ABS_MIN_LEAD_NS = 100_000
REL_MIN_LEAD = 0.03  # of the median step time
SIGMA_FACTOR = 2.0

LATENESS_SCHEMA = pa.schema([
    ("instance", pa.int64()),
    ("rank", pa.int64()),
    ("step", pa.int64()),
    ("name", pa.string()),
    ("participants", pa.int64()),
    ("lateness_ns", pa.int64()),  # start - earliest start of the instance (aligned clocks)
    ("last", pa.bool_()),  # the latest to arrive (ties: all of them)
    ("sole_last", pa.bool_()),  # the only latest to arrive: a tie for last is nobody's fault
    ("delay_ns", pa.int64()),  # if last: its lateness beyond the second-latest; else 0
    ("transfer_ns", pa.int64()),  # its end - the last arrival: time in the collective proper
])


@dataclass
class Straggler:
    rank: int
    instances: int  # instances the rank took part in
    last: int  # instances where it alone arrived last (LATENESS_SCHEMA `sole_last`)
    steps: list[int]  # steps where it arrived last in at least one collective
    median_lateness_ns: int
    median_lead_ns: int  # over the others' median lateness in the same instance
    noise_ns: int  # robust sigma of the others' lateness
    delay_ns: int  # total wall-clock delay it added over the analysed steps
    others_wait_ns: int  # the same, summed over the ranks that waited
    steps_analysed: int
    cause: str | None = None
    factors: dict[str, int] = field(default_factory=dict)  # per-step excess over the others
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def last_fraction(self) -> float:
        return self.last / self.instances if self.instances else 0.0


def lateness(instances: pa.Table) -> pa.Table:
    """Lateness of every rank in every matched instance (`instances` on aligned clocks)."""
    if instances.num_rows == 0:
        return LATENESS_SCHEMA.empty_table()
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
               w.end_ns - w.last_start AS transfer_ns
        FROM w JOIN second s USING (instance)
        ORDER BY w.instance, w.rank
    """).to_arrow_table()
    con.close()
    return t.cast(LATENESS_SCHEMA)


def robust_sigma(x: np.ndarray) -> float:
    """1.4826 x the median absolute deviation: the standard deviation of normal data, robust
    to the outliers (a descheduled thread, a cold cache) that a handful of steps always has."""
    if x.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def find_straggler(lat: pa.Table, median_step_ns: float | None) -> Straggler | None:
    """The persistent straggler, or None (see the module docstring)."""
    if lat.num_rows == 0:
        return None
    iid = lat.column("instance").to_numpy()
    rank = lat.column("rank").to_numpy()
    late = lat.column("lateness_ns").to_numpy().astype(np.float64)
    n_part = lat.column("participants").to_numpy()
    step = lat.column("step").to_numpy()
    delay = lat.column("delay_ns").to_numpy()
    sole_last = lat.column("sole_last").to_numpy(zero_copy_only=False)
    best = None
    for r in np.unique(rank).tolist():
        mine = rank == r
        count = int(mine.sum())
        frac = sole_last[mine].sum() / count if count else 0.0
        key = (frac, float(np.median(late[mine])))
        if best is None or key > best[0]:
            best = (key, r)
    assert best is not None
    r = int(best[1])
    mine = rank == r
    ids = iid[mine]
    n = float(np.median(n_part[mine]))
    frac = float(sole_last[mine].sum()) / ids.size
    # the others in the same instances: lead over their median, and their own spread
    others = ~mine & np.isin(iid, ids)
    o_iid, o_late = iid[others], late[others]
    order = np.argsort(o_iid, kind="stable")
    o_iid, o_late = o_iid[order], o_late[order]
    uniq, first = np.unique(o_iid, return_index=True)
    med = np.array([np.median(seg) for seg in np.split(o_late, first[1:])]) if uniq.size else \
        np.zeros(0)
    med_of = dict(zip(uniq.tolist(), med.tolist()))
    lead = np.array([lt - med_of.get(int(i), 0.0) for i, lt in zip(ids, late[mine])])
    if n >= 3 and o_late.size:
        dev = o_late - np.repeat(med, np.diff(np.append(first, o_late.size)))
        noise = robust_sigma(dev)
    else:
        noise = robust_sigma(lead)
    med_lead = float(np.median(lead)) if lead.size else 0.0
    need_abs = max(ABS_MIN_LEAD_NS, REL_MIN_LEAD * (median_step_ns or 0.0))
    persistent = frac >= 0.5 + 0.5 / max(n, 2.0)
    if not (persistent and med_lead >= need_abs and med_lead >= SIGMA_FACTOR * noise):
        return None
    # cost: per step, the largest delay it alone added to any of the step's collectives
    d_step, d_val, d_n = step[mine], delay[mine], n_part[mine]
    per_step: dict[int, tuple[int, int]] = {}
    for s, d, k in zip(d_step.tolist(), d_val.tolist(), d_n.tolist()):
        if d > per_step.get(s, (0, 0))[0]:
            per_step[s] = (d, k)
    wall = sum(d for d, _ in per_step.values())
    others_wait = sum(d * (k - 1) for d, k in per_step.values())
    last_steps = sorted({int(s) for s, sl in zip(d_step.tolist(), sole_last[mine].tolist())
                         if sl})
    return Straggler(
        rank=r, instances=int(ids.size), last=int(sole_last[mine].sum()), steps=last_steps,
        median_lateness_ns=int(np.median(late[mine])), median_lead_ns=int(med_lead),
        noise_ns=int(noise), delay_ns=int(wall), others_wait_ns=int(others_wait),
        steps_analysed=len(set(d_step.tolist())),
    )


def straggler_cause(rank: int, per_step: dict[int, dict[int, dict[str, float]]],
                    clocks: dict[str, Any] | None = None) -> tuple[str, dict[str, int]]:
    """The straggler's cause and, per factor, its median per-step excess over the other ranks.

    `per_step[step][rank]` holds the factors of one rank in one step (ns): `compute`, `data`,
    `host_launch` and `network` (its time inside collectives after the last arrival). The
    factor with the largest excess wins; `compute` becomes `clock_throttle` when `clocks`
    says the rank's GPU ran slower clocks or had throttle reasons set and the others did not.
    """
    names = ("compute", "data", "host_launch", "network")
    excess: dict[str, list[float]] = {f: [] for f in names}
    for ranks in per_step.values():
        mine = ranks.get(rank)
        others = [v for r, v in ranks.items() if r != rank]
        if mine is None or not others:
            continue
        for f in names:
            excess[f].append(mine.get(f, 0.0) - float(np.median([o.get(f, 0.0) for o in others])))
    factors = {f: int(np.median(v)) if v else 0 for f, v in excess.items()}
    cause = max(names, key=lambda f: factors[f])
    if cause == "compute" and clocks and clocks.get("throttled"):
        cause = "clock_throttle"
    return cause, factors
