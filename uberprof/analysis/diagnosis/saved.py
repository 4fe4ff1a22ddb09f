"""The saved diagnosis: written once beside the derived tables, read by every view.

`uberprof report`, the dashboard and `uberprof export` call `load_or_diagnose`: when the
derived folder holds a diagnosis made from the same inputs (a digest of the analysis'
manifest.json, and in a run directory the size and mtime of run.json, calibration.json, each
rank.json and the node folders' counters), with the same options (the gap threshold) and by
the same uberprof (version and `SAVED_VERSION`), it is read back; otherwise the run is
diagnosed and the result saved, when the folder is writable. Reading it back takes a few
Parquet files instead of the whole diagnosis.

Layout (under the derived folder):

    diagnosis.json                  the `uberprof report --json` document
    diagnosis/state.json            what the JSON does not hold (alignment, straggler, classes,
                                    findings unrounded, longest gaps) and the freshness key;
                                    written last, so a half-written diagnosis is never fresh
    diagnosis/<table>.parquet       instances (aligned clocks), unmatched, lateness, gaps,
                                    bandwidth, steps, rank_lateness, idle, p2p
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from uberprof._version import __version__
from uberprof.analysis.diagnosis.bandwidth import BandwidthClass
from uberprof.analysis.diagnosis.gaps import DEFAULT_THRESHOLD_NS
from uberprof.analysis.diagnosis.model import Diagnosis, Finding
from uberprof.analysis.diagnosis.report_doc import RUN_KEYS
from uberprof.analysis.diagnosis.stragglers import Straggler
from uberprof.analysis.diagnosis.summaries import RankSummaries
from uberprof.analysis.tables.align import Alignment, HostClock
from uberprof.analysis.tables.collectives import Matched
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.derived import (
    DIAGNOSIS_DIR,
    DIAGNOSIS_FILE,
    MANIFEST_FILE,
    diagnosis_table_file,
    read_whole,
    write_parquet,
)
from uberprof.analysis.tables.derived import DIAGNOSIS_STATE_FILE as STATE_FILE
from uberprof.analysis.tables.p2p import PAIR_SCHEMA
from uberprof.rundir import CALIBRATION_FILE, RANK_FILE, RunDir, write_json_atomic
from uberprof.rundir.layout import FLIGHT_LOG_FILE

if TYPE_CHECKING:
    from uberprof.rundir.follow import LiveState

__all__ = [
    "SAVED_VERSION",
    "SavedFindings",
    "freshness_key",
    "load",
    "load_or_diagnose",
    "read_saved_findings",
    "save",
]

SAVED_VERSION = 25  # bump when what is saved changes: older saves are diagnosed again
_TABLES = ("instances", "unmatched", "lateness", "gaps", "bandwidth", "steps", "rank_lateness",
           "idle", "p2p")


def freshness_key(root: Path, derived: Path, threshold_ns: int,
                  inputs: list[str]) -> dict[str, Any] | None:
    """What a saved diagnosis must have been made from to be reused; None when the derived
    folder has no manifest (nothing to compare with). `inputs` are the traces diagnosed: two
    single traces of one folder share a derived folder, not a diagnosis."""
    h = hashlib.sha256()
    h.update(orjson.dumps(sorted(inputs)))
    try:  # canonical form: the order in which workers finished is not an input
        manifest = orjson.loads((derived / MANIFEST_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    h.update(orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS))
    for p in _run_files(root):
        try:
            st = p.stat()
        except OSError:
            continue
        h.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n"
                 .encode("utf-8", "surrogateescape"))  # any file name, UTF-8 or not
    return {"saved_version": SAVED_VERSION, "uberprof_version": __version__,
            "inputs_sha256": h.hexdigest(), "gap_threshold_ns": int(threshold_ns)}


def _run_files(root: Path) -> list[Path]:
    """The files of a run directory besides the traces that the diagnosis reads: host names
    and clock estimates (rank.json), the Flight Recorder's arrivals, the run id, the
    calibration, the counters."""

    run = RunDir(root)
    if not run.is_run():
        return []
    out = [run.run_file, root / CALIBRATION_FILE]
    out += [rd / name for rd in run.rank_dirs() for name in (RANK_FILE, FLIGHT_LOG_FILE)]
    for top, dirs, files in os.walk(run.nodes_dir):
        dirs.sort()
        out += [Path(top) / f for f in sorted(files)]
    return out


def _threshold_of(d: Diagnosis) -> int:
    return round(float(d.run.get("gap_threshold_us") or 0) * 1000)


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def save(d: Diagnosis) -> Path | None:
    """Write `d` under its derived folder (see the module docstring); returns the path of
    diagnosis.json, None when `d` has no derived folder. Raises OSError when it is not
    writable."""

    if d.derived is None:
        return None
    key = freshness_key(Path(d.run["path"]), d.derived, _threshold_of(d), d.inputs)
    folder = d.derived / DIAGNOSIS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STATE_FILE).unlink(missing_ok=True)  # stale until the state is written again
    tables = {"instances": d.alignment.apply(d.matched.instances, ("start_ns", "end_ns")),
              "unmatched": d.matched.unmatched, "lateness": d.lateness, "gaps": d.gaps,
              "bandwidth": d.bandwidth, "steps": d.steps,
              "rank_lateness": d.summaries.lateness, "idle": d.summaries.idle,
              "p2p": d.p2p if d.p2p is not None else PAIR_SCHEMA.empty_table()}
    for name, table in tables.items():
        write_parquet(table, diagnosis_table_file(d.derived, name))
    write_json_atomic(d.derived / DIAGNOSIS_FILE, orjson.loads(_dumps(d.to_json())))
    state = {
        "key": key,
        "alignment": d.alignment.as_dict(),
        "groups": d.matched.groups,
        "method": d.matched.method,
        "classes": [dataclasses.asdict(c) for c in d.classes],
        "straggler": dataclasses.asdict(d.straggler) if d.straggler is not None else None,
        "findings": [dataclasses.asdict(f) for f in d.findings],
        "top_gaps": d.top_gaps,
    }
    if key is not None:  # without a manifest nothing could tell it is fresh: never reused
        write_json_atomic(folder / STATE_FILE, orjson.loads(_dumps(state)))
    return d.derived / DIAGNOSIS_FILE


def load(ctx: RunContext, threshold_ns: int = DEFAULT_THRESHOLD_NS) -> Diagnosis | None:
    """The saved diagnosis of `ctx`'s run when it is fresh (same inputs, options and
    uberprof), else None. An unreadable save counts as absent."""
    derived = Path(ctx.run.derived)
    folder = derived / DIAGNOSIS_DIR
    key = freshness_key(Path(ctx.root), derived, threshold_ns, sorted(ctx.run.inputs))
    try:
        state = orjson.loads((folder / STATE_FILE).read_bytes())
        if key is None or state.get("key") != key:
            return None
        doc = orjson.loads((derived / DIAGNOSIS_FILE).read_bytes())
        t = {name: read_whole(diagnosis_table_file(derived, name)) for name in _TABLES}
    except (OSError, orjson.JSONDecodeError, pa.ArrowInvalid):
        return None
    try:
        return _rebuild(ctx, derived, state, doc, t)
    except (KeyError, TypeError, ValueError):
        return None


def _rebuild(ctx: RunContext, derived: Path, state: dict[str, Any], doc: dict[str, Any],
             t: dict[str, pa.Table]) -> Diagnosis:
    a = state["alignment"]
    hosts = [HostClock(**{**h, "bounds_ns": tuple(h["bounds_ns"]) if h.get("bounds_ns")
                          else None}) for h in a["hosts"]]
    alignment = Alignment(reference=a["reference"], hosts=hosts)
    matched = Matched(instances=_unalign(t["instances"], alignment),
                      unmatched=t["unmatched"], groups=state["groups"], method=state["method"])
    s = state["straggler"]
    if not set(RUN_KEYS) <= doc["run"].keys():
        raise KeyError("run")  # saved without a field every document has: diagnose again
    run = {**doc["run"], "path": str(ctx.root)}  # how this caller named the run
    return Diagnosis(
        run=run, ranks=doc["ranks"], findings=[Finding(**f) for f in state["findings"]],
        alignment=alignment, matched=matched, lateness=t["lateness"], gaps=t["gaps"],
        bandwidth=t["bandwidth"], classes=[BandwidthClass(**c) for c in state["classes"]],
        straggler=Straggler(**s) if s is not None else None, steps=t["steps"],
        summaries=RankSummaries(lateness=t["rank_lateness"], idle=t["idle"]),
        top_gaps=state["top_gaps"], derived=derived,
        inputs=sorted(ctx.run.inputs), p2p=t["p2p"])


def _unalign(aligned: pa.Table, alignment: Alignment) -> pa.Table:
    """The matched instances back on each rank's own clock (they are saved aligned)."""
    if aligned.num_rows == 0:
        return aligned
    offs = alignment.offsets()
    ranks = aligned.column("rank").to_pylist()
    shift = pa.array([-offs.get(r, 0) for r in ranks], pa.int64())
    for col in ("start_ns", "end_ns"):
        i = aligned.schema.get_field_index(col)
        aligned = aligned.set_column(i, col, pc.add(aligned.column(col), shift))
    return aligned


