"""Point-to-point matching: which receive took which send.

A send is not a collective: its other side is the peer's receive, never another send, and the
two ranks need not be busy at the same moments. So send/recv rows never go through the
collective matcher (`collectives.py` leaves them out); here a send from rank A to rank B pairs
with B's receive from A, by (source, destination, step, bytes) and order within them. A row whose
peer is unknown, or whose other side is not in the traces, stays unmatched with its reason, never
guessed.

The peer a program names is a rank of the group the call used (`c10d::send(..., dst, tag)`);
the trace does not say which group. It is read as the rank's pipeline group when it has one (a
device-mesh dimension named like `pp`/`pipe`/`stage`), else the world. The rules below never
make a negative time: on aligned clocks a pair's receiver waits from posting its receive until
the send is posted (the sender's lateness, a pipeline's bubble), and what follows is transfer.
On Gloo a send is posted when its `c10d::send` call starts (the collectives table's
`launch_ns`): the call does the sending, and Gloo's span starts at its end, after the peer's
receive may have ended (launches.py). A receive's side is its Gloo span, the wait for the data
(a pipeline schedule posts `c10d::recv_` early, computes, then waits: from the post on, the time
is its own compute, not transfer). A send/recv kernel's own start on its stream is its post;
when clock error makes the order of the two posts unknowable, the pair's split is `None`
(unsplittable) and only its whole time is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from uberprof.analysis.tables.context import RankInfo, RunContext
from uberprof.analysis.tables.parallelism import is_pipeline_group

__all__ = ["NO_PEER", "P2P", "P2P_NAMES", "PAIR_SCHEMA", "global_peer", "match_p2p", "p2p_doc"]

P2P_NAMES = ("send", "recv")
# a call whose peer the trace does not give (a SQL literal below: no quote in it)
NO_PEER = ("the trace does not name its peer (on Gloo only the recorded inputs of the call give "
           "it: uberprof run --record-shapes on)")

PAIR_SCHEMA = pa.schema([
    ("pair", pa.int64()),
    ("src", pa.int64()),
    ("dst", pa.int64()),
    ("step", pa.int64()),
    ("bytes", pa.int64()),
    ("send_start_ns", pa.int64()),  # aligned clocks
    ("send_end_ns", pa.int64()),
    ("recv_start_ns", pa.int64()),
    ("recv_end_ns", pa.int64()),
    ("wait_ns", pa.int64()),  # receiver: posted before the send was; None: unsplittable
    ("transfer_ns", pa.int64()),  # receiver: from the later post to the end of its receive
    ("send_wait_ns", pa.int64()),  # sender: posted before the receive was; None: unsplittable
])



@dataclass
class P2P:
    """Matched send/recv pairs (PAIR_SCHEMA) and the rows left unmatched (rank, name, peer,
    step, start_ns, bytes, reason)."""

    pairs: pa.Table
    unmatched: pa.Table

    @property
    def rows(self) -> int:
        """Send and receive rows seen, matched or not."""
        return 2 * self.pairs.num_rows + self.unmatched.num_rows

    def per_rank_step(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(rank, step) -> (waiting, transfer) ns over its matched sends and receives: what a
        rank's exposed point-to-point time is made of. Unsplittable pairs count as neither."""
        out: dict[tuple[int, int], tuple[int, int]] = {}
        cols = [self.pairs.column(k).to_pylist() for k in
                ("src", "dst", "step", "wait_ns", "transfer_ns", "send_wait_ns", "send_start_ns",
                 "send_end_ns")]
        for src, dst, step, w, t, sw, s0, s1 in zip(*cols):
            if w is not None and t is not None:
                a = out.get((dst, step), (0, 0))
                out[(dst, step)] = (a[0] + w, a[1] + t)
            if sw is not None:
                a = out.get((src, step), (0, 0))
                out[(src, step)] = (a[0] + sw, a[1] + max(0, s1 - s0 - sw))
        return out


