"""Cores shared by CPU ranks in a projection (tables/contention.py): the processor-sharing rate,
the background fitted to the recorded run-queue wait, and a hand graph whose ranks took turns
on one core, projected with its data wait removed."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from tests.unit.test_whatif_graph import MS, _lane
from uberprof.analysis.diagnosis.whatif import other_load, parse_changes, project
from uberprof.analysis.tables.contention import (
    BUSY_PER_CORE,
    CoreSharing,
    fit_background,
    mean_rates,
    sharing_rate,
)
from uberprof.analysis.tables.graph import build_graph
from uberprof.analysis.tables.lanes import COMPUTE, DATA, HOST, WAIT


def test_without_background_each_thread_gets_its_share_of_the_cores() -> None:
    assert sharing_rate(np.array([1.0, 2.0, 3.0, 4.0]), 2.0, 0.0) == \
        pytest.approx([1.0, 1.0, 2 / 3, 0.5])


def test_a_poisson_background_is_the_expected_share() -> None:
    # one thread on two cores beside a Poisson(0.6) number of others: slowed only when two or
    # more others run, to 2 / (1 + k)
    p = [math.exp(-0.6) * 0.6 ** k / math.factorial(k) for k in range(40)]
    want = p[0] + p[1] + sum(pk * 2 / (1 + k) for k, pk in enumerate(p) if k >= 2)
    assert sharing_rate(np.array([1.0]), 2.0, 0.6)[0] == pytest.approx(want, rel=1e-9)
    rates = sharing_rate(np.array([1.0, 2.0, 3.0]), 2.0, 0.6)
    assert rates[0] > rates[1] > rates[2]  # more load, slower
    assert sharing_rate(np.array([2.0]), 2.0, 1.2)[0] < rates[1]  # more background, slower


def test_the_background_is_the_one_that_gives_the_recorded_rate() -> None:
    loads, thread_ns = np.array([1.0, 2.0]), np.array([3e9, 1e9])
    rate = float(sharing_rate(loads, 2.0, 0.8) @ thread_ns) / 4e9
    assert fit_background(loads, thread_ns, 2.0, rate) == pytest.approx(0.8, abs=1e-6)
    assert fit_background(loads, thread_ns, 2.0, 1.0) == 0.0  # never waited: nothing else


def test_a_segment_s_rate_is_its_share_averaged_over_its_time() -> None:
    # one core; A runs 0-10, B 5-15: each alone half its time, shared the other half
    sh = CoreSharing(np.array([0, 0]), np.array([1.0, 1.0]), np.array([1.0]), np.array([0.0]),
                     ["h"])
    r = mean_rates(sh, np.array([0, 5]) * MS, np.array([10, 15]) * MS)
    assert r == pytest.approx([0.75, 0.75])


def _hosts(background: list[float], cores: list[float]) -> CoreSharing:
    return CoreSharing(np.array([0]), np.array([1.0]), np.array(cores), np.array(background),
                       [f"h{i}" for i in range(len(cores))])


def test_a_host_whose_background_fills_a_quarter_of_its_cores_is_busy_and_cautioned() -> None:
    # fitted on a 2-core VM: 0.06-0.11 quiet, 1.4-1.6 beside one CPU hog
    quiet = _hosts([0.11, 0.5], [2.0, 16.0])
    assert quiet.busy_hosts() == [] and other_load(quiet) is None and other_load(None) is None
    assert [h["busy"] for h in quiet.as_dict()["hosts"]] == [False, False]
    hog = _hosts([1.5, 2 * BUSY_PER_CORE], [2.0, 2.0])
    assert [h for h, _, _ in hog.busy_hosts()] == ["h0", "h1"]
    said = other_load(hog)
    assert said is not None and said.startswith("h0 (and 1 other host(s)) was busy")
    assert "1.5 other runnable thread(s)" in said and "quiet host" in said


def _turns_graph():
    """Two ranks on one core, taking turns in step 0: rank 1's loader waits 0-40 while rank 0
    computes; rank 1 computes 40-78 while rank 0 waits in the all-reduce, which rank 1 reaches
    at 78 and which ends at 80 on both."""
    lanes = {0: _lane(0, [(0, 40, COMPUTE), (40, 80, WAIT)]),
             1: _lane(1, [(0, 40, DATA), (40, 78, COMPUTE), (78, 80, WAIT)])}
    inst = pa.table({"instance": [0, 0], "rank": [0, 1], "name": ["allreduce"] * 2,
                     "start_ns": [40 * MS, 78 * MS], "end_ns": [80 * MS, 80 * MS],
                     "in_bytes": [0, 0], "out_bytes": [0, 0], "group_size": [2, 2],
                     "participants": [2, 2]})
    return build_graph(lanes, {}, inst)


def _remove_data(g) -> dict:
    traced = pa.table({"rank": [0, 1], "step": [0, 0], "step_time_ns": [80 * MS] * 2})
    return project(g, traced, parse_changes(["data"], None, [], None, False), straggler=None)


def test_ranks_that_took_turns_on_one_core_gain_nothing_when_their_wait_is_removed() -> None:
    g = _turns_graph()
    # without the cores known: rank 1 computes 0-38, rank 0 0-40, the all-reduce ends at 42
    assert _remove_data(g)["projected_step_ms"] == pytest.approx(42.0)
    host = np.where(np.isin(g.kind, [COMPUTE, HOST]) & (g.rank >= 0), 0, -1)
    g.sharing = CoreSharing(host, np.ones(g.n), np.array([1.0]), np.array([0.0]), ["h"])
    # at once on one core each computes at half speed: rank 1 ends its 38 ms at 76, rank 0
    # its last 2 ms alone at 78, the all-reduce at 80: as recorded
    assert _remove_data(g)["projected_step_ms"] == pytest.approx(80.0, abs=0.01)
    g.sharing = CoreSharing(host, np.ones(g.n), np.array([2.0]), np.array([0.0]), ["h"])
    assert _remove_data(g)["projected_step_ms"] == pytest.approx(42.0)  # a core each


def test_the_recorded_run_replays_unchanged_with_its_cores_shared() -> None:
    g = _turns_graph()
    host = np.where(np.isin(g.kind, [COMPUTE, HOST]) & (g.rank >= 0), 0, -1)
    g.sharing = CoreSharing(host, np.ones(g.n), np.array([1.0]), np.array([0.7]), ["h"])
    traced = pa.table({"rank": [0, 1], "step": [0, 0], "step_time_ns": [80 * MS] * 2})
    doc = project(g, traced, parse_changes([], 1.0, [], None, False), straggler=None)
    assert doc["projected_step_ms"] == pytest.approx(80.0)
