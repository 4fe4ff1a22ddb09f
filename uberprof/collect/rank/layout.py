"""The parallel layout of a rank, as the rank metadata records it: the process groups this rank
belongs to, and which parallel APIs the process imported.

The readers use it to tell ranks that do the same work (data-parallel replicas) from ranks that
do different work by design (pipeline stages): only the first may be compared with each other
(`analysis/diagnosis/step_signals.py`).

- **Process groups**: torch.distributed's own registry (`distributed_c10d._world`): every group
  this process is a member of (a group a rank is not in is never registered on that rank), with
  its name (what Flight Recorder and the traces call it), its description (a device mesh names
  its groups `mesh_<dimension>`), its ranks in group-rank order (a rank's index there is its
  rank in the group) and its backend.
- **APIs**: `"pipelining"` when `torch.distributed.pipelining` was imported (torch itself never
  imports it). FSDP2 (`fully_shard`) and tensor parallelism have no such signal: torch imports
  their modules itself.

Light (no import of its own; `dist` is the caller's `torch.distributed`) and cheap: a few
microseconds for a handful of groups.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["LayoutKey", "layout_key", "parallel_layout", "process_groups"]

API_MODULES = {"pipelining": "torch.distributed.pipelining"}
"""Parallel API -> the module whose import says the process uses it (never imported by torch
itself)."""


def _world(dist: Any) -> Any:
    return dist.distributed_c10d._world


LayoutKey = tuple[int, tuple[str, ...]]


def layout_key(dist: Any) -> LayoutKey:
    """What tells a changed layout cheaply (the agent records it again then): the number of
    process groups and the APIs imported."""
    return len(_world(dist).pg_names), tuple(_apis())


def _apis() -> list[str]:
    return [api for api, module in API_MODULES.items() if module in sys.modules]


def process_groups(dist: Any) -> list[dict[str, Any]]:
    """Every process group this rank belongs to, the default group first (creation order)."""
    world = _world(dist)
    out = []
    for pg, name in list(world.pg_names.items()):
        members = world.pg_group_ranks.get(pg) or {}
        desc = getattr(pg, "group_desc", None)
        out.append({"name": str(name), "desc": str(desc) if desc is not None else None,
                    "ranks": [int(r) for r, _ in sorted(members.items(), key=lambda kv: kv[1])],
                    "backend": _backend(world, pg)})
    return out


def parallel_layout(dist: Any) -> dict[str, Any]:
    """{"process_groups": [...], "apis": [...]} (module docstring)."""
    return {"process_groups": process_groups(dist), "apis": _apis()}


def _backend(world: Any, pg: Any) -> str | None:
    try:
        return str(pg._get_backend_name())
    except Exception:  # noqa: BLE001 - a private API: older torch may lack it
        config = getattr(world, "pg_backend_config", {}).get(pg)
        return str(config) if config is not None else None