def global_peer(info: RankInfo | None, peer: int) -> int:
    """The global rank of `peer`, a rank of the group the call used (module docstring)."""
    groups = [g for g in (info.process_groups if info else [])
              if isinstance(g.get("ranks"), list) and len(g["ranks"]) > peer]
    for g in groups:
        if is_pipeline_group(g.get("desc")):
            return int(g["ranks"][peer])
    return peer


def match_p2p(ctx: RunContext, offsets: dict[int, int], error_ns: int = 0) -> P2P:
    """Pair the run's sends with their receives (module docstring). `offsets` align each
    rank's clock; `error_ns` is the alignment's error bound, under which the order of two
    posts is unknowable."""
    coll = ctx.collectives()
    if coll.num_rows == 0 or "peer" not in coll.column_names:
        return P2P(PAIR_SCHEMA.empty_table(), _empty_unmatched())
    import duckdb  # here: 45-90 ms that a start reading saved tables never needs

    con = duckdb.connect()
    con.register("coll", coll)
    rows = con.sql(f"""
        SELECT rank, name, peer, step,
               CASE WHEN name = 'send' AND coalesce(stream, -1) < 0  -- Gloo: sent in its call
                    THEN least(start_ns, coalesce(launch_ns, start_ns)) ELSE start_ns END,
               end_ns, in_bytes
        FROM coll WHERE name IN {P2P_NAMES} ORDER BY rank, start_ns""").fetchall()
    if not rows:
        con.close()
        return P2P(PAIR_SCHEMA.empty_table(), _empty_unmatched())
    con.register("p", _sides(ctx, rows, offsets))
    pairs = con.sql(f"""
        WITH k AS (
            SELECT *, row_number() OVER (PARTITION BY side, src, dst, step, nbytes
                                         ORDER BY start_ns) AS occ FROM p WHERE src IS NOT NULL)
        SELECT s.src, s.dst, s.step, s.nbytes AS bytes, s.start_ns AS send_start_ns,
               s.end_ns AS send_end_ns, r.start_ns AS recv_start_ns, r.end_ns AS recv_end_ns,
               CASE WHEN abs(s.start_ns - r.start_ns) <= {int(error_ns)} AND {int(error_ns)} > 0
                    THEN NULL
                    ELSE least(greatest(s.start_ns - r.start_ns, 0), r.end_ns - r.start_ns)
                    END AS wait_ns,
               CASE WHEN abs(s.start_ns - r.start_ns) <= {int(error_ns)} AND {int(error_ns)} > 0
                    THEN NULL
                    ELSE greatest(r.end_ns - greatest(s.start_ns, r.start_ns), 0)
                    END AS transfer_ns,
               CASE WHEN abs(s.start_ns - r.start_ns) <= {int(error_ns)} AND {int(error_ns)} > 0
                    THEN NULL
                    ELSE least(greatest(r.start_ns - s.start_ns, 0), s.end_ns - s.start_ns)
                    END AS send_wait_ns,
               s.rid AS s_rid, r.rid AS r_rid
        FROM k s JOIN k r
          ON s.side = 'send' AND r.side = 'recv' AND s.src = r.src AND s.dst = r.dst
         AND s.step IS NOT DISTINCT FROM r.step AND s.nbytes IS NOT DISTINCT FROM r.nbytes
         AND s.occ = r.occ
        ORDER BY s.start_ns, s.src, s.dst""").to_arrow_table()
    con.register("pairs", pairs)
    unmatched = con.sql(f"""
        SELECT p.rank, p.name, p.peer, p.step, p.start_ns, p.nbytes AS in_bytes,
               CASE WHEN p.src IS NULL THEN '{NO_PEER}'
                    ELSE 'no ' || CASE WHEN p.side = 'send' THEN 'receive' ELSE 'send' END
                         || ' of the same step and size on rank '
                         || CASE WHEN p.side = 'send' THEN p.dst ELSE p.src END END AS reason
        FROM p WHERE p.rid NOT IN (SELECT s_rid FROM pairs UNION ALL SELECT r_rid FROM pairs)
        ORDER BY p.start_ns""").to_arrow_table()
    con.close()
    n = pairs.num_rows
    pairs = pairs.drop_columns(["s_rid", "r_rid"])
    pairs = pa.Table.from_arrays([pa.array(range(n), pa.int64()), *pairs.columns],
                                 names=["pair", *pairs.column_names]).cast(PAIR_SCHEMA)
    return P2P(pairs, unmatched.cast(_UNMATCHED_SCHEMA))


