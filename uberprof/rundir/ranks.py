"""Rank folders read back: each rank's metadata, step timeline and trace windows.

One rank-id rule for every reader (inventory, ingest, analysis, export, dashboard, counters), so
that they never disagree on which folder is which rank:

1. `rank.json`'s `rank` when it is an int (not a bool) in 0..MAX_RANKS-1: the rank the process
   group gave the process, which is what traces and collectives call it. The folder name is
   only the agent's guess at claim time and may differ (the job renumbered its ranks).
2. Else the folder name's leading integer (`3`, `3-2`), in the same range: a rank killed before
   it wrote rank.json, or a rank.json cut off or hand-edited, still has its steps and traces.
3. Else the rank is unreadable: `RankMeta.rank` is None and `RankMeta.problem` says why; such
   a folder is listed (so it is named as a problem) but belongs to no rank.

Two folders for one rank (`0` and `0-2`: a restarted job, or two jobs in one run directory)
are both listed by `list_ranks`, in folder order (the name's number, then its claim number:
`0`, `0-2`, `0-10`, `1`); `ranks_by_id`, which readers needing one folder per rank use, keeps
the first of them in that order (`0`, the first claimed): two jobs' data are never mixed.
`folder_problems` is what every command says about the folders (the same lines in `info`,
`analyze`, `report`, `export` and the dashboard).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.rundir._checked import as_dict, as_int, as_str, is_utf8, shown
from uberprof.rundir.layout import (
    MAX_JSONL_BYTES,
    RANK_FILE,
    STEPS_FILE,
    TRACES_DIR,
    RunDir,
    UnreadableFile,
    as_run_dir,
    check_readable,
    parse_rank_dir_name,
    parse_trace_file_name,
    read_json,
    read_jsonl,
)

MAX_RANKS = 1 << 24
"""Ranks are below this (16.7 M, far above any job); larger numbers are corrupt data."""


@dataclass(frozen=True)
class RankMeta:
    """One rank folder's `rank.json`, with every field checked for its type (None, or {} for
    the dicts, where absent or of the wrong type). `raw` keeps the object as written."""

    rank: int | None  # by the rule above; None: unreadable, see `problem`
    folder: Path
    readable: bool = False  # rank.json was read as a JSON object
    problem: str | None = None  # why rank.json or the rank id could not be read
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    node: str | None = None
    pid: int | None = None
    backend: str | None = None
    job_id: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None  # None: the rank never closed (killed, crashed, still running)
    device: dict[str, Any] = field(default_factory=dict)  # torch's CUDA device; {} on CPU
    clock: dict[str, Any] = field(default_factory=dict)  # the start-up clock offset estimate
    trace: dict[str, Any] = field(default_factory=dict)  # trace schedule, disabled_reason
    cpu_cores: int | None = None  # the cores the rank's process could run on
    torch_threads: int | None = None  # torch's intra-op threads in it
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        return self.end_ns is not None


_READ: dict[str, tuple[tuple[int, int, int], RankMeta]] = {}  # read_rank's, by file identity
_READ_MAX = 1 << 16
_SETTLED_NS = 3_000_000_000


def read_rank(folder: Path) -> RankMeta:
    """A rank folder's metadata; never raises (a missing or broken rank.json is a problem).
    A rank.json read before is not parsed again while its inode, size and mtime are the same
    (it is replaced atomically, never edited in place): a 512-rank run is listed by the
    analysis, the diagnosis and the dashboard, 0.5 ms a folder each time. A file changed in
    the last seconds is always read (mtimes are as coarse as the kernel's clock tick: two
    writes within one tick can leave all three the same)."""
    key = str(folder)
    try:
        st = (folder / RANK_FILE).stat()
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    except (OSError, ValueError):
        return _read_rank(folder)
    if time.time_ns() - st.st_mtime_ns < _SETTLED_NS:
        return _read_rank(folder)
    seen = _READ.get(key)
    if seen is not None and seen[0] == ident:
        return seen[1]
    meta = _read_rank(folder)
    if len(_READ) >= _READ_MAX:
        _READ.clear()
    _READ[key] = (ident, meta)
    return meta


def _read_rank(folder: Path) -> RankMeta:
    path = folder / RANK_FILE
    if not is_utf8(folder.name):
        return RankMeta(rank=None, folder=folder,
                        problem=f"{shown(folder)}: the folder name is not valid UTF-8; rank "
                                "data in it ignored (rename it)")
    parsed = parse_rank_dir_name(folder.name)
    from_name = _rank_number(parsed[0]) if parsed else None
    try:
        raw = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        why = "missing" if isinstance(exc, FileNotFoundError) else f"unreadable ({exc})"
        return RankMeta(rank=from_name, folder=folder, problem=_fallback(path, why, from_name))
    if not isinstance(raw, dict):
        return RankMeta(rank=from_name, folder=folder,
                        problem=_fallback(path, "not a JSON object", from_name))
    rank = _rank_number(raw.get("rank"))
    problem = None
    if rank is None:
        rank = from_name
        problem = _fallback(path, f"rank {_short(raw.get('rank'))} is not a rank number "
                                  f"(0 to {MAX_RANKS - 1})", from_name)
    return RankMeta(
        rank=rank,
        folder=folder,
        readable=True,
        problem=problem,
        world_size=as_int(raw.get("world_size"), 1, MAX_RANKS + 1),
        local_rank=as_int(raw.get("local_rank"), 0, MAX_RANKS),
        host=as_str(raw.get("host")),
        node=as_str(raw.get("node")),
        pid=as_int(raw.get("pid"), 1, 1 << 63),
        backend=as_str(raw.get("backend")),
        job_id=as_str(raw.get("job_id")),
        start_ns=as_int(raw.get("start_ns"), 0, 1 << 63),
        end_ns=as_int(raw.get("end_ns"), 0, 1 << 63),
        device=as_dict(raw.get("device")),
        clock=as_dict(raw.get("clock")),
        trace=as_dict(raw.get("trace")),
        cpu_cores=as_int(as_dict(raw.get("cpu")).get("cores"), 1, 1 << 20),
        torch_threads=as_int(as_dict(raw.get("cpu")).get("torch_threads"), 1, 1 << 20),
        raw=raw,
    )


_SHARED: dict[str, list[RankMeta]] | None = None  # list_ranks' listings, inside `listed_once`
_SHARED_LOCK = threading.Lock()


def list_ranks(run: RunDir | Path | str) -> list[RankMeta]:
    """Every rank folder of a run, in folder order (`3`, `3-2`, `3-10`, `4`), including
    folders whose rank is unreadable (rank None, listed last). Inside `listed_once`, a run
    is listed the first time only and that listing is handed out again."""
    rd = as_run_dir(run)
    shared = _SHARED
    if shared is None:
        return [read_rank(p) for p in rd.rank_dirs()]
    key = str(rd.root.resolve())
    with _SHARED_LOCK:
        metas = shared.get(key)
        if metas is None:
            metas = shared[key] = [read_rank(p) for p in rd.rank_dirs()]
    return list(metas)


@contextmanager
def listed_once() -> Iterator[None]:
    """While inside: each run's rank folders are listed once, by whichever reader asks first,
    and every later `list_ranks` of that run (on any thread) gets the same listing. For one
    pass over a run that is not being written, such as the dashboard's start, where the
    analysis, the diagnosis and the counters each list the run: 512 folders are two `stat`s
    each, ~25 ms a listing. Nested uses share the outer one's listings."""
    global _SHARED
    if _SHARED is not None:
        yield
        return
    _SHARED = {}
    try:
        yield
    finally:
        _SHARED = None


