"""Which process group each collective ran in, where the trace does not say.

NCCL's events name their group; Gloo's do not. On a 2-D job (a device mesh: pipeline x data
parallel, FSDP x tensor parallel) matching every collective on the world group pairs the tensor
group's all-reduce with the data-parallel group's, or finds none. Two sources fill the gap, the
first that answers:

1. The Flight Recorder's arrivals of a run directory (`rundir/flight_log.py`): each collective a
   rank called with its group, in call order and with its time on the rank's own clock. A trace
   row takes the latest arrival of its collective family not yet taken that was called before
   the row started (the call enqueues, the work follows).
2. Where there is none: the groups of the rank (the trace's `distributedInfo.pg_config`) whose
   ranks are exactly those that hold the same collective (step, name, size and order); a row
   that fits no group, or more than one, keeps the world group, and the matcher reports what it
   cannot match rather than guess.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

import pyarrow as pa

from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.launches import collective_family
from uberprof.ingest.classify import canonical_collective

__all__ = ["attribute_groups"]


def attribute_groups(ctx: RunContext, coll: pa.Table, skip: tuple[str, ...] = ()) -> pa.Table:
    """`coll` (RUN_COLLECTIVE_SCHEMA) with `pg_name`/`pg_ranks` filled where they are empty and
    the module's sources tell (rows named in `skip`, such as send/recv, are left alone)."""
    if coll.num_rows == 0:
        return coll
    subgroups = _subgroups(ctx)
    if not subgroups:
        return coll
    names = coll.column("name").to_pylist()
    pg_name = coll.column("pg_name").to_pylist()
    pg_ranks = coll.column("pg_ranks").to_pylist()
    todo = [i for i in range(coll.num_rows)
            if pg_name[i] is None and pg_ranks[i] is None and names[i] not in skip]
    if not todo:
        return coll
    found = _from_flight_log(ctx, coll, todo)
    rest = [i for i in todo if i not in found]
    if rest:
        found.update(_from_presence(coll, rest, subgroups))
    for i, (name, ranks) in found.items():
        pg_name[i], pg_ranks[i] = name, str(ranks)
    coll = coll.set_column(coll.schema.get_field_index("pg_name"), "pg_name",
                           pa.array(pg_name, pa.string()))
    return coll.set_column(coll.schema.get_field_index("pg_ranks"), "pg_ranks",
                           pa.array(pg_ranks, pa.string()))


def _subgroups(ctx: RunContext) -> dict[int, dict[str, list[int]]]:
    """Per rank, its groups other than the world (name -> ranks); {} when no rank has one."""
    out: dict[int, dict[str, list[int]]] = {}
    for r, info in ctx.ranks.items():
        world = info.world_size or len(ctx.ranks)
        for g in info.process_groups:
            ranks = g.get("ranks")
            if isinstance(ranks, list) and 1 < len(ranks) < world and g.get("name"):
                out.setdefault(r, {})[str(g["name"])] = [int(x) for x in ranks]
    return out


def _from_flight_log(ctx: RunContext, coll: pa.Table, todo: list[int]
                     ) -> dict[int, tuple[str, list[int]]]:
    """Rows whose call the Flight Recorder holds: row -> (group name, its ranks)."""
    calls: dict[tuple[int, str], list[tuple[int, str]]] = defaultdict(list)
    for r, log in ctx.flight_logs().items():
        for a in log.arrivals:
            calls[(r, collective_family(canonical_collective(a.op)))].append((a.time_ns, a.group))
    if not calls:
        return {}
    for v in calls.values():
        v.sort()
    groups = {(r, str(g.get("name"))): g.get("ranks") for r, info in ctx.ranks.items()
              for g in info.process_groups}
    rank = coll.column("rank").to_pylist()
    start = coll.column("launch_ns").to_pylist()
    names = coll.column("name").to_pylist()
    used: set[tuple[int, str, int]] = set()
    out: dict[int, tuple[str, list[int]]] = {}
    for i in sorted(todo, key=lambda i: (rank[i], start[i] or 0)):
        key = (rank[i], collective_family(names[i]))
        seq = calls.get(key)
        if not seq or start[i] is None:
            continue
        k = bisect.bisect_right(seq, (start[i], "\uffff")) - 1
        while k >= 0 and (*key, k) in used:
            k -= 1
        if k < 0:
            continue
        used.add((*key, k))
        ranks = groups.get((rank[i], seq[k][1]))
        if isinstance(ranks, list):
            out[i] = (seq[k][1], [int(x) for x in ranks])
    return out


def _from_presence(coll: pa.Table, rows: list[int], subgroups: dict[int, dict[str, list[int]]]
                   ) -> dict[int, tuple[str, list[int]]]:
    """Rows whose collective (step, name, size, order) is held by exactly the ranks of one of
    the rank's groups."""
    cols: dict[str, list[Any]] = {k: coll.column(k).to_pylist()
                                  for k in ("rank", "step", "name", "in_bytes", "launch_ns")}
    occ: dict[int, tuple[Any, ...]] = {}
    counter: dict[tuple[Any, ...], int] = defaultdict(int)
    for i in sorted(rows, key=lambda i: (cols["launch_ns"][i] or 0)):
        base = (cols["rank"][i], cols["step"][i], cols["name"][i], cols["in_bytes"][i])
        occ[i] = (*base[1:], counter[base])
        counter[base] += 1
    holders: dict[tuple[Any, ...], set[int]] = defaultdict(set)
    for i, key in occ.items():
        holders[key].add(cols["rank"][i])
    out: dict[int, tuple[str, list[int]]] = {}
    for i, key in occ.items():
        fits = [(n, rs) for n, rs in subgroups.get(cols["rank"][i], {}).items()
                if set(rs) == holders[key]]
        if len(fits) == 1:
            out[i] = fits[0]
    return out
