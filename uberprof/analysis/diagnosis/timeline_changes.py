"""The story in time: where the job's step time changed level, on which ranks, and which trace
windows cover the steps before and after (`run.timeline_changes`, docs/report.md).

- **The job's steps.** Per step, the longest rank's host step time (`steptime.step_walls`, the
  step time every view uses), without the traced steps (the profiler slows them), the first step
  (start-up) and each step right after a window (uberprof's own cost): `steptime.own_cost_steps`.
- **Changes** (`level_shifts.level_changes`: Pettitt's rank test in binary segmentation, kept
  when the levels differ by 20% and beyond the steps' spread). Consecutive changes the same way
  are one **episode** told once: a level that keeps rising is one slowdown, from its first step
  (`onset_step`), with the steps where it rose again (`further`). Its strength is `uberprof
  diff`'s test of a change in step time (`diff.stats.median_ratio_test`, a moving-block
  bootstrap of the ratio of medians, against the same 20%) on the steps before and after:
  confirmed when it holds and each side has `MIN_CONFIRMED_STEPS`, else suspected.
- **Ranks** (`rank_changes`): in a synchronous job every rank's step lasts as long as the
  slowest one's, so step times cannot say who changed. Each rank's own measures can: its busy
  time (the training thread's CPU time, `busy.py`), its data wait, its arrival lateness at the
  collectives (the Flight Recorder's, `arrivals.py`), and its own step time (which tells in a
  job whose ranks do not wait for each other). A rank is named when one of them moved, from
  the steps before to the steps after, by `RANK_MIN_CHANGE` of its own level and at least
  `RANK_MIN_SHARE` of the job's change, and by that much more than the other ranks' median
  move: the rank that slowed, not those that waited for it. When every rank's measure moved
  alike, `every_rank` says so (the work of every rank changed).
- **Windows**: each trace window of the run (the same steps on several ranks are one window,
  numbered by first step, with what opened it: rank.json's `trace.triggers`) before the onset
  that ran at a level the change departs from, and from the onset until the next change the
  other way (`windows_around`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.arrivals import flight_basis
from uberprof.analysis.diagnosis.busy import BusyTimes
from uberprof.analysis.diagnosis.level_shifts import (
    MIN_CHANGE,
    MIN_SEGMENT,
    LevelChange,
    level_changes,
    pettitt,
)
from uberprof.analysis.diff.stats import median_ratio_test
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.steptime import own_cost_steps, step_walls
from uberprof.rundir import RunDir, ranks_by_id, trace_triggers, trace_windows

__all__ = ["MIN_CONFIRMED_STEPS", "RANK_MIN_CHANGE", "RANK_MIN_SHARE", "Episode",
           "RankSeries", "TimelineWindow", "episodes", "job_series", "rank_moves",
           "run_windows"]

MIN_CONFIRMED_STEPS = 20  # steps on each side of a confirmed change
RANK_MIN_CHANGE = MIN_CHANGE  # a rank's own measure moved by this share of its own level
RANK_MIN_SHARE = 0.5  # ... and by half the job's change at least: it accounts for much of it
MAX_TESTED = 1000  # steps on each side the strength test reads (the nearest to the onset)

MEASURES = {  # measure -> its words; a rank is named by the first that tells, in this order:
    # its own work before its effect on the others
    "busy": "CPU time per step",
    "data_wait": "data wait per step",
    "lateness": "lateness at the collectives",
    "step_time": "own step time",
}


@dataclass(frozen=True)
class Episode:
    """Consecutive level changes the same way with the same ranks named, over the job's
    series (`steps`, `ms`); `moves` is what `rank_moves` read at the first of them."""

    changes: list[LevelChange]
    steps: np.ndarray
    ms: np.ndarray
    moves: dict[str, Any]

    @property
    def first(self) -> LevelChange:
        return self.changes[0]

    @property
    def onset(self) -> int:
        return int(self.steps[self.first.at])

    @property
    def slower(self) -> bool:
        return self.first.ratio > 1

    def before(self) -> np.ndarray:
        return self.ms[self.first.lo:self.first.at]

    def after(self) -> np.ndarray:
        return self.ms[self.first.at:self.changes[-1].hi]

    def span(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The first and last step before the onset, and from it."""
        f, last = self.first, self.changes[-1]
        return ((int(self.steps[f.lo]), int(self.steps[f.at - 1])),
                (int(self.steps[f.at]), int(self.steps[last.hi - 1])))


