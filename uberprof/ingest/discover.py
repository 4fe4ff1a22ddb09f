"""Where the traces are, and which rank each one probably belongs to.

A PATH is a uberprof run directory (`ranks/<rank>/traces/steps-*.pt.trace.json.gz`), any folder
of Kineto traces (tensorboard_trace_handler, torchtitan, HTA test data: every `.json` /
`.json.gz` under it), or one trace file. The rank a trace really belongs to is decided after
parsing: `distributedInfo.rank` first, then the hint found here (run directory, then file name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from uberprof.ingest.head import head_text
from uberprof.rundir import (
    DERIVED_DIR,
    NODE_FILE,
    RANK_FILE,
    RUN_FILE,
    TRACES_DIR,
    RunDir,
    list_ranks,
    parse_trace_file_name,
    shown,
)

__all__ = ["NoTraces", "Source", "TraceInput", "discover", "rank_from_name"]

# rank-34.Jul_15..., sampled_rank-1.json.gz, rank_3/, rank3.json, worker0.pt.trace.json
_RANK_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)
_NOT_TRACES = {RUN_FILE, NODE_FILE, RANK_FILE}


class NoTraces(Exception):
    """PATH holds no trace file at all."""


@dataclass(frozen=True)
class TraceInput:
    path: Path
    rel: str  # path relative to the source root, with '/' separators
    rank_hint: int | None  # from the run directory or the file name
    hint_source: str | None  # "run directory" or "file name"


@dataclass
class Source:
    root: Path
    kind: str  # "run", "folder" or "file"
    inputs: list[TraceInput]
    rank_dirs: list[tuple[int | None, Path]] = field(default_factory=list)  # runs only
    # JSON files of a folder that are no trace (a companion such as key_averages' output):
    # one line each, said as a problem of the analysis and not read
    skipped: list[str] = field(default_factory=list)


def rank_from_name(rel: str) -> int | None:
    """A rank spelled in a file name, else in a folder name of `rel` (nearest first)."""
    for part in reversed(rel.split("/")):
        m = _RANK_NAME.search(part)
        if m:
            return int(m.group(1))
    return None


def discover(path: Path) -> Source:
    """The trace files under `path` (see module doc). Raises NoTraces when there are none."""
    path = Path(path)
    if not path.exists():
        raise NoTraces(f"{path}: no such file or directory")
    if path.is_file():
        root = path.parent
        hint = rank_from_name(path.name)
        return Source(root, "file", [TraceInput(path, path.name, hint,
                                                "file name" if hint is not None else None)])
    run = RunDir(path)
    if run.is_run():
        return _run_source(run)
    inputs, skipped = [], []
    for p in sorted(_trace_files(path)):
        rel = p.relative_to(path).as_posix()
        if not _may_be_a_trace(p):
            skipped.append(f"{shown(p)}: not a trace (no traceEvents at its start; a companion file "
                           "such as torch.profiler's key_averages output): skipped")
            continue
        hint = rank_from_name(rel)
        inputs.append(TraceInput(p, rel, hint, "file name" if hint is not None else None))
    if not inputs:
        raise NoTraces(f"{path}: no Kineto traces here (looked for *.json and *.json.gz, "
                       "and for a uberprof run directory with ranks/)")
    return Source(path, "folder", inputs, skipped=skipped)


COMPANION_HEAD = 1 << 16
"""Bytes of a folder's JSON file read to tell a trace from a companion file: every Kineto and
Chrome trace of the corpus names `traceEvents` within its first 4 KiB (the header keys come
first and are small), so 64 KiB leaves a wide margin and costs well under a millisecond."""


def _may_be_a_trace(path: Path) -> bool:
    """Whether a JSON file found in a folder may be a trace: a Chrome trace's event array, or
    an object that names `traceEvents` near its start. A folder often holds the files a job
    wrote beside its traces (key_averages, configs, metrics); read as traces they became
    inputs without events, and their count made the one real trace of the folder rankless.
    A file that cannot be read is kept, so that the reader names its problem."""
    text = head_text(path, COMPANION_HEAD)
    if text is None:
        return True
    lead = text.lstrip("\ufeff \t\r\n")[:1]
    return lead in ("[", "") or '"traceEvents"' in text


def _trace_files(root: Path) -> list[Path]:
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).parts
        if rel[0] == DERIVED_DIR or any(part.startswith(".") for part in rel):
            continue
        name = p.name.lower()
        if name.endswith((".json", ".json.gz")) and p.name not in _NOT_TRACES and p.is_file():
            out.append(p)
    return out


def _run_source(run: RunDir) -> Source:
    inputs: list[TraceInput] = []
    rank_dirs: list[tuple[int | None, Path]] = []
    for meta in list_ranks(run):
        rank, rd = meta.rank, meta.folder
        rank_dirs.append((rank, rd))
        tdir = rd / TRACES_DIR
        if not tdir.is_dir():
            continue
        files = {p.name: p for p in tdir.iterdir() if p.is_file()}
        for name, p in sorted(files.items()):
            if parse_trace_file_name(name) is None:
                continue
            if not name.endswith(".gz") and name + ".gz" in files:
                continue  # being compressed: the archive is complete, the original not yet gone
            inputs.append(TraceInput(p, p.relative_to(run.root).as_posix(), rank,
                                     "run directory" if rank is not None else None))
    return Source(run.root, "run", inputs, rank_dirs)
