"""Counters on every node: GPU (NVML, GPM, DCGM) and host (CPU, memory, NICs, InfiniBand, the
job's processes), sampled by the node agent beside the job and written into the run directory.

    from uberprof.collect.counters import read_counters
    df = read_counters("uberprof-runs/<run-id>", "node0")   # long format, epoch-ns timestamps

The readers live in `uberprof.rundir.counters` (collect writes, the rest of uberprof reads);
they are re-exported here lazily, so `uberprof run` does not pay for pandas at start-up.
"""

from __future__ import annotations

from typing import Any

from uberprof.collect.counters.sampler import MODES, CounterSettings, NodeSampler

__all__ = [  # noqa: RUF022 - in the order a reader needs them
    "read_counters", "counters_table", "counter_meta", "counter_nodes", "link_caps",
    "rank_gpus", "rank_pids", "CounterSettings", "NodeSampler", "MODES",
]

_READERS = {"read_counters", "counters_table", "counter_meta", "counter_nodes", "link_caps",
            "rank_gpus", "rank_pids"}


def __getattr__(name: str) -> Any:
    if name in _READERS:
        from uberprof.rundir import counters

        return getattr(counters, name)
    raise AttributeError(name)