def ranks_by_id(ranks: RunDir | Path | str | Iterable[RankMeta]) -> dict[int, RankMeta]:
    """One folder per rank: the first in folder order where a rank has several (`0` before
    `0-2`); folders whose rank is unreadable are left out."""
    metas = list_ranks(ranks) if isinstance(ranks, RunDir | Path | str) else ranks
    out: dict[int, RankMeta] = {}
    for m in metas:
        if m.rank is not None:
            out.setdefault(m.rank, m)
    return out


def folder_problems(metas: Sequence[RankMeta]) -> list[str]:
    """What is wrong with a run's rank folders (`list_ranks`), worded once for every command:
    rank ids that could not be read, a rank with several folders (which one is read, which are
    left out) and ranks missing from the world the ranks report."""
    problems = [m.problem for m in metas if m.problem is not None]
    chosen = ranks_by_id(metas)
    folders: dict[int, list[Path]] = {}
    for m in metas:
        if m.rank is not None:
            folders.setdefault(m.rank, []).append(m.folder)
    for rank, dirs in sorted(folders.items()):
        if len(dirs) > 1:
            left = [str(d) for d in dirs if d != chosen[rank].folder]
            problems.append(f"rank {rank} appears {len(dirs)} times "
                            f"({', '.join(map(str, dirs))}): restarted, or two jobs wrote into "
                            f"one run directory; {chosen[rank].folder} (the first claimed) is "
                            f"read, {', '.join(left)} left out")
    world = max((m.world_size or 0 for m in metas), default=0)
    missing = sorted(set(range(world)) - set(folders))
    if missing:
        problems.append(f"missing ranks: {rank_ranges(missing)} of a world of {world}")
    return problems


