"""Collective matching: which rows of different ranks are the same collective instance.

Per docs/DESIGN.md, instances are matched by process group and order within the group, or by the
trace's sequence number (`Seq`) where every row of the group has one. Order is counted within
(step, collective, dtype, size) so that two buckets whose Gloo spans start in a different order
on two ranks (Gloo runs them on two threads) still pair up, and a trace window that starts one
collective later on one rank does not shift every pairing after it. An instance found on only
some of the group's ranks is reported as unmatched, never guessed. Send and receive are not
collectives: `p2p.py` pairs them, and they never reach the instances here (nor the lateness and
straggler test built on them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.groups import attribute_groups
from uberprof.analysis.tables.p2p import P2P_NAMES

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "SAME_SIZE_COLLECTIVES",
    "Matched",
    "drop_inconsistent",
    "group_sizes",
    "match_collectives",
]

# Collectives whose input size is the same on every participant: the size is part of the key.
SAME_SIZE_COLLECTIVES = ("allreduce", "broadcast", "reduce", "barrier", "allgather",
                         "reducescatter")

INSTANCE_SCHEMA = pa.schema([
    ("instance", pa.int64()),  # id of the matched instance
    ("grp", pa.string()),  # process group key: pg_name, else pg_ranks, else "default"
    ("name", pa.string()),
    ("rank", pa.int64()),
    ("step", pa.int64()),
    ("start_ns", pa.int64()),  # the rank's own clock (align.py shifts them)
    ("end_ns", pa.int64()),
    ("in_bytes", pa.int64()),
    ("out_bytes", pa.int64()),
    ("dtype", pa.string()),
    ("participants", pa.int64()),  # ranks of the instance present in the traces
    ("group_size", pa.int64()),  # the group's real size (may exceed participants)
])


@dataclass
class Matched:
    """Matched instances (one row per instance and rank) and what could not be matched."""

    instances: pa.Table  # INSTANCE_SCHEMA
    unmatched: pa.Table  # rank, grp, name, step, start_ns, in_bytes, present, expected, reason
    groups: dict[str, list[int]]  # group key -> ranks expected in it (present in the traces)
    method: dict[str, str]  # group key -> "seq" or "order"

    @property
    def n_instances(self) -> int:
        return len(set(self.instances.column("instance").to_pylist())) if \
            self.instances.num_rows else 0


def match_collectives(ctx: RunContext) -> Matched:
    """Match the run's collective rows across ranks (see the module docstring), in stages on
    one DuckDB connection: the rows with their group key, each group's method (sequence
    numbers or order) and expected ranks, each row's occurrence key, then the instances found
    on every expected rank (matched) and the others (unmatched)."""
    coll = attribute_groups(ctx, ctx.collectives(), skip=P2P_NAMES)
    sizes = group_sizes(ctx)
    if coll.num_rows == 0:
        return Matched(INSTANCE_SCHEMA.empty_table(), _empty_unmatched(), {}, {})
    # imported where used: 45-90 ms that a start reading saved tables (the dashboard's) never needs
    import duckdb

    con = duckdb.connect()
    con.register("coll", coll)
    _load_rows(con)
    seq_groups = _seq_groups(con)
    groups = _expected_ranks(con)
    _register_groups(con, groups, sizes, seq_groups)
    _key_rows(con)
    matched, unmatched = _instances(con)
    con.close()
    return Matched(instances=_renumbered(matched).cast(INSTANCE_SCHEMA), unmatched=unmatched,
                   groups=groups, method={g: ("seq" if g in seq_groups else "order")
                                          for g in groups})


def _load_rows(con: duckdb.DuckDBPyConnection) -> None:
    """Table `c`: the rows of `coll` with their name, group key and, for the collectives of
    equal size on every rank, the size that is part of the key."""
    con.execute(f"""
        CREATE TEMP TABLE c AS
        SELECT rank, coalesce(name, event) AS name, start_ns, end_ns, step, in_bytes,
               out_bytes, dtype, seq, coalesce(pg_name, pg_ranks, 'default') AS grp,
               CASE WHEN coalesce(name, event) IN {SAME_SIZE_COLLECTIVES} THEN in_bytes END
                   AS size_key
        FROM coll WHERE coalesce(name, '') NOT IN {P2P_NAMES}
    """)


def _seq_groups(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The groups matched by sequence number: those where every row has one."""
    return {g for g, all_seq in con.execute(
        "SELECT grp, bool_and(seq IS NOT NULL) FROM c GROUP BY grp").fetchall() if all_seq}


