"""The run directory: one versioned layout, written through this module (read back through
the rest of `uberprof.rundir`).

Every writer owns its own files (one folder per node, one per rank), so many processes on many
hosts can share a run directory on a shared file system without ever writing the same file.

    <out>/<run-id>/
      run.json                      run identity (format version, run id); same content from every node
      nodes/<node>/node.json        the `uberprof run` invocation on that node: command, times, exit code
      nodes/<node>/uberprof.log     the node agent's own log
      nodes/<node>/hang.json        the watchdog's record of a hang on that node: detected_ns,
                                    timeout_s, timeout_source, last_progress_ns, action (report|stop),
                                    ranks [{rank, pid, alive, last_step, last_step_end_ns, stacks,
                                    flight_recorder}]
      nodes/<node>/exits-<pid>.jsonl  exits of rank processes seen by the launcher inside the job
                                    (torchrun's agent, mp.spawn's parent; process <pid>): time_ns,
                                    pid, local_rank, exitcode (negative: killed by that signal),
                                    signal, source
      nodes/<node>/counters/        counters of that node's host (one sampler per host: the first agent
                                    on a host samples, the others note which node did)
        <source>.arrows             Arrow IPC stream, appended every ~2 s, one file per source
                                    (host, nic, ib, proc, nvml, gpm, dcgm); long format:
                                    ts_ns (epoch ns), device, metric, value (float64), unit.
                                    A killed agent leaves every whole batch readable.
        index.json                  per (source, metric): unit, samples, devices, first/last ts_ns
        meta.json                   settings, GPUs (index, UUID, name), NICs (link speed, tc cap),
                                    InfiniBand ports, processes, unsupported metrics, notes
      ranks/<rank>/rank.json        rank metadata: rank, world, host, device, clock reference
      ranks/<rank>/steps.jsonl      one row per finished step, appended as it ends
      ranks/<rank>/traces/          torch.profiler windows, steps-<first>-<last>.pt.trace.json.gz
      ranks/<rank>/uberprof.log     the rank agent's own log
      ranks/<rank>/exceptions.jsonl uncaught exceptions of the rank (sys.excepthook, threading.excepthook,
                                    mp.spawn's worker wrapper; chained, never replaced), one per line:
                                    time_ns, thread, where, type, message, frames [{file, line,
                                    function}] (innermost last), traceback (text), last_step
      ranks/<rank>/fatal.txt        faulthandler's Python stacks of all threads when the rank died of a
                                    fatal signal (SIGSEGV, SIGABRT from a C++ abort, SIGFPE, SIGBUS,
                                    SIGILL); absent when the script enabled faulthandler itself
      ranks/<rank>/stacks.txt       faulthandler's Python stacks of all threads, written from a C signal
                                    handler on the watchdog's request (also while the rank is stuck in
                                    C++ holding the GIL); the signal is rank.json's capture.signal
      ranks/<rank>/hang.json        the rank's answer to a watchdog request, from a helper thread:
                                    request, time_ns, last_step, threads [{name, id, daemon, frames}]
      ranks/<rank>/flight-recorder-<reason>.json  torch's Flight Recorder dump
                                    (`_dump_fr_trace_json`) when the rank raised (reason exception) or
                                    the watchdog asked (hang): {time_ns, reason, dump: {entries,
                                    pg_status, ...}}; one file per reason, the latest dump
      ranks/<rank>/flight-recorder.jsonl  always-on arrivals at collectives: the Flight Recorder's
                                    new entries, one line per dump (after a trace window, every
                                    few hundred steps so its ring never wraps, at exit): time_ns,
                                    reason, step, cost_ns, lost (entries the ring dropped before
                                    this dump), entries [[pg, seq, op, time_created_ns]]
      ranks/<rank>/.hang-request    written by the node agent's watchdog, read by the rank's helper
      requests/trace-<id>.json      `uberprof trace`'s request for a window on demand: id, kind, trigger,
                                    first (the step every rank starts at), steps, ranks (null: all),
                                    created_ns, expires_ns (collect/trace_request.py)
      ranks/<rank>/trace-requests.jsonl  the rank's answer to each request it read, one per line: id,
                                    time_ns, step (its step then), status (accepted|refused), window
                                    [first, last], late (it was past `first`: it starts at its next
                                    step), reason (why refused)
      derived/                      analysis tables; can be rebuilt from the rest at any time
      calibration.json              `uberprof calibrate`: the all-reduce sweep's busbw per link,
                                    written by rank 0 of the sweep (one writer)
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # the rank side works with the standard library alone
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency of the readers
    _fast_loads = json.loads

FORMAT_VERSION = 1
RUN_FILE = "run.json"
NODE_FILE = "node.json"
RANK_FILE = "rank.json"
STEPS_FILE = "steps.jsonl"
LOG_FILE = "uberprof.log"
TRACES_DIR = "traces"
COUNTERS_DIR = "counters"
COUNTERS_SUFFIX = ".arrows"
COUNTERS_INDEX = "index.json"
COUNTERS_META = "meta.json"
DERIVED_DIR = "derived"
CALIBRATION_FILE = "calibration.json"
DISK_FULL_FILE = "disk-full"  # empty; written by the first agent that met a full disk
EXCEPTIONS_FILE = "exceptions.jsonl"
FATAL_FILE = "fatal.txt"
STACKS_FILE = "stacks.txt"
RANK_HANG_FILE = "hang.json"
FLIGHT_RECORDER_FILE = "flight-recorder-{reason}.json"  # reason: exception | hang | peer_failed
FLIGHT_LOG_FILE = "flight-recorder.jsonl"  # the always-on arrivals (collect/rank/flight_log.py)
HANG_REQUEST_FILE = ".hang-request"
REQUESTS_DIR = "requests"  # <run>/requests/trace-<id>.json: `uberprof trace`'s requests
TRACE_ANSWERS_FILE = "trace-requests.jsonl"  # ranks/<rank>/: each rank's answers to them
PEER_FAILED_REQUEST_FILE = ".peer-failed-request"  # the launcher saw a local rank fail
NODE_HANG_FILE = "hang.json"
EXITS_PREFIX = "exits-"  # nodes/<node>/exits-<pid>.jsonl

_TRACE_NAME = re.compile(r"^steps-(\d+)-(\d+)\.pt\.trace\.json(\.gz)?$")
_RANK_DIR_NAME = re.compile(r"^([0-9]+)(?:-(.*))?$")


def _dumps(obj: Any) -> bytes:
    try:
        import orjson

        return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    except ImportError:  # the rank side must work with the standard library alone
        return json.dumps(obj, indent=2, default=str).encode()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so that a reader never sees half a file, even if the writer is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_dumps(obj))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


MAX_JSON_BYTES = 64 << 20
"""The most a JSON file of a run is read whole (rank.json, node.json, run.json, counters'
index and meta, hang and Flight Recorder dumps): the largest written are Flight Recorder dumps
of a few MB. A bigger file is damaged or not ours, and reading it could exhaust memory."""
MAX_JSONL_BYTES = 1 << 30
"""The most a JSON-lines file of a run is read (steps.jsonl: about 300 bytes a step, so over
3 M steps; flight-recorder.jsonl, exceptions.jsonl): beyond it, damaged or not ours."""


class UnreadableFile(OSError):
    """A file that is there but is not read: not a regular file (a folder, a FIFO, a device
    such as /dev/zero behind a link, which would be read forever) or over its size limit. Its
    text says why without the path, for the reader's line that names the file."""