@dataclass(frozen=True)
class StepTimeline:
    """A rank's step rows (`steps.jsonl`, GPU rows merged into their step's), in step order;
    whether the file was cut off; and why rows were left out (`skipped`: reason -> rows)."""

    steps: list[dict[str, Any]]
    truncated: bool = False
    skipped: dict[str, int] = field(default_factory=dict)

    def values(self, name: str) -> dict[int, int]:
        """Per step, the integer field `name` (e.g. `cpu_ns`, written by newer agents only):
        steps without it, or with another type there, are left out."""
        return {r["step"]: v for r in self.steps
                if isinstance(v := r.get(name), int) and not isinstance(v, bool)}

    @property
    def unread(self) -> bool:
        """Whether the step file is there but could not be read at all (`unreadable_reason`)."""
        return any(k.startswith(UNREADABLE + ": ") for k in self.skipped)

    def problem(self, path: Path) -> str | None:
        """One line naming the file and the rows left out, or None when none were."""
        return skipped_rows_line(path, self.skipped)


# The reason under which a step file that is there but cannot be read is counted (`skipped`).
UNREADABLE = "not read"


def unreadable_reason(path: Path, limit: int = MAX_JSONL_BYTES) -> str | None:
    """Why `path`, which is there, is not a file to read (a folder, a device such as /dev/zero
    behind a link, a dangling link, a file over `limit` bytes, which the step readers would
    load whole); None for a regular file within it or nothing at all."""
    if path.is_file():
        try:
            check_readable(path, limit)
        except UnreadableFile as exc:
            return str(exc)
        except OSError:
            return None  # gone since: nothing at all
        return None
    if path.is_symlink() and not path.exists():
        return "a link to nothing"
    if path.is_dir():
        return "a folder, not a file"
    return "not a regular file" if path.exists() else None


def skipped_rows_line(path: Path, skipped: dict[str, int]) -> str | None:
    """The line naming a step file's rows left out (reason -> rows), or None for none; for a
    file that could not be read at all, why."""
    if not skipped:
        return None
    unread = [k[len(UNREADABLE) + 2:] for k in skipped if k.startswith(UNREADABLE + ": ")]
    if unread:
        return f"{path}: not read ({unread[0]}); this rank's step timeline is empty"
    n = sum(skipped.values())
    why = "; ".join(f"{k}: {v}" for k, v in skipped.items())
    return f"{path}: {n} row(s) left out ({why}); the other steps are kept"


