"""Unit tests of the collect pieces that need no job: step detection, schedules, run ids."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests._jobs import PY, job_env
from uberprof.collect.config import CollectConfig, TraceSchedule
from uberprof.collect.rank.steps import StepDetector, StepSource
from uberprof.collect.rank.timeline import StepTimeline
from uberprof.collect.runid import resolve_run_id, torchrun_rdzv_id
from uberprof.inventory import inventory
from uberprof.rundir import RunDir, claim_dir, parse_trace_file_name, read_steps, trace_file_name


def _detector() -> tuple[StepDetector, list[tuple[int, StepSource]]]:
    seen: list[tuple[int, StepSource]] = []
    return StepDetector(lambda t, s: seen.append((t, s))), seen


def test_one_optimizer_one_boundary_per_step() -> None:
    det, seen = _detector()
    for t in (10, 20, 30):
        det.optimizer_stepped(1, t)
    # The first boundary is known once the optimizer comes round again, and dated back.
    assert [t for t, _ in seen] == [10, 20, 30]


def test_several_optimizers_close_the_iteration_at_the_last_one() -> None:
    det, seen = _detector()
    for it in range(3):
        det.optimizer_stepped(1, 100 * it + 10)
        det.optimizer_stepped(2, 100 * it + 20)
    det.flush()
    assert [t for t, _ in seen] == [20, 120, 220]


def test_flush_counts_a_single_iteration() -> None:
    det, seen = _detector()
    det.optimizer_stepped(1, 5)
    det.optimizer_stepped(2, 6)
    det.flush()
    assert seen == [(6, StepSource.OPTIMIZER)]


def test_stronger_source_takes_over_without_a_spurious_step() -> None:
    det, seen = _detector()
    det.optimizer_stepped(1, 10)
    det.optimizer_stepped(1, 20)  # boundaries at 10 and 20
    det.profiler_stepped(21)  # the script's prof.step() shows up: absorbed, no 1 µs step
    det.optimizer_stepped(1, 30)  # ignored from now on
    det.profiler_stepped(31)
    det.explicit_step(40)  # absorbed again
    det.profiler_stepped(41)  # ignored
    det.explicit_step(50)
    assert seen == [(10, StepSource.OPTIMIZER), (20, StepSource.OPTIMIZER),
                    (31, StepSource.PROFILER), (50, StepSource.EXPLICIT)]


def test_explicit_steps_alone() -> None:
    det, seen = _detector()
    for t in (1, 2, 3):
        det.explicit_step(t)
    assert [t for t, _ in seen] == [1, 2, 3]


def test_trace_schedule_parsing_and_windows() -> None:
    s = TraceSchedule.parse_steps("50-52, 5-7,9")
    assert s.windows == ((5, 7), (9, 9), (50, 52))
    assert s.window_at(5) == (5, 7) and s.window_at(6) is None
    p = TraceSchedule.periodic(100, 2)
    assert p.window_at(0) is None and p.window_at(200) == (200, 201)
    assert not TraceSchedule.off().enabled
    for bad in ("7-5", "x", "", "-3", f"1-{1 << 64}"):  # past int64: said, not crashed on
        with pytest.raises(ValueError):
            TraceSchedule.parse_steps(bad)
    with pytest.raises(ValueError):
        TraceSchedule.periodic(2, 3)


def test_config_round_trips_through_the_environment() -> None:
    for shapes in (None, True, False):  # None: by the rank's device (collect/rank/windows.py)
        cfg = CollectConfig(trace=TraceSchedule.periodic(10, 2), with_stack=True,
                            record_shapes=shapes)
        assert CollectConfig.from_env({"UBERPROF_CONFIG": cfg.to_env()}) == cfg
    assert CollectConfig.from_env({}) == CollectConfig()


def test_run_id_sources() -> None:
    tr = ["torchrun", "--nnodes=2", "--rdzv-id=job42", "train.py"]
    assert resolve_run_id(None, tr, {}) == "job42"
    assert resolve_run_id("mine", tr, {"SLURM_JOB_ID": "7"}) == "mine"
    assert torchrun_rdzv_id(["python", "-m", "torch.distributed.run", "--rdzv_id", "a/b",
                             "t.py"]) == "a/b"
    assert resolve_run_id(None, ["python", "-m", "torch.distributed.run", "--rdzv_id", "a/b"],
                          {}) == "a_b"
    assert torchrun_rdzv_id(["python", "train.py", "--rdzv-id=x"]) is None  # not torchrun's
    assert resolve_run_id(None, ["srun", "python"], {"SLURM_JOB_ID": "7",
                                                     "SLURM_STEP_ID": "0"}) == "slurm-7.0"
    generated = resolve_run_id(None, ["python", "t.py"], {})
    assert generated != resolve_run_id(None, ["python", "t.py"], {})
    # Inside a rank without the CLI, torchrun's id is shared by all ranks.
    assert resolve_run_id(None, [], {"TORCHELASTIC_RUN_ID": "abc"}, per_process=True) == "abc"


def test_claim_dir_never_shares(tmp_path: Path) -> None:
    assert [claim_dir(tmp_path, "n").name for _ in range(3)] == ["n", "n-2", "n-3"]


def test_trace_names_round_trip() -> None:
    name = trace_file_name(10, 12)
    assert parse_trace_file_name(name) == (10, 12)
    assert parse_trace_file_name(name + ".gz") == (10, 12)
    assert parse_trace_file_name("rank0.123.pt.trace.json") is None


def test_timeline_is_readable_line_by_line_and_after_a_cut(tmp_path: Path) -> None:
    tl = StepTimeline(tmp_path / "steps.jsonl", start_ns=100)
    tl.add_data_wait(5, end_ns=150)
    tl.add_data_wait(7, end_ns=260)  # after the (retroactive) first boundary: belongs to step 1
    tl.boundary(200, "optimizer", None)
    tl.boundary(300, "optimizer", None)
    # A writer killed mid-line leaves a partial last line.
    with open(tmp_path / "steps.jsonl", "ab") as f:
        f.write(b'{"kind":"step","step":2,"host_st')
    rows, truncated = read_steps(tmp_path)
    assert truncated
    assert [(r["step"], r["host_start_ns"], r["host_end_ns"], r["data_wait_ns"]) for r in rows] \
        == [(0, 100, 200, 5), (1, 200, 300, 7)]


def test_inventory_names_missing_and_duplicate_ranks(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    run.create("r")
    for rank, finished in ((0, True), (0, True), (2, False)):
        d = run.claim_rank_dir(rank)
        (d / "rank.json").write_text(json.dumps({"rank": rank, "world_size": 4,
                                                 "end_ns": 1 if finished else None}))
    inv = inventory([run.root])
    problems = " | ".join(inv["problems"])
    assert "missing ranks: 1, 3 of a world of 4" in problems
    assert "rank 0 appears 2 times" in problems
    assert "rank 2 stopped abruptly" in problems


def test_inventory_rejects_other_folders(tmp_path: Path) -> None:
    proc = subprocess.run([PY, "-m", "uberprof", "info", str(tmp_path)], capture_output=True,
                          text=True, env=job_env(), check=False)
    assert proc.returncode == 1
    assert "not a uberprof run directory" in proc.stderr and str(tmp_path) in proc.stderr


class _FakeEvent:
    """Stands in for torch.cuda.Event on this GPU-less machine: done once `clock` passes it."""

    def __init__(self, cuda: _FakeCuda) -> None:
        self.cuda = cuda
        self.at_ms = None

    def record(self) -> None:
        self.at_ms = self.cuda.recorded_ms

    def query(self) -> bool:
        return self.cuda.gpu_done_ms >= self.at_ms

    def synchronize(self) -> None:
        self.cuda.gpu_done_ms = max(self.cuda.gpu_done_ms, self.at_ms)

    def elapsed_time(self, end: _FakeEvent) -> float:
        return end.at_ms - self.at_ms


class _FakeCuda:
    def __init__(self) -> None:
        self.recorded_ms = 0.0
        self.gpu_done_ms = 0.0

    def Event(self, enable_timing: bool) -> _FakeEvent:
        return _FakeEvent(self)

    def memory_stats(self) -> dict[str, int]:
        return {"allocated_bytes.all.peak": 2048, "allocated_bytes.all.current": 1024}


def test_gpu_times_are_read_without_waiting_for_the_gpu(tmp_path: Path) -> None:
    cuda = _FakeCuda()
    tl = StepTimeline(tmp_path / "steps.jsonl", start_ns=0)
    tl.mark_gpu_start(cuda)
    for step in range(3):
        cuda.recorded_ms += 10.0 + step  # the GPU work queued in this step
        tl.boundary(100 * (step + 1), "optimizer", cuda)
    # The GPU is still busy with everything: no GPU row yet, and nothing blocked.
    assert [r for r in read_steps(tmp_path)[0] if "gpu_time_ns" in r] == []
    cuda.gpu_done_ms = 21.0  # the GPU finished steps 0 and 1
    tl.poll_gpu(cuda, block=False)
    rows, _ = read_steps(tmp_path)
    assert [r.get("gpu_time_ns") for r in rows] == [10_000_000, 11_000_000, None]
    assert rows[0]["gpu_mem_peak_bytes"] == 2048
    tl.close(cuda)  # at exit the rest is waited for
    assert read_steps(tmp_path)[0][2]["gpu_time_ns"] == 12_000_000


def test_a_window_opened_at_the_end_writes_no_backwards_file(tmp_path: Path) -> None:
    from uberprof.collect.rank.windows import TraceWindows
    from uberprof.collect.safety import AgentLog

    config = CollectConfig(trace=TraceSchedule.parse_steps("10-12,20-22"))
    windows = TraceWindows(config, tmp_path / "traces", AgentLog("rank"), rank=0)
    windows.step_started(10)  # the boundary after step 9 opens step 10, which never ends
    assert windows.active
    windows.close(last_step=9)
    assert not windows.active and windows.windows_written == []
    assert not (tmp_path / "traces").exists() or list((tmp_path / "traces").iterdir()) == []
    assert windows.not_reached(9) == [(10, 12), (20, 22)]
    periodic = TraceWindows(CollectConfig(trace=TraceSchedule.periodic(50, 3)), tmp_path,
                            AgentLog("rank"), rank=0)
    assert periodic.not_reached(39) == [(50, 52)] and periodic.not_reached(60) == []
    off = TraceWindows(CollectConfig(trace=TraceSchedule.off()), tmp_path, AgentLog("rank"), 0)
    assert off.not_reached(3) == []


@pytest.mark.parametrize("shapes", [None, False])
def test_a_cpu_window_records_shapes_unless_switched_off(tmp_path: Path,
                                                         shapes: bool | None) -> None:
    """A real torch.profiler window on CPU: the trace lands gzipped, with operator shapes (the
    bytes of Gloo collectives come only from them) unless `--record-shapes off`."""
    import gzip

    import torch

    from uberprof.collect.rank.windows import TraceWindows
    from uberprof.collect.safety import AgentLog

    config = CollectConfig(trace=TraceSchedule.parse_steps("1-2"), record_shapes=shapes)
    windows = TraceWindows(config, tmp_path / "traces", AgentLog("rank"), rank=0)
    a = torch.ones(64, 64)
    for step in range(4):
        windows.step_started(step)
        torch.mm(a, a)
        windows.step_ended(step)
    windows.close(last_step=3)
    assert windows.windows_written == [(1, 2)]
    (gz,) = (tmp_path / "traces").iterdir()
    assert gz.name.endswith(".json.gz"), gz.name
    doc = json.loads(gzip.decompress(gz.read_bytes()))
    mm = [e for e in doc["traceEvents"] if e.get("name") == "aten::mm"]
    assert len(mm) == 2
    assert all(("Input Dims" in e.get("args", {})) is (shapes is None) for e in mm), mm


def test_readers_ignore_a_legacy_backwards_window(tmp_path: Path) -> None:
    from uberprof.ingest.discover import discover

    run = RunDir(tmp_path / "r")
    run.create("r")
    d = run.claim_rank_dir(0)
    (d / "rank.json").write_text(json.dumps({"rank": 0, "world_size": 1, "end_ns": 1}))
    (d / "steps.jsonl").write_text("".join(
        json.dumps({"kind": "step", "step": s, "host_start_ns": s, "host_end_ns": s + 1}) + "\n"
        for s in range(10)))
    (d / "traces").mkdir()
    legacy = d / "traces" / "steps-000010-000009.pt.trace.json.gz"
    legacy.write_bytes(b"")
    assert parse_trace_file_name(legacy.name) is None
    inv = inventory([run.root])
    assert inv["ranks"][0]["trace_windows"] == []
    assert any(p.startswith(f"rank 0: {legacy} ignored: a trace window that ends before it "
                            "starts") for p in inv["problems"]), inv["problems"]
    assert discover(run.root).inputs == []


def test_info_names_ranks_that_recorded_no_step(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    run.create("r")
    for rank in (0, 1):
        d = run.claim_rank_dir(rank)
        (d / "rank.json").write_text(json.dumps({"rank": rank, "world_size": 2, "end_ns": 1}))
    problems = inventory([run.root])["problems"]
    assert any(p.startswith("ranks 0-1 recorded 0 steps") for p in problems), problems


def test_calibration_peak_ignores_a_shapers_burst() -> None:
    from uberprof.collect.calibrate import _summary

    def point(nbytes: int, busbw: float) -> dict[str, float]:
        return {"bytes": nbytes, "time_us": nbytes / busbw * 1e6, "busbw_Bps": busbw}

    # tc's token bucket let the small sizes through at line rate: 200 MB/s over a 125 MB/s cap
    capped = [point(64 << 10, 2.0e8), point(128 << 10, 1.96e8), point(1 << 20, 1.3e8),
              point(8 << 20, 1.25e8), point(32 << 20, 1.24e8)]
    peak, half = _summary(capped)
    assert peak == 1.25e8 and half == 64 << 10  # 1 MiB took 8 ms: too short to count
    # a fast link where no iteration is long: the peak over every point
    fast = [point(64 << 10, 1e9), point(1 << 20, 4e10), point(64 << 20, 3.5e11)]
    assert _summary(fast) == (3.5e11, 64 << 20)


class _NoClone:
    """The job's store as torch < 2.8 has it: no clone(), the TCPStore underneath."""

    def __init__(self, store: object) -> None:
        self.underlying_store = store


