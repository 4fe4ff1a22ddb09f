"""The report document: the one builder of what `uberprof report --json` prints and the HTML
report, the dashboard and the export read (docs/json.md). Every case goes through `run_doc`: a
full diagnosis, a run directory without traces (its hang and crash findings only) and a path
with nothing to diagnose. It builds a `RunDoc` (`report_doc.py`), which declares every key, so
a field is always there, empty or null where nothing was analysed; the advisor fills the rest
of its fields, and `as_json` makes the plain dict `Diagnosis.run` holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from uberprof.analysis.diagnosis.bandwidth import BANDWIDTH_SCHEMA, BandwidthClass
from uberprof.analysis.diagnosis.gaps import GAP_SCHEMA
from uberprof.analysis.diagnosis.lateness import LATENESS_SCHEMA
from uberprof.analysis.diagnosis.memory import memory_doc
from uberprof.analysis.diagnosis.model import Diagnosis, Finding
from uberprof.analysis.diagnosis.rank_comm import RankComm
from uberprof.analysis.diagnosis.report_doc import RankDoc, RunDoc, as_json
from uberprof.analysis.diagnosis.summaries import RankSummaries, summarise
from uberprof.analysis.tables.align import Alignment
from uberprof.analysis.tables.collectives import INSTANCE_SCHEMA, Matched
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.metrics import analysed_parts, percentages
from uberprof.analysis.tables.parallelism import Parallelism
from uberprof.analysis.tables.schemas import RUN_STEP_SCHEMA
from uberprof.rundir import RunDir, list_ranks, ranks_by_id
from uberprof.units import ns_to_ms as _ms

__all__ = ["empty_diagnosis", "failures_only_diagnosis", "ranks_doc", "run_doc", "run_doc_of"]


def run_doc(*, path: Path, run_id: str | None, kind: str, world_size: int, ranks: list[int],
            hosts: dict[str, list[int]], backend: str | None, device_type: str,
            analysed_steps: list[int], wall_ns: int | None, median_step_ns: float | None,
            threshold_ns: int | None, alignment: Alignment, matched: Matched,
            classes: list[BandwidthClass], problems: list[str]) -> RunDoc:
    """The `run` object of the report document (docs/json.md), with every field of `RunDoc`
    in every case. The diagnosis fills `straggler_test`, `step_time`, `accounting`,
    `parallelism`, `operators` (`top_ops.py`), ... where it ran; `memory` (`memory.py`)
    wherever the run directory has memory to show; the rest stay null or empty."""
    un = matched.unmatched
    return RunDoc(
        path=str(path),
        run_id=run_id,
        kind=kind,
        world_size=world_size,
        ranks=ranks,
        hosts=hosts,
        backend=backend,
        device_type=device_type,
        analysed_steps=analysed_steps,
        analysed_wall_ms=_ms(wall_ns) if wall_ns else None,
        step_time_ms=_ms(median_step_ns),
        gap_threshold_us=threshold_ns / 1e3 if threshold_ns is not None else None,
        clock_alignment=alignment.as_dict(),
        collectives={
            "matched_instances": matched.n_instances,
            "unmatched_calls": un.num_rows,
            "unmatched_examples": [
                {"rank": r["rank"], "collective": r["name"], "step": r["step"],
                 "bytes": r["in_bytes"], "reason": r.get("reason")}
                for r in un.slice(0, 5).to_pylist()] if un.num_rows else [],
            "groups": {g: {"ranks": v, "matched_by": matched.method.get(g)}
                       for g, v in matched.groups.items()},
        },
        bandwidth=[c.as_dict() for c in classes],
        problems=problems,
    )


def run_doc_of(ctx: RunContext, traced: pa.Table, wall_ns: int, median_step: float | None,
               alignment: Alignment, matched: Matched, threshold_ns: int, problems: list[str],
               classes: list[BandwidthClass], device_type: str,
               parallelism: Parallelism | None = None) -> RunDoc:
    """`run_doc` of a diagnosed run, with its parallelism (`tables/parallelism.py`)."""
    hosts: dict[str, list[int]] = {}
    for r in ctx.rank_ids:
        hosts.setdefault(ctx.host_of(r) or "unknown", []).append(r)
    doc = run_doc(
        path=ctx.root, run_id=RunDir(ctx.root).run_id() if ctx.is_run_dir else None,
        kind="run" if ctx.is_run_dir else "traces", world_size=ctx.world_size,
        ranks=ctx.rank_ids, hosts=hosts,
        backend=next((i.backend for i in ctx.ranks.values() if i.backend), None),
        device_type=device_type,
        analysed_steps=sorted(set(traced.column("step").to_pylist())) if traced.num_rows else [],
        wall_ns=wall_ns, median_step_ns=median_step, threshold_ns=threshold_ns,
        alignment=alignment, matched=matched, classes=classes, problems=problems)
    doc.parallelism = parallelism.as_dict() if parallelism is not None else None
    doc.traced_ranks = traced_ranks(ctx.root) if ctx.is_run_dir else None
    return doc


def traced_ranks(root: Path) -> list[int] | None:
    """The ranks `--trace-ranks` chose (rank.json's `trace.selected`), None when every rank
    records trace windows (no rank says it was left out)."""
    metas = ranks_by_id(list_ranks(root))
    if not any(m.trace.get("selected") is False for m in metas.values()):
        return None
    return sorted(r for r, m in metas.items() if m.trace.get("selected") is not False)


def empty_diagnosis(root: Path, problems: list[str], findings: list[Finding] | None = None
                    ) -> Diagnosis:
    """The diagnosis of a path with no trace to analyse: the findings given (a run
    directory's hangs and crashes), empty tables, and the same `run` fields as any report."""
    root = Path(root)
    run = RunDir(root)
    is_run = run.is_run()
    metas = ranks_by_id(run) if is_run else {}
    hosts: dict[str, list[int]] = {}
    for r, m in sorted(metas.items()):
        hosts.setdefault(m.host or "unknown", []).append(r)
    lat, gaps = LATENESS_SCHEMA.empty_table(), GAP_SCHEMA.empty_table()
    matched = Matched(INSTANCE_SCHEMA.empty_table(), pa.table({"rank": pa.array([], pa.int64())}),
                      {}, {})
    alignment = Alignment(reference=None)
    doc = run_doc(path=root, run_id=run.run_id() if is_run else None,
                  kind="run" if is_run else "traces", world_size=len(metas),
                  ranks=sorted(metas), hosts=hosts,
                  backend=next((m.backend for m in metas.values() if m.backend), None),
                  device_type="cuda" if any(m.device for m in metas.values()) else "cpu",
                  analysed_steps=[], wall_ns=None, median_step_ns=None, threshold_ns=None,
                  alignment=alignment, matched=matched, classes=[], problems=problems)
    doc.memory = memory_doc(root) if is_run else None
    return Diagnosis(run=as_json(doc), ranks=[], findings=list(findings or []), alignment=alignment,
                     matched=matched, lateness=lat, gaps=gaps,
                     bandwidth=BANDWIDTH_SCHEMA.empty_table(), classes=[], straggler=None,
                     steps=RUN_STEP_SCHEMA.empty_table(), summaries=summarise(lat, gaps))


def ranks_doc(ctx: RunContext, traced: pa.Table, summaries: RankSummaries,
              comm: Mapping[int, RankComm] | None = None) -> list[dict[str, Any]]:
    """One item of `ranks` per rank (RankDoc): its shares and times are of its analysed time
    (`metrics.analysed_parts`), the time the findings' shares are of; `comm`: each rank's
    exposed communication split (`rank_comm`)."""
    comm = comm or {}
    bd = {r["rank"]: r for r in ctx.breakdown().to_pylist()}
    per_rank = _analysed_by_rank(traced)
    out = []
    for r in ctx.rank_ids:
        b = bd.get(r, {})
        info = ctx.ranks[r]
        late = summaries.lateness_of(r)
        idle_ns, gaps = summaries.idle_of(r)
        st = per_rank.get(r, {})
        out.append(as_json(RankDoc(
            rank=r,
            host=info.host,
            mode=info.mode,
            device_type=info.device_type,
            steps=b.get("steps"),
            step_time_ms={"median": b.get("step_time_median_ms"),
                          "p90": b.get("step_time_p90_ms")},
            breakdown_pct=_shares(st),
            analysed={"compute_ms": _ms(st.get("compute")),
                      "exposed_comm_ms": _ms(st.get("exposed_comm")),
                      "memory_ms": _ms(st.get("memory")),
                      "idle_ms": _ms(st.get("idle")),
                      "data_wait_ms": _ms(st.get("data_wait")),
                      "window_ms": _ms(st.get("window")),
                      "comm_ms": _ms(st.get("comm")),
                      "overlap_ms": _ms(st.get("overlap"))},
            idle_gaps={"count": gaps,
                       "ms_by_cause": {c: _ms(v) for c, v in idle_ns.items()}},
            lateness_ms={"median": _ms(late["median_ns"]), "p90": _ms(late["p90_ns"]),
                         "last_in": late["last_in"], "instances": late["instances"]},
            exposed_comm=comm[r].as_dict() if r in comm else None,
        )))
    return out


def _analysed_by_rank(traced: pa.Table) -> dict[int, dict[str, int]]:
    """Per rank, its analysed steps' parts (`metrics.analysed_parts`) and data wait, summed."""
    parts = analysed_parts(traced)
    parts["data_wait"] = traced.column("data_wait_ns").fill_null(0).to_numpy(
        zero_copy_only=False)
    per: dict[int, dict[str, int]] = {}
    for i, r in enumerate(traced.column("rank").to_pylist()):
        acc = per.setdefault(r, {})
        for k, v in parts.items():
            acc[k] = acc.get(k, 0) + int(v[i])
    return per


def _shares(st: dict[str, int]) -> dict[str, float | None]:
    """`breakdown_pct` from a rank's summed parts: `metrics.percentages` of its analysed time."""
    if not st:
        return {k: None for k in ("compute", "non_compute", "exposed_comm", "memory", "idle",
                                  "overlap")}
    p = percentages(st["window"], st["compute"], st["comm"], st["overlap"], st["exposed_comm"],
                    st["memory"], st["idle"])
    return {k: p[f"{k}_pct"] for k in ("compute", "non_compute", "exposed_comm", "memory",
                                      "idle", "overlap")}


def failures_only_diagnosis(root: Path, problems: list[str]) -> Diagnosis:
    """A run directory that has no trace to analyse: its hang and crash findings (read from the
    run directory alone), with empty tables, so every view shows them as usual."""
    from uberprof.analysis.diagnosis.findings import declare
    from uberprof.analysis.diagnosis.findings.failures import failure_findings

    return empty_diagnosis(root, problems, declare(failure_findings(Path(root))))
