"""Straggler and data-stall indications from the step timelines alone, while the job runs.

Before a trace window is analysed, the only evidence is each rank's host step time and data
wait per step (`steps.jsonl`). The indications are held to the diagnosis's own rules, not to
thresholds of their own:

- **Straggler**: each of the last `WINDOW` steps that every rank finished is one instance, and
  a rank's lateness in it is its step time (then, separately, its data wait) beyond the fastest
  rank's. `stragglers.straggler_test` decides, with its sole-last frequency
  test (Poisson-binomial, Bonferroni over ranks) and its materiality rules: confirmed,
  suspected, or nothing. In a synchronous job (DDP) ranks wait for each other, so step times
  are alike and only a data-loader straggler shows in them; where the run has busy time
  (`busy.py`: the training thread's CPU time, CPU runs), the same test on it shows a
  rank that computes more, and at most suspects it where its extra wait for a core is larger
  still (`busy.os_outweighs`) or its extra CPU time is slight (`busy.is_slight`), as the
  diagnosis does. The trace window tells the rest.
- **Data stall**: a rank whose data wait is at least the diagnosis's `MIN_SHARE` of its step
  time over the window; its confidence is `evidence.count_test`'s (too few
  steps: suspected).

Only ranks that do the same work are compared (**peers**). In a pipeline the stages do
different work by design, so one stage's longer step or CPU time is no straggler: the layout
each rank recorded in its rank.json (`process_groups`, `parallel_apis`) tells which ranks are
one stage's (`peer_sets`), the straggler test runs within each stage that has several ranks
(its data-parallel replicas) and not at all in a pipeline of one rank per stage, and a note
says so (a `pipeline_imbalance` signal of confidence "none": the imbalance of the stages is
judged by `uberprof report`, from the traces). A run without a pipeline, or whose ranks
recorded no layout (older runs), compares all its ranks, as before.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from uberprof.analysis.diagnosis.busy import (
    MATERIAL_EXCESS,
    excess_over_others,
    followed_busy,
    followed_run_wait,
    is_slight,
    os_outweighs,
    wait_per_cpu,
)
from uberprof.analysis.diagnosis.evidence import count_test
from uberprof.analysis.diagnosis.lateness import Series, matrix_lateness
from uberprof.analysis.diagnosis.model import MIN_SHARE
from uberprof.analysis.diagnosis.saved import SavedFindings, read_saved_findings
from uberprof.analysis.diagnosis.stragglers import (
    BASIS_STEP_TIMELINE,
    StragglerTest,
    straggler_test,
)
from uberprof.analysis.tables.parallelism import is_pipeline_group, mesh_dim
from uberprof.rundir import RANK_FILE
from uberprof.rundir.ranks import ranks_by_id

if TYPE_CHECKING:
    from uberprof.rundir.follow import RunFollower

__all__ = ["SOURCE_DIAGNOSIS", "SOURCE_LIVE", "WINDOW", "Peers", "Signal", "diagnosed",
           "followed_peers", "followed_signals", "peer_sets", "step_signals"]

WINDOW = 100  # the latest steps every rank finished: what "now" means for an indication
SOURCE_LIVE = "live, from the step timelines"
SOURCE_DIAGNOSIS = "saved diagnosis of every step"


@dataclass(frozen=True)
class Signal:
    """One indication: what, on which rank, how sure, and the test behind it in words."""

    kind: str  # "straggler" | "data_stall" | "pipeline_imbalance" (the diagnosis's kinds)
    rank: int  # -1: the run's, no one rank's (the pipeline note)
    confidence: str  # "confirmed" | "suspected"; "none": a note, no verdict (the pipeline's)
    title: str
    test: dict[str, Any]  # evidence.Test.as_dict()
    source: str = SOURCE_LIVE  # where it comes from, in words (SOURCE_LIVE | SOURCE_DIAGNOSIS)


def diagnosed(found: list[Signal], saved: SavedFindings | None,
              ended_ns: int | None) -> list[Signal]:
    """`found` with the straggler verdict of the saved diagnosis in place of the step
    timelines' indication, where that diagnosis was made after the job ended: it covers every
    step the indication looks at, from stronger evidence (every arrival at the collectives,
    traced and Flight Recorder, with busy time), so `uberprof watch`, the live dashboard and
    `uberprof report` say the same on the same steps. Where the diagnosis names no straggler
    and the step timelines hinted at one, a note says the diagnosis cleared it and why."""
    if saved is None or ended_ns is None or saved.saved_ns < ended_ns:
        return found
    rest = [s for s in found if s.kind != "straggler"]
    hinted = [s for s in found if s.kind == "straggler"]
    named = [f for f in saved.findings if f.get("kind") == "straggler" and f.get("ranks")]
    if named:
        f = named[0]
        test = (f.get("evidence") or {}).get("test") or {}
        return [Signal("straggler", int(f["ranks"][0]), str(f.get("confidence", "confirmed")),
                       str(f.get("title", "")), test, SOURCE_DIAGNOSIS), *rest]
    if not hinted:
        return rest
    t = saved.straggler_test or {}
    why = (t.get("test") or {}).get("sentence") or "no straggler test (no matched collective)"
    title = (f"no straggler: the step timelines hinted at rank {hinted[0].rank}, but the "
             f"diagnosis of every step does not name it ({why})")
    return [Signal("straggler", -1, "none", title, t.get("test") or {}, SOURCE_DIAGNOSIS),
            *rest]


def _matrix(series: Sequence[Series], window: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(ranks, steps, values[rank, step]) over the latest `window` steps that every rank has."""
    last = min(int(s[-1]) for _, s, _ in series)
    lo = last - window + 1
    m = np.full((len(series), window), np.nan)
    for i, (_, s, v) in enumerate(series):
        a, b = np.searchsorted(s, lo), np.searchsorted(s, last, side="right")  # s is in order
        m[i, s[a:b] - lo] = v[a:b]
    done = ~np.isnan(m).any(axis=0)
    return [r for r, _, _ in series], np.arange(lo, last + 1)[done], m[:, done]


