"""`uberprof scaling RUN...`: how one job's throughput holds up as it grows, and where the lost
efficiency goes.

Each run is read as `uberprof report` reads it (its saved diagnosis when fresh, else diagnosed
and saved); `scaling_point_of` keeps what the comparison needs of that document and `scaling`
compares the points, a pure function. Nothing is measured again here: every number is one the
report already holds, so the report, this table, its HTML plot and the dashboard agree.

Definitions (docs/scaling.md):

- **Step time** of a run: its analysed (traced) steps' wall time per step, `host_wall_ms`
  over `analysed_steps` (per step the longest rank's host step time).
- **Throughput per rank**: per-rank batch / step time (samples/s) when every run's per-rank
  batch is known, else 1 / step time (steps/s, which assumes the same per-rank batch);
  the total is that times the world size.
- **Scaling efficiency**: a run's throughput per rank over the smallest run's (weak scaling:
  1.0 is perfect).
- **Where the step time goes**: the step's critical path (`run.critical_path.by_kind_ms`, whose
  steps add up to the analysed wall time), per step: its transfers as exposed communication,
  split over the process groups by their exposed time (`run.comm_by_group`); waiting for peers;
  idle (data wait, host gaps, launch); the stragglers' time at stake (their findings), taken out
  of the path's compute; compute. What the path does not cover is `other`, so the parts always
  add up to the step time and their change to the change in step time.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.analysis.diagnosis.gaps import DEFAULT_THRESHOLD_NS

__all__ = ["BATCH_FLAGS", "SCHEMA_VERSION", "Scaling", "ScalingError", "ScalingPoint",
           "read_scaling_point", "scaling", "scaling_point_of"]

SCHEMA_VERSION = 1

# Script options read as the per-rank batch (samples per step on each rank).
BATCH_FLAGS = ("--batch", "--batch-size", "--batch_size", "--per-device-train-batch-size",
               "--per_device_train_batch_size", "--micro-batch-size", "--micro_batch_size")
# Script options that may differ between runs of one job: the batch, and how long it runs.
_FREE_FLAGS = (*BATCH_FLAGS, "--steps", "--max-steps", "--max_steps", "--epochs",
               "--num-epochs", "--num_train_epochs")

# Critical-path kinds -> part key. Transfers are split over groups (`comm:<group>`).
_KIND_PART = {"compute": "compute", "waiting": "waiting", "data": "idle_data",
              "host": "idle_host", "launch": "idle_launch"}
_FIXED_LABELS = {"stragglers": "stragglers", "waiting": "waiting for peers",
                 "idle_data": "idle: data wait", "idle_host": "idle: host",
                 "idle_launch": "idle: launch", "compute": "compute", "other": "other"}
_ORDER = ("comm:", "waiting", "stragglers", "idle_data", "idle_host", "idle_launch",
          "compute", "other")

Progress = Callable[[int, int, str], None]


class ScalingError(ValueError):
    """Why the runs cannot be compared (one line, naming the run)."""


@dataclass
class ScalingPoint:
    """One run as the scaling table sees it (times in ms per step)."""

    path: str
    run_id: str | None
    world_size: int
    nodes: int
    ranks: int  # ranks analysed
    analysed_steps: int
    step_ms: float
    untraced_step_ms: float | None
    parts_ms: dict[str, float]  # part key -> ms per step; adds up to step_ms
    group_labels: dict[str, str]  # comm:<group> -> label
    script: str | None  # the training script, None when the run does not say
    args: list[str]  # its arguments
    batch: int | None = None  # per-rank batch
    batch_source: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.run_id or self.path


@dataclass
class Scaling:
    """The comparison: points sorted smallest first, the first being the baseline."""

    points: list[ScalingPoint]
    unit: str  # "samples/s" or "steps/s"
    differences: list[str]
    notes: list[str]

    @property
    def base(self) -> ScalingPoint:
        return self.points[0]

    def per_rank(self, p: ScalingPoint) -> float:
        per_step = float(p.batch) if self.unit == "samples/s" and p.batch else 1.0
        return per_step * 1000.0 / p.step_ms

    def ideal_step_ms(self, p: ScalingPoint) -> float:
        """The step time at which `p` would keep the baseline's throughput per rank."""
        if self.unit == "samples/s" and p.batch and self.base.batch:
            return self.base.step_ms * p.batch / self.base.batch
        return self.base.step_ms

    def part_keys(self) -> list[str]:
        keys = {k for p in self.points for k in p.parts_ms}
        return sorted(keys, key=lambda k: (_rank_of(k), k))

    def label(self, key: str) -> str:
        for p in self.points:
            if key in p.group_labels:
                return p.group_labels[key]
        return _FIXED_LABELS.get(key, key.removeprefix("path:"))

    def to_json(self) -> dict[str, Any]:
        """The `uberprof scaling --json` document (docs/scaling.md)."""
        keys = self.part_keys()
        base = self.base
        base_rate = self.per_rank(base)
        runs = []
        for p in self.points:
            rate = self.per_rank(p)
            ideal = self.ideal_step_ms(p)
            parts = {k: _ms(p.parts_ms.get(k, 0.0)) for k in keys}
            delta = {k: _ms(p.parts_ms.get(k, 0.0) - base.parts_ms.get(k, 0.0)) for k in keys}
            runs.append({
                "path": p.path, "run_id": p.run_id, "world_size": p.world_size,
                "nodes": p.nodes, "ranks": p.ranks, "analysed_steps": p.analysed_steps,
                "batch_per_rank": p.batch, "batch_source": p.batch_source,
                "step_ms": round(p.step_ms, 3),
                "untraced_step_ms": p.untraced_step_ms,
                "throughput_per_rank": round(rate, 4),
                "throughput_total": round(rate * p.world_size, 4),
                "efficiency": round(rate / base_rate, 4),
                "ideal_step_ms": round(ideal, 3),
                "lost_ms_per_step": round(p.step_ms - ideal, 3),
                "delta_step_ms": round(p.step_ms - base.step_ms, 3),
                "parts_ms": parts, "delta_parts_ms": delta, "notes": p.notes})
        return {
            "schema_version": SCHEMA_VERSION,
            "throughput_unit": self.unit,
            "basis": {
                "step_time": "analysed (traced) steps: wall time per step, the longest rank's "
                             "host step time (the report's run.host_wall_ms / steps)",
                "throughput": ("per-rank batch / step time" if self.unit == "samples/s" else
                               "1 / step time (steps/s; per-rank batch unknown, taken as "
                               "equal in every run)"),
                "efficiency": "throughput per rank over the smallest run's (weak scaling)",
                "breakdown": "the step's critical path per step (run.critical_path), "
                             "transfers split over process groups by exposed time; "
                             "stragglers' time at stake taken out of compute",
            },
            "baseline": base.path,
            "parts": [{"key": k, "label": self.label(k)} for k in keys],
            "runs": runs,
            "differences": self.differences,
            "notes": self.notes,
        }


