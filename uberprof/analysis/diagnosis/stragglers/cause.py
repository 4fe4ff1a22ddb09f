"""The named straggler's cause (`settle_cause`), in order: the largest per-step excess over the
other ranks' median on the traced steps (`straggler_cause`: compute, data, host/launch,
network; its GPU clocks make compute `clock_throttle`; its confirmed busy-time excess weighs for
compute, its extra wait for a core against host/launch), then the same-work hold (a work cause
on the others' work, unconfirmed by busy time: suspected), then `off_cpu` where its own time
explains under half its lateness and the OS did not delay it, and `preempted` where the OS
delayed it more than it worked extra. Where the Flight Recorder decided, the sentence says
which basis the cause was read from (`note_traced_view`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.stragglers.cost import Straggler
from uberprof.analysis.diagnosis.stragglers.rules import WORK_CAUSES
from uberprof.analysis.diagnosis.stragglers.test import StragglerTest
from uberprof.analysis.diagnosis.stragglers.wording import (
    traced_view_words,
    unexplained_lead_words,
)
from uberprof.analysis.diagnosis.summaries import sql_rows

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.busy import BusyExcess

__all__ = ["hold_for_same_work", "note_traced_view", "settle_cause", "step_factors",
           "straggler_cause"]

FACTORS = ("compute", "data", "host_launch", "network")


def settle_cause(s: Straggler, test: StragglerTest | None,
                 factors: dict[int, dict[int, dict[str, float]]], clocks: dict[str, Any],
                 same_work_of: Callable[[int], bool | None]) -> int | None:
    """Set `s.cause` and `s.factors` (module docstring: the order), and hold `s` and `test`
    at suspected where it ran the others' work (`same_work_of(rank)`, asked only then).
    `factors` are `step_factors`'s, `clocks` its GPU clocks against the others'. Returns the
    busy-time excess that weighed for compute (None where none was confirmed)."""
    work = test.busy if test is not None else None
    mine = work is not None and work.rank == s.rank
    work_ns = work.excess_ns if work is not None and mine and work.confirmed else None
    run_wait = work.run_wait_excess_ns if work is not None and mine else None
    s.cause, s.factors = straggler_cause(s.rank, factors, clocks, work_ns, run_wait)
    if test is not None and _same_work_in_question(test, s):
        hold_for_same_work(test, s, same_work_of(s.rank))
    # what makes it late: its lead, or the host gaps the traced steps blame, if larger
    late_by = max(s.median_lead_ns, s.factors.get("host_launch", 0)
                  if s.cause == "host_launch" else 0)
    if work is not None and mine and work.waited_off_cpu(late_by):
        s.cause = "off_cpu"  # it waited off the CPU by itself (busy.py)
    elif work is not None and mine and work.confirmed and late_by > 0:
        _note_unexplained_lead(s, work, late_by)
    if mine and test is not None and test.outweighed_by_os:
        s.cause = "preempted"  # the OS held it back more than its work (busy.py)
    s.counters = clocks
    return work_ns


def straggler_cause(rank: int, per_step: dict[int, dict[int, dict[str, float]]],
                    clocks: dict[str, Any] | None = None,
                    busy_excess_ns: int | None = None,
                    run_wait_excess_ns: int | None = None) -> tuple[str, dict[str, int]]:
    """The straggler's cause and, per factor, its median per-step excess over the other ranks.

    `per_step[step][rank]` holds the factors of one rank in one step (ns): `compute`, `data`,
    `host_launch` and `network` (its time inside collectives after the last arrival). The
    factor with the largest excess wins; `compute` becomes `clock_throttle` when `clocks`
    says the rank's GPU ran slower clocks or had throttle reasons set and the others did not.
    `busy_excess_ns`, its confirmed busy-time excess (analysis/diagnosis/busy.py: every step,
    where the traced steps are a few), weighs for `compute` where it is larger than the traced
    excess. `run_wait_excess_ns`, its wait for a core beyond the others' (busy.py, CPU runs),
    weighs against `host_launch`: a thread the OS kept off a core between operators shows host
    gaps that are no launch overhead of its own (a 1.3x compute straggler on a loaded host
    waited 50 ms more per step for a core and showed 28 ms more host gaps than compute).
    """
    excess: dict[str, list[float]] = {f: [] for f in FACTORS}
    for ranks in per_step.values():
        mine = ranks.get(rank)
        others = [v for r, v in ranks.items() if r != rank]
        if mine is None or not others:
            continue
        for f in FACTORS:
            excess[f].append(mine.get(f, 0.0) - float(np.median([o.get(f, 0.0) for o in others])))
    factors = {f: int(np.median(v)) if v else 0 for f, v in excess.items()}
    weight = dict(factors)
    if busy_excess_ns is not None:
        weight["compute"] = max(weight["compute"], busy_excess_ns)
    if run_wait_excess_ns is not None and run_wait_excess_ns > 0:
        weight["host_launch"] = max(0, weight["host_launch"] - run_wait_excess_ns)
    cause = max(FACTORS, key=lambda f: weight[f])
    if cause == "compute" and clocks and clocks.get("throttled"):
        cause = "clock_throttle"
    return cause, factors


def step_factors(traced: pa.Table, gaps: pa.Table, lat: pa.Table
                 ) -> dict[int, dict[int, dict[str, float]]]:
    """Per step and rank: compute, data wait, host/launch idle and time in collectives after
    the last arrival (ns), the numbers a straggler's cause is read from."""
    out: dict[int, dict[int, dict[str, float]]] = {}
    for row in traced.select(["rank", "step", "compute_ns", "data_wait_ns"]).to_pylist():
        out.setdefault(row["step"], {})[row["rank"]] = {
            "compute": float(row["compute_ns"] or 0), "data": float(row["data_wait_ns"] or 0),
            "host_launch": 0.0, "network": 0.0}
    if gaps.num_rows:
        for r, s, data, host in sql_rows(
                "SELECT rank, step, sum(dur_ns) FILTER (WHERE cause = 'data'), "
                "sum(dur_ns) FILTER (WHERE cause IN ('launch', 'host', 'sync')) "
                "FROM g GROUP BY rank, step", g=gaps):
            f = out.get(s, {}).get(r)
            if f is not None:
                f["data"] = max(f["data"], float(data or 0))
                f["host_launch"] += float(host or 0)
    if lat.num_rows:
        for r, s, t in sql_rows("SELECT rank, step, sum(transfer_ns) FROM l GROUP BY rank, step",
                                l=lat):
            f = out.get(s, {}).get(r)
            if f is not None:
                f["network"] += float(t or 0)
    return out


