"""Reading a rank's always-on arrivals at collectives (layout.FLIGHT_LOG_FILE, written by
collect/rank/flight_log.py): the Flight Recorder's entries, each once, whatever the dumps.

Never raises for what the file holds: a line that is not a dump, or an entry that is not
[process group, sequence number, op, time_created_ns] with a sequence number and a time, is
left out and counted, as a killed writer's cut-off last line is; `flight_log_problem` names the
file and the lines left out, for every command's problems. A file that cannot be read (not a
regular file, over its size limit) is named too, and reads as no arrivals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uberprof.rundir.layout import FLIGHT_LOG_FILE, UnreadableFile, read_jsonl_counted

__all__ = ["Arrival", "FlightLog", "flight_log_problem", "read_flight_log"]

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
    bad_lines: int = 0  # of them, lines that are not a dump (not JSON, or not a dump object)
    unreadable: str | None = None  # why the file was not read at all

    def problem(self, path: Path) -> str | None:
        """One line naming the file and what was left out of it, or None when nothing was:
        a killed writer's cut-off line is as worth saying as garbage, since arrivals are lost
        either way."""
        if self.unreadable is not None:
            return f"{path}: not read ({self.unreadable}); this rank's Flight Recorder " \
                   "arrivals are left out"
        if not self.skipped:
            return None
        entries = self.skipped - self.bad_lines
        parts = [f"{self.bad_lines} line(s) that are not a Flight Recorder dump"] \
            if self.bad_lines else []
        parts += [f"{entries} malformed entr{'y' if entries == 1 else 'ies'}"] if entries else []
        return f"{path}: {' and '.join(parts)} skipped; its {len(self.arrivals)} other " \
               "arrival(s) are kept"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_NS else None


def read_flight_log(rank_dir: Path) -> FlightLog | None:
    """The rank's arrivals, or None when it has no flight log (an older run, the recorder off)."""
    path = rank_dir / FLIGHT_LOG_FILE
    try:
        rows, bad = read_jsonl_counted(path)
    except UnreadableFile as exc:
        return FlightLog([], unreadable=str(exc))
    except OSError:
        return None
    out = FlightLog([], skipped=bad, bad_lines=bad)
    seen: set[tuple[str, int]] = set()
    for row in rows:
        entries = row.get("entries") if isinstance(row, dict) else None
        if not isinstance(entries, list):
            out.skipped += 1
            out.bad_lines += 1
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


def flight_log_problem(rank_dir: Path) -> str | None:
    """The line naming what was left out of a rank's flight-recorder.jsonl, or None."""
    log = read_flight_log(rank_dir)
    return log.problem(rank_dir / FLIGHT_LOG_FILE) if log is not None else None
