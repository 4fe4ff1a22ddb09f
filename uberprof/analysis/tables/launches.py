"""What the program called, for each Gloo span: the `c10d::` launch behind it.

On a CPU (Gloo) rank a collective shows twice: the `c10d::` operator that the program's call
enqueued (`c10d::_reduce_scatter_base_`, `c10d::send`), and the `gloo:*` span that did the work,
on a Gloo thread for collectives or on the calling thread for send/recv. The span is what took the
time, but only the launch says what was asked for: Gloo runs a reduce-scatter as an all-reduce of
the whole input (so the span says `all_reduce`), and only `c10d::send`/`c10d::recv_` name the
peer. The two are linked by time alone (the trace has no other link): each span takes the latest
launch not yet taken that started before it and asks for a compatible collective.

The launch also says when the program posted a send or receive: Gloo's `gloo:send` span can start
milliseconds after `c10d::send` did (measured on a 2-stage pipeline: the span began 4 ms into the
call, after the peer's receive had already ended), so the pairing of sends with receives
(`p2p.py`) reads the launch's start as the post.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from uberprof.ingest import classify as K

__all__ = ["SpanLaunch", "collective_family", "link_launches"]

# Launches that a span of another name carries out: Gloo's emulations.
_CARRIED_BY = {"reducescatter": "allreduce"}

SpanLaunch = tuple  # (canonical name, peer or None, start ns); None when no launch found


def link_launches(ev: pa.Table, span_rows: np.ndarray,
                  span_names: list[str | None]) -> list[SpanLaunch | None]:
    """For each span row (in `ev`, whose canonical collective name is in `span_names`), the
    launch behind it: its canonical name, for send/recv its peer, and its start; None where
    none fits."""
    kinds = ev.column("kind")
    launch_m = np.asarray(kinds.to_numpy(zero_copy_only=False) == K.COMM_OP) & np.asarray(
        ev.column("coll_name").is_valid())
    rows = np.flatnonzero(launch_m)
    if rows.size == 0 or span_rows.size == 0:
        return [None] * span_rows.size
    ts = ev.column("ts").to_numpy()
    names = ev.column("coll_name").cast(pa.string()).to_pylist()
    peers = ev.column("peer").to_pylist()
    by_family: dict[str, list[int]] = {}
    for r in rows.tolist():  # rows are in time order (the event table is sorted by start)
        by_family.setdefault(collective_family(K.canonical_collective(names[r])), []).append(r)
    starts = {f: ts[np.array(rs)] for f, rs in by_family.items()}
    used: set[int] = set()
    out: list[SpanLaunch | None] = [None] * span_rows.size
    for i in np.argsort(ts[span_rows], kind="stable").tolist():
        name = span_names[i]
        family = collective_family(name) if name else None
        rs = by_family.get(family) if family else None
        if not rs:
            continue
        k = int(np.searchsorted(starts[family], ts[span_rows[i]], side="right")) - 1
        while k >= 0 and rs[k] in used:
            k -= 1
        if k >= 0:
            used.add(rs[k])
            out[i] = (K.canonical_collective(names[rs[k]]), peers[rs[k]], int(ts[rs[k]]))
    return out


def collective_family(name: str | None) -> str:
    """The span name that carries out a launch of canonical `name` (`allgatherintotensor`
    and `allgather` are one family; a reduce-scatter is carried by an all-reduce on Gloo)."""
    n = name or ""
    for prefix in ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "barrier",
                   "send", "recv", "gather", "scatter", "reduce"):
        if n.startswith(prefix):
            return _CARRIED_BY.get(prefix, prefix)
    return n