def _ms(v: float) -> float:
    return round(v, 3) + 0.0  # never -0.0


def _rank_of(key: str) -> int:
    for i, prefix in enumerate(_ORDER):
        if key == prefix or (prefix.endswith(":") and key.startswith(prefix)):
            return i
    return len(_ORDER)


# --- one run ------------------------------------------------------------------------------------

def read_scaling_point(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                       workers: int | None = None, progress: Progress | None = None,
                       threshold_ns: int = DEFAULT_THRESHOLD_NS) -> ScalingPoint:
    """Analyse and diagnose `path` as `uberprof report` does (reusing a fresh saved diagnosis)
    and keep what the scaling table needs. Raises ScalingError naming the run when it has no
    trace or no analysed step."""
    from uberprof.analysis.diagnosis.saved import load_or_diagnose
    from uberprof.analysis.tables.context import load_context
    from uberprof.ingest.discover import NoTraces

    try:
        ctx = load_context(path, out=out, workers=workers, progress=progress)
    except NoTraces as exc:
        raise ScalingError(f"{path}: cannot be analysed: {exc}") from None
    d = load_or_diagnose(ctx, threshold_ns=threshold_ns)
    argv = _argv(ctx)
    return scaling_point_of(d.to_json(), argv, path=str(path))


def _argv(ctx: Any) -> list[str] | None:
    """Rank 0's (else the first rank's) script argv from rank.json; None outside a run
    directory."""
    if not ctx.is_run_dir:
        return None
    from uberprof.rundir import RunDir, ranks_by_id

    metas = ranks_by_id(RunDir(ctx.root))
    for r in sorted(metas):
        argv = metas[r].raw.get("argv")
        if isinstance(argv, list):
            return [str(a) for a in argv]
    return None


