"""What `/operators` shows: the report's operator and kernel lists (`run.operators` of the saved
diagnosis, `analysis/diagnosis/top_ops.py`: calls, self and total time, mean per call, shares of
the analysed steps' time and the spread across ranks per analysed step), and one operator's time
on every rank from the operator table `uberprof analyze` saved (`derived/operators.parquet`,
read through the run's tables), over each rank's analysed steps (`Diagnosis.steps`), the basis of
the document's spread. The analysis made every number; this module picks them out and groups
the saved table by rank, so a diagnosis saved without `operators` (an older uberprof) reads as
"nothing to show". Host operators come grouped by name or, where the trace recorded input shapes,
by name and input shapes (the document's `operators_by_shapes`; the saved table keeps `shapes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.dashboards.data import RunData

__all__ = ["KINDS", "RankBars", "Row", "document", "kinds_present", "per_rank", "rows",
           "shapes_recorded"]

# The page's kind selector: (value, label, the document's list, the table kinds in it).
KINDS = (
    ("operator", "operators", "operators", ("operator",)),
    ("kernel", "kernels", "kernels", ("kernel",)),
    ("comm_kernel", "communication kernels", "comm_kernels", ("comm_kernel",)),
    ("memory", "memory copies", "kernels", ("memcpy", "memset")),
)
_BY_VALUE = {k[0]: k for k in KINDS}


@dataclass(frozen=True)
class Row:
    """One row of the page's table, from one entry of `run.operators` (docs/json.md)."""

    id: str  # "<kind>:<index into the document's list>": the table's row id
    kind: str  # operator, kernel, comm_kernel, memcpy, memset
    name: str
    calls: int
    self_ms: float
    total_ms: float
    mean_us: float | None
    share_pct: float | None  # self (device: its) time, share of the analysed steps' time
    total_pct: float | None  # operators: total time's share; device: share of device time
    ranks: int
    min_ms: float | None  # per analysed step, the rank that ran it least
    min_rank: int | None
    median_ms: float | None
    max_ms: float | None  # ... and most
    max_rank: int | None
    shapes: str | None = None  # by name and input shapes: the operator's (None: not recorded)


@dataclass(frozen=True)
class RankBars:
    """One operator's time per analysed step on every analysed rank (0: never ran it)."""

    kind: str
    name: str
    ranks: list[int]
    ms_per_step: np.ndarray
    calls: np.ndarray  # per rank, over its analysed steps
    steps: np.ndarray  # analysed steps per rank
    time: str  # "self" (host operators) or "device"


def document(data: RunData) -> dict[str, Any] | None:
    """`run.operators` of the saved diagnosis; None when it has none."""
    d = data.diagnose()
    return (d.run["operators"] if d is not None else None) or None


def shapes_recorded(data: RunData) -> bool:
    """Whether the document groups host operators by input shapes too (the traces recorded
    them)."""
    doc = document(data) or {}
    return bool(doc.get("shapes_recorded") and doc.get("operators_by_shapes"))


def rows(data: RunData, kind: str, by_shapes: bool = False) -> list[Row]:
    """The rows of the document for one selector `kind` (KINDS), in its order (operators by
    self time, device work by time); host operators by name and input shapes with `by_shapes`
    (when the document has them)."""
    doc = document(data)
    spec = _BY_VALUE.get(kind)
    if doc is None or spec is None:
        return []
    _, _, key, kinds = spec
    by_shapes = by_shapes and key == "operators" and shapes_recorded(data)
    if by_shapes:
        key = "operators_by_shapes"
    out = []
    for i, e in enumerate(doc.get(key) or []):
        k = e.get("kind", "operator")
        if k not in kinds:
            continue
        host = key in ("operators", "operators_by_shapes")
        spread = (e.get("self_ms_per_step") if host else e.get("ms_per_step")) or {}
        time_ms = e.get("self_ms") if host else e.get("time_ms")
        out.append(Row(
            id=f"{kind}{'+shapes' if by_shapes else ''}:{i}", kind=k, name=e["name"], calls=int(e.get("calls") or 0),
            self_ms=time_ms or 0.0, total_ms=(e.get("total_ms") if host else time_ms) or 0.0,
            mean_us=e.get("mean_us"),
            share_pct=e.get("self_pct") if host else e.get("step_pct"),
            total_pct=e.get("total_pct") if host else e.get("device_pct"),
            ranks=int(e.get("ranks") or 0), min_ms=spread.get("min"),
            min_rank=spread.get("min_rank"), median_ms=spread.get("median"),
            max_ms=spread.get("max"), max_rank=spread.get("max_rank"),
            shapes=e.get("shapes") if by_shapes else None))
    return out


