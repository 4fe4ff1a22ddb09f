"""Reading a rank's always-on arrivals at collectives (layout.FLIGHT_LOG_FILE, written by
collect/rank/flight_log.py): the Flight Recorder's entries, each once, whatever the dumps.

Never raises for what the file holds: a line that is not a dump, or an entry that is not
[process group, sequence number, op, time_created_ns] with a sequence number and a time, is
left out and counted, as a killed writer's cut-off last line is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uberprof.rundir.layout import FLIGHT_LOG_FILE, read_jsonl

__all__ = ["Arrival", "FlightLog", "read_flight_log"]

MAX_NS = 1 << 62


@dataclass(frozen=True)
class Arrival:
    """One collective as one rank called it."""

    group: str  # the process group's name (Flight Recorder `process_group[0]`)
    seq: int  # its collective sequence number in the group
    op: str  # all_reduce, broadcast, ...
    time_ns: int  # when the rank called it (epoch ns, the rank's host clock)


@dataclass
class FlightLog:
    arrivals: list[Arrival]  # in the order of the dumps, each (group, seq) once
    dumps: int = 0
    lost: int = 0  # entries the ring dropped before a dump read them
    skipped: int = 0  # lines or entries left out as malformed


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_NS else None


def read_flight_log(rank_dir: Path) -> FlightLog | None:
    """The rank's arrivals, or None when it has no flight log (an older run, the recorder off)."""
    path = rank_dir / FLIGHT_LOG_FILE
    try:
        rows, truncated = read_jsonl(path)
    except OSError:
        return None
    out = FlightLog([], skipped=int(truncated))
    seen: set[tuple[str, int]] = set()
    for row in rows:
        entries = row.get("entries") if isinstance(row, dict) else None
        if not isinstance(entries, list):
            out.skipped += 1
            continue
        out.dumps += 1
        out.lost += _int(row.get("lost")) or 0
        for e in entries:
            if not (isinstance(e, list) and len(e) == 4):
                out.skipped += 1
                continue
            seq, t = _int(e[1]), _int(e[3])
            if seq is None or not t:
                out.skipped += 1
                continue
            key = (str(e[0]), seq)
            if key in seen:
                continue
            seen.add(key)
            out.arrivals.append(Arrival(key[0], seq, str(e[2]), t))
    return out