def _expected_ranks(con: duckdb.DuckDBPyConnection) -> dict[str, list[int]]:
    """Expected participants of each group: its ranks present in the traces (pg_ranks narrows
    it)."""
    groups: dict[str, list[int]] = {}
    # (from `coll`, not `c`: the long rank lists are not copied into a table per row)
    for grp, ranks, pg_ranks in con.execute(
            "SELECT coalesce(pg_name, pg_ranks, 'default') AS grp, "
            "list(DISTINCT rank ORDER BY rank), any_value(pg_ranks) FROM coll "
            f"WHERE coalesce(name, '') NOT IN {P2P_NAMES} GROUP BY grp").fetchall():
        listed = _parse_ranks(pg_ranks)
        groups[grp] = [r for r in ranks if not listed or r in listed]
    return groups


def _register_groups(con: duckdb.DuckDBPyConnection, groups: dict[str, list[int]],
                     sizes: dict[str, int], seq_groups: set[str]) -> None:
    """Tables `expected` (per group: the ranks expected, and its real size) and `seqgrp` (the
    groups matched by sequence number), for the queries that follow."""
    con.register("expected", pa.table({
        "grp": pa.array(list(groups), pa.string()),
        "expected": pa.array([len(v) for v in groups.values()], pa.int64()),
        "gsize": pa.array([sizes.get(g) or len(v) for g, v in groups.items()], pa.int64()),
    }))
    con.register("seqgrp", pa.table({"grp": pa.array(sorted(seq_groups), pa.string())}))


def _key_rows(con: duckdb.DuckDBPyConnection) -> None:
    """Tables `keyed` (each row's instance key: its sequence number in a seq group, else its
    occurrence within (step, collective, dtype, size) with those four) and `inst` (one row per
    key: the ranks present, the rows, and an instance id in order of first start)."""
    con.execute("""
        CREATE TEMP TABLE k AS
        SELECT c.*,
               CASE WHEN c.grp IN (SELECT grp FROM seqgrp) THEN c.seq
                    ELSE row_number() OVER (PARTITION BY rank, grp, step, name, dtype, size_key
                                            ORDER BY start_ns, end_ns) - 1 END AS occ,
               c.grp IN (SELECT grp FROM seqgrp) AS by_seq
        FROM c
    """)
    con.execute("""
        CREATE TEMP TABLE keyed AS
        SELECT k.*,
               CASE WHEN by_seq THEN NULL ELSE step END AS kstep,
               CASE WHEN by_seq THEN NULL ELSE dtype END AS kdtype,
               CASE WHEN by_seq THEN NULL ELSE size_key END AS ksize
        FROM k
    """)
    con.execute("""
        CREATE TEMP TABLE inst AS
        SELECT grp, kstep, name, kdtype, ksize, occ,
               count(DISTINCT rank) AS present, count(*) AS nrows,
               row_number() OVER (ORDER BY min(start_ns), grp, name) - 1 AS instance
        FROM keyed GROUP BY grp, kstep, name, kdtype, ksize, occ
    """)


def _instances(con: duckdb.DuckDBPyConnection) -> tuple[pa.Table, pa.Table]:
    """The rows of the instances found once on every expected rank (two or more), and the
    rows of the others, where the group expects two or more ranks (never guessed)."""
    join = """
        FROM keyed k JOIN inst i
          ON k.grp = i.grp AND k.name = i.name AND k.occ IS NOT DISTINCT FROM i.occ
         AND k.kstep IS NOT DISTINCT FROM i.kstep AND k.kdtype IS NOT DISTINCT FROM i.kdtype
         AND k.ksize IS NOT DISTINCT FROM i.ksize
        JOIN expected e ON e.grp = k.grp
    """
    matched = con.sql(f"""
        SELECT i.instance, k.grp, k.name, k.rank, k.step, k.start_ns, k.end_ns, k.in_bytes,
               k.out_bytes, k.dtype, i.present AS participants, e.gsize AS group_size
        {join}
        WHERE i.present = e.expected AND i.nrows = i.present AND i.present >= 2
        ORDER BY i.instance, k.rank
    """).to_arrow_table()
    unmatched = con.sql(f"""
        SELECT k.rank, k.grp, k.name, k.step, k.start_ns, k.in_bytes, i.present,
               e.expected, 'not found on every rank of its group' AS reason
        {join}
        WHERE NOT (i.present = e.expected AND i.nrows = i.present AND i.present >= 2)
          AND e.expected >= 2
        ORDER BY k.start_ns, k.rank
    """).to_arrow_table()
    return matched, unmatched