def scaling_point_of(doc: dict[str, Any], argv: list[str] | None,
                     path: str | None = None) -> ScalingPoint:
    """A run's point from its report document (`uberprof report --json`) and its script's
    argv. Raises ScalingError when the run has no analysed step."""
    run = doc["run"]
    where = path or run.get("path") or "?"
    steps = [s for s in run.get("analysed_steps") or []]
    # the host's own pace (a device running behind its host lengthens analysed_wall_ms);
    # documents from before host_wall_ms have only the other
    wall = run.get("host_wall_ms") or run.get("analysed_wall_ms")
    if not steps or not wall:
        raise ScalingError(f"{where}: cannot be analysed: no rank has an analysed traced step "
                           "(see `uberprof report` for its problems)")
    n = len(steps)
    step_ms = float(wall) / n
    notes: list[str] = []
    if steps == [-1]:
        notes.append("no step marks: the whole trace is one step")
    parts, labels = _parts(doc, n, step_ms, notes)
    script, args = _script(argv)
    batch = _batch_of(args)
    untraced = (run.get("step_time") or {}).get("untraced") or {}
    return ScalingPoint(
        path=where, run_id=run.get("run_id"),
        world_size=int(run.get("world_size") or len(run.get("ranks") or [])),
        nodes=max(len(run.get("hosts") or {}), 1), ranks=len(doc.get("ranks") or []),
        analysed_steps=n, step_ms=step_ms, untraced_step_ms=untraced.get("median_ms"),
        parts_ms=parts, group_labels=labels, script=script, args=args,
        batch=batch, batch_source="script argument" if batch is not None else None,
        notes=notes)


def _parts(doc: dict[str, Any], n: int, step_ms: float, notes: list[str]
           ) -> tuple[dict[str, float], dict[str, str]]:
    """The step time per step split as the module docstring says; adds up to `step_ms`."""
    run = doc["run"]
    parts: dict[str, float] = {}
    labels: dict[str, str] = {}
    by_kind = (run.get("critical_path") or {}).get("by_kind_ms") or {}
    if not by_kind:
        notes.append("no critical path in the diagnosis: the step time is not broken down")
    for kind, ms in by_kind.items():
        v = float(ms or 0.0) / n
        if kind == "transfer":
            for key, label, share in _groups(run):
                parts[key] = parts.get(key, 0.0) + v * share
                labels[key] = label
        else:
            key = _KIND_PART.get(kind, f"path:{kind}")  # a kind added later: its own part
            parts[key] = parts.get(key, 0.0) + v
    stake = sum(float(f.get("time_at_stake_ms") or 0.0) for f in doc.get("findings") or []
                if f.get("kind") == "straggler") / n
    if stake > 0:
        taken = min(stake, parts.get("compute", 0.0))
        parts["stragglers"] = taken
        parts["compute"] = parts.get("compute", 0.0) - taken
    parts["other"] = step_ms - sum(v for k, v in parts.items() if k != "other")
    return parts, labels