def _straggler(ranks: list[int], steps: np.ndarray, times: np.ndarray, waits: np.ndarray,
               busy: tuple[np.ndarray, np.ndarray] | None,
               run_wait: tuple[np.ndarray, np.ndarray] | None = None) -> Signal | None:

    median_step = float(np.median(times))
    wall = float(times.max(axis=0).sum())  # the ranks run in parallel
    bases = [("step time", steps, times), ("data wait", steps, waits)]
    if busy is not None:
        bases.append(("CPU time", *busy))
    for what, s, m in bases:
        t = straggler_test(matrix_lateness(ranks, s, m, what), median_step, wall,
                           basis=BASIS_STEP_TIMELINE)
        if t is None or t.decision == "none":
            continue
        outweighed = ""
        if what == "CPU time" and t.decision == "confirmed":
            outweighed = _held_to_busy_rules(t, ranks, s, m, median_step, run_wait)
        verb = "is a straggler" if t.decision == "confirmed" else \
            "may be a straggler (suspected)"
        title = (f"rank {t.rank} {verb}: the longest {what} in {t.last} of the last "
                 f"{t.instances} steps, {t.median_lead_ns / 1e6:,.1f} ms over the others' "
                 "median" + outweighed)
        return Signal("straggler", t.rank, t.decision, title, t.as_test().as_dict())
    return None


def _held_to_busy_rules(t: StragglerTest, ranks: list[int], steps: np.ndarray,
                        cpu: np.ndarray, median_step: float,
                        run_wait: tuple[np.ndarray, np.ndarray] | None) -> str:
    """A CPU-time verdict held to the diagnosis's busy-time rules (busy.py): suspected where
    its extra wait for a core outweighs its extra CPU time (`os_outweighs`) or that extra is
    slight (`is_slight`); what the title adds, in words ("" where it stays confirmed)."""
    i = ranks.index(t.rank)
    rw, per_cpu = _run_wait_excess(i, steps, cpu, *run_wait) if run_wait is not None else \
        (None, 0.0)
    if os_outweighs(rw, t.median_lead_ns, MATERIAL_EXCESS * median_step, per_cpu):
        assert rw is not None
        t.decision, t.outweighed_by_os = "suspected", True
        return (f"; but its wait for a core is {rw / 1e6:+,.1f} ms a step over the others', "
                "more than its extra CPU time: other load on its host")
    others = float(np.median(np.delete(cpu, i, axis=0)))
    if is_slight(t.median_lead_ns, others):
        t.decision, t.slight = "suspected", True
        return (f"; {100 * t.median_lead_ns / others:+.1f}% of the others' CPU time, no more "
                "than a slower core")
    return ""


