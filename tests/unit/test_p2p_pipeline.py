"""Communication that is not data-parallel, on small synthetic Gloo traces (times in µs): a
pipeline stage's send/recv on its training thread, tensor parallelism's functional collectives,
Gloo's emulated reduce-scatter, send/recv pairing, process groups of a 2-D mesh and the pipeline's
stages. Real jobs of each kind: tests/jobs/test_parallelism_runs.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests import _traces as T
from uberprof.analysis.diagnosis.pipeline_stages import pipeline_stages
from uberprof.analysis.tables.collectives import match_collectives
from uberprof.analysis.tables.context import load_context
from uberprof.analysis.tables.p2p import NO_PEER, match_p2p
from uberprof.analysis.tables.rank import analyze_trace
from uberprof.ingest.classify import COMM_OP, classify

US = 1000


def _c10d(ts: float, name: str, peer: int | None = None, dur: float = 5) -> dict[str, Any]:
    """A c10d launch as torch 2.13 writes it (send/recv name their peer in Concrete Inputs)."""
    ev = T.op(ts, dur, name)
    if peer is not None:
        ev["args"]["Concrete Inputs"] = ["", "", str(peer), "0"]
    return ev


def _gloo_trace(rank: int, events: list[dict[str, Any]], world: int = 2,
                groups: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    doc = T.trace([{"ph": "M", "name": "thread_name", "pid": T.PID, "tid": T.GLOO,
                    "args": {"name": f"thread {T.GLOO} (pt_gloo_runloop)"}}, *events],
                  rank=rank, world=world)
    doc["distributedInfo"]["backend"] = "gloo"
    if groups is not None:
        doc["distributedInfo"]["pg_config"] = groups
    return doc


def _stage(rank: int, t0: float, sends: list[float], recvs: list[float],
           compute: float) -> dict[str, Any]:
    """One pipeline stage's step: operators, then its sends/recvs on the training thread."""
    peer = 1 - rank
    ev = [T.step(1, t0, 2000), T.op(t0 + 10, compute)]
    for ts in sends:
        ev += [_c10d(t0 + ts, "c10d::send", peer),
               T.gloo(t0 + ts + 5, 20, 1024, tid=T.MAIN, name="gloo:send")]
    for ts, dur in recvs:
        ev += [_c10d(t0 + ts, "c10d::recv_", peer),
               T.gloo(t0 + ts + 5, dur, 1024, tid=T.MAIN, name="gloo:recv")]
    return _gloo_trace(rank, ev)


def test_functional_collectives_are_classified_as_communication() -> None:
    for name in ("_c10d_functional::wait_tensor", "_c10d_functional::all_reduce",
                 "_c10d_functional::reduce_scatter_tensor"):
        assert classify("cpu_op", name, False) == COMM_OP, name


def test_a_stage_that_runs_send_recv_on_its_training_thread_keeps_its_compute(
        tmp_path: Path) -> None:
    t = analyze_trace(T.write(tmp_path / "r0.json.gz",
                              _stage(0, 1000, sends=[700], recvs=[(900, 600)], compute=600)))
    [s] = t.steps.to_pylist()
    assert s["compute_ns"] == 600 * US  # the operators, although gloo spans share the thread
    assert s["exposed_comm_ns"] == 620 * US  # the send (20) and the recv (600)


def test_a_stage_whose_backward_runs_inside_its_async_sends_keeps_that_compute(
        tmp_path: Path) -> None:
    """A pipeline schedule issues its gradient sends asynchronously: each `gloo:send` span
    runs from its issue to the wait at the end of the step, over the next micro-batches'
    backward on the same thread. That backward is compute; only the thread's time in the
    sends with no operator running (the wait at the end) is communication. A recv that held
    the thread stays communication, whatever small operator runs in it."""
    ev = [T.step(1, 1000, 1000),
          _c10d(1010, "c10d::recv_", 1), T.gloo(1015, 100, 1024, tid=T.MAIN, name="gloo:recv"),
          T.op(1040, 10),  # inside the blocking recv: not compute
          T.op(1120, 200),  # micro-batch 1's backward
          _c10d(1320, "c10d::send", 1), T.gloo(1325, 475, 1024, tid=T.MAIN, name="gloo:send"),
          T.op(1330, 200),  # micro-batch 2's backward, while send 1 is in flight
          _c10d(1530, "c10d::send", 1), T.gloo(1535, 265, 1024, tid=T.MAIN, name="gloo:send"),
          T.op(1540, 200)]  # micro-batch 3's; both sends end at the wait (1800)
    t = analyze_trace(T.write(tmp_path / "r0.json.gz", _gloo_trace(0, ev)))
    [s] = t.steps.to_pylist()
    assert s["compute_ns"] == 600 * US  # the three backward chunks (was 200: only the first)
    # the recv (100) and the sends' time with no operator running: 1325-1330, 1530-1540 and
    # the wait at the end, 1740-1800
    assert s["exposed_comm_ns"] == (100 + 5 + 10 + 60) * US