def load_or_diagnose(ctx: RunContext, threshold_ns: int = DEFAULT_THRESHOLD_NS,
                     on_save_error: Callable[[OSError], None] | None = None) -> Diagnosis:
    """The saved diagnosis when fresh, else a new one (then saved; a folder that cannot be
    written is told to `on_save_error` and otherwise ignored)."""
    d = load(ctx, threshold_ns)
    if d is not None:
        return d
    from uberprof.analysis.diagnosis import advisor  # a second or more: only when diagnosing

    d = advisor.diagnose_context(ctx, threshold_ns=threshold_ns)
    try:
        save(d)
    except OSError as exc:
        if on_save_error is not None:
            on_save_error(exc)
    return d


# --- what `uberprof watch` reads of it while a job runs ---------------------------------------

@dataclass(frozen=True)
class SavedFindings:
    """The diagnosis `uberprof report` (or the dashboard) saved under derived/: its findings,
    each rank's median lateness at the collectives, and when it was saved."""

    findings: list[dict[str, Any]]
    lateness_ns: dict[int, float]
    saved_ns: int
    parallelism: str | None = None  # the saved reading's summary line (run.parallelism)
    straggler_test: dict[str, Any] | None = None  # run.straggler_test, the decision and why

    def fresh_for(self, state: LiveState) -> bool:
        """Whether it was made after the job ended (a running job's inputs still change)."""
        return state.end_ns is not None and self.saved_ns >= state.end_ns


