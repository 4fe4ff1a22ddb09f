"""Unit tests of the diagnosis on synthetic data: matching, alignment, gap causes, stragglers,
bandwidth factors and verdicts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests import _traces as T
from uberprof.analysis.diagnosis.advisor import diagnose
from uberprof.analysis.diagnosis.bandwidth import bandwidth_classes, bus_factor, message_bytes
from uberprof.analysis.diagnosis.lateness import LATENESS_SCHEMA, robust_sigma
from uberprof.analysis.diagnosis.stragglers import find_straggler, straggler_cause
from uberprof.analysis.tables.align import align_clocks, weighted_median
from uberprof.analysis.tables.collectives import drop_inconsistent, match_collectives
from uberprof.analysis.tables.context import RankInfo, RunContext
from uberprof.collect.calibrate import launcher_prefix

COLL = pa.schema([("rank", pa.int64()), ("name", pa.string()), ("event", pa.string()),
                  ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("launch_ns", pa.int64()),
                  ("step", pa.int64()), ("in_bytes", pa.int64()), ("out_bytes", pa.int64()),
                  ("dtype", pa.string()), ("group_size", pa.int32()), ("pg_name", pa.string()),
                  ("pg_ranks", pa.string()), ("seq", pa.int64()), ("stream", pa.int64()),
                  ("tid", pa.int64()), ("trace", pa.string())])


def _ctx(rows: list[dict], hosts: dict[int, str | None], clocks: dict | None = None
         ) -> RunContext:
    full = [{f.name: r.get(f.name) for f in COLL} for r in rows]
    ranks = {r: RankInfo(rank=r, host=h, world_size=len(hosts), local_rank=None,
                         backend="gloo", mode="cpu", device_type="cpu",
                         clock=(clocks or {}).get(r, {}), process_groups=[])
             for r, h in hosts.items()}
    ctx = RunContext(run=None, root=Path("."), is_run_dir=False, ranks=ranks)  # type: ignore
    ctx._cache["collectives"] = pa.Table.from_pylist(full, schema=COLL)
    return ctx


def _row(rank: int, start: int, end: int, step: int = 1, nbytes: int = 4096,
         name: str = "allreduce", **kw: object) -> dict:
    return {"rank": rank, "name": name, "event": f"gloo:{name}", "start_ns": start,
            "end_ns": end, "step": step, "in_bytes": nbytes, "dtype": "float", **kw}


# --- matching -----------------------------------------------------------------------------------

def test_matching_pairs_buckets_by_size_even_when_their_order_differs() -> None:
    rows = [
        _row(0, 100, 200, nbytes=1000), _row(0, 110, 210, nbytes=2000),
        # rank 1 started the 2000-byte bucket first (Gloo runs buckets on two threads)
        _row(1, 105, 205, nbytes=2000), _row(1, 108, 201, nbytes=1000),
    ]
    m = match_collectives(_ctx(rows, {0: "a", 1: "a"}))
    assert m.n_instances == 2 and m.unmatched.num_rows == 0
    by_inst = {}
    for r in m.instances.to_pylist():
        by_inst.setdefault(r["instance"], set()).add(r["in_bytes"])
    assert all(len(v) == 1 for v in by_inst.values())
    assert m.method == {"default": "order"}


def test_a_collective_missing_on_one_rank_is_reported_not_guessed() -> None:
    rows = [_row(0, 100, 200, step=1), _row(1, 100, 200, step=1),
            _row(0, 300, 400, step=2)]  # rank 1's trace lost it
    m = match_collectives(_ctx(rows, {0: "a", 1: "a"}))
    assert m.n_instances == 1
    [u] = m.unmatched.to_pylist()
    assert (u["rank"], u["step"], u["present"], u["expected"]) == (0, 2, 1, 2)


def test_sequence_numbers_match_across_steps() -> None:
    rows = [_row(0, 100, 200, step=1, seq=7, pg_name="0"),
            _row(1, 100, 200, step=2, seq=7, pg_name="0")]  # steps numbered differently
    m = match_collectives(_ctx(rows, {0: "a", 1: "a"}))
    assert m.n_instances == 1 and m.method == {"0": "seq"}


def test_pairings_that_never_overlap_in_time_are_dropped() -> None:
    rows = [_row(0, 0, 1_000_000), _row(1, 50_000_000, 51_000_000)]
    m = match_collectives(_ctx(rows, {0: "a", 1: "a"}))
    kept, dropped = drop_inconsistent(m, {0: 0, 1: 0})
    assert dropped == 1 and kept.n_instances == 0 and kept.unmatched.num_rows == 2


# --- alignment ----------------------------------------------------------------------------------

def test_alignment_recovers_a_host_offset_from_exits() -> None:
    rng = np.random.default_rng(1)
    rows, offset = [], 5_000_000  # host b's clock is 5 ms ahead
    for i in range(30):
        t0 = i * 10_000_000
        end = t0 + 2_000_000
        for r in range(4):
            start = t0 + int(rng.integers(0, 1_000_000))
            e = end + int(rng.normal(0, 3_000))
            shift = offset if r >= 2 else 0
            rows.append(_row(r, start + shift, e + shift, step=i))
    ctx = _ctx(rows, {0: "a", 1: "a", 2: "b", 3: "b"},
               clocks={2: {"offset_to_rank0_ns": -4_000_000, "offset_uncertainty_ns": 2_000_000}})
    al = align_clocks(ctx, match_collectives(ctx))
    [a, b] = al.hosts
    assert a.host == "a" and a.method == "reference" and a.offset_ns == 0
    assert b.host == "b" and b.ranks == [2, 3] and b.method == "collectives"
    assert abs(b.offset_ns + offset) < 20_000, b
    assert b.correction_ns == b.offset_ns - (-4_000_000)
    assert b.residual_ns is not None and b.residual_ns < 20_000
    assert al.offset_of(3) == b.offset_ns


def test_alignment_without_shared_collectives_keeps_the_online_estimate() -> None:
    rows = [_row(0, 0, 10, step=1), _row(1, 0, 10, step=1)]
    ctx = _ctx(rows, {0: "a", 1: "b"}, clocks={1: {"offset_to_rank0_ns": 1234}})
    al = align_clocks(ctx, match_collectives(ctx))
    b = al.hosts[1]
    assert b.method == "online" and b.offset_ns == 1234


def test_weighted_median() -> None:
    assert weighted_median(np.array([1.0, 2.0, 100.0]), np.array([1.0, 1.0, 1.0])) == 2.0
    assert weighted_median(np.array([1.0, 2.0, 100.0]), np.array([1.0, 1.0, 5.0])) == 100.0


# --- stragglers ---------------------------------------------------------------------------------

def _lateness(late: np.ndarray, step_of: np.ndarray) -> pa.Table:
    n_inst, n = late.shape
    rows = []
    for i in range(n_inst):
        order = np.argsort(-late[i])
        for r in range(n):
            last = bool(late[i, r] == late[i].max())
            sole = last and int((late[i] == late[i].max()).sum()) == 1
            delay = late[i, r] - late[i, order[1]] if r == order[0] else 0
            rows.append({"instance": i, "rank": r, "step": int(step_of[i]), "name": "allreduce",
                         "participants": n, "lateness_ns": int(late[i, r]), "last": last,
                         "sole_last": sole, "delay_ns": int(delay), "transfer_ns": 1000})
    return pa.Table.from_pylist(rows, schema=LATENESS_SCHEMA)


def test_a_persistent_straggler_is_found_and_noise_is_not() -> None:
    rng = np.random.default_rng(0)
    noise = rng.exponential(5e6, size=(20, 4))  # 5 ms of arrival jitter
    steps = np.repeat(np.arange(10), 2)
    assert find_straggler(_lateness(noise - noise.min(1, keepdims=True), steps), 200e6) is None
    slow = noise.copy()
    slow[:, 2] += 40e6  # rank 2 arrives 40 ms later
    s = find_straggler(_lateness(slow - slow.min(1, keepdims=True), steps), 200e6)
    assert s is not None and s.rank == 2 and s.last == 20 and s.steps == list(range(10))
    assert s.median_lead_ns > 30e6 and s.delay_ns > 0 and s.others_wait_ns == 3 * s.delay_ns


def test_a_small_lead_is_not_a_straggler() -> None:
    late = np.zeros((20, 4))
    late[:, 1] = 50_000  # always last, by 50 µs of a 100 ms step: below every threshold
    assert find_straggler(_lateness(late, np.arange(20)), 100e6) is None


def test_straggler_cause_is_the_largest_excess() -> None:
    per_step = {s: {0: {"compute": 10.0, "data": 1.0, "host_launch": 0.0, "network": 0.0},
                    1: {"compute": 10.0, "data": 9.0, "host_launch": 0.0, "network": 0.0},
                    2: {"compute": 11.0, "data": 1.0, "host_launch": 0.0, "network": 0.0}}
                for s in range(5)}
    assert straggler_cause(1, per_step)[0] == "data"
    assert straggler_cause(2, per_step)[0] == "compute"
    assert straggler_cause(2, per_step, {"throttled": True})[0] == "clock_throttle"


def test_a_confirmed_busy_excess_weighs_for_compute_over_a_few_traced_steps() -> None:
    """Two traced steps on a loaded machine read 'network' for a rank whose CPU time per step
    is confirmed 8 ns (here) over the others' on every step: the work decides."""
    per_step = {s: {0: {"compute": 10.0, "network": 1.0},
                    1: {"compute": 11.0, "network": 6.0},
                    2: {"compute": 10.0, "network": 1.0}} for s in range(2)}
    cause, factors = straggler_cause(1, per_step)
    assert cause == "network" and factors["network"] == 5 and factors["compute"] == 1
    cause, factors = straggler_cause(1, per_step, busy_excess_ns=8)
    assert cause == "compute" and factors["compute"] == 1  # the traced factors stay as read
    assert straggler_cause(1, per_step, busy_excess_ns=3)[0] == "network"  # smaller: no say