def _renumbered(matched: pa.Table) -> pa.Table:
    """Instances renumbered densely, so that ids are 0..n-1 in time order."""
    ids = matched.column("instance").to_pylist()
    remap = {v: i for i, v in enumerate(sorted(set(ids)))}
    return matched.set_column(0, "instance", pa.array([remap[v] for v in ids], pa.int64()))


def group_sizes(ctx: RunContext) -> dict[str, int]:
    """The real size of each group key: NCCL's `Group size`, the trace's pg_config, the world."""
    sizes: dict[str, int] = {}
    coll = ctx.collectives()
    if coll.num_rows:
        # Each distinct (name, ranks, size) once, in order of first appearance: not a Python
        # string per row for the rank lists.
        combos = coll.select(["pg_name", "pg_ranks", "group_size"]).group_by(
            ["pg_name", "pg_ranks", "group_size"], use_threads=False).aggregate([])
        for name, ranks, gs in zip(combos.column("pg_name").to_pylist(),
                                   combos.column("pg_ranks").to_pylist(),
                                   combos.column("group_size").to_pylist()):
            key = name or ranks or "default"
            n = gs if isinstance(gs, int) and gs > 0 else len(_parse_ranks(ranks))
            if n and key not in sizes:
                sizes[key] = n
    for info in ctx.ranks.values():
        for pg in info.process_groups:
            if isinstance(pg.get("size"), int) and pg.get("name") not in (None, "None"):
                sizes.setdefault(str(pg["name"]), pg["size"])
            if pg.get("desc") == "default_pg" and isinstance(pg.get("size"), int):
                sizes.setdefault("default", pg["size"])
        if info.world_size:
            sizes.setdefault("default", info.world_size)
    return sizes


_INT = re.compile(r"-?\d+")


def _parse_ranks(text: str | None) -> set[int]:
    return {int(x) for x in _INT.findall(text)} if text else set()


def _empty_unmatched() -> pa.Table:
    return pa.table({"rank": pa.array([], pa.int64()), "grp": pa.array([], pa.string()),
                     "name": pa.array([], pa.string()), "step": pa.array([], pa.int64()),
                     "start_ns": pa.array([], pa.int64()), "in_bytes": pa.array([], pa.int64()),
                     "present": pa.array([], pa.int64()), "expected": pa.array([], pa.int64()),
                     "reason": pa.array([], pa.string())})


def drop_inconsistent(matched: Matched, offsets: dict[int, int],
                      min_tolerance_ns: int = 2_000_000) -> tuple[Matched, int]:
    """Move instances whose participants never overlap in time (on aligned clocks) to the
    unmatched rows: a collective runs on all its ranks at once, so such a pairing is wrong (a
    trace that lost some collectives, or windows cut at different places). The tolerance is the
    larger of `min_tolerance_ns` and a tenth of the instance's longest span."""
    inst = matched.instances
    if inst.num_rows == 0:
        return matched, 0
    import duckdb

    con = duckdb.connect()
    con.register("i", inst)
    con.register("o", pa.table({"rank": pa.array(list(offsets), pa.int64()),
                                "off": pa.array(list(offsets.values()), pa.int64())}))
    bad = [r[0] for r in con.sql(f"""
        SELECT instance FROM i LEFT JOIN o USING (rank)
        GROUP BY instance
        HAVING max(start_ns + coalesce(off, 0)) - min(end_ns + coalesce(off, 0))
               > greatest({int(min_tolerance_ns)}, max(end_ns - start_ns) // 10)
    """).fetchall()]
    if not bad:
        con.close()
        return matched, 0
    con.register("bad", pa.table({"instance": pa.array(bad, pa.int64())}))
    moved = con.sql("""
        SELECT rank, grp, name, step, start_ns, in_bytes, participants AS present,
               participants AS expected, 'its ranks never overlap in time' AS reason
        FROM i WHERE instance IN (SELECT instance FROM bad)
    """).to_arrow_table()
    kept = con.sql("SELECT * FROM i WHERE instance NOT IN (SELECT instance FROM bad) "
                   "ORDER BY instance, rank").to_arrow_table()
    con.close()
    unmatched = pa.concat_tables([matched.unmatched, moved.cast(matched.unmatched.schema)])
    return Matched(instances=kept.cast(INSTANCE_SCHEMA), unmatched=unmatched,
                   groups=matched.groups, method=matched.method), len(bad)
