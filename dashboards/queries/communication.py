"""What `/communication` shows: the diagnosis's bandwidth per collective class and per matched
instance (`Diagnosis.classes`, `Diagnosis.bandwidth`), and time per collective kind and message
size (the analysis's collectives table, grouped)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries.tables import evenly

__all__ = ["bandwidth_classes", "bandwidth_instances", "collectives_by_kind", "rank_comm"]


def bandwidth_classes(run: RunData) -> list[dict[str, Any]]:
    d = run.diagnose()
    return [c.as_dict() for c in d.classes] if d is not None else []


def bandwidth_instances(run: RunData, limit: int = 20_000) -> pa.Table | None:
    """BANDWIDTH_SCHEMA rows (evenly sampled beyond `limit`), None when there are none."""
    d = run.diagnose()
    if d is None or d.bandwidth.num_rows == 0:
        return None
    return evenly(d.bandwidth, limit)


def collectives_by_kind(run: RunData) -> pa.Table | None:
    """Per collective kind and message size: calls, total and median time (per rank), as the
    analysis saved them (`read.OpenedRun.collective_kinds`)."""
    return run.once("collectives_by_kind",
                    lambda: run.opened.collective_kinds() if run.opened is not None else None)


def rank_comm(run: RunData) -> list[dict[str, Any]]:
    """Each rank's exposed communication split (waiting by peer and collective, transfer) and
    what no finding explains of it, as the diagnosis saved them (`ranks[].exposed_comm`,
    `ranks[].accounted`), the most exposed first; [] without a diagnosis."""
    d = run.diagnose()
    if d is None:
        return []
    rows = [{"rank": x["rank"], **x["exposed_comm"],
             "unexplained_ms": ((x.get("accounted") or {}).get("exposed_comm") or {})
             .get("unexplained_ms")}
            for x in d.ranks if (x.get("exposed_comm") or {}).get("exposed_ms")]
    return sorted(rows, key=lambda r: -r["exposed_ms"])