def check_readable(path: Path, limit: int) -> int:
    """`path`'s size when it is a regular file of at most `limit` bytes; else UnreadableFile
    (FileNotFoundError when it is not there). Checked before opening: opening a FIFO blocks."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnreadableFile("not a regular file")
    if st.st_size > limit:
        raise UnreadableFile(f"{size_text(st.st_size)}, over the {size_text(limit)} limit for "
                             "this file")
    return st.st_size


def size_text(n: int) -> str:
    """Bytes as the limits' messages say them: `64 MiB`, `1.5 GiB`."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} bytes"


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """A JSON file read whole, at most `limit` bytes (`check_readable`: UnreadableFile, an
    OSError, beyond it or for what is not a regular file)."""
    check_readable(path, limit)
    with open(path, "rb") as f:
        return json.loads(f.read(limit + 1))


def read_jsonl(path: Path, limit: int = MAX_JSONL_BYTES) -> tuple[list[dict[str, Any]], bool]:
    """Rows of a JSON-lines file, and whether its tail was cut off (a writer killed mid-line;
    any line that is not JSON counts so). At most `limit` bytes (`read_jsonl_counted`)."""
    rows, bad = read_jsonl_counted(path, limit)
    return rows, bad > 0


def read_jsonl_counted(path: Path, limit: int = MAX_JSONL_BYTES
                       ) -> tuple[list[dict[str, Any]], int]:
    """Rows of a JSON-lines file, and how many of its lines are not JSON (garbage, or a cut-off
    last line), for readers that name them. orjson first (5x faster: a 512-rank x 10,000-step
    run has 5 M rows); the standard parser for what it refuses but JSON readers accept (NaN,
    integers beyond 64 bits), so that the rows' checks, not the parser, say what is wrong with
    them. At most `limit` bytes (`check_readable`: UnreadableFile, an OSError, beyond it or for
    what is not a regular file)."""
    rows: list[dict[str, Any]] = []
    bad = 0
    check_readable(path, limit)
    with open(path, "rb") as f:
        for line in f:
            try:
                rows.append(_fast_loads(line))
                continue
            except ValueError:
                pass
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError):
                bad += 1
    return rows, bad


def claim_dir(parent: Path, name: str) -> Path:
    """Create a folder no other writer holds: `name`, else `name-2`, `name-3`, ...

    `mkdir` is atomic (also on NFS), so two writers racing for one name never share it.
    """
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = parent / (name if n == 1 else f"{name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot claim a folder named {name} under {parent}")


