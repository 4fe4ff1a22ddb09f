"""The report document's shape (docs/json.md): `RunDoc` owns every key of its `run` object and
`RankDoc` every key of an item of its `ranks`, each with its type, its default (null or empty
where nothing was analysed) and its meaning (`field(metadata={"doc": ...})`).

`document.py` builds them for every case (a diagnosed run, a run directory without traces, a
path with nothing to diagnose) and the advisor fills their fields: slotted dataclasses, so no
undeclared key can be set, and every document has all of them. `as_json` makes the plain dict
`Diagnosis.run` holds and the JSON prints. docs/json.md's tables of these fields are generated
from them (`schema_doc.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from uberprof._version import __version__
from uberprof.analysis.diagnosis.model import SCHEMA_VERSION
from uberprof.analysis.diagnosis.model import field_doc as _m

__all__ = ["RUN_KEYS", "RankDoc", "RunDoc", "as_json"]


@dataclass(slots=True, kw_only=True)
class RunDoc:
    """The `run` object: the run and everything decided across ranks."""

    schema_version: int = field(default=SCHEMA_VERSION, metadata=_m(
        "the document's version, 1 (see above)"))
    uberprof_version: str = field(default=__version__, metadata=_m(
        "the uberprof that made the diagnosis"))
    path: str = field(metadata=_m("the PATH diagnosed"))
    run_id: str | None = field(default=None, metadata=_m(
        "the run directory's id; null for a folder of traces"))
    kind: str = field(metadata=_m(
        '`"run"` (a uberprof run directory) or `"traces"` (a folder of Kineto traces, or one '
        "trace)"))
    world_size: int = field(metadata=_m(
        "the job's world size (from the run's metadata or the traces)"))
    ranks: list[int] = field(default_factory=list, metadata=_m("the ranks found, sorted"))
    hosts: dict[str, list[int]] = field(default_factory=dict, metadata=_m(
        'host name → its ranks (`"unknown"` when a trace does not name its host)'))
    backend: str | None = field(default=None, metadata=_m(
        "`nccl`, `gloo`, ... as the ranks recorded it; null when unknown"))
    device_type: str = field(default="cpu", metadata=_m(
        'the accelerator (`cuda`, ...), `"cpu"` when no rank has one'))
    traced_ranks: list[int] | None = field(default=None, metadata=_m(
        "the ranks `uberprof run --trace-ranks` chose to record trace windows; the others "
        "have their step timeline and Flight Recorder only (their step times and arrivals "
        "count, and a missing trace of theirs is no problem); null when every rank records"))
    analysed_steps: list[int] = field(default_factory=list, metadata=_m(
        "the traced steps the diagnosis covers (`-1`: a rank whose trace has no step "
        "annotations, analysed as one pseudo-step spanning its trace); `[]` where nothing was "
        "analysed"))
    analysed_wall_ms: float | None = field(default=None, metadata=_m(
        "wall time of the analysed steps: per step the longest rank's analysed time (the longer "
        "of its host and device windows: a device running behind its host lengthens it), "
        "summed. Every share and severity is of this"))
    host_wall_ms: float | None = field(default=None, metadata=_m(
        "the same steps by their host windows alone (per step the longest rank's host step "
        "time, summed): the job's own pace, which `uberprof scaling` reads"))
    step_time_ms: float | None = field(default=None, metadata=_m(
        "the median host step time over every rank's analysed steps"))
    warmup: dict[str, Any] | None = field(default=None, metadata=_m(
        "the warm-up left out of the analysed steps and of every verdict: `{steps, ranks, ms, "
        "cut_ms, evidence_ms, why}`: the leading steps that one-time work (compilation, cuDNN "
        "autotuning, lazy kernel loading, CUDA initialisation) made at least 1.5x the later "
        "steps' median with its evidence for half the excess, the ranks whose evidence named "
        "them, their wall time, per rank without step markers the part of its window cut, "
        "the evidence by kind (ms, the most on one rank) and the same in words; null when "
        "there was none (docs/report.md#warm-up)"))
    gap_threshold_us: float | None = field(default=None, metadata=_m(
        "the shortest idle gap counted (`--gap-threshold-us`)"))
    clock_alignment: dict[str, Any] = field(
        default_factory=lambda: {"reference": None, "hosts": []},
        metadata=_m("how each host's clock was put on the reference clock (below); "
                    '`{"reference": null, "hosts": []}` where nothing was analysed'))
    collectives: dict[str, Any] = field(
        default_factory=lambda: {"matched_instances": 0, "unmatched_calls": 0,
                                 "unmatched_examples": [], "groups": {}},
        metadata=_m("matching of collectives across ranks (below)"))
    bandwidth: list[dict[str, Any]] = field(default_factory=list, metadata=_m(
        "one object per collective class, with its verdict (below)"))
    problems: list[str] = field(default_factory=list, metadata=_m(
        "one sentence per problem met while reading or matching (a damaged file, missing ranks, "
        "unmatched collectives, no trace window)"))
    straggler_test: dict[str, Any] | None = field(default=None, metadata=_m(
        "the straggler decision and its numbers, also when no straggler is named; null without "
        "matched collectives (below)"))
    step_time: dict[str, Any] | None = field(default=None, metadata=_m(
        "step time with its basis, profiler inflation and uberprof's own cost (below); null "
        "where nothing was analysed"))
    timeline_changes: list[dict[str, Any]] = field(default_factory=list, metadata=_m(
        "where the job's step time changed level over the whole step timeline, one object "
        "per episode (consecutive changes the same way), in step order (below; "
        "[report.md](report.md#the-story-in-time)); `[]` where it held its level or there is "
        "no step timeline"))
    accounting: dict[str, Any] | None = field(default=None, metadata=_m(
        "`analysed_wall_ms`, `at_stake_ms` (the findings' times at stake, summed: never more "
        "than `analysed_wall_ms`), and `rule`, the accounting rule in words; null where nothing "
        "was analysed"))
    parallelism: dict[str, Any] | None = field(default=None, metadata=_m(
        "how the ranks divide the work, read from the traces' process groups and API markers "
        "([parallelism.md](parallelism.md)): `kinds` (`pp`, `tp`, `fsdp2`, `fsdp1`, `ddp`, in "
        "that order; `[]` single-process or unknown), `summary` (one line, as the report prints "
        "it), `dims` (device-mesh dimension → size), `groups` (kind or dimension → its groups "
        "in global ranks), `stage_of` (rank, as a string → pipeline stage), `evidence` (kind or "
        "dimension → what it was read from, in words), `ranks_read` (ranks whose traces were "
        "read for markers), `pipeline` (schedule and micro-batches where known, else null); "
        "null where nothing was analysed"))
    operators: dict[str, Any] | None = field(default=None, metadata=_m(
        "the operator and kernel views: host operators by self time, kernels and communication "
        "kernels by time, summed over the analysed steps of every rank, with shares and spread "
        "across ranks (below; [operators.md](operators.md)); null where nothing was analysed"))
    memory: dict[str, Any] | None = field(default=None, metadata=_m(
        "each rank's GPU and host memory: peak against the device, what it holds between steps "
        "and how that changed, the process's resident set size (below; "
        "`uberprof/analysis/diagnosis/memory.py`); null where no rank has any (a CPU run "
        "without counters, a path that is not a run directory). A run directory without traces "
        "has it too"))
    critical_path: dict[str, Any] | None = field(default=None, metadata=_m(
        "what sets each traced step's length across ranks, from the step graph "
        "([whatif.md](whatif.md)): `steps[]` (`step`, `length_ms`, `rank` whose window is "
        "longest, `by_kind_ms` over `compute`, `transfer`, `waiting`, `data`, `host`, "
        "`by_rank_ms`, `top_operators[]` `{name, ms}`), and over the steps `by_kind_ms`, "
        "`by_kind_pct`, `by_rank_ms`, `rank` and `kind` (most of the path), `top_operators[]`, "
        "`summary` (one line); null where nothing was analysed"))
    replay: dict[str, Any] | None = field(default=None, metadata=_m(
        "the step graph replayed with the recorded durations against the measured steps "
        "([whatif.md](whatif.md)): `steps[]` (`step`, `measured_ms`, `replayed_ms`, "
        "`error_pct`), `median_error_pct`, `max_error_pct`, `fit_for_projection` (median error "
        "at most `threshold_pct`, 5), `why` (a sentence; the reasons when unfit), `caveats` "
        "(sentences: what makes projections less sure than their intervals, such as CPU ranks "
        "that fill their cores or a host busy with other work; "
        "[whatif.md](whatif.md#reading-a-projection)), `graph` (`ranks`, nodes and edges by "
        "kind, `dropped_dependencies`), `core_sharing` (where CPU ranks' run-queue wait is "
        "known: `model` and per host `host`, `cores`, `background_threads`, the mean number of "
        "other runnable threads fitted to it, and `busy`, that number at least a quarter of the "
        "cores; null otherwise; [whatif.md](whatif.md#cores-shared-by-cpu-ranks)); null where "
        "nothing was analysed"))
    fix_top_two: dict[str, Any] | None = field(default=None, metadata=_m(
        "the first two findings with a positive `projected_gain`, fixed together in one replay "
        "(gains do not add): `findings` (their indices), `kinds`, `changes`, "
        "`baseline_step_ms`, `projected_step_ms`, `gain_ms`, `gain_pct`, `interval_ms`, "
        "`separate_gain_ms`, `sum_of_separate_gain_ms`, `sentence`; null when fewer than two "
        "findings have a gain"))
    p2p: dict[str, Any] | None = field(default=None, metadata=_m(
        "send/recv pairs and unpaired calls, per direction their waiting and transfer (below; "
        "[parallelism.md](parallelism.md)); null where nothing was analysed"))
    pipeline: dict[str, Any] | None = field(default=None, metadata=_m(
        "each pipeline stage's compute, waits and bubble, the micro-batches and the schedule "
        "(below); null without point-to-point traffic between stages"))
    comm_by_group: list[dict[str, Any]] = field(default_factory=list, metadata=_m(
        "the exposed communication per process group of the matched collectives (below); `[]` "
        "where nothing was analysed"))
    modules: dict[str, Any] | None = field(default=None, metadata=_m(
        "time per `nn.Module` (forward), from module spans in the traces (`uberprof run "
        "--modules`, or torch.profiler's own with stacks): the top modules by total time over "
        "every rank's analysed steps (below; [modules.md](modules.md)); null where the traces "
        "have none"))
    memory_timeline: dict[str, Any] | None = field(default=None, metadata=_m(
        "per rank and device, the peak allocated bytes in the trace windows and its moment, "
        "from torch.profiler's `[memory]` events (`uberprof run --profile-memory`; below); null "
        "where the traces have none"))
    job_traits: dict[str, Any] = field(default_factory=dict, metadata=_m(
        "what the job already does, read before any remedy is chosen (each remedy's "
        "precondition, [findings.md](findings.md#remedies-and-their-preconditions)): "
        "`optimizer` (`classes`, `implementation` foreach/fused/plain, `device`, `region`, "
        "`host_ms_per_step`, `top_op`), `cuda_graphs`, `compiled`, `collectives` (per group and "
        "collective: `calls_per_step`, `mb_median`/`mb_min`/`mb_max`, `ms`, `share_pct`), "
        "`embeddings`, `precision`, `activation_checkpointing`, `data_loader_workers`, "
        "`ranks_read`; `{}` where nothing was analysed"))


@dataclass(slots=True, kw_only=True)
class RankDoc:
    """One item of `ranks`: a rank's own numbers."""

    rank: int = field(metadata=_m("the rank"))
    host: str | None = field(metadata=_m("its host (null when unknown)"))
    mode: str = field(metadata=_m(
        "`device` (GPU activity analysed) or `cpu` (a CPU-only rank: operators are the compute, "
        "Gloo spans the communication)"))
    device_type: str | None = field(metadata=_m("`cuda`, ... or null"))
    steps: int | None = field(metadata=_m(
        "steps known for the rank (its step timeline, else its `ProfilerStep#N` annotations)"))
    step_time_ms: dict[str, float | None] = field(metadata=_m(
        "`{median, p90}` of its host step times"))
    breakdown_pct: dict[str, float | None] = field(metadata=_m(
        "`{compute, non_compute, exposed_comm, memory, idle, overlap}`: % of the rank's "
        "analysed time (`analysed.window_ms`, the time the findings' shares are of); compute, "
        "exposed communication, memory and idle tile it, idle including a host step longer "
        "than the device's; `overlap` is |compute ∩ comm| / |comm|, null without "
        "communication (`uberprof analyze` prints HTA's whole-trace breakdown instead: "
        "[analyze.md](analyze.md#definitions))"))
    analysed: dict[str, float | None] = field(metadata=_m(
        "`{compute_ms, exposed_comm_ms, memory_ms, idle_ms, data_wait_ms, window_ms, comm_ms, "
        "overlap_ms}` summed over the analysed steps; `window_ms` is the rank's analysed time "
        "(per step the longer of its host and device windows), which the four parts before "
        "`data_wait_ms` tile; `comm_ms` all communication, `overlap_ms` the part under "
        "compute"))
    idle_gaps: dict[str, Any] = field(metadata=_m(
        "`{count, ms_by_cause: {data, sync, launch, host, other, warmup}}`: idle gaps over "
        "the threshold in the analysed steps (`warmup`: one-time initialisation, named and "
        "left out of the verdicts)"))
    lateness_ms: dict[str, Any] = field(metadata=_m(
        "`{median, p90, last_in, instances}`: its lateness at matched collectives of the traced "
        "window, how often it alone arrived last, and out of how many"))
    exposed_comm: dict[str, Any] | None = field(default=None, metadata=_m(
        "its exposed communication over the analysed steps, split "
        "([report.md](report.md#exposed-communication-per-rank)): `exposed_ms` (= "
        "`analysed.exposed_comm_ms`) = `wait_ms` (waiting for late peers) + `transfer_ms` + "
        "`unmatched_ms` (in no matched collective), to rounding; `wait_by_peer[]` `{rank, ms}` "
        "(the peer that arrived last), `wait_by_collective[]` `{name, group, ms}` and "
        "`top_waits[]` `{peer, name, group, ms}` (the five largest; `peer` null for sends and "
        "receives), largest first; null without analysed steps"))
    accounted: dict[str, Any] | None = field(default=None, metadata=_m(
        "how the findings account for its time: `exposed_comm` and `idle`, each `{ms` (its "
        "own, as in `analysed`), `by_findings[]` `{index, kind, ms}` (the findings' "
        "`accounts_for` this rank), `unexplained_ms}` (what no finding explains: `ms` less "
        "the findings' parts, never below 0; the terminal report says it); `idle` also "
        "`warmup_ms` (its warm-up gaps: named, left out of the verdicts on purpose, and not in "
        "`unexplained_ms`) and `in_short_gaps_ms` (the part of `unexplained_ms` in no idle "
        "gap over the threshold); null without analysed steps"))


RUN_KEYS = tuple(f.name for f in fields(RunDoc))  # every key of the `run` object, in order


def as_json(doc: Any) -> dict[str, Any]:
    """A document dataclass as the plain dict the JSON holds: its fields in declared order
    (shallow: nested objects are the document's own)."""
    return {f.name: getattr(doc, f.name) for f in fields(doc)}
