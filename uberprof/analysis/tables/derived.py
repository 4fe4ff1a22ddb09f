"""The derived folder: the one owner of its layout, format, manifest, freshness, writing and
reading. Whoever needs a derived path or table asks this module.

    <derived>/manifest.json         the inputs analysed (size, mtime) and how each went
    <derived>/inputs/<key>/         events.arrow, steps.arrow, collectives.arrow,
                                    operators.arrow, activity.arrow, summary.json; and
                                    modules.parquet, memory.parquet when they have rows (a
                                    missing one reads as none: read_input_table's callers)
    <derived>/timelines/<key>.arrow a rank's step timeline (steps.jsonl), as a table
    <derived>/steps.parquet         one row per rank and step: host and device windows, breakdown
    <derived>/ranks.parquet         one row per rank: whole-trace breakdown (HTA-compatible)
    <derived>/collectives.parquet   one row per collective instance on each rank
    <derived>/operators.parquet     one row per rank, kind, name and input shapes (where
                                    recorded): operators' and kernels' calls, self and
                                    inclusive time over the analysed steps
    <derived>/modules.parquet       one row per rank and module path: calls, total and self
                                    time (tables/modules.py; empty without module spans)
    <derived>/memory.parquet        one row per rank and [memory] event: the memory timeline
                                    (tables/memory_timeline.py; empty without profile_memory)
    <derived>/summary.json          the `uberprof analyze --json` document
    <derived>/shares.json           the traced ranks' time shares and the run's breakdown
    <derived>/collective_kinds.parquet  per collective name and size: calls, total and median
                                    time (both tables/shares.py)

Paths stored here are relative to the source's root (the run directory, the trace folder, or
the folder of a single trace), so the folder reads the same from any working directory. Every
file is written under a unique temporary name in its folder and renamed into place, so two
analyses of one run at once each leave whole files and a reader never sees half of one.
What each table holds, column by column, is schemas.py's.

An input's tables and a rank's step timeline are Arrow IPC files (`.arrow`, `write_small`),
the run-level ones Parquet: a run has thousands of them, each written once by the map and read
once by the reduce, and at their size a file is all overhead: IPC writes one in about half
Parquet's time and reads it in a third (0.4 against 0.85 ms, 0.16 against 0.42 ms for a trace's
steps). A small one is written to memory and then to its file in one call, and every one is
read in one call (Arrow's file streams made ~190 writes and ~70 seeks per trace's tables, and
read a small file in 0.14 ms against 0.04 ms whole); a large one is written in batches. An
input's events are compressed (zstd) from 1 MiB up: there IPC with zstd is the size of
Parquet's zstd and writes 3x, reads 5x as fast (a 45 k-event trace: 7.7 against 22.5 ms, 4.3
against 20 ms); a small trace's 750 events are written as they are (0.27 against 1.6 ms, ~100
kB against ~25 kB).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from uberprof.analysis.tables.schemas import TIMELINE_SCHEMA
from uberprof.ingest.discover import Source
from uberprof.rundir import DERIVED_DIR, write_json_atomic

__all__ = [
    "COLLECTIVES_FILE",
    "COLLECTIVE_KINDS_FILE",
    "DIAGNOSIS_FILE",
    "EVENTS_FILE",
    "FORMAT_VERSION",
    "INPUTS_DIR",
    "INPUT_COLLECTIVES_FILE",
    "INPUT_OPERATORS_FILE",
    "INPUT_STEPS_FILE",
    "MANIFEST_FILE",
    "MEMORY_FILE",
    "MODULES_FILE",
    "OLD_INPUT_FILES",
    "OPERATORS_FILE",
    "OVERVIEW_FILE",
    "OVERVIEW_HEATMAP_FILE",
    "PARTS_PREFIX",
    "PART_STEPS_FILE",
    "RANKS_FILE",
    "SHARES_FILE",
    "STEPS_FILE",
    "SUMMARY_FILE",
    "TIMELINES_DIR",
    "Analysis",
    "ParquetOut",
    "derived_dir_for",
    "diagnosis_table_file",
    "entry_key",
    "input_dir",
    "input_entry",
    "is_fresh",
    "old_timeline_file",
    "rank_input_keys",
    "read_collective_kinds",
    "read_collectives",
    "read_events_if_any",
    "read_input_events",
    "read_input_summary",
    "read_input_table",
    "read_manifest",
    "read_memory_timeline",
    "read_modules",
    "read_operators",
    "read_rank_events",
    "read_rank_names",
    "read_ranks",
    "read_run_steps",
    "read_saved_report",
    "read_shares",
    "read_small",
    "read_summary",
    "read_timeline",
    "read_whole",
    "replacing",
    "timeline_file",
    "write_collective_kinds",
    "write_events",
    "write_manifest",
    "write_parquet",
    "write_shares",
    "write_small",
]

FORMAT_VERSION = 13  # bump when derived tables change: inputs are analysed again
MANIFEST_FILE = "manifest.json"
INPUTS_DIR = "inputs"
TIMELINES_DIR = "timelines"
# One input's tables (inputs/<key>/), and the run-level ones beside the manifest; summary.json
# is both: an input's summary and the run's --json document.
EVENTS_FILE = "events.arrow"  # an input's events (write_events)
ACTIVITY_FILE = "activity.arrow"  # a trace's device activity as interval sets, by role
INPUT_STEPS_FILE = "steps.arrow"  # an input's steps; the run's: STEPS_FILE
INPUT_COLLECTIVES_FILE = "collectives.arrow"  # an input's collectives; the run's: below
INPUT_OPERATORS_FILE = "operators.arrow"  # an input's operators (operators.py); the run's: below
STEPS_FILE = "steps.parquet"
COLLECTIVES_FILE = "collectives.parquet"
OPERATORS_FILE = "operators.parquet"  # the run's, with rank (operators.py)
MODULES_FILE = "modules.parquet"  # an input's, then the run's (with rank): modules.py
MEMORY_FILE = "memory.parquet"  # an input's, then the run's (with rank): memory_timeline.py
SUMMARY_FILE = "summary.json"
RANKS_FILE = "ranks.parquet"
SHARES_FILE = "shares.json"  # the traced ranks' time shares, the run's breakdown (shares.py)
COLLECTIVE_KINDS_FILE = "collective_kinds.parquet"  # per collective name and size (shares.py)
OVERVIEW_FILE = "overview.json"  # the step table's summary the overview draws (overview.py)
OVERVIEW_HEATMAP_FILE = "overview_heatmap.parquet"  # its binned rank x step heat map
REDUCE_FILE = "reduce.json"  # the key of what the last reduce read, and each input's rank
DIAGNOSIS_FILE = "diagnosis.json"  # the saved `uberprof report --json` document
DIAGNOSIS_DIR = "diagnosis"  # the tables behind it, and its state (diagnosis/saved.py)
DIAGNOSIS_STATE_FILE = "state.json"  # in DIAGNOSIS_DIR, written last
PARTS_PREFIX = ".parts-"  # + a reducing process's id and a token: handed-over rows (reduce.py)
PART_STEPS_FILE = "rank-{rank}.arrow"  # in a PARTS_PREFIX folder: a rank's rows (reduce_rank)


@dataclass
class Analysis:
    """What `analyze` produced: where the tables are, the summary document, and its numbers."""

    source: Path
    derived: Path
    summary: dict[str, Any]  # the --json document
    ranks: list[dict[str, Any]]  # RANK_SCHEMA rows
    inputs: dict[str, dict[str, Any]]  # manifest entries of this source's inputs, by rel path
    analysed: int = 0  # inputs analysed this time (the others were up to date)
    notices: list[str] = field(default_factory=list)
    timelines: dict[str, dict[str, Any]] = field(default_factory=dict)  # by rank folder (rel)

    @property
    def ok(self) -> bool:
        """Whether at least one rank could be analysed."""
        return bool(self.ranks)

    def trace_files(self, rank: int) -> list[Path]:
        """The analysed trace files of one rank, by relative path: under the source's root as
        named now, whatever directory the manifest was written from."""
        return [self.source / rel for rel, e in sorted(self.inputs.items())
                if e.get("rank") == rank and e.get("status") == "ok"]

    def input_summaries(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(rank, summary) of each analysed input with a rank, in input order: the trace's
        header facts and whole-trace numbers. Unreadable ones are skipped (the reduce named
        them among the problems)."""
        for e in self.inputs.values():
            rank = e.get("rank")
            if not isinstance(rank, int) or e.get("status") != "ok":
                continue
            try:
                doc = read_input_summary(self.derived, e["key"])
            except (OSError, ValueError, KeyError):
                continue
            yield rank, doc.get("summary") or {}

    def first_input_summaries(self) -> dict[int, dict[str, Any]]:
        """Each rank's first readable summary of `input_summaries`, a rank's later inputs not
        read once it has one: half the files where each rank has two trace windows (1,024
        files at 512 ranks, read at every start of an analysed run)."""
        first: dict[int, dict[str, Any]] = {}
        for e in self.inputs.values():
            rank = e.get("rank")
            if not isinstance(rank, int) or rank in first or e.get("status") != "ok":
                continue
            try:
                doc = read_input_summary(self.derived, e["key"])
            except (OSError, ValueError, KeyError):
                continue
            first[rank] = doc.get("summary") or {}
        return first

    def timeline_entry(self, rank_dir: Path) -> dict[str, Any] | None:
        """The manifest entry of a rank folder's step timeline when its table was written
        (rows, last step and its end); None without one (no steps.jsonl, unreadable, or not
        this analysis's folder): readers then read the file itself."""
        try:
            e = self.timelines.get(Path(rank_dir).relative_to(self.source).as_posix())
        except ValueError:
            return None
        return e if e is not None and e.get("status") == "ok" else None

    def timeline(self, rank_dir: Path) -> pa.Table | None:
        """A rank folder's step timeline (TIMELINE_SCHEMA, one row per step), or None
        (`timeline_entry`)."""
        e = self.timeline_entry(rank_dir)
        if e is None:
            return None
        try:
            return read_timeline(self.derived, e["key"])
        except (OSError, KeyError, ValueError, pa.ArrowException):  # ValueError: a saved table
            return None  # of other columns (an analysis of another layout): read the JSON lines

    def step_tail(self, rank_dir: Path) -> tuple[int, int | None, int | None] | None:
        """A rank folder's step count, last step and its end as the analysis's map read them
        (`rundir.step_table.StepTail`), or None (`timeline_entry`; a manifest from before)."""
        e = self.timeline_entry(rank_dir)
        if e is None or "last_step" not in e:
            return None
        return int(e.get("rows") or 0), e.get("last_step"), e.get("last_end_ns")