def test_waiting_in_a_functional_collective_inside_an_operator_is_not_compute(
        tmp_path: Path) -> None:
    ev = [T.step(1, 1000, 1000),
          T.op(1100, 400, "_FromTorchTensorBackward"),  # autograd wraps the TP all-reduce wait
          _c10d(1150, "_c10d_functional::all_reduce", dur=10),
          T.gloo(1160, 300, 1000),
          T.op(1200, 300, "_c10d_functional::wait_tensor")]
    t = analyze_trace(T.write(tmp_path / "r0.json.gz", _gloo_trace(0, ev)))
    [s] = t.steps.to_pylist()
    # 400 µs of operator less the all-reduce launch (10) and the wait (300)
    assert s["compute_ns"] == 90 * US
    assert s["exposed_comm_ns"] == 260 * US  # the gloo span outside the remaining compute


def test_a_reduce_scatter_gloo_runs_as_an_all_reduce_keeps_its_name(tmp_path: Path) -> None:
    ev = [T.step(1, 1000, 1000), T.op(1010, 100),
          _c10d(1200, "c10d::_reduce_scatter_base_"), T.gloo(1210, 200, 4000),
          _c10d(1500, "c10d::allreduce_"), T.gloo(1510, 100, 10)]
    t = analyze_trace(T.write(tmp_path / "r0.json.gz", _gloo_trace(0, ev)))
    assert t.collectives.column("name").to_pylist() == ["reducescatter", "allreduce"]
    assert t.collectives.column("in_bytes").to_pylist() == [16000, 40]


def _pipeline_run(tmp_path: Path, drop_last_recv: bool = False) -> Path:
    # rank 0 sends two activations (posted at 700 and 760), rank 1 receives them, waiting from
    # 300 for the first; then rank 1 sends one gradient back
    r1_recvs = [(300, 420), (730, 60)]
    if drop_last_recv:
        r1_recvs = r1_recvs[:1]
    T.write(tmp_path / "run" / "rank0.json.gz",
            _stage(0, 1000, sends=[700, 760], recvs=[(1000, 500)], compute=600))
    T.write(tmp_path / "run" / "rank1.json.gz",
            _stage(1, 1000, sends=[1300], recvs=r1_recvs, compute=200))
    return tmp_path / "run"


def test_sends_pair_with_the_peers_receives_never_with_sends(tmp_path: Path) -> None:
    ctx = load_context(_pipeline_run(tmp_path), out=tmp_path / "derived")
    assert match_collectives(ctx).instances.num_rows == 0  # not collectives
    p = match_p2p(ctx, {})
    rows = p.pairs.to_pylist()
    assert [(r["src"], r["dst"]) for r in rows] == [(0, 1), (0, 1), (1, 0)]
    assert p.unmatched.num_rows == 0
    first = rows[0]
    # rank 1 waited in its receive (from 305) 395 µs before rank 0's send call started (700):
    # waiting, not transfer
    assert first["wait_ns"] == 395 * US
    assert first["transfer_ns"] == (300 + 5 + 420 - 700) * US  # from the send's c10d call
    for r in rows:
        assert min(r["wait_ns"], r["transfer_ns"], r["send_wait_ns"]) >= 0, r