def _sides(ctx: RunContext, rows: list[tuple[Any, ...]], offsets: dict[int, int]) -> pa.Table:
    """Each send/recv row with its source and destination in global ranks and aligned times."""
    out: dict[str, list[Any]] = {k: [] for k in ("rid", "rank", "name", "side", "peer", "src",
                                                 "dst", "step", "start_ns", "end_ns", "nbytes")}
    for rid, (rank, name, peer, step, start, end, nbytes) in enumerate(rows):
        off = offsets.get(rank, 0)
        other = global_peer(ctx.ranks.get(rank), int(peer)) if peer is not None else None
        send = name == "send"
        out["rid"].append(rid)
        out["rank"].append(rank)
        out["name"].append(name)
        out["side"].append("send" if send else "recv")
        out["peer"].append(other)
        out["src"].append(None if other is None else (rank if send else other))
        out["dst"].append(None if other is None else (other if send else rank))
        out["step"].append(step)
        out["start_ns"].append(start + off)
        out["end_ns"].append(end + off)
        out["nbytes"].append(nbytes)
    return pa.table(out)


_UNMATCHED_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("name", pa.string()), ("peer", pa.int64()), ("step", pa.int64()),
    ("start_ns", pa.int64()), ("in_bytes", pa.int64()), ("reason", pa.string()),
])


def _empty_unmatched() -> pa.Table:
    return _UNMATCHED_SCHEMA.empty_table()


def p2p_doc(p2p: P2P, examples: int = 5) -> dict[str, Any]:
    """The report document's `run.p2p` (docs/json.md): pairs and unmatched calls, and per
    direction (source, destination) the transfers, their size, the receiver's waiting and
    transfer time and the effective bandwidth (bytes over transfer time, latency included)."""
    doc: dict[str, Any] = {"pairs": p2p.pairs.num_rows, "unmatched_calls": p2p.unmatched.num_rows,
                           "unmatched_examples": [
                               {k: r[k] for k in ("rank", "name", "peer", "step", "in_bytes",
                                                  "reason")}
                               for r in p2p.unmatched.slice(0, examples).to_pylist()],
                           "by_direction": []}
    if not p2p.pairs.num_rows:
        return doc
    import duckdb

    con = duckdb.connect()
    con.register("p", p2p.pairs)
    for src, dst, n, med_bytes, wait, transfer, unsplit, bw in con.sql("""
            SELECT src, dst, count(*), median(bytes), sum(wait_ns), sum(transfer_ns),
                   count(*) FILTER (WHERE transfer_ns IS NULL),
                   median(bytes * 8.0 / transfer_ns) FILTER (WHERE transfer_ns > 0)
            FROM p GROUP BY src, dst ORDER BY src, dst""").fetchall():
        doc["by_direction"].append({
            "src": src, "dst": dst, "transfers": n,
            "bytes": int(med_bytes) if med_bytes is not None else None,
            "wait_ms": _ms(wait), "transfer_ms": _ms(transfer), "unsplittable": unsplit,
            "effective_gbit_s": round(float(bw), 3) if bw is not None else None})
    con.close()
    return doc


def _ms(ns: Any) -> float | None:
    return round(float(ns) / 1e6, 3) if ns is not None else None