def _same_work_in_question(test: StragglerTest, s: Straggler) -> bool:
    """Whether the same-work hold can apply: a confirmed straggler late by work
    (`WORK_CAUSES`) whose busy time, on a run that has it, does not confirm that it works
    longest. Not where there is no busy time (device runs: a slower GPU on the same kernels is
    a straggler)."""
    work = test.busy
    return s.confidence == "confirmed" and s.cause in WORK_CAUSES and work is not None and \
        work.rank == s.rank and not work.confirmed


def hold_for_same_work(test: StragglerTest, s: Straggler, same: bool | None) -> bool:
    """Hold a confirmed straggler late by work at suspected where its traced steps ran the
    others' work (`same`: op_excess.same_work) and its busy time over every step does not
    confirm it works longest (`_same_work_in_question`); whether it did."""
    if same is not True or not _same_work_in_question(test, s):
        return False
    test.decision, test.same_work = "suspected", True
    s.confidence, s.test = "suspected", test.test_doc()
    return True


def _note_unexplained_lead(s: Straggler, work: BusyExcess, late_by_ns: float) -> None:
    """Say how much of its lateness a straggler's confirmed extra work leaves unexplained when
    that is over half (busy.py, `waited_off_cpu`): the cause stands, the rest is time off the
    CPU the run does not attribute (waits of its own, or CPU time its host did not give it)."""
    explained = work.explained_ns
    if explained >= 0.5 * late_by_ns:
        return
    s.test["sentence"] += unexplained_lead_words(explained, late_by_ns)


def note_traced_view(s: Straggler, traced: StragglerTest | None,
                     work_ns: int | None = None) -> None:
    """Say where the traced steps, which the cause is read from, disagree with the Flight
    Recorder's verdict: another rank last there, or the rank not slower by its cause; and
    which basis the cause was read from (`cause_basis`)."""
    excess = s.factors.get(s.cause or "compute", 0) if s.factors else 0
    traced_says = max(s.factors, key=lambda f: s.factors[f]) if s.factors else None
    by_busy = s.cause == "compute" and work_ns is not None and traced_says != "compute"
    sentence, note = traced_view_words(
        s.rank, traced is None or traced.rank != s.rank,
        (s.cause or "compute") if excess <= 0 and not by_busy else None, by_busy)
    s.test["sentence"] += sentence
    s.test["cause_basis"] = "busy time" if by_busy else "traced steps"
    if note:
        s.test["cause_note"] = note
