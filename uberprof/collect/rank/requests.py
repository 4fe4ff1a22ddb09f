"""Requests for a trace window on demand (`uberprof trace`), as a rank reads them.

The channel is the run directory itself, so it reaches every node that shares it and needs
nothing from the training script: the CLI writes `requests/trace-<id>.json` (atomically), and
each rank looks for new requests from its step hook, at most every `POLL_S` and then with one
`stat` of the folder (a listing only when the folder's mtime changed, or changed in the last
two seconds: a timestamp tick can hide a second change). A step costs a clock read
when nothing is due. The rank answers each request it reads, once, in its own
`trace-requests.jsonl` (accepted, with the window it will record, or refused, with the reason);
the window itself is opened by `windows.py` at the boundary of its first step.

Requests past their `expires_ns` (the CLI stopped waiting) and files that cannot be read are
skipped, never retried; nothing here raises into the job.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uberprof.collect import diskfull
from uberprof.collect.safety import AgentLog
from uberprof.rundir.layout import read_json

POLL_S = 0.5  # how often a rank looks at the requests folder (from a step boundary)
RECENT_NS = 2_000_000_000  # list a folder changed this recently at every poll (mtime ticks)
MAX_STEPS = 100  # the most steps one window on demand may cover (collect/trace_request.py)


def valid_request(req: Any) -> dict[str, Any] | None:
    """The request's fields, checked; None for anything that is not a whole trace request."""
    if not isinstance(req, dict) or req.get("kind") != "trace":
        return None
    first, steps, ranks = req.get("first"), req.get("steps"), req.get("ranks")
    if not (_int(first) and first >= 0 and _int(steps) and 1 <= steps <= MAX_STEPS):
        return None
    if ranks is not None and not (isinstance(ranks, list) and all(_int(r) for r in ranks)):
        return None
    if not isinstance(req.get("id"), str) or not _int(req.get("expires_ns")):
        return None
    return req


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class RequestInbox:
    """The rank's view of `<run>/requests/`: `poll()` gives each new, unexpired request once."""

    def __init__(self, folder: Path, answers: Callable[[], Path], log: AgentLog) -> None:
        self._dir = folder
        self._answers = answers  # the rank's answers file (its folder can move: a callable)
        self._log = log
        self._due = 0.0
        self._mtime: int | None = None
        self._seen: set[str] = set()

    def poll(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        if now < self._due:
            return []
        self._due = now + POLL_S
        try:
            mtime = os.stat(self._dir).st_mtime_ns
        except OSError:  # no request was ever made
            return []
        # a folder changed within the file system's timestamp tick of the last listing may
        # have changed again since without a new mtime: list it again while that is recent
        if mtime == self._mtime and time.time_ns() - mtime > RECENT_NS:
            return []
        self._mtime = mtime
        out = []
        try:
            names = sorted(e.name for e in os.scandir(self._dir)
                           if e.name.startswith("trace-") and e.name.endswith(".json"))
        except OSError as exc:
            self._log.error("listing trace requests", exc)
            return []
        wall = time.time_ns()
        for name in names:
            if name in self._seen:
                continue
            self._seen.add(name)
            try:
                req = valid_request(read_json(self._dir / name, limit=1 << 16))
            except (OSError, ValueError) as exc:
                self._log.error(f"reading the trace request {name}", exc)
                continue
            if req is None:
                self._log.write(f"trace request {name} ignored: not a whole request")
            elif req["expires_ns"] < wall:
                self._log.write(f"trace request {name} ignored: it expired before this rank "
                                "read it")
            else:
                out.append(req)
        return out

    def answer(self, row: dict[str, Any]) -> None:
        """Append the rank's answer (one line, flushed at once: the CLI is waiting for it)."""
        if diskfull.is_full():
            return
        try:
            with open(self._answers(), "ab") as f:
                f.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
        except OSError as exc:
            self._log.error("answering a trace request", exc)
