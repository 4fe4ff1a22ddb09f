"""The hang watchdog: a thread of the node agent (never of a rank) that watches every local
rank's step timeline grow, and captures the evidence when none of them finishes a step for
the hang timeout.

- Timeout: `--hang-timeout SECONDS`, else derived from the run as it goes: the larger of
  `MIN_TIMEOUT_S` (5 minutes) and `STEP_FACTOR` (20) times the median step time so far.
- A job still starting up is not a hang: the clock runs only once a local rank has finished a
  step (start-up, data loading and compilation can take long), and only while one is alive.
- On a hang: every live local rank gets the capture signal (stacks of all threads, written by
  faulthandler from C) and a request file its helper thread answers (hang.json, Flight
  Recorder dump); then `nodes/<node>/hang.json` records the ranks, their last steps, whether
  they are alive and answered, and their /proc state. A rank that cannot answer is not waited
  for: a stopped one (SIGSTOP, a debugger) at once, one without even the signal's stacks after
  `unresponsive_bound` (a fifth of the hang timeout). `on_hang` is told (one line on stderr);
  with action `stop` the job is then ended (SIGTERM to its process group and the local ranks,
  with SIGCONT to a stopped one, SIGKILL after `STOP_GRACE_S`). A job spanning nodes is ended
  only once the other nodes' watchdogs recorded the hang too (`_await_peers`): stopping this
  node's ranks breaks the others' collectives (Gloo raises at once), and a rank that dies before
  its own node captured it would lose its evidence and read as the culprit.
- A rank's `alive` is as at detection; one that died while the watchdog waited for answers
  (a peer node stopped its part of the job) is marked `exited_during_capture`.
- If steps resume, the record gets `resumed_ns` and the watchdog arms again.

It reads the run directory only (the same files `uberprof info` reads); each poll reads the
bytes the step files grew by, so its cost does not grow with the run. For the slowdown trigger
(`on_peer_step`) it also reads, the same way, the step timelines of up to `PEER_RANKS` ranks of
other nodes where the run directory is shared (their CPU time per step: the job's median that
each local rank's lateness is compared against), and tells (`on_scope`) how many of the job's
ranks the run directory shows: fewer than the world, it is not shared.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.collect.rank.capture import SIGNAL
from uberprof.collect.safety import AgentLog
from uberprof.rundir import NODE_FILE, RANK_FILE, STEPS_FILE, RunDir, list_ranks, write_json_atomic
from uberprof.rundir.layout import (
    HANG_REQUEST_FILE,
    NODE_HANG_FILE,
    RANK_HANG_FILE,
    STACKS_FILE,
    read_json,
)
from uberprof.rundir.ranks import step_record

MIN_TIMEOUT_S = 300.0
STEP_FACTOR = 20.0
STOP_GRACE_S = 10.0
# The ranks' helpers poll once a second and answer in well under a second on a quiet machine;
# on a loaded one (measured: 4 ranks on 2 busy cores) two of three took longer than 5 s. A hung
# job loses nothing by this wait, and it ends as soon as every live rank has answered.
ANSWER_WAIT_S = 30.0
# A rank that leaves even faulthandler's capture signal unanswered (the C handler runs as soon
# as the rank runs at all) is given up on after a fifth of the hang timeout, at least this.
UNRESPONSIVE_MIN_S = 2.0
# Other nodes' watchdogs are not visible where each node writes its own run directory: then
# ending this node's part of the job waits this long (and a poll) for them to capture theirs.
PEER_GRACE_S = 10.0
PEER_RANKS = 8  # other nodes' ranks read for the job's median CPU time a step: a sample, so
# a node agent's reads do not grow with the job (8 of a 1,000-rank job: spread over the ranks)
STOPPED_STATES = ("T", "t")  # /proc state: stopped by a signal, or by a tracer
ACTIONS = ("report", "stop")
HANG_EXIT_CODE = 124
"""`uberprof run` exits with this code after `--on-hang stop` ended the job (as `timeout` does)."""


def derived_timeout(median_step_s: float | None) -> float:
    """The default hang timeout: max(5 min, 20 x the median step)."""
    return max(MIN_TIMEOUT_S, STEP_FACTOR * (median_step_s or 0.0))


@dataclass
class _Rank:
    rank: int
    folder: Path
    pid: int | None
    signal: int | None
    helper: bool
    armed: bool = True  # rank.json said what its capture armed (the two fields above)
    offset: int = 0
    last_step: int | None = None
    last_end_ns: int | None = None
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=256))


class HangWatchdog:
    def __init__(self, run: RunDir, node_dir: Path, log: AgentLog, timeout_s: float | None = None,
                 action: str = "report", on_hang: Callable[[dict[str, Any]], None] | None = None,
                 poll_s: float | None = None,
                 on_step: Callable[[int, int, float, int, float | None], None] | None = None,
                 on_peer_step: Callable[[int, int, float | None], None] | None = None,
                 on_scope: Callable[[int, int], None] | None = None) -> None:
        self.run = run
        self.node_dir = node_dir
        self.log = log
        self.timeout_s = timeout_s
        self.action = action
        self.on_hang = on_hang
        # each step read, (rank, step, seconds, local ranks, CPU seconds or None): the slowdown
        # trigger (slowdown.py)
        self.on_step = on_step
        # each step of another node's rank read, (rank, step, CPU seconds or None); and after
        # each poll (ranks the run directory shows, the world size): the slowdown trigger
        self.on_peer_step = on_peer_step
        self.on_scope = on_scope
        self._peers: dict[Path, _Rank] = {}
        self._peers_seen = -1  # other nodes' ranks seen when the peers were chosen
        self.visible_ranks = 0  # ranks of the job the run directory shows (all nodes)
        self.poll_s = poll_s or (min(5.0, max(0.5, timeout_s / 10)) if timeout_s else 5.0)
        self.job_pid: int | None = None
        self.world_size = 0  # the largest world any local rank reported
        self.stopped_job = False
        self.hangs = 0
        self._ranks: dict[Path, _Rank] = {}
        self._record: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="uberprof-watchdog", daemon=True)

    def start(self, job_pid: int) -> None:
        self.job_pid = job_pid
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    # ---- the loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._poll()
            except Exception as exc:  # noqa: BLE001 - never harm the job
                self.log.error("hang watchdog", exc)

    def _poll(self) -> None:
        self._discover()
        if self.on_peer_step is not None:  # first: a local step then finds its peers' read
            for r in self._peers.values():
                self._read_peer(r)
        for r in self._ranks.values():
            self._read_steps(r)
        if self.on_scope is not None:
            self.on_scope(self.visible_ranks, self.world_size)
        ends = [r.last_end_ns for r in self._ranks.values() if r.last_end_ns is not None]
        if not ends:
            return  # still starting up
        progress = max(ends)
        if self._record is not None:
            if progress > self._record["last_progress_ns"]:
                self._record["resumed_ns"] = time.time_ns()
                self._write_record()
                self._record = None
            return
        alive = [r for r in self._ranks.values() if _alive(r.pid)
                 and _is_rank_process(r.pid, self.run.root)]
        if not alive:
            return
        timeout = self.current_timeout()
        if time.time_ns() - progress < timeout * 1e9:
            return
        alive = [r for r in alive if not _closing(r)]  # read only when a hang is due
        if alive:
            self._capture(progress, timeout, alive)

    def current_timeout(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        durations = [d for r in self._ranks.values() for d in r.durations]
        return derived_timeout(statistics.median(durations) if durations else None)

    def _discover(self) -> None:
        """New ranks of this node, and how to ask each for its stacks: a rank writes rank.json
        before it arms its capture and again after, so a rank first seen without `capture` is
        read again until it has one (else a hang would get nothing from it)."""
        metas = list_ranks(self.run)
        self.visible_ranks = len({m.rank for m in metas if m.rank is not None})
        if self.on_peer_step is not None:
            self._discover_peers(metas)
        for meta in metas:
            known = self._ranks.get(meta.folder)
            if meta.node == self.node_dir.name:
                self.world_size = max(self.world_size, meta.world_size or 0)
            if (known is not None and known.armed) or meta.rank is None \
                    or meta.node != self.node_dir.name:
                continue
            capture = meta.raw.get("capture")
            armed = isinstance(capture, dict)
            capture = capture if armed else {}
            sig = capture.get("signal")
            sig = sig if isinstance(sig, int) and sig == SIGNAL else None
            if known is not None:
                known.signal, known.helper, known.armed = sig, bool(capture.get("helper")), armed
                continue
            self._ranks[meta.folder] = _Rank(
                rank=meta.rank, folder=meta.folder, pid=meta.pid, signal=sig,
                helper=bool(capture.get("helper")), armed=armed)

    def _discover_peers(self, metas: list[Any]) -> None:
        """Other nodes' ranks to read (`PEER_RANKS` of them at most, spread evenly over their
        ranks), chosen again only when new ranks appear."""
        others = sorted((m for m in metas if m.rank is not None and m.node
                         and m.node != self.node_dir.name), key=lambda m: m.rank)
        if not others or len(others) == self._peers_seen:
            return
        self._peers_seen = len(others)
        stride = max(1, len(others) // PEER_RANKS)
        chosen = others[::stride][:PEER_RANKS]
        self._peers = {m.folder: self._peers.get(m.folder) or
                       _Rank(rank=m.rank, folder=m.folder, pid=None, signal=None, helper=False)
                       for m in chosen}

    def _read_peer(self, r: _Rank) -> None:
        assert self.on_peer_step is not None
        for row in _new_rows(r):
            step, cpu = row.get("step"), row.get("cpu_ns")
            if isinstance(step, int):
                self.on_peer_step(r.rank, step, cpu / 1e9 if isinstance(cpu, int) else None)

    def _read_steps(self, r: _Rank) -> None:
        for row in _new_rows(r):
            a, b = row.get("host_start_ns"), row.get("host_end_ns")
            if isinstance(b, int):
                r.last_step, r.last_end_ns = row.get("step"), b
                if isinstance(a, int) and b >= a:
                    r.durations.append((b - a) / 1e9)
                    step = row.get("step")
                    if self.on_step is not None and isinstance(step, int):
                        cpu = row.get("cpu_ns")
                        self.on_step(r.rank, step, (b - a) / 1e9, len(self._ranks),
                                     cpu / 1e9 if isinstance(cpu, int) else None)

    # ---- on a hang --------------------------------------------------------------------------

    def _capture(self, progress_ns: int, timeout: float, alive: list[_Rank]) -> None:
        self.hangs += 1
        detected = time.time_ns()
        request = {"id": self.hangs, "time_ns": detected, "node": self.node_dir.name}
        for r in alive:
            self._request(r, request)
        self._await_answers(alive, request, timeout)
        self._record = {
            "detected_ns": detected,
            "timeout_s": timeout,
            "timeout_source": "option" if self.timeout_s is not None else "derived",
            "last_progress_ns": progress_ns,
            "action": self.action,
            "resumed_ns": None,
            "ranks": [self._rank_doc(r, request, r in alive) for r in
                      sorted(self._ranks.values(), key=lambda x: x.rank)],
        }
        self._write_record()
        if self.on_hang is not None:
            try:
                self.on_hang(self._record)
            except Exception as exc:  # noqa: BLE001
                self.log.error("reporting a hang", exc)
        if self.action == "stop":
            self._await_peers(progress_ns)
            self._stop_job(alive)

    def _request(self, r: _Rank, request: dict[str, Any]) -> None:
        try:
            if r.signal is not None and r.pid is not None:
                with open(r.folder / STACKS_FILE, "w"):
                    pass  # this capture's dump only (the rank appends)
                os.kill(r.pid, r.signal)
            if r.helper:
                write_json_atomic(r.folder / HANG_REQUEST_FILE, request)
        except OSError as exc:
            self.log.write(f"hang capture request to rank {r.rank} (pid {r.pid}): {exc!r}")

    def _await_answers(self, ranks: list[_Rank], request: dict[str, Any], timeout: float
                       ) -> None:
        """Wait until every live rank's helper answered, at most ANSWER_WAIT_S; a rank that
        cannot answer is given up on sooner (`_frozen`), so a frozen rank delays the verdict
        no more than any hang."""
        start = time.monotonic()
        deadline = start + ANSWER_WAIT_S
        bound = unresponsive_bound(timeout)
        waiting = [r for r in ranks if r.helper]
        while waiting and time.monotonic() < deadline and not self._stop.is_set():
            waiting = [r for r in waiting if not self._answered(r, request) and _alive(r.pid)
                       and not _frozen(r, time.monotonic() - start, bound)]
            time.sleep(0.2)

    @staticmethod
    def _answered(r: _Rank, request: dict[str, Any]) -> bool:
        try:
            return read_json(r.folder / RANK_HANG_FILE).get("request") == request
        except (OSError, ValueError, AttributeError):
            return False

    def _rank_doc(self, r: _Rank, request: dict[str, Any], alive: bool) -> dict[str, Any]:
        """The rank in the node's record; `alive` as at detection (a rank dead by then is a
        suspect, one that died during the capture most likely a victim of a peer's stop)."""
        stacks = r.folder / STACKS_FILE
        return {"rank": r.rank, "pid": r.pid, "alive": alive,
                "exited_during_capture": alive and not _alive(r.pid),
                "last_step": r.last_step, "last_step_end_ns": r.last_end_ns,
                "stacks": stacks.exists() and stacks.stat().st_size > 0,
                "answered": self._answered(r, request), "process_state": _state(r.pid),
                "folder": r.folder.name}

    def _write_record(self) -> None:
        try:
            write_json_atomic(self.node_dir / NODE_HANG_FILE, self._record)
        except OSError as exc:
            self.log.error("writing hang.json", exc)

    def _await_peers(self, progress_ns: int) -> None:
        """Before ending a job that spans nodes, wait until every other node seen in the run
        directory recorded this hang (a record detected after this node's last progress) or
        ended its part (a peer that crashed records no hang), at most a poll and
        `ANSWER_WAIT_S`; where some ranks of the world are not visible (each node writes its
        own directory), `PEER_GRACE_S` and a poll. One node alone: no wait."""
        if self.world_size <= len({r.rank for r in self._ranks.values()}):
            return
        metas = [m for m in list_ranks(self.run) if m.rank is not None]
        peers = {m.node for m in metas if m.node and m.node != self.node_dir.name}
        if len({m.rank for m in metas}) < self.world_size:
            self._stop.wait(self.poll_s + PEER_GRACE_S)
            return
        deadline = time.monotonic() + self.poll_s + ANSWER_WAIT_S
        root = self.node_dir.parent
        while peers and time.monotonic() < deadline and not self._stop.is_set():
            peers = {n for n in peers if not _recorded_after(root / n / NODE_HANG_FILE,
                                                               progress_ns)
                     and not _ended(root / n / NODE_FILE)}
            if peers:
                time.sleep(0.2)
        if peers:
            self.log.write(f"ending the job without the hang records of {sorted(peers)}")

    def _stop_job(self, ranks: list[_Rank]) -> None:
        """End the job: SIGTERM to its group (torchrun then stops its workers) and to the local
        ranks (torchrun puts them in sessions of their own), SIGKILL after a grace period."""
        self.stopped_job = True
        self.log.write("stopping the job after a hang (--on-hang stop)")
        pids = [r.pid for r in ranks if r.pid is not None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.job_pid is not None:
                _signal_group(self.job_pid, sig)
            for pid in pids:
                _signal_pid(pid, sig)
                if sig == signal.SIGTERM and _state(pid) in STOPPED_STATES:
                    _signal_pid(pid, signal.SIGCONT)  # a stopped rank takes its SIGTERM now
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline and any(_alive(p) for p in pids + [self.job_pid]):
                time.sleep(0.2)


def _new_rows(r: _Rank) -> list[dict[str, Any]]:
    """The step records rank `r`'s step timeline grew by since the last read (whole lines
    only: one being written is read next time)."""
    try:
        with open(r.folder / STEPS_FILE, "rb") as f:
            f.seek(r.offset)
            data = f.read()
    except OSError:
        return []
    end = data.rfind(b"\n") + 1
    r.offset += end
    rows = (step_record(line) for line in data[:end].splitlines())
    return [row for row in rows if row is not None]


def unresponsive_bound(timeout_s: float) -> float:
    """How long a rank may leave even the capture signal unanswered before the watchdog gives
    up on it: a fifth of the hang timeout, within [UNRESPONSIVE_MIN_S, ANSWER_WAIT_S]."""
    return min(ANSWER_WAIT_S, max(UNRESPONSIVE_MIN_S, timeout_s / 5))


def _recorded_after(path: Path, progress_ns: int) -> bool:
    """A node's hang record exists and was detected after `progress_ns` (this hang, not an
    earlier one that resumed)."""
    try:
        detected = read_json(path).get("detected_ns")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(detected, int) and detected > progress_ns


def _ended(path: Path) -> bool:
    """A node's `node.json` says its part of the job ended (`end_ns`)."""
    try:
        return isinstance(read_json(path).get("end_ns"), int)
    except (OSError, ValueError, AttributeError):
        return False


def _frozen(r: _Rank, waited_s: float, bound_s: float) -> bool:
    """A rank that cannot answer: stopped (SIGSTOP, a debugger), or after `bound_s` still
    without the stacks that faulthandler writes from C as soon as the rank runs at all (in
    the kernel, swapped out). Ranks without the capture signal are waited for in full."""
    if _state(r.pid) in STOPPED_STATES:
        return True
    if r.signal is None or waited_s < bound_s:
        return False
    try:
        return (r.folder / STACKS_FILE).stat().st_size == 0
    except OSError:
        return True


def _state(pid: int | None) -> str | None:
    """The process's state letter in /proc (R, S, D, T, t, Z, ...), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def _alive(pid: int | None) -> bool:
    """A process that exists and is not a zombie."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _closing(r: _Rank) -> bool:
    """The rank said it is winding down (rank.json's `closing_ns` or `end_ns`, written when
    its capture closes at a normal exit): no step will come, and that is no hang."""
    try:
        meta = read_json(r.folder / RANK_FILE)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and any(isinstance(meta.get(k), int)
                                          for k in ("closing_ns", "end_ns"))


def _is_rank_process(pid: int | None, run_root: Path) -> bool:
    """The pid still runs a process of this job (pids are reused): its environment names the
    run directory. A signal meant for a rank must never reach another process."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"UBERPROF_RUN_DIR={run_root}".encode() in env


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass
