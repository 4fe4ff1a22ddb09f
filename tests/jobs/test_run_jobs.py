"""`uberprof run` around real jobs: torchrun, FSDP, mp.spawn, re-launch, plain python."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest

from tests._jobs import PY, SAMPLES, SCRIPTS, assert_ranks, info_json, torchrun, uberprof_run
from tests._runs import ShortRun

# Steps past the default trace window (10-19) with two to spare: the window must close at 19
# though the job goes on (tests/jobs/test_clients.py runs as many).
DEFAULT_WINDOW_STEPS = 22


@pytest.mark.parametrize("nproc", [2, 4])
def test_torchrun_ddp(tmp_path: Path, nproc: int) -> None:
    steps = DEFAULT_WINDOW_STEPS
    proc = uberprof_run(tmp_path, "ddp", torchrun(nproc, SAMPLES / "train_ddp.py", "--steps",
                                                  str(steps)))
    run = tmp_path / "ddp"
    assert f"run directory {run}" in proc.stderr  # printed at start...
    assert f"uberprof info {run}" in proc.stderr  # ...and at the end
    assert f"trained {steps} steps" in proc.stdout  # the job's own output passes through
    info = info_json(run)
    assert_ranks(info, nproc, steps, [10, 19])
    rank1 = json.loads((run / "ranks" / "1" / "rank.json").read_text())
    assert rank1["world_size"] == nproc and rank1["backend"] == "gloo"
    assert rank1["local_rank"] == 1 and rank1["launcher"] == "torchrun"
    assert rank1["clock"]["method"] == "same-host" and rank1["clock"]["offset_to_rank0_ns"] == 0
    assert rank1["process_groups"][0]["ranks"] == list(range(nproc))
    # The trace window holds the same steps, numbered like the step timeline, with shapes.
    trace = json.loads(gzip.decompress((run / "ranks" / "1" / "traces" /
                                        "steps-000010-000019.pt.trace.json.gz").read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {f"ProfilerStep#{s}" for s in range(10, 20)} <= names
    assert "ProfilerStep#20" not in names and "ProfilerStep#9" not in names
    assert trace["distributedInfo"]["rank"] == 1
    gloo = [e for e in trace["traceEvents"] if e.get("name") == "gloo:all_reduce"]
    assert gloo, "Gloo all-reduces are in the window"
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"])
    # The step timeline: contiguous host windows, data wait inside the step.
    steps = [json.loads(line)
             for line in (run / "ranks" / "1" / "steps.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["kind"] == "step"]
    for a, b in itertools.pairwise(steps):
        assert a["host_end_ns"] == b["host_start_ns"]
    for s in steps:
        assert s["host_end_ns"] > s["host_start_ns"]
        assert 0 <= s["data_wait_ns"] < s["host_end_ns"] - s["host_start_ns"]
        assert s["source"] == "optimizer"


def test_fsdp(tmp_path: Path) -> None:
    uberprof_run(tmp_path, "fsdp", torchrun(2, SAMPLES / "train_fsdp.py", "--steps", "20"))
    info = info_json(tmp_path / "fsdp")
    assert_ranks(info, 2, 20, [10, 19])
    trace = json.loads(gzip.decompress((tmp_path / "fsdp/ranks/0/traces/"
                                        "steps-000010-000019.pt.trace.json.gz").read_bytes()))
    assert any(e.get("name", "").startswith("gloo:all_gather") for e in trace["traceEvents"])


def test_multiprocessing_spawn(tmp_path: Path) -> None:
    steps = 8  # the window 4-5 well inside the job, which goes on after it (it ran 20)
    uberprof_run(tmp_path, "spawn", [PY, str(SAMPLES / "train_spawn.py"), "--nprocs", "2",
                                     "--steps", str(steps)], "--trace-steps", "4-5")
    info = info_json(tmp_path / "spawn")
    assert_ranks(info, 2, steps, [4, 5])
    assert {r["pid"] for r in info["ranks"]} != {None}


def test_relaunch_of_sys_argv(tmp_path: Path) -> None:
    uberprof_run(tmp_path, "relaunch", [PY, str(SCRIPTS / "train_relaunch.py"), "--steps", "12"],
                 "--trace-steps", "3-4")
    assert_ranks(info_json(tmp_path / "relaunch"), 2, 12, [3, 4])


def test_plain_python_with_dataloader_workers(tmp_path: Path) -> None:
    # Data-loader workers import torch too; they must not become ranks.
    proc = uberprof_run(tmp_path, "plain", [PY, str(SAMPLES / "train_ddp.py"), "--steps", "8",
                                            "--workers", "2"], "--no-trace")
    assert "trained 8 steps on 1 rank(s)" in proc.stdout
    info = info_json(tmp_path / "plain")
    assert_ranks(info, 1, 8, None)
    assert len(list((tmp_path / "plain" / "ranks").iterdir())) == 1


def test_periodic_trace_windows(tmp_path: Path) -> None:
    uberprof_run(tmp_path, "every", [PY, str(SAMPLES / "train_ddp.py"), "--steps", "14"],
                 "--trace-every", "5", "--trace-active", "2")
    [rank] = info_json(tmp_path / "every")["ranks"]
    assert [w["steps"] for w in rank["trace_windows"]] == [[5, 6], [10, 11]]


def test_own_profiler_is_respected(tmp_path: Path) -> None:
    proc = uberprof_run(tmp_path, "own", [PY, str(SCRIPTS / "own_profiler.py"), "12"],
                        "--trace-steps", "2-3")
    assert "own profiler done" in proc.stdout
    assert "runs its own torch.profiler" in proc.stderr
    [rank] = info_json(tmp_path / "own")["ranks"]
    assert rank["trace_windows"] == []
    assert "own torch.profiler" in rank["trace_disabled_reason"]
    assert rank["steps"] == 12  # ProfilerStep boundaries, one per prof.step()
    rows = [json.loads(x) for x in (tmp_path / "own/ranks/0/steps.jsonl").open()]
    assert {r["source"] for r in rows[1:]} == {"profiler"}


def test_explicit_steps_without_optimizer(tmp_path: Path) -> None:
    uberprof_run(tmp_path, "explicit", [PY, str(SCRIPTS / "explicit_steps.py"), "7"],
                 "--trace-steps", "2-3")
    [rank] = info_json(tmp_path / "explicit")["ranks"]
    assert rank["steps"] == 7
    assert [w["steps"] for w in rank["trace_windows"]] == [[2, 3]]


def test_several_optimizers_and_accumulation_count_iterations(tmp_path: Path) -> None:
    uberprof_run(tmp_path, "gan", [PY, str(SCRIPTS / "two_optimizers.py"), "6"], "--no-trace")
    [rank] = info_json(tmp_path / "gan")["ranks"]
    assert rank["steps"] == 6


def test_a_job_that_ends_where_its_window_starts(tmp_path: Path) -> None:
    # 10 steps (0-9) and a window at 10-12: no backwards 10-9 file, and both run and info say
    # why there is no trace.
    proc = uberprof_run(tmp_path, "edge", [PY, str(SAMPLES / "train_ddp.py"), "--steps", "10"],
                        "--trace-steps", "10-12")
    run = tmp_path / "edge"
    assert not list(run.glob("ranks/*/traces/*"))
    closing = "1 rank(s), 10 steps per rank, 0 trace window file(s)"
    assert closing in proc.stderr
    said = ("no trace window: the job ended at step 9, before the window at steps 10-12; "
            "to get a trace, run again with a window inside the job, e.g. --trace-steps 4-6")
    assert f"uberprof: {said}" in proc.stderr
    info = info_json(run)
    assert info["problems"] == [said]
    assert info["ranks"][0]["steps"] == 10 and info["ranks"][0]["trace_windows"] == []


def test_closing_line_counts_steps_per_rank(short_ddp_run: ShortRun) -> None:
    _, proc = short_ddp_run  # 2 ranks, 6 steps, traced on steps 2-3
    assert "2 rank(s), 6 steps per rank, 2 trace window file(s)" in proc.stderr
    assert "12 steps" not in proc.stderr


COMPILED = """
import warnings
import torch
warnings.simplefilter("always")
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
cm = torch.compile(model, backend="eager")
for _ in range(3):
    opt.zero_grad()
    cm(torch.randn(2, 4)).sum().backward()
    opt.step()