def totals(data: RunData, kind: str) -> int | None:
    """How many names of this kind the run has in all (the document keeps the top few); None
    for memory copies, which the document counts among the kernels."""
    doc = document(data) or {}
    return {"operator": doc.get("operators_total"), "kernel": None,
            "comm_kernel": doc.get("comm_kernels_total")}.get(kind)


def kinds_present(data: RunData) -> list[str]:
    """The selector's kinds with at least one row, in KINDS order."""
    return [k[0] for k in KINDS if rows(data, k[0])]


def _grouped(data: RunData, by_shapes: bool = False) -> pa.Table | None:
    """The saved operator table summed per rank, kind and name (`by_shapes`: and input shapes;
    a rank's traces together), on the analysed ranks only; None without traces."""
    def build() -> pa.Table | None:
        if data.ctx is None:
            return None
        ops = data.ctx.operators()
        steps = _analysed_steps(data)
        ops = ops.filter(pc.is_in(ops.column("rank"),
                                  value_set=pa.array(sorted(steps), pa.int64())))
        keys = ["rank", "kind", "name"]
        if by_shapes:
            if "shapes" not in ops.column_names:
                ops = ops.append_column("shapes", pa.nulls(ops.num_rows, pa.string()))
            keys.append("shapes")
        return ops.group_by(keys).aggregate(
            [("calls", "sum"), ("self_ns", "sum"), ("incl_ns", "sum")])
    return data.once("operators-by-rank-shapes" if by_shapes else "operators-by-rank", build)


def _analysed_steps(data: RunData) -> dict[int, int]:
    """rank -> its analysed steps (rows of `Diagnosis.steps`, as the document counts them)."""
    def build() -> dict[int, int]:
        d = data.diagnose()
        if d is None or d.steps.num_rows == 0:
            return {}
        counts = d.steps.group_by("rank").aggregate([("rank", "count")])
        return dict(zip(counts.column("rank").to_pylist(),
                        counts.column("rank_count").to_pylist()))
    return data.once("operators-rank-steps", build)


def analysed_ranks(data: RunData) -> list[int]:
    g = _grouped(data)
    return sorted(set(g.column("rank").to_pylist())) if g is not None and g.num_rows else []


def per_rank(data: RunData, kind: str, name: str, shapes: str | None = None
             ) -> RankBars | None:
    """Operator (or kernel) `name` of table kind `kind` (with `shapes`: only its calls with
    these input shapes) on every analysed rank: its self time (device work: its time) per
    analysed step, as the document's spread counts it."""
    g = _grouped(data, by_shapes=shapes is not None)
    if g is None or not g.num_rows:
        return None
    ranks = analysed_ranks(data)
    steps = _analysed_steps(data)
    match = pc.and_(pc.equal(g.column("kind"), kind), pc.equal(g.column("name"), name))
    if shapes is not None:
        match = pc.and_(match, pc.equal(g.column("shapes"), shapes))
    x = g.filter(match)
    by = "self_ns_sum" if kind == "operator" else "incl_ns_sum"
    pos = {r: i for i, r in enumerate(ranks)}
    ns = np.zeros(len(ranks))
    calls = np.zeros(len(ranks), dtype=np.int64)
    for r, v, c in zip(*(x.column(col).to_pylist() for col in ("rank", by, "calls_sum"))):
        ns[pos[r]] += v or 0
        calls[pos[r]] += c or 0
    n = np.array([max(steps.get(r, 0), 1) for r in ranks], dtype=np.int64)
    return RankBars(kind=kind, name=name, ranks=ranks, ms_per_step=ns / n / 1e6, calls=calls,
                    steps=n, time="self" if kind == "operator" else "device")
