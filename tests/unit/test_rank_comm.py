"""Exposed communication per rank (diagnosis/rank_comm.py), the `alltoall_imbalance` finding
and the exposed_comm finding's per-rank part (issue 48), on matched collectives made here: an
8-rank all-to-all job where one rank gets more tokens and arrives late, and the same job
balanced."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings import exposed_comm
from uberprof.analysis.diagnosis.findings.alltoall import alltoall_imbalance_findings
from uberprof.analysis.diagnosis.lateness import lateness
from uberprof.analysis.diagnosis.rank_accounts import rank_accounting
from uberprof.analysis.diagnosis.rank_comm import rank_comm
from uberprof.analysis.tables.collectives import INSTANCE_SCHEMA
from uberprof.analysis.tables.schemas import RUN_STEP_SCHEMA

MS = 1_000_000
RANKS, STEPS, PER_STEP = 8, 6, 4


def _job(heavy: int | None, late_ms: float, seed: int = 0, name: str = "alltoall"
         ) -> tuple[pa.Table, pa.Table]:
    """Matched instances on aligned clocks and the step table: PER_STEP collectives a step, 1 ms
    of arrival jitter, 2 ms of transfer after the last arrival; rank `heavy` moves twice the
    others' bytes, computes 1.5 times as long and arrives `late_ms` later. Each rank's exposed communication is its whole
    time in the collectives (no compute beside them)."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    exposed: dict[tuple[int, int], int] = {}
    for step in range(STEPS):
        for k in range(PER_STEP):
            i = step * PER_STEP + k
            t0 = (step * 100 + k * 20) * MS
            arrive = t0 + rng.uniform(0, 1, RANKS) * MS
            if heavy is not None:
                arrive[heavy] += late_ms * MS
            end = int(arrive.max()) + 2 * MS
            for r in range(RANKS):
                size = 2 << 20 if r == heavy else 1 << 20
                rows.append({"instance": i, "grp": "ep", "name": name, "rank": r, "step": step,
                             "start_ns": int(arrive[r]), "end_ns": end, "in_bytes": size,
                             "out_bytes": None, "dtype": "float", "participants": RANKS,
                             "group_size": RANKS})
                exposed[(r, step)] = exposed.get((r, step), 0) + end - int(arrive[r])
    inst = pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA)
    cols: dict[str, Any] = {f.name: pa.nulls(len(exposed), f.type) for f in RUN_STEP_SCHEMA}
    keys = sorted(exposed)
    cols["rank"] = pa.array([r for r, _ in keys], pa.int64())
    cols["step"] = pa.array([s for _, s in keys], pa.int64())
    cols["exposed_comm_ns"] = pa.array([exposed[k] for k in keys], pa.int64())
    cols["comm_ns"] = cols["exposed_comm_ns"]
    cols["idle_ns"] = pa.array([0] * len(keys), pa.int64())
    cols["compute_ns"] = pa.array([(60 if r == heavy else 40) * MS for r, _ in keys], pa.int64())
    return inst, pa.table(cols, schema=RUN_STEP_SCHEMA)


def _facts(inst: pa.Table, traced: pa.Table, wall_ns: int = STEPS * 100 * MS) -> Facts:
    lat = lateness(inst)
    groups = dict(zip(inst.column("instance").to_pylist(), inst.column("grp").to_pylist()))
    return Facts(ctx=None, traced=traced, wall_ns=wall_ns, lateness=lat,  # type: ignore[arg-type]
                 gaps=pa.table({}), classes=[], clocks={}, straggler=None,
                 summaries=None, device_type="cuda", window=None,  # type: ignore[arg-type]
                 instances=inst, rank_comm=rank_comm(traced, lat, groups))


def test_each_ranks_exposed_comm_splits_into_waiting_for_the_late_peer_and_transfer() -> None:
    inst, traced = _job(heavy=5, late_ms=8.0)
    comm = rank_comm(traced, lateness(inst), {i: "ep" for i in range(STEPS * PER_STEP)})
    n = STEPS * PER_STEP
    for r, rc in comm.items():
        assert abs(rc.wait_ns + rc.transfer_ns + rc.unmatched_ns - rc.exposed_ns) < 1e-3 * MS
        assert abs(rc.transfer_ns - n * 2 * MS) < 1e-3 * MS  # 2 ms after the last arrival
    for r in set(range(RANKS)) - {5}:
        d = comm[r].as_dict()
        assert [w["rank"] for w in d["wait_by_peer"]] == [5]  # waited for rank 5 only
        assert d["wait_by_collective"] == [{"name": "alltoall", "group": "ep",
                                            "ms": d["wait_ms"]}]
        assert n * 7 * MS < comm[r].wait_ns < n * 9 * MS
    assert comm[5].wait_ns == 0.0  # the last to arrive waits for no one


