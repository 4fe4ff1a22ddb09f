"""Always-on arrivals at collectives: the Flight Recorder's entries, kept for every step.

torch's Flight Recorder (on by default under `uberprof run`: TORCH_FR_BUFFER_SIZE) notes every
collective a rank calls, with `time_created_ns` (epoch ns): when the rank arrived at it. Across
ranks, per (process group, sequence number), the last to arrive is the one the others waited
for, on every step and not only in the traced window (analysis/flight_log.py reads it).

The ring holds the last N entries, so it is read before it wraps: right after each trace
window's profiler stops (where the job already pays for its teardown, hundreds of ms), every
K steps, K chosen from the rate of collectives seen so far so that at most half the ring is
new between two dumps, and once at exit. A dump serialises the whole ring on the training
thread (the C++ call holds the GIL: a helper thread would not hide it), so its cost grows with
the ring's fill, about 10 us per entry on a busy 2-core machine: 0.2-1 ms for the 10-70
entries of a 30-step job, 20-25 ms for a full ring of 2000 (over 100 ms at a load of 4 per
core). Hence a budget: outside trace windows a dump is made only while the ring holds at
most `CHEAP_ENTRIES` (the ring never empties, so past that only the windows' dumps go on,
and the steps between windows are not covered). Each dump's `cost_ns` is in the file and
counted as uberprof's own time in the step timeline. Only entries newer than the last dump
are written (one line per dump, layout.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uberprof.collect import diskfull
from uberprof.collect.safety import AgentLog

RING_SHARE = 0.5  # of the ring that may fill with new entries between two dumps
FIRST_DUE = 1  # the first dump, after step 1: learns the rate of collectives (a small ring)
CHEAP_ENTRIES = 400  # the most a dump outside a trace window may serialise (about 4 ms)
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")

try:
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads

    def _line(row: dict[str, Any]) -> bytes:
        return orjson.dumps(row) + b"\n"
except ImportError:  # the rank side works with the standard library alone
    _loads = json.loads

    def _line(row: dict[str, Any]) -> bytes:
        return (json.dumps(row, separators=(",", ":")) + "\n").encode()


def ring_size(env: Any = None) -> int:
    """The Flight Recorder's ring size in this process (0: off)."""
    env = os.environ if env is None else env
    for name in FR_ENV:
        if name in env:
            try:
                return max(0, int(env[name]))
            except ValueError:
                return 0
    return 0


def dump_entries() -> list[dict[str, Any]] | None:
    """Every entry of the ring, completed ones included (None: no torch.distributed). The
    recorder outlives the process group, so this works after `destroy_process_group()` too."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return None
    import torch

    doc = _loads(bytes(torch._C._distributed_c10d._dump_fr_trace_json(True, False)))
    entries = doc.get("entries") if isinstance(doc, dict) else None
    return entries if isinstance(entries, list) else []


def new_rows(entries: list[dict[str, Any]], after: int) -> tuple[list[list[Any]], int, int]:
    """([pg, seq, op, time_created_ns] of the collectives with record_id > `after`, the
    highest record_id seen, the entries lost between `after` and the oldest one kept)."""
    rows: list[list[Any]] = []
    last, oldest = after, None
    for e in entries:
        rid = e.get("record_id")
        if not isinstance(rid, int) or rid <= after:
            continue
        last = max(last, rid)
        oldest = rid if oldest is None else min(oldest, rid)
        if e.get("is_p2p"):
            continue
        pg = e.get("process_group")
        pg_name = str(pg[0]) if isinstance(pg, list) and pg else str(e.get("pg_id"))
        op = str(e.get("profiling_name") or "?").split(":", 1)[-1]
        rows.append([pg_name, e.get("collective_seq_id"), op, e.get("time_created_ns")])
    lost = max(0, oldest - after - 1) if oldest is not None else 0
    return rows, last, lost


class FlightLog:
    """Appends the ring's new entries to `path()` at the dump points (module docstring)."""

    def __init__(self, path: Callable[[], Path], log: AgentLog, size: int) -> None:
        self._path = path
        self._log = log
        self.size = size
        self.enabled = size > 0
        self.next_due = FIRST_DUE
        self._last_record = -1
        self._last_step = -1  # the step of the last dump (-1: before step 0)
        self._held = 0  # entries the ring held at the last dump
        self._rate = 0.0  # new entries per step between the last two dumps
        self.dumps = 0
        self.cost_ns = 0
        self.max_cost_ns = 0

    def held_at(self, step: int) -> float:
        """The entries the ring will hold at the end of `step` (it never empties)."""
        return min(self.size, self._held + self._rate * max(0, step - self._last_step))

    def within_budget(self, step: int) -> bool:
        """Whether a dump at `step` serialises at most CHEAP_ENTRIES entries."""
        return self.held_at(step) <= CHEAP_ENTRIES

    def step_ended(self, step: int) -> int:
        """Dump when the ring is due, within budget; returns the ns it took."""
        if not self.enabled or step < self.next_due or not self.within_budget(step):
            return 0
        return self.dump(step, "periodic")

    def dump(self, step: int, reason: str) -> int:
        """Append the new entries (one line); never raises. Returns the ns it took. Outside a
        trace window (`reason` other than "window") only within budget."""
        if not self.enabled or diskfull.is_full() or \
                (reason != "window" and not self.within_budget(step)):
            return 0
        t0 = time.perf_counter_ns()
        try:
            entries = dump_entries()
            if entries is None:
                return 0
            rows, last, lost = new_rows(entries, self._last_record)
            self._last_record = last
            cost = time.perf_counter_ns() - t0
            line = {"time_ns": time.time_ns(), "reason": reason, "step": step, "cost_ns": cost,
                    "lost": lost, "entries": rows}
            with open(self._path(), "ab") as f:
                f.write(_line(line))
        except Exception as exc:  # noqa: BLE001 - less evidence, never a broken job
            self.enabled = False
            self._log.error("dumping the Flight Recorder", exc)
            return time.perf_counter_ns() - t0
        self._schedule(step, len(rows), len(entries))
        cost = time.perf_counter_ns() - t0
        self.dumps += 1
        self.cost_ns += cost
        self.max_cost_ns = max(self.max_cost_ns, cost)
        return cost

    def _schedule(self, step: int, new: int, held: int) -> None:
        """The next periodic dump: when half the ring is new, or when it holds CHEAP_ENTRIES
        (the last one within budget), whichever comes first."""
        steps = max(1, step - self._last_step)
        self._rate = new / steps
        self._held, self._last_step = held, step
        room = min(RING_SHARE * self.size, CHEAP_ENTRIES - held)
        ahead = int(room / self._rate) if self._rate > 0 else 2 * steps
        self.next_due = step + max(1, ahead)

    def status(self) -> dict[str, Any]:
        """rank.json's `flight_log`: how often it dumped and what that cost."""
        return {"ring": self.size, "dumps": self.dumps,
                "within_budget": self.within_budget(self._last_step),
                "cost_ms": round(self.cost_ns / 1e6, 3),
                "max_cost_ms": round(self.max_cost_ns / 1e6, 3)}