# --- places -------------------------------------------------------------------------------------

def derived_dir_for(source: Source, out: Path | None) -> tuple[Path, str | None]:
    """Where derived tables go: `--out`, else beside the data, else (read-only data) a cache;
    and, for the cache, a notice saying so."""
    if out is not None:
        return Path(out), None
    beside = source.root / DERIVED_DIR
    # The data folder itself decides: a derived/ left inside a read-only folder does not count.
    if _writable(source.root) and _writable(beside):
        return beside, None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha1(str(source.root.resolve()).encode()).hexdigest()[:10]
    cache = base / "uberprof" / "derived" / f"{_safe(source.root.name)}-{digest}"
    return cache, (f"{source.root} is read-only: derived tables go to {cache} "
                   "(choose another place with --out)")


def entry_key(rel: str) -> str:
    """The folder/file name of an input's tables: readable, unique per relative path."""
    digest = hashlib.sha1(rel.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{_safe(rel)[-80:]}-{digest}"


def input_dir(derived: Path, key: str) -> Path:
    """Where one trace's tables go."""
    return derived / INPUTS_DIR / key


def diagnosis_table_file(derived: Path, name: str) -> Path:
    """Where the saved diagnosis keeps its table `name` (diagnosis/saved.py)."""
    return derived / DIAGNOSIS_DIR / f"{name}.parquet"


# What earlier derived formats wrote that is not read now: removed when an input is analysed again.
OLD_INPUT_FILES = frozenset({"steps.parquet", "collectives.parquet", "operators.parquet",
                             "activity.parquet",  # format 10's
                             "events.parquet"})  # format 11's


def old_timeline_file(timeline: Path) -> Path:
    """Where format 10 kept the step timeline table now at `timeline` (removed when it is
    written again)."""
    return timeline.with_suffix(".parquet")


def timeline_file(derived: Path, key: str) -> Path:
    """Where one rank folder's step timeline table goes."""
    return derived / TIMELINES_DIR / f"{key}.arrow"


# --- the manifest -------------------------------------------------------------------------------

def read_manifest(derived: Path) -> dict[str, Any]:
    """The manifest, or {} when missing, unreadable or of another format version."""
    try:
        m = orjson.loads((derived / MANIFEST_FILE).read_bytes())
        return m if isinstance(m, dict) and m.get("version") == FORMAT_VERSION else {}
    except (OSError, orjson.JSONDecodeError):
        return {}


def write_manifest(derived: Path, manifest: dict[str, Any]) -> None:
    manifest["format"] = "uberprof-derived"
    manifest["version"] = FORMAT_VERSION
    write_json_atomic(derived / MANIFEST_FILE, manifest)


def input_entry(rel: str, st: os.stat_result) -> dict[str, Any]:
    """A manifest entry for a file (or rank folder) about to be analysed. `path` is relative to
    the source's root, never to the working directory."""
    return {"key": entry_key(rel), "path": rel, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "version": FORMAT_VERSION}


def is_fresh(old: Mapping[str, Any] | None, st: os.stat_result, made: Path) -> bool:
    """Whether a manifest entry still describes its file: same format, size and mtime, and
    either its tables are there (`made`, written last) or it failed (final until it changes)."""
    return (old is not None and old.get("version") == FORMAT_VERSION
            and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
            and (old.get("status") == "error" or made.exists()))


# --- writing ------------------------------------------------------------------------------------

_TOKEN = os.urandom(6).hex()  # this process's (or its parent's, when forked: then the pid differs)
_SERIAL = itertools.count()


def _temp_beside(path: Path) -> Path:
    """A unique file name in `path`'s folder (the same file system: renames are atomic), for
    the writer to create: the process id, a random token drawn when this module was loaded and
    a serial number, so no two processes on any host sharing the folder pick the same name.
    Not created here: mkstemp's exclusive create and close, then the writer's second open, were
    half the cost of writing a small table (an analysis writes thousands)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{_TOKEN}-{next(_SERIAL)}.tmp")


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A unique temporary path to write `path`'s new content to (the block creates it);
    renamed onto `path` when the block ends without error, removed otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_parquet(table: pa.Table, path: Path, **options: Any) -> None:
    """`pq.write_table`, atomically (see the module doc)."""
    with replacing(path) as tmp:
        pq.write_table(table, tmp, **{**encoding(table.schema), **options})


BUFFER_BELOW = 1 << 18  # bytes of a table in memory (write_small)
BATCH_ROWS = 1 << 16  # rows of a large table's batches in its IPC file
COMPRESS_EVENTS_FROM = 1 << 20  # bytes of an input's event table in memory (module doc)


def write_small(table: pa.Table, path: Path, compression: str | None = None) -> None:
    """A table as an Arrow IPC file, atomically (see the module doc): an input's tables and a
    rank's step timeline. A small one is made in memory and written in one call; from
    BUFFER_BELOW bytes straight to the file: a few dozen writes, and no second copy of a
    megabyte."""
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with replacing(path) as tmp:
        if table.nbytes >= BUFFER_BELOW:
            # in batches: a compressed batch is held whole until it is written
            with pa.OSFile(str(tmp), "wb") as f, \
                    pa.ipc.new_file(f, table.schema, options=options) as writer:
                writer.write_table(table, max_chunksize=BATCH_ROWS)
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        tmp.write_bytes(sink.getvalue())


def write_events(table: pa.Table, path: Path) -> None:
    """An input's event table (EVENTS_FILE): `write_small`, compressed when it is large."""
    write_small(table, path, "zstd" if table.nbytes >= COMPRESS_EVENTS_FROM else None)


def encoding(schema: pa.Schema) -> dict[str, Any]:
    """Dictionary encoding for the text columns only: the integer ones (times, sizes) are
    nearly all distinct, and trying a dictionary on them first made the 512-rank step table
    twice as slow to write and 4x as slow to read, and larger."""
    return {"use_dictionary": [f.name for f in schema
                               if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)]}