def _groups(run: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(key, label, share) of the path's transfer time per process group, by each group's
    exposed time; point-to-point alone when there is no collective group."""
    groups = [g for g in run.get("comm_by_group") or [] if (g.get("exposed_ms") or 0) > 0]
    total = sum(float(g["exposed_ms"]) for g in groups)
    if not groups or total <= 0:
        p2p = (run.get("p2p") or {}).get("pairs")
        if p2p:
            return [("comm:p2p", "exposed comm: send/recv", 1.0)]
        return [("comm:?", "exposed comm", 1.0)]
    out = []
    for g in groups:
        name = str(g.get("dim") or g.get("group"))
        out.append((f"comm:{name}", f"exposed comm: {name}", float(g["exposed_ms"]) / total))
    return out


def _script(argv: list[str] | None) -> tuple[str | None, list[str]]:
    """The script (or `-m module`) and its arguments, the interpreter and its flags left out."""
    if not argv:
        return None, []
    i = 0
    if Path(argv[0]).name.startswith("python"):
        i = 1
        while i < len(argv) and argv[i].startswith("-"):
            if argv[i] == "-m" and i + 1 < len(argv):
                return f"-m {argv[i + 1]}", argv[i + 2:]
            i += 1
    if i >= len(argv):
        return None, []
    return Path(argv[i]).name, argv[i + 1:]


def _options(args: list[str]) -> dict[str, str]:
    """`--flag value` and `--flag=value` pairs (a flag without a value: "")."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[a] = args[i + 1]
                i += 1
            else:
                out[a] = ""
        else:
            out[f"#{i}"] = a
        i += 1
    return out


def _batch_of(args: list[str]) -> int | None:
    opts = _options(args)
    for flag in BATCH_FLAGS:
        v = opts.get(flag)
        if v is not None and v.isdigit() and int(v) > 0:
            return int(v)
    return None


# --- the comparison -----------------------------------------------------------------------------

def scaling(points: Sequence[ScalingPoint], force: bool = False,
            batches: Sequence[int] | None = None) -> Scaling:
    """Compare the runs, smallest first (world size, then nodes, then batch). `batches`: the
    per-rank batch of every run (one value for all, or one per run in the given order),
    overriding what the scripts' arguments say. Raises ScalingError for fewer than two runs, or
    runs of different jobs unless `force`."""
    pts = list(points)
    if len(pts) < 2:
        raise ScalingError(f"needs at least 2 runs of one job, got {len(pts)}")
    if batches:
        if len(batches) not in (1, len(pts)):
            raise ScalingError(f"--batch: give one value for every run or one per run "
                               f"({len(pts)}), got {len(batches)}")
        for i, p in enumerate(pts):
            p.batch = int(batches[0] if len(batches) == 1 else batches[i])
            p.batch_source = "--batch"
    differences = job_differences(pts)
    if differences and not force:
        raise ScalingError("the runs are not of one job: " + "; ".join(differences)
                           + " (--force compares them anyway)")
    notes: list[str] = []
    unknown = [p.name for p in pts if p.batch is None]
    unit = "samples/s" if not unknown else "steps/s"
    if unknown and len(unknown) < len(pts):
        notes.append(f"per-rank batch unknown for {', '.join(unknown)}: throughput in steps/s "
                     "(give --batch)")
    seen: set[int] = set()
    for p in pts:
        if p.world_size in seen:
            notes.append(f"world size {p.world_size} appears more than once")
        seen.add(p.world_size)
    pts.sort(key=lambda p: (p.world_size, p.nodes, p.batch or 0))
    return Scaling(pts, unit, differences, notes)


def job_differences(points: Sequence[ScalingPoint]) -> list[str]:
    """What makes the runs different jobs: another script, or other arguments besides the
    batch, the run length and file paths. A run that does not say its script is not judged."""
    known = [p for p in points if p.script is not None]
    out: list[str] = []
    if len(known) < 2:
        return out
    ref = known[0]
    ref_opts = _comparable(ref.args)
    for p in known[1:]:
        if p.script != ref.script:
            out.append(f"{p.name} runs {p.script}, {ref.name} runs {ref.script}")
            continue
        opts = _comparable(p.args)
        for k in sorted(set(ref_opts) | set(opts), key=str):
            a, b = ref_opts.get(k), opts.get(k)
            if a != b:
                flag = k if not k.startswith("#") else "argument"
                out.append(f"{p.name} has {_shown(flag, b)}, {ref.name} {_shown(flag, a)}")
    return out


def _comparable(args: list[str]) -> dict[str, str]:
    return {k: v for k, v in _options(args).items()
            if k not in _FREE_FLAGS and os.sep not in v}


def _shown(flag: str, value: str | None) -> str:
    if value is None:
        return f"no {flag}"
    return shlex.join([flag, value]) if value else flag