def test_robust_sigma_ignores_outliers() -> None:
    x = np.array([1.0, 1.1, 0.9, 1.0, 50.0])
    assert robust_sigma(x) < 0.2


# --- bandwidth ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "n", "f"), [("allreduce", 4, 1.5), ("allreduce", 2, 1.0),
                                               ("allgather", 4, 0.75), ("reducescatter", 8, 0.875),
                                               ("alltoall", 2, 0.5), ("broadcast", 8, 1.0),
                                               ("send", 2, 1.0)])
def test_bus_factors_are_nccl_tests(name: str, n: int, f: float) -> None:
    assert bus_factor(name, n) == pytest.approx(f)


def test_message_bytes_count_the_whole_buffer() -> None:
    assert message_bytes("allreduce", 1000, 1000, 4) == 1000
    assert message_bytes("allgather", 250, 1000, 4) == 1000
    assert message_bytes("allgather", 250, None, 4) == 1000
    assert message_bytes("reducescatter", 1000, 250, 4) == 1000


def _bw_rows(size: int, busbw: list[float], peak: float | None) -> pa.Table:
    from uberprof.analysis.diagnosis.bandwidth import BANDWIDTH_SCHEMA

    rows = [{"instance": i, "grp": "default", "name": "allreduce", "step": i, "n": 2,
             "bytes": size, "t_ns": 1_000_000, "algbw_Bps": b, "busbw_Bps": b,
             "link": "inter-node", "link_kind": "NIC eth0", "peak_Bps": peak,
             "peak_source": "tc cap" if peak else None, "half_peak_bytes": None,
             "exposed_ns": 500_000} for i, b in enumerate(busbw)]
    return pa.Table.from_pylist(rows, schema=BANDWIDTH_SCHEMA)