def trace_file_name(first_step: int, last_step: int) -> str:
    return f"steps-{first_step:06d}-{last_step:06d}.pt.trace.json"


def parse_trace_file_name(name: str) -> tuple[int, int] | None:
    """Steps covered by a trace window file written by uberprof, or None for other names and
    for backwards windows (see `is_backwards_trace_file_name`), which cover no step."""
    m = _TRACE_NAME.match(name)
    if not m:
        return None
    first, last = int(m.group(1)), int(m.group(2))
    return (first, last) if first <= last else None


def is_backwards_trace_file_name(name: str) -> bool:
    """`steps-000010-000009...`: what uberprof up to 0.1 wrote when the job ended exactly where a
    window started; readers ignore it (it would add a phantom step) and `info` names it."""
    m = _TRACE_NAME.match(name)
    return bool(m) and int(m.group(1)) > int(m.group(2))


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory."""

    root: Path

    @property
    def run_file(self) -> Path:
        return self.root / RUN_FILE

    @property
    def nodes_dir(self) -> Path:
        return self.root / "nodes"

    @property
    def ranks_dir(self) -> Path:
        return self.root / "ranks"

    @property
    def derived_dir(self) -> Path:
        return self.root / DERIVED_DIR

    def is_run(self) -> bool:
        return self.run_file.is_file() or self.ranks_dir.is_dir()

    def run_id(self) -> str | None:
        """run.json's run id; None when the file is missing, unreadable, not an object, or its
        run_id is not a non-empty string (a hand-edited or damaged run.json)."""
        try:
            doc = read_json(self.run_file)
        except (OSError, ValueError, RecursionError):
            return None
        v = doc.get("run_id") if isinstance(doc, dict) else None
        return v if isinstance(v, str) and v and v.isprintable() and len(v) < 1024 else None

    def run_file_problem(self) -> str | None:
        """One line naming run.json and what is wrong with it (missing, unreadable, over its
        size limit, not an object, no run id), or None when it is sound: every command says
        it (`nodes.metadata_problems`), so a damaged run.json is never a silent fallback."""
        try:
            doc = read_json(self.run_file)
        except FileNotFoundError:
            return f"{self.run_file}: missing; the run id is taken from the folder name"
        except (OSError, ValueError, RecursionError) as exc:
            return f"{self.run_file}: unreadable ({_one_line(exc)}); the run id is taken from " \
                   "the folder name"
        if not isinstance(doc, dict):
            return f"{self.run_file}: not a JSON object; the run id is taken from the folder name"
        if self.run_id() is None:
            return f"{self.run_file}: no usable run_id; the run id is taken from the folder name"
        return None

    def node_dirs(self) -> Iterator[Path]:
        if self.nodes_dir.is_dir():
            yield from sorted(p for p in self.nodes_dir.iterdir() if p.is_dir())

    def rank_dirs(self) -> Iterator[Path]:
        if self.ranks_dir.is_dir():
            dirs = [p for p in self.ranks_dir.iterdir() if p.is_dir()]
            yield from sorted(dirs, key=_rank_dir_sort_key)

    def create(self, run_id: str) -> None:
        """Make the folder and its run.json; idempotent, so every node of a job may call it."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.run_file.exists():
            write_json_atomic(
                self.run_file,
                {"format": "uberprof-run", "format_version": FORMAT_VERSION, "run_id": run_id},
            )

    def claim_node_dir(self, host: str | None = None) -> Path:
        return claim_dir(self.nodes_dir, _safe_name(host or socket.gethostname()))

    def claim_rank_dir(self, rank: int) -> Path:
        return claim_dir(self.ranks_dir, str(rank))


def _one_line(exc: BaseException) -> str:
    """An exception's text on one line, at most 200 characters (a parser's message may quote
    the file)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def as_run_dir(run: RunDir | str | os.PathLike[str]) -> RunDir:
    """Readers take a RunDir or a path."""
    return run if isinstance(run, RunDir) else RunDir(Path(run))


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "node"


def parse_rank_dir_name(name: str) -> tuple[int, int] | None:
    """(leading integer, claim number) of a rank folder: `3` is (3, 1); `3-2` is (3, 2), the
    second writer that claimed rank 3 (`claim_rank_dir`). None when the name does not start
    with ASCII digits followed by the end or `-`; other suffixes sort after every claim."""
    m = _RANK_DIR_NAME.match(name)
    if m is None:
        return None
    suffix = m.group(2)
    claim = 1 if suffix is None else int(suffix) if suffix.isascii() and suffix.isdigit() \
        else 1 << 62
    return int(m.group(1)), claim


def _rank_dir_sort_key(p: Path) -> tuple[int, int, str]:
    parsed = parse_rank_dir_name(p.name)
    return (*parsed, p.name) if parsed else (1 << 62, 0, p.name)


def disk_full_at(run_root: Path) -> int | None:
    """When the run met a full disk (epoch ns of DISK_FULL_FILE, see collect.diskfull), or None."""
    try:
        return (run_root / DISK_FULL_FILE).stat().st_mtime_ns
    except OSError:
        return None