class ParquetOut:
    """A run-level table written in pieces (one rank's rows at a time, in row groups of at least
    GROUP_ROWS), to a temporary file renamed into place once complete: readers never see half
    a table, and the writer never holds the whole one."""

    GROUP_ROWS = 1 << 14

    def __init__(self, path: Path, schema: pa.Schema, compression: str = "snappy") -> None:
        self.path = path
        self.tmp = _temp_beside(path)
        self.writer = pq.ParquetWriter(self.tmp, schema, compression=compression,
                                       **encoding(schema))
        self.pending: list[pa.Table] = []
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.rows += table.num_rows
        if self.rows >= self.GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.concat_tables(self.pending))
        self.pending, self.rows = [], 0

    def __enter__(self) -> ParquetOut:  # noqa: PYI034 - final class
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            if exc_type is None:
                self._flush()
        finally:
            self.writer.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


# --- reading ------------------------------------------------------------------------------------

def read_summary(derived: Path) -> dict[str, Any]:
    """The run's `uberprof analyze --json` document."""
    return orjson.loads((derived / SUMMARY_FILE).read_bytes())


def read_shares(derived: Path) -> dict[str, Any] | None:
    """shares.json (`tables/shares.py`), None when it is missing or unreadable."""
    try:
        doc = orjson.loads((derived / SHARES_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def write_shares(derived: Path, doc: dict[str, Any]) -> None:
    write_json_atomic(derived / SHARES_FILE, doc)


def read_collective_kinds(derived: Path) -> pa.Table | None:
    """collective_kinds.parquet (`tables/shares.py`), None when it is missing."""
    try:
        return read_whole(derived / COLLECTIVE_KINDS_FILE)
    except (OSError, pa.ArrowException):
        return None


def write_collective_kinds(derived: Path, table: pa.Table) -> None:
    write_parquet(table, derived / COLLECTIVE_KINDS_FILE)


def read_saved_report(derived: Path) -> dict[str, Any] | None:
    """The saved diagnosis's report document (diagnosis.json, written by diagnosis/saved.py),
    as it is, whether fresh or not; None when it is missing or unreadable."""
    try:
        doc = orjson.loads((derived / DIAGNOSIS_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def read_whole(path: Path, columns: Sequence[str] | None = None,
               read_dictionary: Sequence[str] | None = None) -> pa.Table:
    """One derived table file, read as a file rather than a dataset: `pq.read_table` goes
    through `pyarrow.dataset`, whose import and discovery cost a dashboard's start 0.25 s on a
    quiet machine before it has read a byte."""
    with pq.ParquetFile(path, read_dictionary=read_dictionary) as f:
        return f.read(columns=list(columns) if columns is not None else None)


def read_ranks(derived: Path) -> pa.Table:
    """RANK_SCHEMA: one row per rank, whole-trace breakdown."""
    return read_whole(derived / RANKS_FILE)


def read_run_steps(derived: Path, rank: int | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
    """RUN_STEP_SCHEMA: one row per rank and step (one rank's rows with `rank`; only
    `columns`, with "rank" among them for `rank`, when given)."""
    return _of_rank(read_whole(derived / STEPS_FILE, columns), rank)


def read_collectives(derived: Path, rank: int | None = None) -> pa.Table:
    """RUN_COLLECTIVE_SCHEMA: one row per collective instance on each rank (or on `rank`).
    `pg_ranks` stays dictionary-encoded as in the file: a group's rank list is the same long
    string on each of its rows (2.5 kB at 512 ranks: 48 MB of 20k rows, decoded)."""
    return _of_rank(read_whole(derived / COLLECTIVES_FILE, read_dictionary=["pg_ranks"]), rank)


def read_operators(derived: Path, rank: int | None = None) -> pa.Table:
    """RUN_OPERATOR_SCHEMA: per rank (and trace), each operator's and kernel's calls, self and
    inclusive time over its analysed steps (`tables/operators.py`); one rank's with `rank`."""
    return _of_rank(read_whole(derived / OPERATORS_FILE), rank)


def read_modules(derived: Path, rank: int | None = None) -> pa.Table:
    """RUN_MODULE_SCHEMA: per rank (and trace), each module path's calls, total and self time
    over its analysed steps (`tables/modules.py`); one rank's with `rank`."""
    return _of_rank(read_whole(derived / MODULES_FILE), rank)


def read_memory_timeline(derived: Path, rank: int | None = None) -> pa.Table:
    """RUN_MEMORY_TIMELINE_SCHEMA: per rank (and trace), its [memory] events with their step
    and operator (`tables/memory_timeline.py`); one rank's with `rank`."""
    return _of_rank(read_whole(derived / MEMORY_FILE), rank)


def read_input_table(derived: Path, key: str, name: str) -> pa.Table:
    """One table (EVENTS_FILE, INPUT_STEPS_FILE, INPUT_COLLECTIVES_FILE, ...) of one analysed
    input.
    FileNotFoundError for MODULES_FILE and MEMORY_FILE means the input has no rows of them:
    the analysis writes those two only when it has some."""
    return read_small(input_dir(derived, key) / name)


def read_small(path: Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A one-file table of an input or a rank (thousands of them per run): an Arrow IPC file
    (`write_small`'s), read whole in one call (module doc), or Parquet read directly, on this
    thread, at less than half `pq.read_table`'s cost (no dataset discovery, no thread pool:
    0.25 ms against 0.56 ms per small file). `columns`: only those (an IPC file's others are
    not decompressed)."""
    if path.suffix == ".arrow":
        with open(path, "rb") as f:
            data = f.read()
        opts = None
        if columns is not None:
            schema = pa.ipc.open_file(pa.py_buffer(data)).schema
            opts = pa.ipc.IpcReadOptions(included_fields=[schema.get_field_index(c)
                                                          for c in columns])
        return pa.ipc.open_file(pa.py_buffer(data), options=opts).read_all()
    with pq.ParquetFile(path) as f:
        return f.read(columns=columns, use_threads=False)


def read_timeline(derived: Path, key: str) -> pa.Table:
    """One rank folder's step timeline table (TIMELINE_SCHEMA), by its manifest key."""
    return read_small(timeline_file(derived, key)).cast(TIMELINE_SCHEMA)


def read_input_summary(derived: Path, key: str) -> dict[str, Any]:
    """An analysed input's {"summary", "problems"}; raises OSError or ValueError."""
    return orjson.loads((input_dir(derived, key) / SUMMARY_FILE).read_bytes())


def read_rank_events(derived: Path, inputs: Mapping[str, Mapping[str, Any]],
                     rank: int) -> pa.Table:
    """Every event of one rank (all its inputs, `Analysis.inputs` entries), sorted by start.
    KeyError when no input belongs to that rank."""
    keys = rank_input_keys(inputs).get(rank)
    if not keys:
        raise KeyError(rank)
    return read_input_events(derived, keys)


def read_rank_names(derived: Path, inputs: Mapping[str, Mapping[str, Any]],
                    rank: int) -> set[str]:
    """The distinct event names of one rank (all its inputs): what tells which parallel APIs
    it ran (`parallelism.py`). Only the dictionary-encoded `name` column is read, so this costs
    a fraction of `read_rank_events`. KeyError when no input belongs to that rank."""
    keys = rank_input_keys(inputs).get(rank)
    if not keys:
        raise KeyError(rank)
    names: set[str] = set()
    for k in keys:
        column = read_small(input_dir(derived, k) / EVENTS_FILE, ["name"]).column("name")
        for chunk in column.chunks:
            distinct = chunk.unique()
            if pa.types.is_dictionary(distinct.type):
                distinct = distinct.dictionary_decode()
            names.update(n for n in distinct.to_pylist() if n)
    return names


def read_rank_activity(derived: Path, inputs: Mapping[str, Mapping[str, Any]],
                       rank: int) -> pa.Table:
    """One rank's device activity (ACTIVITY_SCHEMA, all its inputs), what the analysis
    counted as compute, communication and memory. KeyError when no input belongs to it."""
    keys = rank_input_keys(inputs).get(rank)
    if not keys:
        raise KeyError(rank)
    parts = [read_input_table(derived, k, ACTIVITY_FILE) for k in keys]
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def rank_input_keys(inputs: Mapping[str, Mapping[str, Any]]) -> dict[int, list[str]]:
    """Per rank, the derived keys of its analysed inputs (`Analysis.inputs` entries), in input
    order: where its event tables are."""
    keys: dict[int, list[str]] = {}
    for e in inputs.values():
        if isinstance(e.get("rank"), int) and e.get("key"):
            keys.setdefault(e["rank"], []).append(e["key"])
    return keys


def read_events_if_any(derived: Path, keys: list[str]) -> pa.Table | None:
    """`read_input_events`, None when the rank has no input or its events cannot be read (a
    map's unit of work then gives the rank's empty result)."""
    if not keys:
        return None
    try:
        return read_input_events(derived, keys)
    except OSError:
        return None


def read_input_events(derived: Path, keys: list[str]) -> pa.Table:
    """The events of the analysed inputs `keys` (one rank's), as one table sorted by start."""
    parts = [read_input_table(derived, k, EVENTS_FILE) for k in keys]
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables(parts, promote_options="permissive").sort_by("ts")


def _of_rank(t: pa.Table, rank: int | None) -> pa.Table:
    return t if rank is None else t.filter(pc.equal(t.column("rank"), rank))


# --- small helpers ------------------------------------------------------------------------------

def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_") or "x"


def _writable(d: Path) -> bool:
    """Whether we may write `d`: permission bits are honoured even for root, so a folder made
    read-only on purpose (chmod a-w) is never written into."""
    probe = d
    while not probe.exists():
        if probe.parent == probe:
            return False
        probe = probe.parent
    try:
        if not os.access(probe, os.W_OK) or not probe.stat().st_mode & 0o222:
            return False
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".write-test-"):
            pass
        return True
    except OSError:
        return False