def test_verdicts() -> None:
    [c] = bandwidth_classes(_bw_rows(8 << 20, [118e6, 60e6, 121e6, 119e6], 125e6))
    assert c.verdict == "bandwidth-bound" and c.busbw_Bps == pytest.approx(119.5e6)
    [c] = bandwidth_classes(_bw_rows(8 << 20, [30e6, 40e6, 35e6], 125e6))
    assert c.verdict == "fine"
    [c] = bandwidth_classes(_bw_rows(4096, [1e6, 2e6], 125e6))
    assert c.verdict == "latency-bound"
    [c] = bandwidth_classes(_bw_rows(8 << 20, [118e6], None))
    assert c.verdict == "unknown"
    [c] = bandwidth_classes(_bw_rows(512, [1e5], None))
    assert c.verdict == "latency-bound"  # tiny: latency dominates on any link
    assert c.as_dict()["exposed_pct"] == 50.0


def test_launcher_prefix() -> None:
    cmd = ["/usr/bin/python", "-m", "torch.distributed.run", "--nproc_per_node=4",
           "/home/me/train.py", "--lr", "3e-4"]
    assert launcher_prefix(cmd) == cmd[:4]
    assert launcher_prefix(["srun", "python", "train.py"]) == ["srun", "python"]
    assert launcher_prefix(["python", "-m", "mypkg.train"]) == []


# --- idle gaps on a synthetic GPU trace ---------------------------------------------------------

