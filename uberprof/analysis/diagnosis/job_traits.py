"""What the job already does, read from its traces before any remedy is chosen (issue 50).

A remedy is advice to change something; advice to do what the job already does costs trust.
Each field below is a remedy's precondition (`causes.REMEDIES` names which), computed once per
diagnosis from the tables `analyze` saved, and saved as `run.job_traits` (docs/json.md), so the
remedy's words and the number it quotes are the document's:

- `optimizer`: the optimizer classes (`Optimizer.step#<Class>.step`), their implementation
  (`fused`: `aten::_fused_*` operators; `foreach`: `aten::_foreach_*`; `plain`: neither), the
  device its kernels run on (multi-tensor-apply or fused kernels), the host time a step of its
  region (a `## optimizer ##`-style annotation where the job has one, else the
  `Optimizer.step` spans) and its costliest foreach or fused operator per call;
- `cuda_graphs` (`cudaGraphLaunch` calls) and `compiled` (Triton kernels, compiled regions);
- `collectives`: per process group and collective, its calls a step, bytes a call (median,
  smallest, largest) and time, and each collective's share of the communication time;
- `embeddings` (fbgemm split-embedding kernels, TorchRec, EmbeddingBag);
- `precision`: the reduced-precision dtypes kernel names show (bf16, fp16, fp8);
- `activation_checkpointing` where its annotations show; `data_loader_workers` (multi-process or
  single-process data-loader iterator) where the trace shows the fetch.

Read from at most `RANKS_READ` ranks' event names and optimizer spans (the first ones), the
whole operator and collective tables otherwise.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables import derived as D
from uberprof.ingest import classify as K
from uberprof.units import ns_to_ms as _ms

if TYPE_CHECKING:
    from uberprof.analysis.tables.context import RunContext

__all__ = ["RANKS_READ", "job_traits", "traits_of"]

RANKS_READ = 4  # ranks whose events are read (every rank of a job runs the same program)

_OPT_CLASS = re.compile(r"^Optimizer\.step#(\w+)\.step$")
_FUSED_OP = re.compile(r"^aten::_fused_(adamw?|sgd|adagrad)_?")
_FOREACH_OP = re.compile(r"^aten::_foreach_")
_OPT_KERNEL = re.compile(r"multi_tensor_apply|fused_adam|FusedAdam|fused_sgd|foreach", re.IGNORECASE)
_OPT_REGION = re.compile(r"optimi[sz]er", re.IGNORECASE)
_COMPILED = re.compile(r"^triton_|^Torch-Compiled Region|CompiledFxGraph|CompiledFunction")
_EMBEDDING = re.compile(r"split_embedding|fbgemm|torchrec|embedding_bag|EmbeddingBag", re.IGNORECASE)
_CHECKPOINT = re.compile(r"CheckpointFunction|checkpoint", re.IGNORECASE)
_PRECISION = (("fp8", re.compile(r"fp8|e4m3|e5m2", re.IGNORECASE)),
              ("bf16", re.compile(r"bf16|bfloat16", re.IGNORECASE)),
              ("fp16", re.compile(r"c10::Half|fp16|__half|\bhalf\b|h884|h1688|f16", re.IGNORECASE)))
_MULTI_WORKER = re.compile(r"_MultiProcessingDataLoaderIter")
_ONE_WORKER = re.compile(r"_SingleProcessDataLoaderIter")


def job_traits(ctx: RunContext, traced: pa.Table, device_type: str) -> dict[str, Any]:
    """`run.job_traits` of a diagnosed run (module docstring)."""
    ranks = sorted(ctx.rank_ids)[:RANKS_READ]
    names: set[str] = set()
    spans: dict[int, pa.Table] = {}
    for r in ranks:
        try:
            names |= D.read_rank_names(ctx.derived, ctx.run.inputs, r)
            spans[r] = _optimizer_spans(ctx, r)
        except (KeyError, OSError, ValueError, pa.ArrowException):
            continue
    try:
        ops = ctx.operators()
    except (OSError, pa.ArrowException):
        ops = None
    try:
        colls = ctx.collectives()
    except (OSError, pa.ArrowException):
        colls = None
    return traits_of(names, ops, spans, colls, traced, device_type)


def _optimizer_spans(ctx: RunContext, rank: int) -> pa.Table:
    """One rank's optimizer spans: `Optimizer.step#...` and annotations named for the
    optimizer (name, ts, dur, step, tid)."""
    parts = []
    for k in D.rank_input_keys(ctx.run.inputs).get(rank, []):
        t = D.read_small(D.input_dir(ctx.derived, k) / D.EVENTS_FILE,
                         ["name", "kind", "ts", "dur", "step", "tid"])
        name = t.column("name").cast(pa.string())
        keep = pc.or_(pc.equal(t.column("kind").cast(pa.string()), K.OPTIMIZER),
                      pc.and_(pc.equal(t.column("kind").cast(pa.string()), K.ANNOTATION),
                              pc.and_(pc.match_substring_regex(name, r"(?i)optimi[sz]er"),
                                      pc.invert(pc.match_substring(name, "zero_grad")))))
        t = t.filter(pc.fill_null(keep, False))
        i = t.schema.get_field_index("name")
        parts.append(t.set_column(i, "name", t.column("name").cast(pa.string())))
    return pa.concat_tables(parts) if parts else pa.table({})


def traits_of(names: set[str], ops: pa.Table | None, spans: dict[int, pa.Table],
              colls: pa.Table | None, traced: pa.Table, device_type: str) -> dict[str, Any]:
    """The reading itself, from the event names of the ranks read, the operator table, their
    optimizer spans, the collective table and the analysed steps."""
    kernels = {n for n in names if n} if ops is None else set(
        ops.filter(pc.is_in(ops.column("kind"), pa.array([K.KERNEL])))
        .column("name").to_pylist())
    graph_launches = _calls(ops, "cudaGraphLaunch") if ops is not None else 0
    compiled = sorted(n for n in names if _COMPILED.search(n))
    precision = [p for p, pat in _PRECISION if any(pat.search(k) for k in kernels)]
    workers = ("several" if any(_MULTI_WORKER.search(n) for n in names) else
               "none" if any(_ONE_WORKER.search(n) for n in names) else None)
    return {
        "optimizer": _optimizer(names, ops, kernels, spans, device_type),
        # launches: calls counted where the operator table has them, else None (present only)
        "cuda_graphs": {"present": bool(graph_launches or "cudaGraphLaunch" in names),
                        "launches": graph_launches or None},
        "compiled": {"present": bool(compiled),
                     "triton_kernels": sum(1 for k in kernels if k.startswith("triton_")),
                     "examples": compiled[:3]},
        "collectives": _collectives(colls, traced),
        "embeddings": {"present": any(_EMBEDDING.search(n) for n in names | kernels),
                       "examples": sorted(n for n in names | kernels
                                          if _EMBEDDING.search(n))[:3]},
        "precision": precision,
        "activation_checkpointing": True if any(_CHECKPOINT.search(n) for n in names) else None,
        "data_loader_workers": workers,
        "ranks_read": sorted(spans),
    }


def _calls(ops: pa.Table, name: str) -> int:
    t = ops.filter(pc.equal(ops.column("name"), name))
    return int(pc.sum(t.column("calls")).as_py() or 0) if t.num_rows else 0


def _optimizer(names: set[str], ops: pa.Table | None, kernels: set[str],
               spans: dict[int, pa.Table], device_type: str) -> dict[str, Any]:
    classes = sorted({m.group(1) for n in names if (m := _OPT_CLASS.match(n))})
    fused = sorted(n for n in names if _FUSED_OP.match(n))
    foreach = sorted(n for n in names if _FOREACH_OP.match(n))
    impl = ("fused" if fused else "foreach" if foreach else "plain" if classes else None)
    on_device = any(_OPT_KERNEL.search(k) for k in kernels)
    device = "cpu" if device_type == "cpu" else (device_type if on_device else
                                                 ("host" if impl else None))
    region, per_step = _region_ms(spans)
    top = None
    if ops is not None and (fused or foreach):
        t = ops.filter(pc.is_in(ops.column("name"), pa.array(fused or foreach)))
        if t.num_rows:
            rows = sorted(t.to_pylist(), key=lambda r: -(r["self_ns"] or 0))
            r = rows[0]
            top = {"name": r["name"], "ms_per_call": _ms((r["incl_ns"] or 0)
                                                         / max(r["calls"] or 1, 1))}
    return {"classes": classes, "implementation": impl, "device": device,
            "region": region, "host_ms_per_step": per_step, "top_op": top}


def _region_ms(spans: dict[int, pa.Table]) -> tuple[str | None, float | None]:
    """The optimizer region's host time a step (the largest over the ranks read): a named
    annotation where the job has one (it holds every optimizer of the step), else the
    `Optimizer.step` spans; nested spans counted once."""
    best: tuple[str | None, float | None] = (None, None)
    for t in spans.values():
        if not t.num_rows:
            continue
        rows = t.to_pylist()
        ann = [r for r in rows if not _OPT_CLASS.match(r["name"])]
        use = ann or rows
        region = ann[0]["name"] if ann else "Optimizer.step"
        steps = {r["step"] for r in use if r["step"] is not None}
        total = _union_ns([(r["ts"], r["ts"] + (r["dur"] or 0)) for r in use])
        per = _ms(total / max(len(steps), 1))
        if best[1] is None or per > best[1]:
            best = (region, per)
    return best


def _union_ns(iv: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(iv):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _collectives(colls: pa.Table | None, traced: pa.Table) -> list[dict[str, Any]]:
    """Per process group and collective: calls a step (on the rank with most), bytes a call
    and time, each collective's share of the run's collective time; by time, largest first."""
    if colls is None or not colls.num_rows:
        return []
    steps = max(len(set(traced.column("step").to_pylist())), 1) if traced.num_rows else 1
    rows = colls.select(["rank", "name", "pg_name", "in_bytes", "start_ns", "end_ns",
                         "group_size", "step"]).to_pylist()
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["name"] in ("send", "recv", "barrier"):
            continue
        by.setdefault((str(r["pg_name"] or "default"), str(r["name"])), []).append(r)
    total = sum(max(r["end_ns"] - r["start_ns"], 0) for rs in by.values() for r in rs) or 1
    out = []
    for (pg, name), rs in by.items():
        size = [r["in_bytes"] for r in rs if r["in_bytes"]]
        per_rank: dict[int, int] = {}
        for r in rs:
            per_rank[r["rank"]] = per_rank.get(r["rank"], 0) + 1
        ns = sum(max(r["end_ns"] - r["start_ns"], 0) for r in rs)
        gs = [r["group_size"] for r in rs if r["group_size"]]
        largest: dict[tuple[int, Any], int] = {}  # (rank, step) -> its largest call's bytes
        for r in rs:
            k = (r["rank"], r["step"])
            largest[k] = max(largest.get(k, 0), r["in_bytes"] or 0)
        out.append({"group": pg, "name": name,
                    "calls_per_step": round(max(per_rank.values()) / steps, 1),
                    "group_size": max(gs) if gs else None,
                    "mb_median": round(float(np.median(size)) / 2**20, 2) if size else None,
                    "mb_min": round(min(size) / 2**20, 2) if size else None,
                    "mb_max": round(max(size) / 2**20, 2) if size else None,
                    "largest_mb_across_ranks": _across_ranks(largest),
                    "ms": _ms(ns), "share_pct": round(100 * ns / total, 1)})
    return sorted(out, key=lambda c: -c["ms"])


def _across_ranks(largest: dict[tuple[int, Any], int]) -> list[float] | None:
    """The largest call of a step on the rank that sends least and on the one that sends
    most, in the step where they differ most (MB): unequal all-to-all splits show here. None
    with fewer than two ranks in any step."""
    by_step: dict[Any, list[int]] = {}
    for (_, step), b in largest.items():
        by_step.setdefault(step, []).append(b)
    spans = [(min(v), max(v)) for v in by_step.values() if len(v) > 1 and max(v)]
    if not spans:
        return None
    lo, hi = min(spans, key=lambda x: x[0] / x[1])
    return [round(lo / 2**20, 2), round(hi / 2**20, 2)]
