"""`uberprof watch` and the incremental readers behind it (uberprof/rundir/follow.py). In a real
terminal (tmux): tests/jobs/test_watch_tmux.py."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa

from tests._jobs import PY, ROOT, job_env
from uberprof.rundir.follow import CounterFollower, RunFollower, StepFollower


def _step(step: int, start_ms: int, dur_ms: int, wait_ms: int = 1) -> bytes:
    return json.dumps({"kind": "step", "step": step, "host_start_ns": start_ms * 10**6,
                       "host_end_ns": (start_ms + dur_ms) * 10**6,
                       "data_wait_ns": wait_ms * 10**6}).encode() + b"\n"


def test_step_follower_reads_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_bytes(_step(0, 0, 100) + _step(1, 100, 300))
    f = StepFollower(path)
    assert f.poll() == 2
    assert f.medians() == (200 * 10**6, 10**6)
    line = _step(2, 400, 50)
    with open(path, "ab") as out:  # a writer caught mid-line: the half waits
        out.write(line[:20])
    assert f.poll() == 0
    with open(path, "ab") as out:
        out.write(line[20:] + b'{"kind": "gpu", "step": 2, "gpu_time_ns": 7}\n'
                  + b'{"step": -1}\n' + b"not json\n")
    assert f.poll() == 1
    assert list(f.step.values) == [0, 1, 2]
    assert list(f.duration_ns.values) == [100 * 10**6, 300 * 10**6, 50 * 10**6]
    assert f.last_gpu_time_ns == 7 and f.skipped == 2
    assert f.offset == path.stat().st_size
    assert f.poll() == 0  # nothing new: nothing read again


def _nvml_batch(ts: int, util: float, clock: float) -> pa.RecordBatch:
    return pa.record_batch({"ts_ns": pa.array([ts, ts, ts], pa.int64()),
                            "device": ["gpu0", "gpu0", "gpu1"],
                            "metric": ["util.gpu", "clock.sm", "util.gpu"],
                            "value": pa.array([util, clock, 1.0]), "unit": ["%", "MHz", "%"]})


def test_counter_follower_reads_new_batches_and_waits_for_a_cut_tail(tmp_path: Path) -> None:
    path = tmp_path / "nvml.arrows"
    sink = pa.OSFile(str(path), "wb")
    writer = pa.ipc.new_stream(sink, _nvml_batch(0, 0, 0).schema)
    writer.write_batch(_nvml_batch(1, 50.0, 1000.0))
    sink.flush()
    f = CounterFollower(path)
    assert f.poll() == 1
    assert f.latest[("gpu0", "util.gpu")] == (1, 50.0)
    writer.write_batch(_nvml_batch(2, 90.0, 1400.0))
    writer.close()
    sink.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:-30])  # the last message cut off
    assert f.poll() == 0
    path.write_bytes(whole)
    assert f.poll() == 1
    assert f.latest[("gpu0", "util.gpu")] == (2, 90.0)
    assert f.latest[("gpu0", "clock.sm")] == (2, 1400.0)
    assert f.latest[("gpu1", "util.gpu")] == (2, 1.0)


def test_run_follower_says_running_then_ended(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"run_id": "x"}')
    rank = tmp_path / "ranks" / "0"
    rank.mkdir(parents=True)
    (rank / "rank.json").write_text('{"rank": 0, "world_size": 1}')
    (rank / "steps.jsonl").write_bytes(_step(0, 0, 100))
    node = tmp_path / "nodes" / "n0"
    node.mkdir(parents=True)
    (node / "node.json").write_text('{"end_ns": null, "exit_code": null}')
    follower = RunFollower(tmp_path)
    state = follower.poll()
    assert state.running and state.steps == 1
    assert re.fullmatch(r"running · 1 steps · last step \d+ s ago", state.status_line())
    with open(rank / "steps.jsonl", "ab") as out:
        out.write(_step(1, 100, 100))
    (node / "node.json").write_text('{"end_ns": 5, "exit_code": 3}')
    state = follower.poll()
    assert state.ended and state.steps == 2 and state.exit_code == 3
    assert state.status_line() == "ended (exit 3) · 2 steps"


def test_watch_once_on_a_synthetic_run(tmp_path: Path) -> None:
    run = tmp_path / "synth"
    subprocess.run([PY, str(ROOT / "benchmarks" / "synth_run.py"), str(run), "--ranks", "4",
                    "--steps", "30", "--trace-steps", "5-6", "--straggler", "-1"],
                   check=True, capture_output=True, timeout=300)
    proc = subprocess.run([PY, "-m", "uberprof", "watch", "--once", str(run)], check=False,
                          capture_output=True, text=True, timeout=120, env=job_env(COLUMNS="160"))
    assert proc.returncode == 0, proc.stderr
    assert "ended (exit 0) · 30 steps" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s+\d\s+30\s", line)]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert all(r[-1].endswith("/1,980") for r in rows)  # SM clock / max from NVML counters
    bad = subprocess.run([PY, "-m", "uberprof", "watch", str(tmp_path)], check=False,
                         capture_output=True, text=True, timeout=60, env=job_env())
    assert bad.returncode == 1 and "not a uberprof run directory" in bad.stderr


def test_watch_shows_saved_findings_and_lateness_and_says_when_they_are_old() -> None:
    from rich.console import Console

    from uberprof.analysis.diagnosis.saved import SavedFindings
    from uberprof.analysis.diagnosis.step_signals import step_signals
    from uberprof.present.terminal.watch import render
    from uberprof.rundir.follow import LiveState, RankLive

    rank = RankLive(rank=3, steps=10, last_step=9, last_ns=10**8, median_ns=10**8,
                    data_wait_ns=3 * 10**7, data_wait_median_ns=3 * 10**7, last_end_ns=5)
    saved = SavedFindings([{"severity": "high", "title": "rank 3 arrives last"}], {3: 4.5e6},
                          saved_ns=100)

    # rank 3's 10 steps: 100 ms each, 30 ms of it waiting for data
    notes = [f"{s.title}  ({s.source})" for s in step_signals([(3, np.arange(10), np.full(10, 10**8))],
                                           [(3, np.arange(10), np.full(10, 3 * 10**7))])]

    def shown(state: LiveState) -> str:
        out = io.StringIO()
        Console(file=out, width=150).print(render(state, saved, "run", notes=notes))
        return out.getvalue()

    ended = shown(LiveState(running=False, exit_code=0, end_ns=50, now_ns=200, ranks=[rank]))
    assert "findings (saved diagnosis):" in ended and "[high] rank 3 arrives last" in ended
    assert re.search(r"^\s+3\s+10\s+100\.0\s+100\.0\s+30\.0\s+–\s+4\.5\s", ended, re.MULTILINE)
    assert "rank 3 waits for data 30% of its step time  (live, from the step timelines)" \
        in ended  # the live hint from the timeline
    running = shown(LiveState(running=True, exit_code=None, end_ns=None, now_ns=200,
                              ranks=[rank]))
    assert "findings of an older diagnosis" in running and "q or Ctrl-C: quit" in running