def test_a_send_is_posted_when_its_c10d_call_starts_not_when_gloos_span_does(
        tmp_path: Path) -> None:
    """Gloo's `gloo:send` span can start after the peer's receive already ended (seen on a real
    2-stage pipeline: at the end of a 4 ms `c10d::send`): the pair reads the call's start as the
    send's post, so the receive ends after the send and its transfer is not clamped to nothing.
    The receive's side stays its Gloo span (the wait)."""
    r0 = [T.step(1, 1000, 6000), _c10d(1700, "c10d::send", 1, dur=4100),
          T.gloo(5780, 20, 1024, tid=T.MAIN, name="gloo:send")]
    r1 = [T.step(1, 1000, 6000), _c10d(1300, "c10d::recv_", 0, dur=10),
          T.gloo(1305, 700, 1024, tid=T.MAIN, name="gloo:recv")]
    T.write(tmp_path / "run" / "rank0.json.gz", _gloo_trace(0, r0))
    T.write(tmp_path / "run" / "rank1.json.gz", _gloo_trace(1, r1))
    ctx = load_context(tmp_path / "run", out=tmp_path / "derived")
    [pair] = match_p2p(ctx, {}).pairs.to_pylist()
    assert pair["send_start_ns"] - pair["recv_start_ns"] == 395 * US  # the call 1700, wait 1305
    assert pair["recv_end_ns"] > pair["send_start_ns"]  # data arrives after it was sent
    assert (pair["wait_ns"], pair["transfer_ns"]) == (395 * US, (2005 - 1700) * US)


def test_a_send_whose_receive_is_missing_is_unmatched_with_its_reason(tmp_path: Path) -> None:
    ctx = load_context(_pipeline_run(tmp_path, drop_last_recv=True), out=tmp_path / "derived")
    p = match_p2p(ctx, {})
    assert p.pairs.num_rows == 2
    [u] = p.unmatched.to_pylist()
    assert (u["rank"], u["name"], u["peer"]) == (0, "send", 1)
    assert "no receive" in u["reason"] and "rank 1" in u["reason"]


def test_calls_recorded_without_inputs_are_unmatched_saying_shapes_name_the_peer(
        tmp_path: Path) -> None:
    # `--record-shapes off`: the c10d calls carry no Concrete Inputs, so no peer
    for rank in (0, 1):
        doc = _stage(rank, 1000, sends=[700], recvs=[(300, 420)], compute=200)
        for ev in doc["traceEvents"]:
            ev.get("args", {}).pop("Concrete Inputs", None)
        T.write(tmp_path / "run" / f"rank{rank}.json.gz", doc)
    p = match_p2p(load_context(tmp_path / "run", out=tmp_path / "derived"), {})
    assert p.pairs.num_rows == 0 and p.unmatched.num_rows == 4
    assert set(p.unmatched.column("reason").to_pylist()) == {NO_PEER}
    assert "--record-shapes on" in NO_PEER


def test_posts_closer_than_the_clock_error_leave_the_pair_unsplittable(tmp_path: Path) -> None:
    ctx = load_context(_pipeline_run(tmp_path), out=tmp_path / "derived")
    p = match_p2p(ctx, {}, error_ns=10_000 * US)  # clocks known to 10 ms only
    assert all(r["wait_ns"] is None and r["transfer_ns"] is None for r in p.pairs.to_pylist())
    assert p.per_rank_step() == {}  # neither waiting nor transfer is claimed


def _pairs(rows: list[tuple[int, int, int, int, int]]) -> pa.Table:
    """(src, dst, step, send_start, recv_start) -> a PAIR_SCHEMA-like table (waits 0)."""
    cols = list(zip(*rows))
    return pa.table({"src": cols[0], "dst": cols[1], "step": cols[2], "send_start_ns": cols[3],
                     "recv_start_ns": cols[4], "wait_ns": [0] * len(rows)})


def _traced(compute: dict[int, int], steps: int = 4) -> pa.Table:
    rows = [(r, s, c, 1000) for r, c in compute.items() for s in range(steps)]
    cols = list(zip(*rows))
    return pa.table({"rank": cols[0], "step": cols[1], "compute_ns": cols[2],
                     "window_ns": cols[3]})


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_stages_microbatches_and_schedule_from_the_transfers(schedule: str) -> None:
    rows = []
    for step in range(4):
        t = step * 10_000
        if schedule == "gpipe":  # stage 0 (rank 1 here) posts its 4 forward sends first
            fwd, bwd = [t + 10 * i for i in range(4)], [t + 100 + 10 * i for i in range(4)]
        else:  # 1F1B: a backward receive between the forward sends
            fwd, bwd = [t, t + 20, t + 40, t + 60], [t + 30, t + 50, t + 70, t + 80]
        rows += [(1, 0, step, f, f) for f in fwd] + [(0, 1, step, b, b) for b in bwd]
    pipe = pipeline_stages(_traced({0: 300, 1: 600}), _pairs(rows))
    assert pipe is not None
    assert pipe.stage_of == {1: 0, 0: 1}  # the step's first transfer goes forward
    assert (pipe.microbatches, pipe.schedule) == (4, schedule)
    assert pipe.ideal_bubble == pytest.approx(1 / 5)  # (p-1)/(m+p-1), p=2, m=4
    slow = max(pipe.stages, key=lambda s: s.compute_ns)
    assert slow.ranks == [1] and slow.slowest_in == 4