@dataclass(frozen=True)
class RankSeries:
    """One own measure of every rank: per rank, its steps and values (ms), in step order."""

    measure: str
    series: dict[int, tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class TimelineWindow:
    """A trace window of the run: its number (by first step), steps, trigger and ranks."""

    number: int
    first: int
    last: int
    trigger: str
    ranks: list[int]

    def as_dict(self) -> dict[str, Any]:
        return {"window": self.number, "steps": [self.first, self.last],
                "trigger": self.trigger, "ranks": self.ranks}


def job_series(steps: pa.Table, windows: list[TimelineWindow] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(steps, ms): the job's step time per step, without the traced steps, the first step
    and each step right after a window (module docstring). `windows` names the traced steps
    too, where their traces were not analysed."""
    walls = step_walls(steps)
    first, after = own_cost_steps(walls)
    skip = set(after) | ({first} if first is not None else set())
    for w in windows or []:
        skip |= set(range(w.first, w.last + 2))
    keep = [(s, w) for s, (w, traced) in walls.items() if not traced and s not in skip]
    if not keep:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    s, w = zip(*keep, strict=True)
    return np.asarray(s, np.int64), np.asarray(w, np.float64) / 1e6


def episodes(changes: list[LevelChange], steps: np.ndarray, ms: np.ndarray,
             measures: list[RankSeries]) -> list[Episode]:
    """The job's level changes, each with the ranks that moved at it (`rank_moves`, over the
    segments either side); consecutive ones the same way that name the same ranks are one
    episode (a level that keeps rising for one cause is told once)."""
    out: list[Episode] = []
    for c in changes:
        moves = rank_moves(c, steps, ms, measures)
        last = out[-1] if out else None
        if last is not None and last.slower == (c.ratio > 1) and \
                (last.moves["ranks"], last.moves["every_rank"]) == \
                (moves["ranks"], moves["every_rank"]):
            out[-1] = Episode([*last.changes, c], steps, ms, last.moves)
        else:
            out.append(Episode([c], steps, ms, moves))
    return out


def strength(ep: Episode) -> tuple[str, dict[str, Any]]:
    """Its confidence and the test behind it: `uberprof diff`'s test of a change in step time
    on the steps either side (the `MAX_TESTED` nearest the onset), held to the same 20%."""
    before, after = ep.before()[-MAX_TESTED:], ep.after()[:MAX_TESTED]
    t = median_ratio_test(before, after, min_change_pct=100 * MIN_CHANGE)
    enough = min(before.size, after.size) >= MIN_CONFIRMED_STEPS
    confirmed = t.significant and enough
    test = {**t.as_dict(), "located_by": "Pettitt's rank test (binary segmentation)",
            "p_value": float(f"{ep.first.p_value:.3g}")}
    if t.significant and not enough:
        test["reason"] = (f"{t.reason}; fewer than {MIN_CONFIRMED_STEPS} steps on a side: "
                          "suspected (more steps at the new level would confirm it)")
    return ("confirmed" if confirmed else "suspected"), test


def rank_moves(c: LevelChange, steps: np.ndarray, ms: np.ndarray,
               measures: list[RankSeries]) -> dict[str, Any]:
    """Which ranks' own measures moved at the change (module docstring), as `ranks`,
    `every_rank` and `rank_changes` (each named rank's move, by the first measure in
    `MEASURES` that tells, with the step its own measure changed at)."""
    before = (int(steps[c.lo]), int(steps[c.at - 1]))
    after = (int(steps[c.at]), int(steps[c.hi - 1]))
    rise = float(np.median(ms[c.at:c.hi]) - np.median(ms[c.lo:c.at]))
    named: dict[int, dict[str, Any]] = {}
    every = False
    for m in measures:
        moves = _moves(m, before, after)
        deltas = {r: a - b for r, (b, a) in moves.items()}
        # in a synchronous job every rank's step time moves with the slowest one's: alike
        # step times say nothing of every rank's own work
        every |= m.measure != "step_time" and len(moves) > 1 and \
            all(_moved(b, a, rise) for b, a in moves.values())
        for r, (b, a) in moves.items():
            others = [d for q, d in deltas.items() if q != r]
            beyond = (a - b) - (float(np.median(others)) if others else 0.0)
            if _moved(b, a, rise) and (not others or _moved(b, b + beyond, rise)) and \
                    r not in named:  # the first measure that tells, in MEASURES' order
                named[r] = {"rank": r, "measure": m.measure, "what": MEASURES[m.measure],
                            "onset_step": _own_onset(m, r, c, steps),
                            "before_ms": round(b, 3), "after_ms": round(a, 3),
                            "delta_ms": round(a - b, 3),
                            "others_delta_ms": round(float(np.median(others)), 3)
                            if others else None}
    if every:
        named = {}
    return {"ranks": sorted(named), "every_rank": every,
            "rank_changes": [named[r] for r in sorted(named)]}


def _own_onset(m: RankSeries, rank: int, c: LevelChange, steps: np.ndarray) -> int | None:
    """Where the rank's own measure changed near the job's change: its own change-point
    (Pettitt's split) over as many steps either side of the job's onset as the shorter side
    has (the test finds a split near the middle of what it reads more easily than one near an
    end), which can be sharper than the job's, whose step times carry every rank's noise."""
    half = min(c.at - c.lo, c.hi - c.at)
    lo, hi = int(steps[c.at - half]), int(steps[c.at + half - 1])
    s, v = m.series[rank]
    keep = (s >= lo) & (s <= hi) & np.isfinite(v)
    found = pettitt(v[keep], min_segment=max(2, min(MIN_SEGMENT, half // 2)))
    return int(s[keep][found[0]]) if found is not None else None


def _moved(before: float, after: float, rise: float) -> bool:
    """A move the same way as the job's, by RANK_MIN_CHANGE of its own level and RANK_MIN_SHARE
    of the job's change."""
    d = after - before
    return d * rise > 0 and abs(d) >= RANK_MIN_CHANGE * abs(before) and \
        abs(d) >= RANK_MIN_SHARE * abs(rise)


def _moves(m: RankSeries, before: tuple[int, int], after: tuple[int, int]
           ) -> dict[int, tuple[float, float]]:
    """Per rank, the median of its measure over the steps before and after (ranks with at
    least 3 steps on each side)."""
    out = {}
    for r, (s, v) in m.series.items():
        b = v[(s >= before[0]) & (s <= before[1])]
        a = v[(s >= after[0]) & (s <= after[1])]
        b, a = b[np.isfinite(b)], a[np.isfinite(a)]
        if b.size >= 3 and a.size >= 3:
            out[r] = (float(np.median(b)), float(np.median(a)))
    return out


def own_measures(ctx: RunContext, busy: BusyTimes | None,
                 lateness: pa.Table | None) -> list[RankSeries]:
    """The ranks' own measures the run has: busy time (`busy`, CPU runs), data wait and step
    time (the step table's untraced steps), lateness (the Flight Recorder's,
    LATENESS_SCHEMA)."""
    out = []
    if busy is not None:
        out.append(RankSeries("busy", {r: (busy.steps, busy.busy[i] / 1e6)
                                       for i, r in enumerate(busy.ranks)}))
    steps = ctx.steps(["rank", "step", "traced", "step_time_ns", "data_wait_ns"])
    steps = steps.filter(pc.invert(pc.fill_null(steps.column("traced"), False)))
    out.append(_per_rank_step(steps, "data_wait_ns", "data_wait", "max"))
    if lateness is not None and lateness.num_rows:
        out.append(_per_rank_step(lateness, "lateness_ns", "lateness", "max"))
    out.append(_per_rank_step(steps, "step_time_ns", "step_time", "max"))
    return out  # in MEASURES' order


def _per_rank_step(t: pa.Table, col: str, measure: str, how: str) -> RankSeries:
    """A table's `col` (ns) per rank and step (`how` over several rows), as ms."""
    t = t.select(["rank", "step", col]).filter(pc.is_valid(t.column(col)))
    g = t.group_by(["rank", "step"]).aggregate([(col, how)]).sort_by([("rank", "ascending"),
                                                                      ("step", "ascending")])
    ranks = g.column("rank").to_numpy()
    steps = g.column("step").to_numpy()
    vals = g.column(f"{col}_{how}").to_numpy(zero_copy_only=False).astype(np.float64) / 1e6
    out = {}
    for r in np.unique(ranks):
        mine = ranks == r
        out[int(r)] = (steps[mine], vals[mine])
    return RankSeries(measure, out)


def run_windows(ctx: RunContext) -> list[TimelineWindow]:
    """The run's trace windows: the same steps and trigger on several ranks are one window,
    numbered 1, 2, ... by first step."""
    if not ctx.is_run_dir:
        return []
    found: dict[tuple[int, int, str], list[int]] = {}
    for r, meta in ranks_by_id(RunDir(ctx.root)).items():
        triggers = trace_triggers(meta.trace.get("triggers"))
        for w in trace_windows(meta.folder):
            a, b = (int(x) for x in w["steps"])
            found.setdefault((a, b, triggers.get(a, "schedule")), []).append(r)
    return [TimelineWindow(i + 1, a, b, t, sorted(rs))
            for i, ((a, b, t), rs) in enumerate(sorted(found.items()))]


def windows_around(ep: Episode, until: int, windows: list[TimelineWindow],
                   level_at: Callable[[int], float]) -> tuple[list[TimelineWindow],
                                                              list[TimelineWindow]]:
    """The windows before the onset that ran at a level the change departs from (the job's
    step time at them, `level_at`, below the new level by `MIN_CHANGE` for a slowdown, above
    it for a speed-up: a window at start-up, before the job settled faster, is still a
    "before" of a later slowdown), and the windows from the onset until step `until` (the
    next change the other way)."""
    after_ms = float(np.median(ep.after()))

    def departs(w: TimelineWindow) -> bool:
        lvl = level_at(w.first)
        return after_ms >= (1 + MIN_CHANGE) * lvl if ep.slower else \
            lvl >= (1 + MIN_CHANGE) * after_ms

    return ([w for w in windows if w.last < ep.onset and departs(w)],
            [w for w in windows if ep.onset <= w.first and w.last < until])


def levels(changes: list[LevelChange], steps: np.ndarray, ms: np.ndarray
           ) -> Callable[[int], float]:
    """The job's level at a step: the median of the segment between changes that holds it
    (a traced step, left out of the series, takes the segment of the next step kept)."""
    bounds = [0, *(c.at for c in changes), int(ms.size)]
    medians = [float(np.median(ms[a:b])) for a, b in itertools.pairwise(bounds)]

    def at(step: int) -> float:
        i = min(int(np.searchsorted(steps, step)), int(ms.size) - 1)
        return medians[bisect.bisect_right(bounds[1:-1], i)]

    return at


def timeline_changes(ctx: RunContext, busy: BusyTimes | None,
                     offsets: Mapping[int, int]) -> list[dict[str, Any]]:
    """`run.timeline_changes`: every episode of the job's step timeline with its strength,
    ranks and windows (module docstring), in step order; `lead` marks the one the report's
    head tells: the largest change that names ranks, else the largest. The ranks' own
    measures (the Flight Recorder's arrivals among them) are read only when there is a
    change to explain."""
    windows = run_windows(ctx)
    steps, ms = job_series(ctx.steps(["rank", "step", "step_time_ns", "traced"]), windows)
    changes = level_changes(ms)
    if not changes:
        return []
    fr = flight_basis(ctx, offsets)
    eps = episodes(changes, steps, ms, own_measures(ctx, busy, fr.lateness if fr else None))
    level_at = levels(changes, steps, ms)
    docs = [episode_doc(ep, windows_around(ep, _until(eps, i), windows, level_at))
            for i, ep in enumerate(eps)]
    size = [(bool(d["ranks"]), abs(np.log(d["ratio"] or 1.0))) for d in docs]
    docs[size.index(max(size))]["lead"] = True
    return docs


def _until(eps: list[Episode], i: int) -> int:
    """The onset of the next episode after `i` that went the other way (or past the last
    step)."""
    return min([e.onset for e in eps if e.slower != eps[i].slower and e.onset > eps[i].onset],
               default=1 << 62)


def episode_doc(ep: Episode, around: tuple[list[TimelineWindow], list[TimelineWindow]]
                ) -> dict[str, Any]:
    """One item of `run.timeline_changes` (docs/json.md), with its sentence."""
    confidence, test = strength(ep)
    (b0, b1), (a0, a1) = ep.span()
    before, after = float(np.median(ep.before())), float(np.median(ep.after()))
    doc: dict[str, Any] = {
        "onset_step": ep.onset, "direction": "slower" if ep.slower else "faster",
        "before": {"first_step": b0, "last_step": b1, "steps": int(ep.before().size),
                   "median_ms": round(before, 3)},
        "after": {"first_step": a0, "last_step": a1, "steps": int(ep.after().size),
                  "median_ms": round(after, 3)},
        "ratio": round(after / before, 3) if before > 0 else None,
        "further": [{"step": int(ep.steps[c.at]), "before_ms": round(c.before, 3),
                     "after_ms": round(c.after, 3)} for c in ep.changes[1:]],
        "confidence": confidence, "test": test, **ep.moves,
        "windows_before": [w.as_dict() for w in around[0]],
        "windows_after": [w.as_dict() for w in around[1]],
        "windows_compared": None, "lead": False,
    }
    doc["summary"] = summary(doc)
    return doc


def summary(doc: Mapping[str, Any]) -> str:
    """The change in one sentence, as the report prints it."""
    b, a = doc["before"]["median_ms"], doc["after"]["median_ms"]
    ratio = doc["ratio"]
    how = (f"{ratio:.2f}x slower" if doc["direction"] == "slower" else
           f"{1 / ratio:.2f}x faster" if ratio else "faster")
    out = f"from step {doc['onset_step']}, steps {how} ({b:.0f} -> {a:.0f} ms"
    if doc["further"]:
        out += ", moving again at step" + ("s " if len(doc["further"]) > 1 else " ") + \
            ", ".join(str(f["step"]) for f in doc["further"])
    out += ")"
    if doc["confidence"] == "suspected":
        out = "suspected: " + out
    return f"{out}; {_ranks_words(doc)}{_windows_words(doc)}"


def _ranks_words(doc: Mapping[str, Any]) -> str:
    if doc["every_rank"]:
        return "every rank's own time moved alike"
    if not doc["rank_changes"]:
        return "no rank's own time moved (a cause they share: the machine, the network)"
    return ", ".join(f"rank {c['rank']} ({_from(c)}{c['what']} {c['before_ms']:.1f} -> "
                     f"{c['after_ms']:.1f} ms, the others' {c['others_delta_ms']:+.1f} ms)"
                     for c in doc["rank_changes"][:3]) + \
        (f" and {len(doc['rank_changes']) - 3} more" if len(doc["rank_changes"]) > 3 else "")


def _from(c: Mapping[str, Any]) -> str:
    return f"from step {c['onset_step']}, " if c["onset_step"] is not None else ""


def _windows_words(doc: Mapping[str, Any]) -> str:
    def name(w: Mapping[str, Any]) -> str:
        a, b = w["steps"]
        trig = "" if w["trigger"] == "schedule" else f" ({w['trigger']} trigger)"
        return f"window {w['window']}{trig}, steps {a}-{b},"

    parts = []
    if doc["windows_after"]:
        parts.append(f"{name(doc['windows_after'][-1])} covers the {doc['direction']} stretch")
    if doc["windows_before"]:
        parts.append(f"{name(doc['windows_before'][-1])} the one before")
    if not parts:
        return "; no trace window on either side"
    return "; " + " and ".join(parts).replace(",,", ",")
