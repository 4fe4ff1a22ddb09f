"""Communication per process group: how much of the step each group's collectives leave exposed.

A 2-D job's exposed communication is the sum of its groups', and the remedy depends on which:
tensor-parallel all-reduces call for sequence parallelism or async TP, FSDP's all-gathers for
prefetching. Each matched collective instance's exposed part (its span not under compute, per
rank: `rank_diagnosis.py`) is summed by the instance's group; a group's share is its ranks' mean
exposed time over the analysed wall time. Overlapping collectives of one group can count a
moment twice, so a share is an upper bound; the breakdown's exposed_comm stays the one total.
Groups are named by their device-mesh dimension where the trace's pg_config gives one
(`mesh_tp` -> "tp"), else by the group's name.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.parallelism import mesh_dim
from uberprof.units import ns_to_ms as _ms

__all__ = ["GroupComm", "group_comm"]


@dataclass(frozen=True)
class GroupComm:
    """One process group's collectives over the analysed steps."""

    group: str  # the matcher's group key
    dim: str | None  # its device-mesh dimension ("tp", "dp", ...), None when not a mesh's
    ranks: list[int]
    collectives: dict[str, int]  # name -> instances
    time_ns: int  # the ranks' mean time inside the group's collectives
    exposed_ns: int  # the ranks' mean exposed time in them
    share: float  # exposed_ns over the analysed wall time

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "dim": self.dim, "ranks": self.ranks,
                "collectives": self.collectives, "time_ms": _ms(self.time_ns),
                "exposed_ms": _ms(self.exposed_ns),
                "exposed_pct_of_wall": round(100 * self.share, 1)}


def group_comm(ctx: RunContext, instances: pa.Table, exposed: dict[tuple[int, int], int],
               wall_ns: int) -> list[GroupComm]:
    """Per group of the matched `instances` (INSTANCE_SCHEMA), largest exposed share first."""
    if instances.num_rows == 0 or not wall_ns:
        return []
    dims = _dims(ctx)
    count: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    time_: dict[str, int] = defaultdict(int)
    exp: dict[str, int] = defaultdict(int)
    ranks: dict[str, set[int]] = defaultdict(set)
    for inst, grp, name, rank, start, end in zip(*(instances.column(k).to_pylist() for k in (
            "instance", "grp", "name", "rank", "start_ns", "end_ns"))):
        count[grp][name].add(inst)
        ranks[grp].add(rank)
        time_[grp] += max(0, end - start)
        exp[grp] += exposed.get((inst, rank), 0)
    out = []
    for grp, rs in ranks.items():
        n = len(rs)
        out.append(GroupComm(group=grp, dim=dims.get(grp), ranks=sorted(rs),
                             collectives={k: len(v) for k, v in sorted(count[grp].items())},
                             time_ns=time_[grp] // n, exposed_ns=exp[grp] // n,
                             share=exp[grp] / n / wall_ns))
    return sorted(out, key=lambda g: -g.share)


def _dims(ctx: RunContext) -> dict[str, str]:
    """Group name -> its mesh dimension (`mesh_tp` -> "tp"); the world group is "world"."""
    out = {"default": "world"}
    for info in ctx.ranks.values():
        for g in info.process_groups:
            desc = g.get("desc")
            if dim := mesh_dim(desc):
                out[str(g.get("name"))] = dim
            elif desc == "default_pg":
                out[str(g.get("name"))] = "world"
    return out