def test_collectives_of_a_two_dimensional_mesh_match_within_their_groups(
        tmp_path: Path) -> None:
    # 2 x 2 mesh: dp groups {0,1} and {2,3} all-reduce buckets of different sizes; no Flight
    # Recorder, so the groups come from which ranks hold each collective
    dp = {0: ("3", [0, 1]), 1: ("3", [0, 1]), 2: ("4", [2, 3]), 3: ("4", [2, 3])}
    pp = {0: ("1", [0, 2]), 2: ("1", [0, 2]), 1: ("2", [1, 3]), 3: ("2", [1, 3])}
    for r in range(4):
        groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
                  {"pg_name": pp[r][0], "pg_desc": "mesh_pp", "pg_size": 2, "ranks": pp[r][1]},
                  {"pg_name": dp[r][0], "pg_desc": "mesh_dp", "pg_size": 2, "ranks": dp[r][1]}]
        numel = 1000 if r < 2 else 3000
        ev = [T.step(1, 1000, 1000), T.op(1010, 100), _c10d(1200, "c10d::allreduce_"),
              T.gloo(1210 + r, 200, numel)]
        T.write(tmp_path / "run" / f"rank{r}.json.gz", _gloo_trace(r, ev, 4, groups))
    m = match_collectives(load_context(tmp_path / "run", out=tmp_path / "derived"))
    assert m.unmatched.num_rows == 0
    assert m.groups == {"3": [0, 1], "4": [2, 3]}
    assert sorted(set(zip(m.instances.column("grp").to_pylist(),
                          m.instances.column("participants").to_pylist()))) == \
        [("3", 2), ("4", 2)]


def _nccl_stage(rank: int, send: bool) -> dict[str, Any]:
    """One GPU rank's step: a compute kernel, then an NCCL send (rank 0) or recv (rank 1) as
    torch 2.x records it: c10d::send / c10d::recv_ (naming the peer) around
    record_param_comms (the collective's metadata) around the kernel's launch."""
    name, op = ("send", "c10d::send") if send else ("recv", "c10d::recv_")
    peer = 1 - rank
    meta = {"Collective name": name, "In msg nelems": 1024, "Out msg nelems": 1024,
            "dtype": "Float", "Group size": 2, "Process Group Name": "0"}
    ev = [T.step(1, 1000, 1000), T.launch(1010, 1), T.kernel(1100, 300, 1),
          _c10d(1400, op, peer, dur=60),
          {**T.op(1405, 50, "record_param_comms"),
           "args": {"External id": 2, **meta}},
          T.launch(1410, 2),
          T.kernel(1500 if send else 1450, 200, 2,
                   name="ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", stream=20)]
    return T.trace(ev, rank=rank)


def test_nccl_send_recv_kernels_take_their_peer_from_the_launch_and_pair(
        tmp_path: Path) -> None:
    T.write(tmp_path / "run" / "rank0.json.gz", _nccl_stage(0, send=True))
    T.write(tmp_path / "run" / "rank1.json.gz", _nccl_stage(1, send=False))
    ctx = load_context(tmp_path / "run", out=tmp_path / "derived")
    coll = ctx.collectives()
    assert coll.column("name").to_pylist() == ["send", "recv"]
    assert coll.column("peer").to_pylist() == [1, 0]
    p = match_p2p(ctx, {})
    [pair] = p.pairs.to_pylist()
    assert (pair["src"], pair["dst"], pair["bytes"]) == (0, 1, 4096)
    assert pair["wait_ns"] == 50 * US  # the recv kernel ran from 1450, the send's from 1500

