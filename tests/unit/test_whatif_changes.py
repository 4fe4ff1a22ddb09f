"""The what-if changes of issue 26 item 4 on graphs built by hand, each projection worked out on
paper (docs/whatif.md): `--link-gbps`, `--remove launch|sync|exposed-comm`, `--balance-stages`,
and their composition. The two-rank graph is test_whatif_graph.py's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tests.unit.test_whatif_graph import MS, _lane, hand_graph, traced_steps
from uberprof.analysis.diagnosis.whatif import parse_changes, project, with_bytes
from uberprof.analysis.diagnosis.whatif_changes import Change, _latency
from uberprof.analysis.tables.graph import build_graph
from uberprof.analysis.tables.lanes import COMPUTE, HOST, WAIT, RankLane


def _project(g, *remove: str, gbps: float | None = None, scale: float | None = None,
             balance: bool = False, stages: dict[int, int] | None = None,
             traced: pa.Table | None = None) -> dict:
    return project(g, traced if traced is not None else traced_steps(),
                   parse_changes(list(remove), scale, [], gbps, balance), straggler=None,
                   stages=stages)


def _with_allreduce_bytes(g_bytes: int):
    """The hand graph whose all-reduce (2 ranks: bus factor 1) moves `g_bytes` and whose
    send/recv has no byte count."""
    lanes = {
        0: _lane(0, [(0, 30, COMPUTE), (30, 60, WAIT), (60, 80, COMPUTE), (80, 100, WAIT)]),
        1: _lane(1, [(0, 50, COMPUTE), (50, 60, WAIT), (60, 90, COMPUTE), (90, 95, WAIT),
                     (95, 100, HOST)]),
    }
    inst = pa.table({"instance": [0, 0], "rank": [0, 1], "name": ["allreduce"] * 2,
                     "start_ns": [25 * MS, 50 * MS], "end_ns": [60 * MS, 60 * MS],
                     "in_bytes": [g_bytes] * 2, "out_bytes": [g_bytes] * 2,
                     "group_size": [2, 2], "participants": [2, 2]})
    pairs = pa.table({"pair": [0], "src": [1], "dst": [0], "step": [0],
                      "bytes": pa.array([None], pa.int64()),
                      "send_start_ns": [90 * MS], "send_end_ns": [95 * MS],
                      "recv_start_ns": [80 * MS], "recv_end_ns": [100 * MS]})
    return build_graph(lanes, {}, with_bytes(inst), pairs)


def test_link_gbps_retimes_the_transfers_whose_bytes_are_known_and_says_which_are_not() -> None:
    # 1.25 MB at 2 Gbit/s is 5 ms: the all-reduce ends at 55, rank 1 computes 55-85 and posts
    # its send at 85; the receive (no byte count: its 10 ms kept) ends at 95, so does the step
    g = _with_allreduce_bytes(1_250_000)
    doc = _project(g, gbps=2.0)
    assert doc["projected_step_ms"] == 95.0
    ch = doc["changes"][0]
    assert ch["transfers"] == 1 and ch["transfer_ms"] == 10.0
    assert ch["projected_transfer_ms"] == 5.0 and ch["latency_us"] == 0.0
    assert "1 of 2 transfers have no byte count" in ch["note"]
    # the link it was measured at: the same transfers, the same step
    assert _project(g, gbps=1.0)["projected_step_ms"] == 100.0


def test_the_latency_is_the_intercept_of_transfer_time_against_bytes() -> None:
    size = np.array([1e6, 1e6, 2e6, 2e6, 4e6])
    t = 1e6 + size * 2.0  # 1 ms of latency, then 2 ns per byte
    alpha, basis = _latency(size, t)
    assert alpha == pytest.approx(1e6) and "intercept" in basis
    alpha, basis = _latency(np.array([1e6, 1e6]), np.array([3e6, 3e6]))
    assert alpha == 0.0 and "one message size" in basis
    alpha, basis = _latency(np.array([1e6, 1.5e6]), np.array([3e6, 4e6]))
    assert alpha == 0.0 and "less than 2x apart" in basis


def test_hiding_communication_keeps_the_wait_for_the_late_peer_and_the_receive() -> None:
    # the all-reduce no longer blocks: both waits end at its last arrival (rank 1's, 50); rank 0
    # computes 50-70 and posts its receive at 70, rank 1 computes 50-80 and sends at 80: the
    # receive (kept) ends at 90, the send at 85, rank 1's host time ends at 90
    doc = _project(hand_graph(), "exposed-comm")
    assert doc["projected_step_ms"] == 90.0
    ch = doc["changes"][0]
    assert ch["collectives"] == 2 and ch["unblocked_waits"] == 2 and ch["transfer_ms"] == 10.0


def test_hiding_within_groups_hides_only_the_collectives_inside_them() -> None:
    g = hand_graph()
    inside = project(g, traced_steps(), [Change("exposed-comm", groups=((0, 1),))], None)
    assert inside["projected_step_ms"] == 90.0
    outside = project(g, traced_steps(), [Change("exposed-comm", groups=((0,), (1,)))], None)
    assert outside["projected_step_ms"] == 100.0
    assert outside["changes"][0]["collectives"] == 0


def test_hidden_communication_still_ends_before_its_step_does() -> None:
    # both ranks compute 0-40, all-reduce 40-100 (60 ms of transfer), host 100-110: hidden,
    # the host work runs 40-50, but the step cannot end before the collective (100)
    lanes = {r: _lane(r, [(0, 40, COMPUTE), (40, 100, WAIT), (100, 110, HOST)]) for r in (0, 1)}
    inst = pa.table({"instance": [0, 0], "rank": [0, 1], "start_ns": [40 * MS] * 2,
                     "end_ns": [100 * MS] * 2})
    g = build_graph(lanes, {}, inst, None)
    traced = pa.table({"rank": [0, 1], "step": [0, 0], "step_time_ns": [110 * MS] * 2})
    assert _project(g, "exposed-comm", traced=traced)["projected_step_ms"] == 100.0


def device_rank() -> RankLane:
    """One GPU rank, step 0 of 40 ms. Host: launches 0-10 (4 ms inside launch calls), waits in
    a synchronize 10-30 for the kernel, then 30-40. Device: idle 0-2 until the kernel launched
    at host time 2, the kernel 2-30."""
    host = _lane(0, [(0, 10, HOST), (10, 30, WAIT), (30, 40, HOST)])
    host.launch_ns = np.array([4 * MS, 0, 0], np.int64)
    host.device = _lane(0, [(0, 2, WAIT), (2, 30, COMPUTE)])
    # reach: the device idle ends 2 ms into the host's first segment; the host's wait ends
    # 28 ms into the kernel
    host.links = np.array([(0, 0, 1, 0, 2 * MS), (1, 1, 0, 1, 28 * MS)], np.int64)
    return host


def _device_graph():
    return build_graph({0: device_rank()}, {}, pa.table({"instance": pa.array([], pa.int64()),
                                                         "rank": pa.array([], pa.int64()),
                                                         "start_ns": pa.array([], pa.int64()),
                                                         "end_ns": pa.array([], pa.int64())}),
                       None)


def _device_traced() -> pa.Table:
    return pa.table({"rank": [0], "step": [0], "step_time_ns": [40 * MS]})


def test_removing_syncs_lets_the_host_run_on_but_the_step_ends_with_its_device_work() -> None:
    g = _device_graph()
    base = _project(g, traced=_device_traced())
    assert base["baseline_step_ms"] == 40.0 and base["replayed_step_ms"] == 40.0
    doc = _project(g, "sync", traced=_device_traced())
    # the host's 20 ms wait is gone (0-10, 10-20), but the step's kernel still runs to 30
    assert doc["projected_step_ms"] == 30.0 and doc["changes"][0]["removed_ms"] == 20.0


def test_removing_launch_overhead_frees_the_device_and_the_host() -> None:
    doc = _project(_device_graph(), "launch", traced=_device_traced())
    # the device no longer waits for the launch (kernel 0-28), the host's first segment loses
    # its 4 ms of launch calls (0-6), its wait ends with the kernel (28), then 28-38
    assert doc["projected_step_ms"] == 38.0
    ch = doc["changes"][0]
    assert ch["device_idle_ms"] == 2.0 and ch["launch_overhead_ms"] == 4.0


def test_launch_and_sync_removed_together_compose() -> None:
    doc = _project(_device_graph(), "launch", "sync", traced=_device_traced())
    assert doc["projected_step_ms"] == 28.0  # host 0-6, no wait, 6-16; the kernel 0-28
    assert [c["change"].split()[0] for c in doc["changes"]] == ["launch", "host"]


def test_launch_and_sync_say_so_on_cpu_ranks() -> None:
    doc = _project(hand_graph(), "launch", "sync")
    assert doc["projected_step_ms"] == doc["baseline_step_ms"] == 100.0
    assert all("CPU ranks have none" in c["note"] for c in doc["changes"])


def test_balancing_two_stages_sets_each_ones_compute_at_their_mean() -> None:
    # stage 0 (rank 0) computes 50 ms, stage 1 (rank 1) 80: both at 65, rank 0's work x1.3 and
    # rank 1's x0.8125. Rank 0 issues the all-reduce at 32.5, rank 1 at 40.625 (the end of its
    # compute): it ends at 50.625; rank 0 computes to 76.625 and posts its receive, rank 1
    # computes to 75 and sends; the receive passes at 76.625 and ends 10 ms later, and so does
    # rank 1's host time after its send (81.625 + 5)
    doc = _project(hand_graph(), balance=True, stages={0: 0, 1: 1})
    assert doc["projected_step_ms"] == 86.625
    ch = doc["changes"][0]
    assert [(s["stage"], s["compute_ms"], s["balanced_ms"]) for s in ch["stages"]] == \
        [(0, 50.0, 65.0), (1, 80.0, 65.0)]
    assert ch["moved_ms"] == 15.0


def test_balancing_without_stages_changes_nothing_and_says_why() -> None:
    doc = _project(hand_graph(), balance=True, stages={})
    assert doc["projected_step_ms"] == 100.0 and "no pipeline stages" in doc["changes"][0]["note"]


def test_the_link_and_hiding_compose_in_one_projection() -> None:
    # hidden all-reduce (waits end at 50) and a link twice as fast: rank 0 computes 50-70 and
    # posts its receive, rank 1 computes 50-80 and sends; the receive's transfer is 5 ms (85),
    # the send's 2.5 ms (82.5) and rank 1's host time ends at 87.5
    doc = _project(hand_graph(), "exposed-comm", scale=2.0)
    assert doc["projected_step_ms"] == 87.5
    assert [c["change"].split()[0] for c in doc["changes"]] == ["collective", "communication"]


def test_new_options_parse_and_refuse_bad_values() -> None:
    kinds = [c.kind for c in parse_changes(["launch", "sync", "exposed-comm"], None, [], 4.0,
                                           True)]
    assert kinds == ["launch", "sync", "exposed-comm", "gbps", "balance"]
    with pytest.raises(ValueError, match="link-gbps"):
        parse_changes([], None, [], 0.0)


def _behind_graph():
    """One GPU rank whose device runs behind its host: host 0-10 launches (its one segment),
    device idle 0-2, a kernel of `aten::mm` 2-30 (in a step whose host window ends at 10), idle
    30-40 until the next step's first kernel."""
    host = _lane(0, [(0, 10, HOST)])
    host.device = _lane(0, [(0, 2, WAIT), (2, 30, COMPUTE), (30, 40, HOST)],
                        ops=[(1, "ampere_sgemm", 28)])
    host.device.idle = np.array([True, False, True])
    host.device.via_seg = np.array([1, 1], np.int64)
    host.device.via_name = ["aten::mm", "aten::linear"]
    host.device.via_ns = np.array([28 * MS, 28 * MS], np.int64)
    host.links = np.array([(0, 0, 1, 0, 2 * MS)], np.int64)
    return build_graph({0: host}, {}, pa.table({"instance": pa.array([], pa.int64()),
                                                "rank": pa.array([], pa.int64()),
                                                "start_ns": pa.array([], pa.int64()),
                                                "end_ns": pa.array([], pa.int64())}), None)


def test_a_gpu_step_ends_with_its_device_work_not_the_idle_after_it() -> None:
    """The host's window is 10 ms, its kernel ends at 30, the device idles to 40: the step is
    measured and replayed to 30."""
    doc = project(_behind_graph(), pa.table({"rank": [0], "step": [0],
                                             "step_time_ns": [10 * MS]}), [], None)
    assert doc["baseline_step_ms"] == 30.0 and doc["replayed_step_ms"] == 30.0


@pytest.mark.parametrize("name", ["aten::mm", "aten::linear", "ampere_sgemm"])
def test_op_on_a_gpu_rank_shortens_the_kernels_of_a_host_operator_or_a_kernel_name(
        name: str) -> None:
    """`--op aten::mm=2`, the operator enclosing it, or the kernel's own name: the kernel's
    28 ms take 14, and the step, set by the device, ends 14 ms earlier."""
    doc = project(_behind_graph(), pa.table({"rank": [0], "step": [0],
                                             "step_time_ns": [10 * MS]}),
                  [Change("op", 2.0, name)], None)
    assert doc["gain_ms"] == 14.0 and doc["projected_step_ms"] == 16.0, doc
    assert doc["changes"][0]["matched"] == [name]