def _gap_trace() -> dict:
    k = T.kernel
    ev = [
        T.step(1, 0, 3000),
        T.launch(5, 1), k(10, 190, 1),  # ends at 200
        # data: the host fetches a batch 200-600, launches at 610
        T.annotation(200, 400, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"),
        T.launch(610, 2), k(620, 380, 2),  # 620-1000
        T.launch(630, 3), k(1000, 100, 3),  # 1000-1100
        # sync: the host blocks 1050-1110, then launches at 1200
        T.launch(1050, 90, name="cudaStreamSynchronize", dur=60),
        T.launch(1200, 4), k(1210, 290, 4),  # 1210-1500
        # launch-bound: an operator keeps the host busy 1490-1700, launch at 1690
        T.op(1490, 210, "aten::add"), T.launch(1690, 5), k(1700, 300, 5),  # 1700-2000
        # host: the optimizer runs on the host 1990-2300
        T.annotation(1990, 310, "Optimizer.step#SGD.step"),
        T.launch(2290, 6), k(2300, 300, 6),  # 2300-2600
        # other: launched at 2400 but starts only at 2800 (waits on another stream)
        T.launch(2400, 7), k(2800, 150, 7),
    ]
    return T.trace(ev, rank=0, world=1)


def test_gap_causes(tmp_path: Path) -> None:
    T.write(tmp_path / "traces" / "rank-0.json", _gap_trace())
    d = diagnose(tmp_path / "traces", out=tmp_path / "derived")
    gaps = {(g["start_ns"] - T.BASE_NS) // 1000: g for g in d.gaps.to_pylist()}
    causes = {t: g["cause"] for t, g in gaps.items()}
    assert causes == {200: "data", 1100: "sync", 1500: "launch", 2000: "host", 2600: "other"}
    assert gaps[1500]["after"] == "void gemm_kernel<float>()"
    [r] = d.ranks
    by = r["idle_gaps"]["ms_by_cause"]
    assert by["data"] == pytest.approx(0.42) and by["other"] == pytest.approx(0.2)
    kinds = {f.kind for f in d.findings}
    assert {"data_stall", "launch_bound", "idle"} <= kinds
    # a lower threshold keeps the same gaps; a higher one drops them all
    d2 = diagnose(tmp_path / "traces", out=tmp_path / "derived", threshold_ns=500_000)
    assert d2.gaps.num_rows == 0


def test_a_gap_filled_by_a_long_runtime_call_is_warm_up_and_makes_no_finding(
        tmp_path: Path) -> None:
    """No step markers: a kernel, then 80 ms of device idle while the host is in cudaFree for
    70 ms and an 8 ms cudaLaunchKernel (lazy loading of the next kernel's module): warm-up, cut
    from the window up to the next kernel and named (`run.warmup`), no launch-bound or idle
    verdict; a 2 ms gap whose launch came late after an operator stays launch-bound."""
    k = T.kernel
    ev = [T.launch(0, 1), k(10, 990, 1),  # 10-1000
          T.launch(1000, 90, name="cudaFree", dur=70_000),  # 1000-71000
          T.op(71_000, 10_000, "aten::cudnn_convolution"),
          T.launch(72_000, 2, dur=8_000), k(81_000, 5_000, 2),  # 81000-86000
          T.op(86_000, 2_000, "aten::add"), T.launch(87_990, 3), k(88_000, 12_000, 3)]
    T.write(tmp_path / "traces" / "rank-0.json", T.trace(ev, rank=0, world=1))
    d = diagnose(tmp_path / "traces", out=tmp_path / "derived")
    causes = {(g["start_ns"] - T.BASE_NS) // 1000: g["cause"] for g in d.gaps.to_pylist()}
    assert causes == {86_000: "launch"}
    w = d.run["warmup"]
    assert w["steps"] == [] and w["evidence_ms"] == {"init": pytest.approx(70.0)}
    assert w["cut_ms"]["0"] == pytest.approx(81.0, abs=0.02)  # up to the next kernel
    [r] = d.ranks
    assert r["idle_gaps"]["ms_by_cause"]["warmup"] == 0
    assert r["analysed"]["window_ms"] == pytest.approx(19.0, abs=0.02)
    assert [f.kind for f in d.findings if f.kind in ("launch_bound", "idle")] == ["launch_bound"]
    (f,) = [f for f in d.findings if f.kind == "launch_bound"]
    assert f.time_at_stake_ms == pytest.approx(2.0)
