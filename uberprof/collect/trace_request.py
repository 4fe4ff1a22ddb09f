"""`uberprof trace`: ask a running job for a trace window on its next steps.

The channel is the run directory (collect/rank/requests.py has the rank's side): this writes
`requests/trace-<id>.json`, naming the step every chosen rank starts at, and waits for each
rank's answer in its `trace-requests.jsonl`. Nothing reaches the job but that file: a rank that
cannot read it (a node that does not share the run directory, a stuck process) simply does not
answer, and the job never waits for this command.

The start step: the last step any rank finished (from the tails of the step timelines) plus a
margin that covers the time a rank may take to see the request (its poll interval, one step:
it looks only at step boundaries, and a second for the file system) at the job's current step
time, plus one step already under way. A rank that reads the request past that step starts at
its next step and says so (`late`).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.collect.rank.requests import MAX_STEPS, POLL_S
from uberprof.rundir import (
    RunDir,
    list_nodes,
    list_ranks,
    rank_ranges,
    ranks_by_id,
    write_json_atomic,
)
from uberprof.rundir.layout import REQUESTS_DIR, STEPS_FILE, TRACE_ANSWERS_FILE
from uberprof.rundir.ranks import step_record

LEAD_S = 1.0  # beyond a rank's poll interval and one step: the file system, a busy machine
ANSWER_WAIT_S = 10.0  # the default wait for answers, beyond 3 steps of the job
TAIL_BYTES = 1 << 16  # read of each step timeline's end: its last few hundred steps
RECENT_STEPS = 20  # steps per rank whose median is the job's current step time


class CannotTrace(Exception):
    """The request cannot be made: no job runs in the run directory, or no chosen rank there."""


@dataclass
class TraceOutcome:
    """What the ranks answered: `accepted` and `refused` map a rank to its answer (`window`,
    `late`, `step`, `reason`); `silent` lists the ranks that did not answer in `wait_s`."""

    request_id: str
    first: int
    last: int
    ranks: list[int]
    wait_s: float
    step_s: float
    last_step: int
    accepted: dict[int, dict[str, Any]] = field(default_factory=dict)
    refused: dict[int, dict[str, Any]] = field(default_factory=dict)
    silent: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.accepted) and not self.refused and not self.silent

    def as_json(self) -> dict[str, Any]:
        return {"request": self.request_id, "first": self.first, "last": self.last,
                "ranks": self.ranks, "last_step": self.last_step,
                "step_ms": round(self.step_s * 1e3, 3), "wait_s": self.wait_s, "ok": self.ok,
                "accepted": {str(r): a for r, a in sorted(self.accepted.items())},
                "refused": {str(r): a for r, a in sorted(self.refused.items())},
                "silent": self.silent}


def request_trace(root: Path, steps: int, ranks: set[int] | None = None,
                  wait_s: float | None = None) -> TraceOutcome:
    """Ask the job running in `root` for a window of `steps` steps on `ranks` (None: every
    rank), and wait for the answers. Raises `CannotTrace` with the reason it cannot ask."""
    if not 1 <= steps <= MAX_STEPS:
        raise CannotTrace(f"a window on demand covers 1 to {MAX_STEPS} steps, not {steps}")
    run = RunDir(root)
    if not run.is_run():
        raise CannotTrace(f"{root}: not a uberprof run directory")
    nodes = [n for n in list_nodes(run) if n.readable]
    if nodes and all(n.end_ns is not None for n in nodes):
        raise CannotTrace(_ended(max(n.end_ns for n in nodes if n.end_ns)))
    metas = ranks_by_id(list_ranks(run))
    if not metas:
        raise CannotTrace("no rank has started yet (the job is starting up): ask again once "
                          "it runs steps")
    live = {r: m for r, m in metas.items() if not m.finished}
    if not live:
        raise CannotTrace(_ended(max((m.end_ns for m in metas.values() if m.end_ns),
                                     default=None)))
    if ranks is not None and (unknown := sorted(ranks - set(metas))):
        raise CannotTrace(f"no rank {_list(unknown)} in this run (its ranks: "
                          f"{_list(sorted(metas))})")
    chosen = sorted(ranks if ranks is not None else metas)
    ended = [r for r in chosen if r not in live]
    if ended and len(ended) == len(chosen):
        raise CannotTrace(f"rank(s) {_list(ended)} ended already")
    tails = {r: _last_steps(m.folder / STEPS_FILE) for r, m in live.items()}
    last_step = max((t[-1][0] for t in tails.values() if t), default=None)
    if last_step is None:
        raise CannotTrace("no rank has finished a step yet (the job is starting up): ask "
                          "again once it runs steps")
    durations = [d for t in tails.values() for _, d in t[-RECENT_STEPS:]]
    step_s = max(1e-4, statistics.median(durations) / 1e9) if durations else 1.0
    first = last_step + margin_steps(step_s)
    wait = wait_s if wait_s is not None else ANSWER_WAIT_S + 3 * step_s
    asked = [r for r in chosen if r in live]
    request_id = write_request(run.root, first=first, steps=steps,
                               ranks=None if ranks is None else chosen, trigger="on demand",
                               expires_s=wait, detail={"last_step_seen": last_step,
                                                       "step_ms": round(step_s * 1e3, 3)})
    assert request_id is not None  # a name of its own: never taken
    outcome = TraceOutcome(request_id, first, first + steps - 1, chosen, round(wait, 1), step_s,
                           last_step)
    outcome.refused.update({r: {"reason": "the rank ended already"} for r in ended})
    _await_answers(outcome, {r: live[r].folder for r in asked}, wait)
    return outcome


def margin_steps(step_s: float) -> int:
    """How far ahead of the last finished step a request's window starts: a rank's poll
    interval, one step (it looks only at step boundaries) and `LEAD_S`, at `step_s` a step,
    plus the step under way and one more."""
    return 2 + math.ceil((POLL_S + LEAD_S) / max(1e-4, step_s))


def write_request(root: Path, *, first: int, steps: int, ranks: list[int] | None, trigger: str,
                  expires_s: float, name: str | None = None,
                  detail: dict[str, Any] | None = None) -> str | None:
    """Write a trace request into the run directory `root`; its id, or None when `name` (a
    slot such as `slowdown-1`) was taken already (another node asked first). Written whole
    under a temporary name, then linked to its own (exclusive: a link never replaces)."""
    now = time.time_ns()
    request_id = name or \
        f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now / 1e9))}-{os.urandom(3).hex()}"
    folder = root / REQUESTS_DIR
    tmp = folder / f".{request_id}.{os.getpid()}.{os.urandom(3).hex()}.tmp"
    write_json_atomic(tmp, {"kind": "trace", "id": request_id, "trigger": trigger,
                            "first": first, "steps": steps, "ranks": ranks, "created_ns": now,
                            "expires_ns": now + int(expires_s * 1e9), **(detail or {})})
    try:
        os.link(tmp, folder / f"trace-{request_id}.json")
    except FileExistsError:
        return None
    finally:
        os.unlink(tmp)
    return request_id


def _await_answers(outcome: TraceOutcome, folders: dict[int, Path], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    waiting = dict(folders)
    while waiting:
        for rank, folder in list(waiting.items()):
            answer = _answer(folder / TRACE_ANSWERS_FILE, outcome.request_id)
            if answer is None:
                continue
            del waiting[rank]
            (outcome.accepted if answer.get("status") == "accepted"
             else outcome.refused)[rank] = answer
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    outcome.silent = sorted(waiting)


def _answer(path: Path, request_id: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(row, dict) and row.get("id") == request_id:
            return row
    return None


def _last_steps(path: Path) -> list[tuple[int, int]]:
    """(step, host duration ns) of the last steps of a step timeline, read from its end."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first may be cut
    out = []
    for line in lines:
        row = step_record(line)
        if row is None:
            continue
        step, a, b = row.get("step"), row.get("host_start_ns"), row.get("host_end_ns")
        if all(isinstance(v, int) for v in (step, a, b)) and b >= a:
            out.append((step, b - a))
    return out


def _ended(end_ns: int | None) -> str:
    at = "" if end_ns is None else \
        " at " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(end_ns / 1e9))
    return f"the job ended{at}: a window on demand needs a running job"


def _list(ranks: list[int]) -> str:
    return rank_ranges(ranks)