def read_step_timeline(rank_dir: Path) -> StepTimeline:
    """The rank's step timeline; never raises for what the file holds. A row is left out (and
    counted) when it is not a JSON object, has no step number, or holds a number no step can
    have (`step_row_problem`)."""
    path = rank_dir / STEPS_FILE
    if (why := unreadable_reason(path)) is not None:
        return StepTimeline([], skipped={f"{UNREADABLE}: {why}": 1})
    if not path.exists():
        return StepTimeline([])
    try:
        rows, truncated = read_jsonl(path)
    except UnreadableFile as exc:  # replaced by one over the limit since the check
        return StepTimeline([], skipped={f"{UNREADABLE}: {exc}": 1})
    skipped: dict[str, int] = {}
    steps: dict[int, dict[str, Any]] = {}
    gpu: dict[int, dict[str, Any]] = {}
    for row in rows:
        why = step_row_problem(row)
        if why is not None:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        kind = row.get("kind")
        if kind == "step":
            steps[row["step"]] = {k: v for k, v in row.items() if k != "kind"}
        elif kind == "gpu":
            gpu[row["step"]] = row
    for step, row in gpu.items():
        if step in steps:
            steps[step].update({k: v for k, v in row.items() if k not in ("kind", "step")})
    return StepTimeline([steps[s] for s in sorted(steps)], truncated, skipped)


def read_steps(rank_dir: Path) -> tuple[list[dict[str, Any]], bool]:
    """`read_step_timeline`'s rows and whether the file was cut off."""
    t = read_step_timeline(rank_dir)
    return t.steps, t.truncated


MAX_STEP = 1 << 53
"""Step numbers are below this; larger ones are corrupt data."""
UNSIGNED_SUFFIXES = ("_ns", "_bytes")
"""Step-row fields named so (times, sizes) are never negative."""


def step_row_problem(row: Any) -> str | None:
    """Why a `steps.jsonl` row cannot be used, or None: not an object, no int step number in
    0..MAX_STEP-1, or a number field (times in ns, bytes) that is negative, not finite or
    beyond int64."""
    if not isinstance(row, dict):
        return "not a JSON object"
    if as_int(row.get("step"), 0, MAX_STEP) is None:
        return "no step number" if "step" not in row else "step is not a step number"
    for k, v in row.items():
        if type(v) is int:  # the common case (times, counts): the range check alone
            if v >= 1 << 63 or (v < 0 and (v < -(1 << 63) or k.endswith(UNSIGNED_SUFFIXES))):
                return f"{k} out of range"
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            return f"{k} is not a finite number"
        lo = 0 if k.endswith(UNSIGNED_SUFFIXES) else -(1 << 63)
        if not lo <= v < 1 << 63:
            return f"{k} out of range"
    start, end = row.get("host_start_ns"), row.get("host_end_ns")
    if isinstance(start, int) and isinstance(end, int) and end < start:
        return "host_end_ns before host_start_ns"
    return None


def trace_windows(rank_dir: Path) -> list[dict[str, Any]]:
    """The rank's trace window files: steps [first, last], path, bytes."""
    out = []
    tdir = rank_dir / TRACES_DIR
    if tdir.is_dir():
        for p in sorted(tdir.iterdir()):
            steps = parse_trace_file_name(p.name)
            if steps is not None:
                out.append({"steps": list(steps), "path": str(p), "bytes": p.stat().st_size})
    return out


def trace_triggers(value: Any) -> dict[int, str]:
    """rank.json's `trace.triggers` as {first step: what opened the window}; anything malformed
    is left out (a window not listed there is the schedule's, as in runs from before
    triggers were recorded)."""
    if not isinstance(value, list):
        return {}
    return {t["first"]: t["trigger"] for t in value
            if isinstance(t, dict) and isinstance(t.get("first"), int)
            and isinstance(t.get("trigger"), str)}


def rank_ranges(values: list[int]) -> str:
    """`[1, 2, 3, 7]` as "1-3, 7"."""
    out, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def _fallback(path: Path, why: str, from_name: int | None) -> str:
    if from_name is not None:
        return f"{path}: {why}; rank {from_name} taken from the folder name"
    return f"{path}: {why}, and the folder name is not a rank number; rank data in " \
           f"{path.parent} ignored"


def _rank_number(v: Any) -> int | None:
    return as_int(v, 0, MAX_RANKS)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def step_record(line: bytes | str) -> dict[str, Any] | None:
    """One line of a step timeline (`steps.jsonl`) as its step record, or None for a line
    that is not JSON or not a step's (the watchdog's and the trace requests' tail readers)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and row.get("kind") == "step" else None