@pytest.mark.parametrize("torch_store", ["clone", "no clone"])
def test_the_clock_estimate_never_holds_the_jobs_store(monkeypatch: pytest.MonkeyPatch,
                                                       torch_store: str) -> None:
    """A store client runs one request at a time: rank 0's estimate, waiting for a rank that is
    slow to start, must not hold the job's own store calls (it held them up to a minute)."""
    import socket
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from uberprof.collect.rank import clock

    monkeypatch.setattr(clock, "TIMEOUT", timedelta(seconds=30))
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job_store = dist.PrefixStore("default_pg", server)
    host = socket.gethostname()
    results: list[dict] = []
    given = job_store if torch_store == "clone" else _NoClone(server)
    thread = clock.start_offset_estimate(given, 0, 2, 0, host, "run", results.append,
                                         lambda e: results.append({"error": repr(e)}))
    probe = clock._own_client(given)  # where rank 1's estimate would write
    probe.wait([f"{clock.PREFIX}/job"], timedelta(seconds=30))
    time.sleep(0.2)  # the estimate is now waiting for rank 1's key
    job_store.set("the job's own key", "1")  # returned at once: the estimate is still waiting
    assert thread.is_alive() and not results
    probe.set(f"{clock.PREFIX}/host/1", f"1|{host}")  # rank 1 arrives, on rank 0's host
    thread.join(timeout=30)
    assert results == [{"offset_to_rank0_ns": 0, "offset_uncertainty_ns": 0,
                        "method": "reference", "job_id": "run", "hosts_measured": 0}]


def test_a_default_group_made_without_naming_a_backend_records_the_one_it_runs_on(
        one_rank_process_group: None) -> None:
    """`init_device_mesh` makes the default group with no backend named: torch.distributed's
    get_backend() then says "undefined", rank.json says what the group runs on (a real
    one-rank Gloo group in this process)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from uberprof.collect.rank.agent import process_group_info
    from uberprof.collect.rank.backend import default_backend

    init_device_mesh("cpu", (1,))
    assert dist.get_backend() == "undefined"  # what the agent used to record
    assert default_backend(dist) == "gloo"
    info = process_group_info(dist)
    assert info["backend"] == "gloo" and info["process_groups"][0]["backend"] == "gloo"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_run_refuses_a_number_that_is_not_finite(value: str) -> None:
    from click.testing import CliRunner

    from uberprof.cli import main

    res = CliRunner().invoke(main, ["run", "--hang-timeout", value, "--", "true"])
    assert res.exit_code == 2 and "--hang-timeout" in res.output, res.output
