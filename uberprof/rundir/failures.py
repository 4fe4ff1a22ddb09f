"""What a rank or node left behind when the job hung or crashed, read back (layout.py names the
files): exceptions, fatal-signal and on-request stacks, the Flight Recorder dump, the
watchdog's hang record and the launcher's view of rank exits.

Every reader returns what is well-formed and never raises on a missing or damaged file: the
evidence of a failure is often written by a process in the middle of dying.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.rundir._checked import as_int, as_str
from uberprof.rundir.layout import (
    EXCEPTIONS_FILE,
    EXITS_PREFIX,
    FATAL_FILE,
    FLIGHT_RECORDER_FILE,
    MAX_JSON_BYTES,
    NODE_HANG_FILE,
    RANK_HANG_FILE,
    STACKS_FILE,
    check_readable,
    read_json,
    read_jsonl,
)

__all__ = ["Collective", "Stacks", "parse_faulthandler", "read_exceptions", "read_exits",
           "read_fatal", "read_flight_recorder", "read_node_hang", "read_rank_hang",
           "read_stacks"]

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? "
                     r"\(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_FATAL = re.compile(r"^Fatal Python error: (.*)$")


@dataclass(frozen=True)
class Stacks:
    """Python stacks of all threads as faulthandler writes them; frames innermost last (as in a
    traceback). `fatal` is faulthandler's reason ("Segmentation fault", "Aborted") or None."""

    threads: list[dict[str, Any]] = field(default_factory=list)  # {name, current, frames}
    fatal: str | None = None
    time_ns: int | None = None  # when the file was last written


def parse_faulthandler(text: str) -> Stacks:
    """faulthandler's text: `Fatal Python error: ...`, then per thread a header and `File
    "f", line N in func` lines, innermost first. The last dump in the text wins."""
    threads: list[dict[str, Any]] = []
    fatal = None
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if m := _FATAL.match(line):
            fatal, threads, current = m.group(1).strip(), [], None
            continue
        if m := _THREAD.match(line):
            if current is not None and m.group(1) == "Current thread" and \
                    any(t["current"] for t in threads):
                threads = []  # a second dump in the same file starts here
            current = {"name": m.group(3) or m.group(2), "current": m.group(1) == "Current thread",
                       "frames": []}
            threads.append(current)
            continue
        if current is not None and (m := _FRAME.match(line)):
            current["frames"].insert(0, {"file": m.group(1), "line": int(m.group(2)),
                                         "function": m.group(3)})
    return Stacks(threads=threads, fatal=fatal)


def _read_stacks_file(path: Path) -> Stacks | None:
    try:  # bounded: faulthandler's dumps are KBs; a link to /dev/zero is not read
        check_readable(path, MAX_JSON_BYTES)
        text = path.read_text(errors="replace")
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None
    if not text.strip():
        return None
    s = parse_faulthandler(text)
    return Stacks(threads=s.threads, fatal=s.fatal, time_ns=mtime) if s.threads else None


def read_fatal(rank_dir: Path) -> Stacks | None:
    """The stacks faulthandler wrote when the rank died of a fatal signal, or None."""
    return _read_stacks_file(rank_dir / FATAL_FILE)


def read_stacks(rank_dir: Path) -> Stacks | None:
    """The stacks written on the watchdog's request (the signal handler's dump), or None."""
    return _read_stacks_file(rank_dir / STACKS_FILE)


def read_exceptions(rank_dir: Path) -> list[dict[str, Any]]:
    """The rank's uncaught exceptions in the order they happened (rows with a type only)."""
    path = rank_dir / EXCEPTIONS_FILE
    try:
        rows, _ = read_jsonl(path)
    except OSError:
        return []
    return [r for r in rows if isinstance(r, dict) and as_str(r.get("type"))]


def read_rank_hang(rank_dir: Path) -> dict[str, Any] | None:
    """The rank's answer to the watchdog (hang.json), or None."""
    return _json_object(rank_dir / RANK_HANG_FILE)


def read_node_hang(node_dir: Path) -> dict[str, Any] | None:
    """The watchdog's record of a hang on that node (hang.json), or None."""
    return _json_object(node_dir / NODE_HANG_FILE)


def read_exits(node_dir: Path) -> list[dict[str, Any]]:
    """Rank process exits that the launchers inside the job saw on that node (all files)."""
    out: list[dict[str, Any]] = []
    try:
        files = sorted(p for p in node_dir.iterdir() if p.name.startswith(EXITS_PREFIX)
                       and p.name.endswith(".jsonl"))
    except OSError:
        return out
    for p in files:
        try:
            rows, _ = read_jsonl(p)
        except OSError:
            continue
        out += [r for r in rows if isinstance(r, dict) and as_int(r.get("exitcode")) is not None]
    return out


@dataclass(frozen=True)
class Collective:
    """One Flight Recorder entry: a collective the rank issued, in issue order per group."""

    group: str  # process group name ("default_pg", or its id)
    seq: int  # collective_seq_id (p2p_seq_id for point-to-point)
    op: str  # "all_reduce" (backend prefix dropped)
    sizes: list[Any]
    dtypes: list[Any]
    time_ns: int | None  # when it was issued (epoch)
    completed: bool  # retired, or at or before the group's last completed collective
    is_p2p: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"process_group": self.group, "seq": self.seq, "op": self.op,
                "sizes": self.sizes, "dtypes": self.dtypes, "time_ns": self.time_ns,
                "completed": self.completed}


def read_flight_recorder(rank_dir: Path, reason: str
                         ) -> tuple[dict[str, Any], list[Collective]] | None:
    """({time_ns, reason}, the collectives in issue order) of the rank's Flight Recorder dump
    made for `reason` (exception, hang), or None when it has none."""
    doc = _json_object(rank_dir / FLIGHT_RECORDER_FILE.format(reason=reason))
    if doc is None or not isinstance(doc.get("dump"), dict):
        return None
    dump = doc["dump"]
    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    out = []
    for e in dump.get("entries") or []:
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group")
        pg_id = str(pg[0]) if isinstance(pg, list) and pg else str(e.get("pg_id"))
        name = str(pg[1]) if isinstance(pg, list) and len(pg) > 1 else ""
        name = name if name not in ("", "undefined") else f"group {pg_id}"
        p2p = bool(e.get("is_p2p"))
        seq = as_int(e.get("p2p_seq_id" if p2p else "collective_seq_id"))
        if seq is None:
            continue
        done_upto = as_int(_str_int((status.get(pg_id) or {}).get("last_completed_collective")))
        completed = bool(e.get("retired")) or str(e.get("state")) == "completed" or \
            (not p2p and done_upto is not None and seq <= done_upto)
        op = str(e.get("profiling_name") or "?").split(":", 1)[-1]
        out.append(Collective(group=name, seq=seq, op=op, sizes=list(e.get("input_sizes") or []),
                              dtypes=list(e.get("input_dtypes") or []),
                              time_ns=as_int(e.get("time_created_ns")), completed=completed,
                              is_p2p=p2p))
    meta = {"time_ns": as_int(doc.get("time_ns")), "reason": as_str(doc.get("reason"))}
    return meta, out


def _str_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        doc = read_json(path)
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None
