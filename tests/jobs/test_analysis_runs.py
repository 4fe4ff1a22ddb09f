"""`uberprof analyze` on real 2- and 4-rank CPU (Gloo) runs of the DDP sample."""

from __future__ import annotations

import json
from pathlib import Path

import pandas  # noqa: F401 - loaded before the in-process CLI runs: see keep_pandas_out
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import uberprof
from tests._runs import STEPS, TRACE_STEPS, sample_parameter_count
from uberprof.cli import main

TRACED = list(range(TRACE_STEPS[0], TRACE_STEPS[1] + 1))


@pytest.mark.parametrize("n", [2, 4])
def test_summary(ddp_runs: dict[int, Path], n: int) -> None:
    res = CliRunner().invoke(main, ["analyze", str(ddp_runs[n]), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["problems"] == []
    assert [r["rank"] for r in doc["ranks"]] == list(range(n))
    for r in doc["ranks"]:
        assert r["steps"] == STEPS
        assert r["overlap_pct"] is not None and 0 <= r["overlap_pct"] <= 100
        assert abs(r["idle_pct"] + r["compute_pct"] + r["non_compute_pct"] - 100) < 0.05
        assert r["non_compute_pct"] == r["exposed_comm_pct"]  # no memcpy on a CPU rank
        assert r["step_time_ms"]["median"] > 0


@pytest.mark.parametrize("n", [2, 4])
def test_steps_add_up_to_the_step_window(ddp_runs: dict[int, Path], n: int) -> None:
    run = uberprof.load(ddp_runs[n])
    steps = run.steps()
    for rank in range(n):
        s = steps[steps["rank"] == rank].sort_values("step")
        assert list(s["step"]) == list(range(STEPS))
        traced = s[s["traced"]]
        assert list(traced["step"]) == TRACED
        assert s.loc[~s["traced"], "step_time_ns"].notna().all()
        parts = (traced["compute_ns"] + traced["exposed_comm_ns"] + traced["memory_ns"]
                 + traced["idle_ns"])
        assert (parts == traced["window_ns"]).all()
        assert (traced["window_ns"] == traced["device_end_ns"] - traced["device_start_ns"]).all()
        assert (traced["window_ns"] > 0).all() and (traced["compute_ns"] > 0).all()
        # device windows tile: each ends where the next begins
        assert list(traced["device_end_ns"])[:-1] == list(traced["device_start_ns"])[1:]
        assert (traced["device_start_ns"] >= traced["host_start_ns"]).all()
        assert (traced["overlap_ns"] <= traced["comm_ns"]).all()
        assert (traced["comm_ns"] == traced["overlap_ns"] + traced["exposed_comm_ns"]).all()


@pytest.mark.parametrize("n", [2, 4])
def test_gloo_all_reduces_are_communication_with_bytes(ddp_runs: dict[int, Path],
                                                       n: int) -> None:
    grad_bytes = 4 * sample_parameter_count()  # float32 gradients, all-reduced once per step
    run = uberprof.load(ddp_runs[n])
    steps = run.steps()
    traced = steps[steps["traced"]]
    assert (traced["comm_ns"] > 0).all()
    assert (traced["comm_bytes"] == grad_bytes).all(), traced[["rank", "step", "comm_bytes"]]
    coll = run.collectives()
    assert set(coll["name"]) == {"allreduce"} and set(coll["dtype"]) == {"float"}
    assert set(coll["event"]) == {"gloo:all_reduce"}
    per = coll.groupby(["rank", "step"])["in_bytes"].sum()
    assert (per == grad_bytes).all() and len(per) == n * len(TRACED)
    ev = run.events(0)
    gl = ev[ev["kind"] == "host_comm"]
    assert set(gl["name"]) == {"gloo:all_reduce"} and gl["in_bytes"].notna().all()
    # the Gloo spans run on Gloo's own threads, not the training thread
    ops_threads = set(ev.loc[ev["kind"] == "operator", "tid"])
    assert not set(gl["tid"]) & (ops_threads - set(gl["tid"]))
    derived = pq.read_table(Path(run.derived) / "ranks.parquet").to_pylist()
    assert {r["mode"] for r in derived} == {"cpu"}
