"""Communication of one run per collective class (group, collective, bytes), per step.

A class's bytes are `S` as the report's bandwidth table counts them (`bandwidth.message_bytes`:
the whole buffer, so an all-gather's is its output), and its group the one the matcher used
(`tables/groups.py`), so `diff` and `report` name the same class the same way.

Calls and time come from every rank's collective calls; bus bandwidth, waiting (arrived before
the last participant) against transfer (after the last arrival), and exposed time (not under
compute) come from the diagnosis's matched instances, so they exist where instances matched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from uberprof.analysis.diagnosis.bandwidth import message_bytes
from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.analysis.tables.collectives import group_sizes
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.groups import attribute_groups
from uberprof.analysis.tables.p2p import P2P_NAMES

__all__ = ["CollStat", "collective_stats"]

CollKey = tuple[str, str, int]  # group, collective, bytes S (-1: unknown)


@dataclass
class CollStat:
    """One collective class of one run; per-step values are per rank (calls, time, wait,
    transfer) or for the step as a whole (exposed)."""

    group: str
    name: str
    bytes: int | None
    calls: float  # per rank and step
    time_ns: float  # per rank and step: the calls' own duration
    busbw_Bps: float | None  # median over matched instances
    wait_ns: float | None  # per rank and step
    transfer_ns: float | None  # per rank and step
    exposed_ns: float | None  # per step (the fastest participant's, docs/DESIGN.md)


def _in(col: str, values: list[int] | None) -> str:
    return "TRUE" if values is None else \
        f"{col} IN ({', '.join(map(str, values)) or 'NULL'})"


def collective_stats(ctx: RunContext, d: Diagnosis, ranks: list[int], steps: list[int]
                     ) -> dict[CollKey, CollStat]:
    """Per class, per-step averages over `ranks` and `steps` (step -1: the whole trace)."""
    n_ranks, n_steps = max(len(ranks), 1), max(len(steps), 1)
    step_filter = None if steps == [-1] else steps
    con = duckdb.connect()
    try:
        calls = attribute_groups(ctx, ctx.collectives(), skip=P2P_NAMES)
        if calls.num_rows == 0:
            return {}
        con.register("c", calls)
        sizes = group_sizes(ctx)
        out: dict[CollKey, CollStat] = {}
        for grp, name, inb, outb, gsize, n, t in con.sql(f"""
                SELECT coalesce(pg_name, pg_ranks, 'default'), coalesce(name, event),
                       in_bytes, out_bytes, any_value(group_size), count(*),
                       sum(end_ns - start_ns)
                FROM c WHERE {_in('rank', ranks)} AND {_in('step', step_filter)}
                  AND coalesce(name, '') NOT IN {P2P_NAMES}
                GROUP BY ALL""").fetchall():
            s = message_bytes(name, inb, outb, gsize or sizes.get(grp) or 1)
            size = -1 if s is None else int(s)
            st = out.get((grp, name, size))
            if st is None:
                st = out[(grp, name, size)] = CollStat(grp, name, None if size < 0 else size,
                                                        0.0, 0.0, None, None, None, None)
            st.calls += n / n_ranks / n_steps
            st.time_ns += float(t or 0) / n_ranks / n_steps
        if d.matched.instances.num_rows:
            _add_matched(con, d, ranks, step_filter, n_ranks, n_steps, out)
        return out
    finally:
        con.close()


def _add_matched(con: duckdb.DuckDBPyConnection, d: Diagnosis, ranks: list[int],
                 steps: list[int] | None, n_ranks: int, n_steps: int,
                 out: dict[CollKey, CollStat]) -> None:
    con.register("i", d.matched.instances)
    con.register("b", d.bandwidth)
    con.register("l", d.lateness)
    rows: list[tuple[Any, ...]] = con.sql(f"""
        WITH lw AS (
            SELECT instance, rank, transfer_ns,
                   max(lateness_ns) OVER (PARTITION BY instance) - lateness_ns AS wait_ns
            FROM l),
        per AS (
            SELECT i.grp, i.name, i.instance,
                   sum(lw.wait_ns) AS wait_ns, sum(lw.transfer_ns) AS transfer_ns
            FROM i JOIN lw ON lw.instance = i.instance AND lw.rank = i.rank
            WHERE {_in('i.rank', ranks)} AND {_in('i.step', steps)}
            GROUP BY ALL)
        SELECT per.grp, per.name, coalesce(b.bytes, -1), median(b.busbw_Bps), sum(per.wait_ns),
               sum(per.transfer_ns), sum(b.exposed_ns)
        FROM per JOIN b ON b.instance = per.instance
        GROUP BY ALL""").fetchall()
    for grp, name, size, busbw, wait, transfer, exposed in rows:
        st = out.get((grp, name, int(size)))
        if st is None:
            continue
        st.busbw_Bps = float(busbw) if busbw is not None else None
        st.wait_ns = float(wait or 0) / n_ranks / n_steps
        st.transfer_ns = float(transfer or 0) / n_ranks / n_steps
        st.exposed_ns = float(exposed or 0) / n_steps if exposed is not None else None
