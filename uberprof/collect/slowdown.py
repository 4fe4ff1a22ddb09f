"""The slowdown trigger (on by default; `uberprof run --no-trace-on-slowdown` turns it off): a
trace window on every rank when the job's step time, or one rank's lateness, rises beyond its
own recent level.

It runs in the node agent, never in a rank: the hang watchdog (watchdog.py) already reads what
each local rank's step timeline grew by, and hands every step it reads to `SlowdownTrigger`.
Two signals, each a series of one value per step, are watched by the same change-point test:
- the step time: the median over the node's ranks that finished the step (in a synchronous job
  every rank's step lasts as long as the slowest rank's: one slow rank shows in all of them);
- each local rank's lateness: its own work in the step (`cpu_ns`, the training thread's CPU
  time less uberprof's) over the median of its peers': the node's other ranks and, where the
  run directory is shared, up to 8 ranks of other nodes that the watchdog reads too
  (`peer_read`; with one rank a node, the job's ranks are its only peers). A rank that computes more than
  before stands out here even when the job's step barely moves (it fell behind inside slack:
  the others waited less), and the job's own phases (evaluation, a checkpoint) move every rank
  alike and cancel. It needs one peer that reports its CPU time; work off the CPU (sleep,
  I/O, a GPU kernel) shows only in the step time.

The change-point test (`SlowdownDetector`), robust to noise and to isolated spikes:
- level: the median of the last `recent` values (20);
- baseline: the median and the MAD of up to `baseline` values before them (200, at least 50:
  no verdict before a series has 70 values, so a job shorter than that never triggers);
- a rise: the level exceeds the baseline by more than `mad_k` (4) scaled MADs and by more
  than `min_rise` (20%) of it (the threshold), and at least two thirds of the recent values
  are above half that rise (a lasting level, not a burst). A checkpoint, an evaluation pass or
  a garbage collection is one long step (steps are optimizer steps): a few of those among 20
  move neither the median nor the two thirds.
- after a trigger every series' history is dropped, so the new levels become the next
  baselines (a job that stays slow triggers once).

A budget (`Budget`) bounds the windows: at most `max_per_run` (3) a run and `max_per_hour` (1)
an hour, and none once the run directory's traces (every window's files) exceed the disk
budget (`--trace-disk-budget`, by default the smaller of 5 GB and a tenth of the disk's free
space when the run starts). A rise over budget is logged and recorded, not traced.

On a rise it asks for a window exactly as `uberprof trace` does (collect/trace_request.py): a
request file in the run directory naming a step ahead of the job's last, with `trigger`
(`slowdown` when the step time rose, `lateness` when only ranks' lateness did), `involved`
(the ranks whose lateness rose, when any did) and `reason` (in words). With `--trace-ranks`
the window is on the involved ranks plus at least one healthy `reference` rank (one of the
selected ranks, else the node's least late one); without it, on every rank. Its name is the
trigger's slot (`trace-slowdown-<n>.json`), created exclusively, so on a shared run directory
the node that sees the rise first asks, and the others' requests for the same slot are not
written: they record the request they found (`asked_by`, its window). Nodes that do not share
the run directory (it shows fewer ranks than the world: `scope`, said once in the log) each ask
their own ranks, at steps of their own.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.collect.safety import AgentLog
from uberprof.rundir.layout import TRACES_DIR, RunDir

MAD_SCALE = 1.4826  # MAD to standard deviation under normal noise
GATE_REFRESH = 10  # values between two full reads of a series' baseline
GATE_SHARE = 0.8  # a recent level below this share of the rise is not tested in full
HOUR_NS = 3600 * 1_000_000_000
PEER_STEPS_KEPT = 1000  # other nodes' steps kept ahead of this node's (a node gone quiet)
SCOPE_AFTER_STEPS = 5  # steps watched before the ranks the run directory shows are judged


@dataclass(frozen=True)
class SlowdownSettings:
    recent: int = 20
    baseline: int = 200
    min_baseline: int = 50
    mad_k: float = 4.0
    min_rise: float = 0.2
    max_per_run: int = 3
    max_per_hour: int = 1
    window_steps: int = 5
    disk_budget_bytes: int | None = None  # None: no disk budget (the CLI always sets one)
    lateness: bool = True  # also watch each rank's lateness (its CPU time against its peers')


@dataclass
class Slowdown:
    """A detected rise of one series at `step`: the level of the recent values against the
    baseline's, and the step from which the recent ones stay above half the rise (`onset`).
    `rank` is None for the node's step time, else the rank whose lateness rose (values are
    then ratios to the other ranks' work)."""

    step: int
    onset: int
    baseline_s: float
    level_s: float
    threshold_s: float
    rank: int | None = None

    def words(self) -> str:
        if self.rank is not None:
            return (f"rank {self.rank}'s work per step rose from {self.baseline_s:.2f}x to "
                    f"{self.level_s:.2f}x the other ranks' from step {self.onset} on")
        return (f"step time rose from {self.baseline_s * 1e3:.0f} to {self.level_s * 1e3:.0f} ms "
                f"from step {self.onset} on")