def read_saved_findings(run: RunDir | Path | str) -> SavedFindings | None:
    """derived/diagnosis.json's findings and derived/diagnosis/rank_lateness.parquet, or None
    when there is no saved diagnosis (or it is unreadable)."""
    derived = RunDir(Path(run)).derived_dir if not isinstance(run, RunDir) else run.derived_dir
    path = derived / DIAGNOSIS_FILE
    try:
        saved_ns = path.stat().st_mtime_ns
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    findings = doc.get("findings") if isinstance(doc, dict) else None
    findings = [f for f in findings if isinstance(f, dict)] if isinstance(findings, list) else []
    run = doc.get("run") if isinstance(doc, dict) else None
    par = run.get("parallelism") if isinstance(run, dict) else None
    summary = par.get("summary") if isinstance(par, dict) else None
    test = run.get("straggler_test") if isinstance(run, dict) else None
    return SavedFindings(findings, _saved_lateness(derived), saved_ns,
                         summary if isinstance(summary, str) else None,
                         test if isinstance(test, dict) else None)


def _saved_lateness(derived: Path) -> dict[int, float]:
    """rank -> median lateness (ns) from the saved diagnosis; {} when it holds none."""
    try:
        t = read_whole(diagnosis_table_file(derived, "rank_lateness"), ["rank", "median_ns"])
    except (OSError, pa.ArrowInvalid, KeyError):  # a lateness table is a bonus
        return {}
    return {int(r): float(m) for r, m in zip(t.column("rank").to_pylist(),
                                             t.column("median_ns").to_pylist())
            if r is not None and m is not None}
