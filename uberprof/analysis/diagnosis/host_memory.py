"""Was the host's memory nearly full when a rank died without a trace?

A rank killed by SIGKILL, or that stopped with no record at all, leaves no exception to read;
the usual cause on a training node is the kernel's OOM killer, which picks the largest process
when the host runs out of memory. The node's counters sample the host's memory (`host` source:
`mem.total`, `mem.available`) and each rank process's resident set size (`proc` source,
`mem.rss`) every 0.1-1 s, so the last samples before the death say whether memory was the
likely cause: the host at least `NEAR_FULL` used. The evidence is the samples themselves; the
finding words it as "suspected", since a sample can be up to a second old and the kernel's log
(`dmesg`), which would prove it, is not readable by uberprof.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc

__all__ = ["NEAR_FULL", "host_memory_at"]

NEAR_FULL = 0.95  # of the host's memory in use (1 - available / total)
LOOK_BACK_NS = 5_000_000_000  # samples older than this before the death say nothing of it


def host_memory_at(root: Path, node: str | None, rank: int, time_ns: int | None
                   ) -> dict[str, Any] | None:
    """The host's memory and the rank's RSS at the last samples before `time_ns` (within
    `LOOK_BACK_NS`), or None without such samples. `near_full`: the host at least
    `NEAR_FULL` used."""
    if node is None or time_ns is None:
        return None
    try:
        from uberprof.rundir.counters import counters_table

        t = counters_table(root, node, sources=["host", "proc"],
                           metrics=["mem.total", "mem.available", "mem.rss"],
                           start_ns=time_ns - LOOK_BACK_NS, end_ns=time_ns)
    except Exception:  # noqa: BLE001 - counters are optional evidence
        return None

    def last(source: str, metric: str, device: str | None = None) -> tuple[int, float] | None:
        m = pc.and_(pc.equal(t.column("source"), source), pc.equal(t.column("metric"), metric))
        if device is not None:
            m = pc.and_(m, pc.equal(t.column("device"), device))
        rows = t.filter(m)
        if rows.num_rows == 0:
            return None
        i = int(pc.index(rows.column("ts_ns"), pc.max(rows.column("ts_ns"))).as_py())
        return int(rows.column("ts_ns")[i].as_py()), float(rows.column("value")[i].as_py())

    total, avail = last("host", "mem.total"), last("host", "mem.available")
    if total is None or avail is None or total[1] <= 0:
        return None
    rss = last("proc", "mem.rss", f"rank:{rank}")
    used = 1.0 - avail[1] / total[1]
    return {"host_total_bytes": int(total[1]), "host_available_bytes": int(avail[1]),
            "host_used_pct": round(100 * used, 1), "rank_rss_bytes": int(rss[1]) if rss else None,
            "sample_age_ms": round((time_ns - avail[0]) / 1e6, 1),
            "near_full": used >= NEAR_FULL}