class Budget:
    """How many windows the trigger may still ask for: `max_per_run` and `max_per_hour`, and
    the disk budget of the run directory's traces. `take` says why not, or records a window."""

    def __init__(self, settings: SlowdownSettings, run_root: Path | None = None) -> None:
        self.s = settings
        self.run_root = run_root
        self.fired_ns: list[int] = []
        self.suppressed = 0  # rises the budget left without a window

    def take(self, now_ns: int) -> str | None:
        """None when a window may be asked for (and counts it), else why not (counted apart)."""
        reason = None
        if len(self.fired_ns) >= self.s.max_per_run:
            reason = f"over the budget of {self.s.max_per_run} triggered windows a run"
        elif sum(now_ns - t < HOUR_NS for t in self.fired_ns) >= self.s.max_per_hour:
            reason = f"over the budget of {self.s.max_per_hour} triggered window(s) an hour"
        elif self.s.disk_budget_bytes is not None and self.run_root is not None:
            used = traces_bytes(self.run_root)
            if used > self.s.disk_budget_bytes:
                reason = (f"the run's traces take {used / 1e6:.0f} MB, over the disk budget "
                          f"of {self.s.disk_budget_bytes / 1e6:.0f} MB (--trace-disk-budget)")
        if reason is not None:
            self.suppressed += 1
            return reason
        self.fired_ns.append(now_ns)
        return None


class SlowdownDetector:
    """Feed it each step's value in order. `check` says whether the level rose (and keeps the
    history); `add` also drops the history on a rise and returns it only if the budget
    allows a window (the trigger's own series; the lateness series share its budget)."""

    def __init__(self, settings: SlowdownSettings | None = None, budget: Budget | None = None,
                 rank: int | None = None) -> None:
        self.s = settings or SlowdownSettings()
        self.budget = budget or Budget(self.s)
        self.rank = rank
        self._steps: deque[tuple[int, float]] = deque(maxlen=self.s.baseline + self.s.recent)
        self._recent: deque[float] = deque(maxlen=self.s.recent)
        self._added = 0  # values since the last reset
        self._gate: tuple[int, float] | None = None  # (at `_added`, the level that asks more)

    @property
    def fired_ns(self) -> list[int]:
        return self.budget.fired_ns

    @property
    def suppressed(self) -> int:
        return self.budget.suppressed

    def reset(self) -> None:
        """Forget the history: the current level becomes the next baseline."""
        self._steps.clear()
        self._recent.clear()
        self._added = 0
        self._gate = None

    def check(self, step: int, value: float) -> Slowdown | None:
        """Append `value` (step `step`); the rise, if the recent level is one. The baseline's
        median and MAD (sorting 200 values) are taken again every `GATE_REFRESH` values only:
        a recent level below `GATE_SHARE` of their rise is no rise (the baseline moves little
        in 10 of its 200 values), and one above it is tested in full. The node agent then
        spends a few µs per series a step (benchmarks/slowdown.py --cost)."""
        self._steps.append((step, value))
        self._recent.append(value)
        self._added += 1
        if len(self._steps) < self.s.min_baseline + self.s.recent:
            return None
        if self._gate is None or self._added - self._gate[0] >= GATE_REFRESH:
            found = self.level()
            assert found is not None
            f = found[0]
            self._gate = (self._added,
                          f.baseline_s + GATE_SHARE * (f.threshold_s - f.baseline_s))
        if statistics.median(self._recent) <= self._gate[1]:
            return None
        found = self.level()
        return found[0] if found is not None and found[1] else None

    def level(self) -> tuple[Slowdown, bool] | None:
        """The recent level against the baseline, and whether it is a rise; None before the
        series is long enough."""
        s = self.s
        if len(self._steps) < s.min_baseline + s.recent:
            return None
        values = [v for _, v in self._steps]
        base, recent = values[:-s.recent], values[-s.recent:]
        med = statistics.median(base)
        mad = statistics.median(abs(v - med) for v in base)
        threshold = med + max(s.mad_k * MAD_SCALE * mad, s.min_rise * med)
        level = statistics.median(recent)
        above = [v > (med + threshold) / 2 for v in recent]
        rose = level > threshold and 3 * sum(above) >= 2 * len(above)
        recent_steps = [st for st, _ in list(self._steps)[-s.recent:]]
        # the onset: where the recent values turn above half the rise for good, the start that
        # maximises (values above) - (values below) from it on, the latest of equal ones (a
        # stray slow step before the rise, even one just before it, is not the onset: a slow
        # step then a fast one add nothing)
        scores = [sum(1 if up else -1 for up in above[i:]) for i in range(len(above))]
        best = max(scores)
        onset = recent_steps[max(i for i, v in enumerate(scores) if v == best)]
        return Slowdown(self._steps[-1][0], onset, med, level, threshold, self.rank), rose

    def add(self, step: int, seconds: float, now_ns: int | None = None) -> Slowdown | None:
        found = self.check(step, seconds)
        if found is None:
            return None
        self.reset()
        now = time.time_ns() if now_ns is None else now_ns
        return found if self.budget.take(now) is None else None