def test_only_the_exposed_part_of_a_ranks_collective_time_is_split_and_the_rest_is_unmatched(
        ) -> None:
    inst, traced = _job(heavy=5, late_ms=8.0)
    lat = lateness(inst)
    half = traced.set_column(traced.schema.get_field_index("exposed_comm_ns"), "exposed_comm_ns",
                             pa.compute.divide(traced.column("exposed_comm_ns"), 2))
    full, part = rank_comm(traced, lat)[0], rank_comm(half, lat)[0]
    assert abs(part.wait_ns - full.wait_ns / 2) < 1e-3 * MS and part.unmatched_ns == 0.0
    double = traced.set_column(traced.schema.get_field_index("exposed_comm_ns"),
                               "exposed_comm_ns",
                               pa.compute.multiply(traced.column("exposed_comm_ns"), 2))
    more = rank_comm(double, lat)[0]
    assert abs(more.wait_ns - full.wait_ns) < 1e-3 * MS  # all of it, and no more
    assert abs(more.unmatched_ns - full.exposed_ns) < 1e-3 * MS


def test_a_heavy_late_rank_at_the_all_to_alls_is_named_and_a_balanced_job_is_not() -> None:
    facts = _facts(*_job(heavy=5, late_ms=8.0))
    (f,) = alltoall_imbalance_findings(facts)
    assert f.ranks == [5] and f.confidence == "confirmed"
    assert f.evidence["splits"]["heavy_ranks"] == [5]
    assert [r["rank"] for r in f.evidence["late_ranks"]] == [5]
    assert "rank 5" in f.title
    # every other rank's waiting for rank 5 is this finding's part of its exposed time
    assert sorted(map(int, f.accounts_for)) == [0, 1, 2, 3, 4, 6, 7]
    for r, part in f.accounts_for.items():
        assert abs(part["exposed_comm_ms"] - facts.rank_comm[int(r)].wait_ns / MS) < 1e-2
    assert 0 < f.time_at_stake_ms <= max(part["exposed_comm_ms"]
                                         for part in f.accounts_for.values()) + 1e-3
    assert alltoall_imbalance_findings(_facts(*_job(heavy=None, late_ms=0.0))) == []


def test_unequal_splits_without_a_late_rank_are_suspected_and_other_collectives_are_not_read(
        ) -> None:
    """Rank 3 moves twice the others' bytes but arrives only 0.3 ms later on 1 ms of jitter:
    last at about 40% of the all-to-alls, no late rank; its waits matter on a short run."""
    (f,) = alltoall_imbalance_findings(_facts(*_job(heavy=3, late_ms=0.3), wall_ns=60 * MS))
    assert f.ranks == [3] and f.evidence["splits"]["heavy_ranks"] == [3]
    assert f.evidence["late_ranks"] == [] and f.confidence == "suspected"
    assert "(suspected)" in f.title and "only one of" in f.evidence["test"]["sentence"]
    assert alltoall_imbalance_findings(_facts(*_job(heavy=3, late_ms=8.0,
                                                    name="allreduce"))) == []


def test_exposed_comm_names_the_ranks_that_pay_more_and_whom_they_wait_for() -> None:
    """An all-reduce job where rank 5 arrives 8 ms late: no all-to-all finding; the exposed
    communication finding's per-rank part names the others waiting for rank 5, and explains
    every rank's exposed time (the rank accounting leaves nothing unexplained)."""
    inst, traced = _job(heavy=5, late_ms=8.0, name="allreduce")
    facts = _facts(inst, traced)
    (f,) = exposed_comm.exposed_comm_findings(facts)
    rows = f.evidence["per_rank"]
    assert 5 not in [r["rank"] for r in rows] and len(rows) == RANKS - 1
    assert all(r["waits_for"][0]["peer"] == 5 and r["waits_for"][0]["name"] == "allreduce"
               for r in rows)
    assert "mostly waiting for rank 5 in allreduce" in f.title
    ranks = [{"rank": r, "analysed": {"exposed_comm_ms": rc.exposed_ns / MS, "idle_ms": 0.0,
                                      "window_ms": 600.0}, "idle_gaps": {"ms_by_cause": {}}}
             for r, rc in facts.rank_comm.items()]
    for r in rank_accounting(ranks, [f]):
        assert r["accounted"]["exposed_comm"]["unexplained_ms"] < 1e-2, r


def test_a_rank_late_at_the_all_to_alls_without_more_work_or_bytes_is_not_this_finding() -> None:
    """Late from a slower or shared host, not from its share: the straggler test judges it."""
    inst, traced = _job(heavy=5, late_ms=8.0)
    inst = inst.set_column(inst.schema.get_field_index("in_bytes"), "in_bytes",
                           pa.array([1 << 20] * inst.num_rows, pa.int64()))
    traced = traced.set_column(traced.schema.get_field_index("compute_ns"), "compute_ns",
                               pa.array([40 * MS] * traced.num_rows, pa.int64()))
    assert alltoall_imbalance_findings(_facts(inst, traced)) == []
