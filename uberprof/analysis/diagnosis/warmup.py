"""Warm-up steps: the first traced steps that one-time work makes much longer than the rest, named
and left out of the steady-state verdicts (issue 48).

A job's first iterations pay for work it does once: CUDA initialisation, lazy kernel loading,
cuDNN's autotuning of each new convolution, and `torch.compile`'s tracing, code generation and
Triton autotuning. A straggler, launch-bound, idle or data-stall verdict read from such a step
describes the start-up, not the training, and a median of two or three steps is pulled by it.

**Evidence**, per step of a rank, host time inside spans of each kind of warm-up (their union
over threads, within the step's host window; `WARMUP_EVIDENCE` in causes.py names them):

- `compile`: Dynamo, AOTAutograd and Inductor compilation and Triton autotuning: the spans
  torch 2.x names its compile stages with (`... (dynamo_timed)`, `entire_frame_compile`,
  `inductor_compile`, `compile_file`, `async_compile.wait`, `autotune`, ...). Not the
  wrappers every compiled call has (`Torch-Compiled Region`, `TorchDynamo Cache Lookup`,
  `CompiledFunction`): those are steady state;
- `cudnn`: cuDNN's algorithm search (`cudnnFind*`, `cudnnGet*_v7`);
- `kernel_load`: lazy module loading (`cuModuleLoad*`, `cuLibraryLoad*`, `cuModuleGetFunction`);
- `init`: runtime calls of `INIT_CALL_NS` (50 ms) or more that are not synchronisations (the
  idle gaps' warm-up rule, gaps.py: CUDA context and streams, memory pool growth).

Steady-state calls of these names take microseconds (66 `cudaFuncGetAttributes` a step on the
H100 samples), so they never weigh: only the time that explains a step's excess counts.

**A warm-up step** is one of a rank's leading traced steps (from its first on, while each
qualifies) whose analysed time is at least `WARMUP_RATIO` times the median of the steps after
it, with evidence covering at least half its excess over that median. At least one step stays.
The run leaves out every step that is warm-up on some rank, on every rank: steps are numbered
alike across ranks, and the others wait for a rank that compiles.

**Without step markers** (the pseudo-step -1 spanning a trace, `advisor.analysed_steps`), the
window is cut at the first device work after the last evidence span, when evidence covers at
least half of the part before that span's end: AlexNet's 10 s first convolution (cuDNN's
streams and lazy loading inside it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.causes import WARMUP_EVIDENCE
from uberprof.analysis.diagnosis.gaps import INIT_CALL_NS
from uberprof.analysis.tables import intervals as iv
from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables.metrics import analysed_ns
from uberprof.ingest import classify as K
from uberprof.units import ns_to_ms as _ms

__all__ = ["EVIDENCE_SCHEMA", "NO_STEP", "WARMUP_RATIO", "Cut", "Warmup", "cut_window",
           "step_evidence", "warmup_of"]

WARMUP_RATIO = 1.5  # a warm-up step is at least this much longer than the later steps' median
NO_STEP = -1  # the pseudo-step of a trace without step markers

_STEADY = re.compile(r"Torch-Compiled Region|TorchDynamo Cache Lookup|^CompiledFunction")
PATTERNS: dict[str, re.Pattern[str]] = {
    # torch 2.x names its compile stages with dynamo_timed: "<stage> (dynamo_timed)" and the
    # bare stage names below (a real CPU compile: samples/compile/)
    "compile": re.compile(
        r"\(dynamo_timed\)$|^dynamo$|^entire_(frame|backward)_compile$|^backend_compile$|"
        r"^inductor_compile$|^compile_file$|^code_gen$|_compile\.compile_inner|compile_fx|"
        r"call_user_compiler|create_aot_dispatcher|async_compile|load_by_key_path|"
        r"autotun|benchmark_all_configs|TritonBenchmark|precompile"),
    "cudnn": re.compile(r"^cudnnFind|^cudnnGet\w*_v7|cudnn\w*[Bb]enchmark"),
    "kernel_load": re.compile(r"^cuModuleLoad|^cuLibraryLoad|^cuModuleGetFunction|"
                              r"^cuLibraryGetKernel"),
}

EVIDENCE_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    ("step", pa.int64()),
    ("cause", pa.string()),  # a key of causes.WARMUP_EVIDENCE
    ("ns", pa.int64()),  # host time in its spans inside the step's host window
])


def _spans(events: pa.Table) -> dict[str, iv.Intervals]:
    """Each kind of evidence's spans in one rank's events (module docstring)."""
    ts = events.column("ts").to_numpy()
    end = ts + events.column("dur").to_numpy()
    steady = M.name_mask(events, _STEADY)
    out = {k: iv.union(ts[m], end[m]) for k, p in PATTERNS.items()
           if (m := M.name_mask(events, p) & ~steady).any()}
    init = M.kind_mask(events, (K.RUNTIME,)) & ((end - ts) >= INIT_CALL_NS)
    if init.any():
        out["init"] = iv.union(ts[init], end[init])
    return out


def step_evidence(rank: int, events: pa.Table, steps: pa.Table) -> pa.Table:
    """EVIDENCE_SCHEMA rows of one rank: for each of its `steps` (RUN_STEP_SCHEMA) and kind
    of evidence found, the host time inside its spans. Run in the per-rank pass, where the
    event table is read."""
    spans = _spans(events)
    if not spans or steps.num_rows == 0:
        return EVIDENCE_SCHEMA.empty_table()
    lo = steps.column("host_start_ns").to_numpy(zero_copy_only=False)
    hi = steps.column("host_end_ns").to_numpy(zero_copy_only=False)
    step = steps.column("step").to_numpy(zero_copy_only=False)
    rows: dict[str, list[Any]] = {"rank": [], "step": [], "cause": [], "ns": []}
    for cause, s in spans.items():
        got = iv.covered_in(s, lo, hi)
        for k in np.flatnonzero(got > 0):
            rows["rank"].append(rank)
            rows["step"].append(int(step[k]))
            rows["cause"].append(cause)
            rows["ns"].append(int(got[k]))
    return pa.table(rows, schema=EVIDENCE_SCHEMA)


@dataclass(frozen=True)
class Cut:
    """The warm-up part cut from a trace without step markers: its window now starts at
    `at_ns`; `parts` is the breakdown of what is left (`metrics.Breakdown.as_dict` names)."""

    from_ns: int  # where the window started
    at_ns: int
    evidence: dict[str, int]  # cause -> ns of the part cut
    parts: dict[str, int]


def cut_window(events: pa.Table, steps: pa.Table, act: M.Activity) -> Cut | None:
    """Where a trace without step markers (its one pseudo-step) ends its warm-up: at the first
    device work after the last evidence span (the device's wait for it is warm-up too), when
    evidence fills at least half of the part before that span's end (module docstring); None
    otherwise."""
    if steps.num_rows != 1 or steps.column("step")[0].as_py() != NO_STEP:
        return None
    lo, hi = steps.column("host_start_ns")[0].as_py(), steps.column("host_end_ns")[0].as_py()
    spans = _spans(events)
    if not spans or lo is None or hi is None:
        return None
    merged = iv.clip(iv.merge(*spans.values()), lo, hi)
    if not len(merged):
        return None
    end = int(merged.ends[-1])
    nxt = int(np.searchsorted(act.busy.ends, end, side="right"))
    if nxt >= len(act.busy) or iv.total(merged) < 0.5 * (end - lo):
        return None  # no device work after it, or the part cut is not mostly warm-up
    at = max(end, int(act.busy.starts[nxt]))  # the steady part starts with device work
    if at >= hi:
        return None
    evidence = {k: int(iv.covered_in(s, np.array([lo]), np.array([at]))[0])
                for k, s in spans.items()}
    b = M.breakdown(act, np.array([at]), np.array([hi])).as_dict()
    return Cut(lo, at, {k: v for k, v in evidence.items() if v > 0},
               {k: int(v[0]) for k, v in b.items()})


@dataclass
class Warmup:
    """The run's warm-up: the steps left out, the cuts of traces without step markers, and
    what they cost and why."""

    steps: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # the ranks whose evidence named them
    ns: int = 0  # wall time left out: per step the longest rank's, plus the cuts' longest
    evidence: dict[str, int] = field(default_factory=dict)  # cause -> ns, over the ranks' max
    cuts: dict[int, Cut] = field(default_factory=dict)  # rank -> its cut
    # the analysed steps before the warm-up was left out (what the map's per-trace sums cover)
    traced: pa.Table = field(default_factory=lambda: pa.table({}))

    def steady(self, traced: pa.Table) -> pa.Table:
        """`traced` without the warm-up steps, its pseudo-steps starting after their cuts."""
        out = _without_steps(traced, self.steps)
        if not self.cuts:
            return out
        rows = out.to_pylist()
        for row in rows:
            cut = self.cuts.get(row["rank"]) if row["step"] == NO_STEP else None
            if cut is not None:
                row.update(host_start_ns=cut.at_ns, device_start_ns=cut.at_ns,
                           step_time_ns=row["host_end_ns"] - cut.at_ns, **cut.parts)
        return pa.Table.from_pylist(rows, schema=traced.schema)

    def keeps(self, row: dict[str, Any]) -> bool:
        """Whether a row with `rank`, `step` and `start_ns` (a gap) is outside the warm-up."""
        cut = self.cuts.get(row["rank"])
        return row["step"] not in self.steps and (cut is None or row["start_ns"] >= cut.at_ns)

    def steady_rows(self, table: pa.Table, start: str = "start_ns") -> pa.Table:
        """Rows of a per-step table (gaps, collectives, ...) outside the warm-up: not in a
        warm-up step, and not starting before a rank's cut (by its `start` column; "" for a
        table without one)."""
        out = _without_steps(table, self.steps)
        if not self.cuts or out.num_rows == 0 or not start or start not in out.column_names:
            return out
        ranks = out.column("rank").to_numpy(zero_copy_only=False)
        at = np.array([self.cuts[r].at_ns if r in self.cuts else np.iinfo(np.int64).min
                       for r in ranks.tolist()], dtype=np.int64)
        keep = out.column(start).to_numpy(zero_copy_only=False) >= at
        return out.filter(pa.array(keep))

    def doc(self) -> dict[str, Any] | None:
        """`run.warmup` (docs/json.md): null when nothing was warm-up."""
        if not self.steps and not self.cuts:
            return None
        order = [k for k in WARMUP_EVIDENCE if k in self.evidence]
        return {"steps": self.steps, "ranks": self.ranks, "ms": _ms(self.ns),
                "cut_ms": {str(r): _ms(c.at_ns - c.from_ns) for r, c in sorted(self.cuts.items())},
                "evidence_ms": {k: _ms(self.evidence[k]) for k in order},
                "why": "; ".join(f"{WARMUP_EVIDENCE[k]} {_ms(self.evidence[k])} ms"
                                 for k in order)}


def _without_steps(table: pa.Table, steps: list[int]) -> pa.Table:
    if not steps or table.num_rows == 0:
        return table
    return table.filter(pc.invert(pc.is_in(table.column("step"),
                                           pa.array(steps, pa.int64()))))


def warmup_of(traced: pa.Table, evidence: pa.Table, cuts: dict[int, Cut]) -> Warmup:
    """The run's warm-up (module docstring) from its analysed steps, the per-rank passes'
    evidence (EVIDENCE_SCHEMA) and cuts."""
    w = Warmup(cuts=dict(cuts), traced=traced)
    by_rank = _evidence_by_rank(evidence)
    steps: set[int] = set()
    for r, got in by_rank.items():
        mine = _leading_warmup(traced.filter(pc.equal(traced.column("rank"), r)), got)
        if mine:
            steps |= mine
            w.ranks.append(r)
    w.steps = sorted(steps)
    w.ranks = sorted(set(w.ranks) | set(cuts))
    _cost(w, traced, by_rank)
    return w


def _evidence_by_rank(evidence: pa.Table) -> dict[int, dict[int, dict[str, int]]]:
    """rank -> step -> cause -> ns."""
    out: dict[int, dict[int, dict[str, int]]] = {}
    for row in evidence.to_pylist():
        out.setdefault(row["rank"], {}).setdefault(row["step"], {})[row["cause"]] = row["ns"]
    return out


def _leading_warmup(rows: pa.Table, evidence: dict[int, dict[str, int]]) -> set[int]:
    """A rank's leading warm-up steps (module docstring): from its first traced step on,
    while each is WARMUP_RATIO times the later steps' median with evidence for half its
    excess; at least one step stays."""
    order = np.argsort(rows.column("step").to_numpy(zero_copy_only=False), kind="stable")
    step = rows.column("step").to_numpy(zero_copy_only=False)[order]
    t = analysed_ns(rows)[order].astype(np.float64)
    out: set[int] = set()
    for k in range(step.size - 1):
        if step[k] == NO_STEP:
            break
        median = float(np.median(t[k + 1:]))
        excess = t[k] - median
        seen = sum(evidence.get(int(step[k]), {}).values())
        if t[k] < WARMUP_RATIO * median or seen < 0.5 * excess:
            break
        out.add(int(step[k]))
    return out


def _cost(w: Warmup, traced: pa.Table, by_rank: dict[int, dict[int, dict[str, int]]]) -> None:
    """The wall time left out (per warm-up step the longest rank's analysed time, plus the
    longest cut) and the evidence behind it (per cause, the rank with the most)."""
    if w.steps:
        rows = traced.filter(pc.is_in(traced.column("step"), pa.array(w.steps, pa.int64())))
        per: dict[int, int] = {}
        for s, t in zip(rows.column("step").to_pylist(), analysed_ns(rows).tolist()):
            per[s] = max(per.get(s, 0), int(t))
        w.ns = sum(per.values())
    if w.cuts:
        w.ns += max(c.at_ns - c.from_ns for c in w.cuts.values())
    mine = [{k: sum(got.get(s, {}).get(k, 0) for s in w.steps) for k in WARMUP_EVIDENCE}
            for got in by_rank.values()] + [c.evidence for c in w.cuts.values()]
    for got in mine:
        for k, v in got.items():
            if v > 0:
                w.evidence[k] = max(w.evidence.get(k, 0), v)