def traces_bytes(run_root: Path) -> int:
    """The bytes of every rank's trace windows in the run directory (`ranks/*/traces/`)."""
    total = 0
    try:
        ranks = list(os.scandir(RunDir(run_root).ranks_dir))
    except OSError:
        return 0
    for rank in ranks:
        try:
            with os.scandir(Path(rank.path) / TRACES_DIR) as files:
                total += sum(f.stat().st_size for f in files if f.is_file())
        except OSError:
            continue
    return total


DISK_BUDGET_MAX = 5 * 10**9  # the default disk budget's cap: a few hundred windows of a big job


def default_disk_budget(run_root: Path) -> int:
    """The default disk budget: the smaller of 5 GB and a tenth of the free space of the disk
    that holds the run directory (or of its nearest existing parent) now."""
    path = run_root
    while not path.exists() and path.parent != path:
        path = path.parent
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return DISK_BUDGET_MAX
    return min(DISK_BUDGET_MAX, free // 10)


@dataclass
class SlowdownTrigger:
    """The node agent's side: step times (and each rank's CPU time) from the watchdog's reads,
    one step at a time once every local rank that is still running finished it, and a request
    when a series rose. `on_detection` is told after each detection (node.json follows)."""

    run_root: Path
    log: AgentLog
    settings: SlowdownSettings = field(default_factory=SlowdownSettings)
    trace_ranks: tuple[int, ...] | None = None  # `--trace-ranks`: windows on these only
    on_detection: Callable[[], None] | None = None
    detections: list[dict[str, Any]] = field(default_factory=list)
    node: str = ""  # this node's folder in the run directory, and its host: who asked
    host: str = ""
    # ask once the watchdog's read of every rank is through (`scope`, at each poll's end), so
    # the window starts past the last step of that read, not of the rows read so far
    ask_at_poll_end: bool = False

    def __post_init__(self) -> None:
        self.budget = Budget(self.settings, self.run_root)
        self.detector = SlowdownDetector(self.settings, self.budget)
        self.lateness: dict[int, SlowdownDetector] = {}
        self._pending: dict[int, dict[Any, tuple[float, float | None]]] = {}
        self._recent: deque[float] = deque(maxlen=self.settings.recent)  # step times
        self._baseline_s = 0.0  # the step time's baseline at the last detection
        self.cpu_ns = 0  # this trigger's own CPU time (the node agent's watchdog thread)
        self.watched = 0  # steps handed to the detectors
        self._next = 0  # the next step to hand to the detectors
        self._latest = -1  # the last step any local rank finished, as read so far
        self._peers: dict[int, dict[int, float]] = {}  # step: other nodes' ranks' CPU time
        self.peer_ranks: set[int] = set()  # the other nodes' ranks read (watchdog.PEER_RANKS)
        self.shared: bool | None = None  # does the run directory show every rank of the job
        self._to_ask: list[dict[str, Any]] = []  # detections waiting for the poll's end
        self.ranks_seen = 0
        self.world_size = 0

    def step_read(self, rank: Any, step: int, seconds: float, local_ranks: int,
                  cpu_s: float | None = None) -> None:
        """Rank `rank` of this node finished `step` in `seconds` (`cpu_s` of them on its
        training thread's CPU, if known); never raises. Its own CPU time adds up in
        `cpu_ns` (node.json's `slowdowns.watch_cpu_ms`)."""
        start = time.thread_time_ns()
        try:
            self._latest = max(self._latest, step)
            if step < self._next:
                return
            self._pending.setdefault(step, {})[rank] = (seconds, cpu_s)
            while self._pending:
                first = min(self._pending)
                times = self._pending[first]
                # complete when every local rank finished it, or when a later step is
                # complete on all (a rank gone: go on with the others)
                later_done = any(len(v) >= local_ranks for s, v in self._pending.items()
                                 if s > first)
                if len(times) < local_ranks and not later_done:
                    break
                del self._pending[first]
                self._next = first + 1
                self.watched += 1
                self._step_done(first, times)
        except Exception as exc:  # noqa: BLE001 - the trigger is a courtesy, the job goes on
            self.log.error("the slowdown trigger", exc)
        finally:
            self.cpu_ns += time.thread_time_ns() - start

    def peer_read(self, rank: int, step: int, cpu_s: float | None) -> None:
        """Rank `rank` of another node (the run directory is shared) finished `step` with
        `cpu_s` on its training thread's CPU: one more peer for this node's ranks' lateness at
        that step. Never raises; costs count in `cpu_ns`."""
        start = time.thread_time_ns()
        try:
            self.peer_ranks.add(rank)
            if cpu_s is None or step < self._next:
                return
            self._peers.setdefault(step, {})[rank] = cpu_s
            while len(self._peers) > PEER_STEPS_KEPT:  # this node stopped finishing steps
                del self._peers[min(self._peers)]
        except Exception as exc:  # noqa: BLE001 - the trigger is a courtesy, the job goes on
            self.log.error("the slowdown trigger", exc)
        finally:
            self.cpu_ns += time.thread_time_ns() - start

    def scope(self, ranks_seen: int, world_size: int) -> None:
        """The watchdog's poll is through, and the run directory shows `ranks_seen` of the
        job's `world_size` ranks: the detections of this read ask now. Fewer ranks than the
        world, once this node's ranks run steps (every rank registered before its first
        step): the nodes do not share it, and the trigger asks this node's ranks only, at the
        steps this node sees; said once in the node's log. Never raises."""
        start = time.thread_time_ns()
        try:
            self._judge_scope(ranks_seen, world_size)
            while self._to_ask:
                self._finish(self._to_ask.pop(0))
        except Exception as exc:  # noqa: BLE001 - the trigger is a courtesy, the job goes on
            self.log.error("the slowdown trigger", exc)
        finally:
            self.cpu_ns += time.thread_time_ns() - start

    def _judge_scope(self, ranks_seen: int, world_size: int) -> None:
        if self.watched < SCOPE_AFTER_STEPS or world_size <= 0:
            return
        self.ranks_seen, self.world_size = ranks_seen, world_size
        shared = ranks_seen >= world_size
        if shared is False and self.shared is not False:
            self.log.notice(
                f"the run directory shows {ranks_seen} of the job's {world_size} ranks (the "
                "nodes do not share it): a slowdown seen here opens a window on this node's "
                "ranks only, at steps of its own; other nodes decide for theirs",
                key="slowdown-scope")
        changed, self.shared = shared != self.shared, shared
        if changed and self.on_detection is not None:
            self.on_detection()  # node.json says it while the job runs (`uberprof info`)

    def _step_done(self, step: int, times: dict[Any, tuple[float, float | None]]) -> None:
        step_s = statistics.median(v[0] for v in times.values())
        self._recent.append(step_s)
        rose = self.detector.check(step, step_s)
        peers = self._peers.pop(step, {})
        for old in [s for s in self._peers if s < step]:
            del self._peers[old]
        late = [f for f in (self._late(step, rank, times, peers) for rank in times)
                if f is not None]
        if rose is None and not late:
            return
        levels = {r: lv for r, d in self.lateness.items() if (lv := d.level()) is not None}
        now = self.detector.level()  # the step time's baseline, risen or not
        self._baseline_s = now[0].baseline_s if now is not None else step_s
        involved = sorted({f.rank for f in late if f.rank is not None} |
                          {r for r, (f, _) in levels.items() if _elevated(f)})
        for d in (self.detector, *self.lateness.values()):
            d.reset()  # the new levels are the next baselines
        self._detected(step, rose, late, involved, levels)

    def _late(self, step: int, rank: Any, times: dict[Any, tuple[float, float | None]],
              peers: dict[int, float]) -> Slowdown | None:
        """Rank `rank`'s lateness at `step`: its CPU time over the median of the others' (the
        node's other ranks and the other nodes' ranks read at that step). A step for which
        fewer than half of the other nodes' ranks read were found is left out: its median
        would be the node's alone, another measure than the series'."""
        cpu = times[rank][1]
        if 2 * len(peers) < len(self.peer_ranks):
            return None
        others = [c for r, (_, c) in times.items() if r != rank and c is not None]
        others += [c for r, c in peers.items() if r != rank]
        if not self.settings.lateness or cpu is None or not isinstance(rank, int) or not others:
            return None
        peers = statistics.median(others)
        if peers <= 0:
            return None
        if rank not in self.lateness:
            self.lateness[rank] = SlowdownDetector(self.settings, self.budget, rank=rank)
        return self.lateness[rank].check(step, cpu / peers)

    def _detected(self, step: int, rose: Slowdown | None, late: list[Slowdown],
                  involved: list[int], levels: dict[int, tuple[Slowdown, bool]]) -> None:
        lead = rose or max(late, key=lambda f: f.level_s / max(f.baseline_s, 1e-9))
        ranks, reference = self._window_ranks(involved, levels)
        refused = self.budget.take(time.time_ns())
        step_level = statistics.median(self._recent)
        said = {f.rank for f in late}
        reason = "; ".join([f.words() for f in ([rose] if rose else []) + late] + [
            f"rank {r}'s work per step is {levels[r][0].level_s:.2f}x the other ranks'"
            for r in involved if r not in said and r in levels])
        record: dict[str, Any] = {
            "trigger": "slowdown" if rose else "lateness", "step": step, "onset": lead.onset,
            "baseline_ms": round(self._baseline_s * 1e3, 3),
            "level_ms": round(step_level * 1e3, 3), "involved": involved,
            "lateness": {str(r): round(f.level_s, 3) for r, (f, _) in sorted(levels.items())},
            "ranks": ranks, "reference": reference, "reason": reason,
            "window": None, "refused": refused, "requested": False, "asked_by": None}
        if self.shared is False:
            record["scope"] = "node"  # this node's ranks only: the run directory is not shared
        if self.ask_at_poll_end:
            self._to_ask.append(record)
        else:
            self._finish(record)

    def _finish(self, record: dict[str, Any]) -> None:
        """The window, ahead of the last step read on this node (the watchdog reads every
        few seconds: the ranks may be well past the step the detector just saw, and past
        the rows of this read that follow it), then the request and the line."""
        first = max(record["step"], self._latest) + _margin(record["level_ms"] / 1e3)
        record["window"] = [first, first + self.settings.window_steps - 1]
        if record["refused"] is None:
            record["requested"] = self._ask(record, len(self.budget.fired_ns))
        self.detections.append(record)
        self._say(record, len(self.detections))

    def _window_ranks(self, involved: list[int], levels: dict[int, tuple[Slowdown, bool]]
                      ) -> tuple[list[int] | None, list[int]]:
        """The window's ranks (None: every rank) and its healthy reference: with
        `--trace-ranks`, the involved ranks plus one rank measured healthy here (a selected
        one first, the least late otherwise), else a selected rank; no involved rank known,
        the selected ranks."""
        if self.trace_ranks is None:
            return None, []
        if not involved:
            return sorted(self.trace_ranks), []
        healthy = sorted((r for r, (f, _) in levels.items() if r not in involved),
                         key=lambda r: (r not in self.trace_ranks, levels[r][0].level_s, r))
        spare = [r for r in self.trace_ranks if r not in involved]
        reference = healthy[:1] or spare[:1]
        return sorted(set(involved) | set(reference)), reference

    def _ask(self, record: dict[str, Any], n: int) -> bool:
        from uberprof.collect.trace_request import write_request

        detail = {k: record[k] for k in ("involved", "reference", "reason", "onset")}
        detail["slowdown"] = record["reason"]  # the field's first name (kept for readers)
        detail["node"], detail["host"] = self.node, self.host
        if record["involved"]:
            detail["rank"] = record["involved"][0]
        # a slot another node took within the hourly budget's spacing is this rise's (nodes
        # see one rise at different steps, up to a few polls apart; a second rise that soon
        # would be over the budget anyway); one taken earlier was another rise, and the next
        # slot is this one's
        for slot in range(n, n + 2 * self.settings.max_per_run + 1):
            written = write_request(self.run_root, first=record["window"][0],
                                    steps=self.settings.window_steps, ranks=record["ranks"],
                                    trigger=record["trigger"], name=f"slowdown-{slot}",
                                    expires_s=600.0, detail=detail)
            if written is not None:
                record["asked_by"] = {"node": self.node, "host": self.host}
                return True
            other = _slot_request(self.run_root, slot)
            if other is None or self._same_rise(other):
                break
        if other is None or not self._same_rise(other):
            return False
        asker = {"node": other.get("node"), "host": other.get("host")}
        window = [other["first"], other["first"] + other["steps"] - 1]
        if window[1] < record["onset"]:  # an earlier rise, within the hour: the job's budget
            self.budget.fired_ns.pop()
            self.budget.suppressed += 1
            record["refused"] = (f"node {asker['host']} asked for steps {window[0]}-{window[1]} "
                                 f"on an earlier rise less than an hour ago, over the job's "
                                 f"budget of {self.settings.max_per_hour} triggered window(s) "
                                 "an hour")
            return False
        # the same rise, asked by the node that saw it first
        record["asked_by"], record["window"], record["ranks"] = asker, window, other.get("ranks")
        return False

    def _same_rise(self, request: dict[str, Any]) -> bool:
        """Another node's request is for the rise this node sees: made less than the hourly
        budget's spacing ago (an hour at one window an hour)."""
        created = request.get("created_ns")
        spacing = HOUR_NS // max(1, self.settings.max_per_hour)
        return isinstance(created, int) and time.time_ns() - created < spacing

    def _say(self, record: dict[str, Any], n: int) -> None:
        first, last = record["window"]
        on = "every rank" if record["ranks"] is None else \
            f"rank(s) {','.join(map(str, record['ranks']))}"
        if record["reference"]:
            on += f" (reference: rank {record['reference'][0]})"
        if record.get("scope") == "node":
            on += " of this node (the run directory is not shared)"
        if record["refused"] is not None:
            tail = f": no trace window, {record['refused']}"
        else:
            asker = (record.get("asked_by") or {}).get("host")
            tail = f": trace window on steps {first}-{last} on {on}" + \
                ("" if record["requested"] else
                 f" (asked first by node {asker})" if asker else " (another node asked first)")
        self.log.notice(f"{record['reason']}{tail}", key=f"slowdown-{n}")
        if self.on_detection is not None:
            self.on_detection()


def _slot_request(run_root: Path, slot: int) -> dict[str, Any] | None:
    """The request another node wrote in slot `slot` (its `first` and `steps` checked), or
    None when it cannot be read."""
    from uberprof.rundir.layout import REQUESTS_DIR, read_json

    try:
        req = read_json(run_root / REQUESTS_DIR / f"trace-slowdown-{slot}.json")
    except (OSError, ValueError):
        return None
    ok = isinstance(req, dict) and all(isinstance(req.get(k), int) for k in ("first", "steps"))
    return req if ok else None


def _elevated(found: Slowdown) -> bool:
    """A level above half its rise's threshold: the rank stands out, if less than a trigger."""
    return found.level_s > (found.baseline_s + found.threshold_s) / 2


def _margin(step_s: float) -> int:
    from uberprof.collect.trace_request import margin_steps

    return margin_steps(step_s)