def _run_wait_excess(i: int, steps: np.ndarray, cpu: np.ndarray, rw_steps: np.ndarray,
                     rw: np.ndarray) -> tuple[int | None, float]:
    """Row `i`'s run-queue wait over the other rows' median on `steps` (median over the steps
    that have every rank's), and the others' wait per ns of CPU (`busy.wait_per_cpu`); None
    and 0 where fewer than half of `steps` have it."""
    keep = np.isin(rw_steps, steps)
    if int(keep.sum()) < max(1, steps.size // 2):
        return None, 0.0
    on = np.isin(steps, rw_steps[keep])
    return excess_over_others(rw[:, keep], i), \
        wait_per_cpu(np.delete(rw[:, keep], i, axis=0), np.delete(cpu[:, on], i, axis=0))


def _data_stall(ranks: list[int], times: np.ndarray, waits: np.ndarray) -> Signal | None:

    share = waits.sum(axis=1) / np.maximum(times.sum(axis=1), 1)
    hit = np.flatnonzero(share >= MIN_SHARE)
    if not hit.size:
        return None
    i = int(hit[np.argmax(share[hit])])
    rank, steps = ranks[i], int(times.shape[1])
    pct = 100 * float(share[i])
    confidence, test = count_test(
        f"data wait on rank {rank}, {pct:.0f}% of its step time over the last {steps} step(s) "
        f"(threshold {100 * MIN_SHARE:.0f}%)", int((waits[i] > 0).sum()), steps)
    title = (f"rank {rank} waits for data {pct:.0f}% of its step time"
             + (f" ({hit.size} ranks over {100 * MIN_SHARE:.0f}%)" if hit.size > 1 else "")
             + ("" if confidence == "confirmed" else " (suspected)"))
    return Signal("data_stall", rank, confidence, title, test.as_dict())


def step_signals(times: Sequence[Series], waits: Sequence[Series], window: int = WINDOW,
                 busy: Sequence[Series] | None = None,
                 peers: Sequence[Sequence[int]] | None = None,
                 run_wait: Sequence[Series] | None = None) -> list[Signal]:
    """The indications of the latest `window` steps every rank finished: `times` and `waits`
    are per rank (rank, steps, step time ns) and (rank, steps, data wait ns), in step order
    (`RunFollower.series`); `busy`, where the run has busy time, likewise
    (`analysis.busy.followed_busy`), and the run-queue wait (`followed_run_wait`). `peers`:
    the sets of ranks that do the same work (`peer_sets`); a straggler is sought within each
    set of two or more ranks only (one signal per set at most). None: every rank is every
    other's peer. None before any step."""
    times = [x for x in times if x[1].size]
    if not times:
        return []
    ranks, steps, t = _matrix(times, window)
    by_rank = {r: (s, v) for r, s, v in waits}
    _, _, w = _matrix([(r, *by_rank.get(r, (s, np.zeros_like(v)))) for r, s, v in times], window)
    if not steps.size or w.shape != t.shape:
        return []
    w = np.nan_to_num(w)
    b = None
    busy_of = {r: (s, v) for r, s, v in busy or () if s.size}
    if busy_of.keys() == set(ranks):  # every rank, or no busy basis at all
        _, b_steps, b_m = _matrix([(r, *busy_of[r]) for r in ranks], window)
        b = (b_steps, b_m) if b_steps.size else None
    q = None
    wait_of = {r: (s, v) for r, s, v in run_wait or () if s.size}
    if b is not None and wait_of.keys() == set(ranks):
        _, q_steps, q_m = _matrix([(r, *wait_of[r]) for r in ranks], window)
        q = (q_steps, q_m) if q_steps.size else None
    row = {r: i for i, r in enumerate(ranks)}
    out = []
    for group in ([ranks] if peers is None else peers):
        rows = [row[r] for r in group if r in row]
        if len(rows) > 1:
            out.append(_straggler([ranks[i] for i in rows], steps, t[rows], w[rows],
                                  (b[0], b[1][rows]) if b is not None else None,
                                  (q[0], q[1][rows]) if q is not None else None))
    out.append(_data_stall(ranks, t, w))
    return [s for s in out if s is not None]


@dataclass(frozen=True)
class Peers:
    """Which ranks do the same work, from the layout the ranks recorded."""

    sets: list[list[int]] | None  # None: all ranks are peers (no pipeline, or no layout)
    stages: int = 0  # the pipeline's stages; 0: no pipeline

    def note(self) -> Signal | None:
        """What the screen says where the run is a pipeline (module docstring)."""
        if not self.stages:
            return None
        within = "ranks of one stage are compared with each other only" \
            if any(len(s) > 1 for s in self.sets or ()) else \
            "no rank is compared with another on step or CPU time"
        title = (f"pipeline of {self.stages} stage{'s' if self.stages != 1 else ''}: the stages "
                 "do different work by design, "
                 f"so {within}; stage imbalance is judged by `uberprof report` from the traces")
        return Signal("pipeline_imbalance", -1, "none", title,
                      {"name": "pipeline stages", "sentence": title})


def _stage_key(rank: int, meta: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The work `rank` does, from its rank.json: ("stage", i) in a pipeline group (a process
    group named like a pipeline dimension: its index there is its stage), ("rank", rank) in a
    pipeline without one (torch.distributed.pipelining imported, and no device-mesh dimension
    names something else), ("all",) where it is no pipeline stage; None: no layout recorded."""
    apis = meta.get("parallel_apis")
    if not isinstance(apis, list):
        return None
    pgs = meta.get("process_groups")
    groups = [g for g in (pgs if isinstance(pgs, list) else []) if isinstance(g, dict)
              and isinstance(g.get("ranks"), list) and rank in g["ranks"]]
    for g in groups:
        if len(g["ranks"]) > 1 and is_pipeline_group(g.get("desc")):
            return ("stage", g["ranks"].index(rank))
    if "pipelining" not in apis:
        return ("all",)
    named = [g for g in groups if len(g["ranks"]) > 1 and (d := mesh_dim(g.get("desc")))
             and not re.fullmatch(r"dim_\d+|default", d)]
    return ("all",) if named else ("rank", rank)  # a mesh without a pipeline dimension


def peer_sets(metas: Mapping[int, Mapping[str, Any]]) -> Peers:
    """The ranks that do the same work (module docstring), from each rank's rank.json (as
    written: `RankMeta.raw`). A rank without a layout in a pipeline run is nobody's peer."""
    keys = {r: _stage_key(r, m) for r, m in metas.items()}
    staged = {k for k in keys.values() if k is not None and k[0] != "all"}
    if not staged:
        return Peers(None)
    sets: dict[tuple[Any, ...], list[int]] = {}
    for r, k in sorted(keys.items()):
        sets.setdefault(k if k is not None else ("unknown", r), []).append(r)
    return Peers(list(sets.values()), len(staged))


_PEERS: weakref.WeakKeyDictionary[Any, tuple[Any, Peers]] = weakref.WeakKeyDictionary()


def followed_peers(follower: RunFollower) -> Peers:
    """`peer_sets` of a followed run, read again only when a rank.json changed."""
    followed = follower.step_followers()
    key = []
    for r, f in sorted(followed.items()):
        try:
            st = (f.path.parent / RANK_FILE).stat()
            key.append((r, st.st_mtime_ns, st.st_size))
        except OSError:
            key.append((r, None, None))
    seen = _PEERS.get(follower)
    if seen is not None and seen[0] == key:
        return seen[1]
    metas = ranks_by_id(follower.run)
    peers = peer_sets({r: m.raw for r, m in metas.items() if r in followed})
    _PEERS[follower] = (key, peers)
    return peers


def followed_signals(follower: RunFollower, window: int = WINDOW) -> list[Signal]:
    """The indications of a run followed while its job runs (`uberprof watch`, the live
    dashboard): step time, data wait and, where the run has it, busy time per rank, each
    rank compared with its peers only (`followed_peers`); in a pipeline, a note that says so.
    Once the job ended and a diagnosis was saved, its straggler verdict (`diagnosed`)."""
    peers = followed_peers(follower)
    found = step_signals(follower.series("duration_ns"), follower.series("data_wait_ns"),
                         window, busy=followed_busy(follower, window), peers=peers.sets,
                         run_wait=followed_run_wait(follower, window))
    ended = follower.ended_ns()  # the saved diagnosis matters only once the job ended
    found = diagnosed(found, read_saved_findings(follower.run) if ended is not None else None,
                      ended)
    note = peers.note()
    return found + [note] if note is not None else found