print("done", torch.compile.__name__)
"""


def test_torch_compile_prints_no_new_warning(tmp_path: Path) -> None:
    # torch.compile(module) warns when global module hooks exist (OptimizedModule.__call__, any
    # backend): uberprof's first-forward watch must not be one when the module is called.
    import subprocess

    from tests._jobs import job_env

    plain = subprocess.run([PY, "-c", COMPILED], capture_output=True, text=True, timeout=300,
                           env=job_env(), check=False)
    proc = uberprof_run(tmp_path, "compiled", [PY, "-c", COMPILED], "--counters", "none")
    assert "global hooks" not in plain.stderr  # the check is real: the plain job is quiet
    assert "global hooks" not in proc.stderr, proc.stderr
    assert proc.stdout == plain.stdout == "done compile\n"
    [rank] = info_json(tmp_path / "compiled")["ranks"]
    assert rank["steps"] == 3


def test_a_rank_that_starts_before_its_process_group_gets_its_own_folder(tmp_path: Path) -> None:
    # Lightning with profiler="pytorch": the rank agent starts at the script's profiler step,
    # before init_process_group, in an environment without RANK (it was written to ranks/0-2).
    proc = uberprof_run(tmp_path, "early", [PY, str(SCRIPTS / "profiler_before_process_group.py")])
    assert "rank 1 done" in proc.stdout
    run = tmp_path / "early"
    assert sorted(p.name for p in (run / "ranks").iterdir()) == ["0", "1"]
    info = info_json(run)
    assert [(r["rank"], Path(r["dir"]).name, r["steps"]) for r in info["ranks"]] == \
        [(0, "0", 7), (1, "1", 7)]
    assert not any("appears" in p for p in info["problems"]), info["problems"]
