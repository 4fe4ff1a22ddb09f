"""The hang and crash pieces on their own: faulthandler's text, the Flight Recorder default,
the derived timeout, the watchdog on a fake rank, and the judgement of synthetic evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from uberprof.analysis.diagnosis.findings.failures import failure_findings
from uberprof.analysis.tables.context import load_context
from uberprof.collect.node_agent import FR_BUFFER_SIZE, flight_recorder_env
from uberprof.collect.safety import AgentLog
from uberprof.collect.watchdog import HangWatchdog, derived_timeout
from uberprof.rundir import RunDir, write_json_atomic
from uberprof.rundir.failures import parse_faulthandler, read_flight_recorder

DUMP = """Fatal Python error: Aborted

Thread 0x00007f1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f2 (most recent call first):
  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/job/train.py", line 58 in train
  File "/job/train.py", line 101 in <module>

Extension modules: numpy (total: 1)
"""


def test_faulthandler_text_is_parsed_innermost_last() -> None:
    s = parse_faulthandler(DUMP)
    assert s.fatal == "Aborted" and len(s.threads) == 2
    main = s.threads[1]
    assert main["current"] and [f["function"] for f in main["frames"]] == \
        ["<module>", "train", "all_reduce"]
    assert main["frames"][1] == {"file": "/job/train.py", "line": 58, "function": "train"}
    assert parse_faulthandler("").threads == []


def test_flight_recorder_is_on_unless_the_user_set_it() -> None:
    assert flight_recorder_env({}) == {"TORCH_FR_BUFFER_SIZE": str(FR_BUFFER_SIZE)}
    assert flight_recorder_env({"TORCH_FR_BUFFER_SIZE": "0"}) == {}
    assert flight_recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}) == {}


def test_the_default_timeout_is_five_minutes_or_twenty_steps() -> None:
    assert derived_timeout(None) == 300 and derived_timeout(1.0) == 300
    assert derived_timeout(60.0) == 1200


def _fake_rank(run: RunDir, node: str, rank: int, pid: int, steps: int, world: int = 1) -> Path:
    d = run.claim_rank_dir(rank)
    write_json_atomic(d / "rank.json", {"rank": rank, "pid": pid, "node": node,
                                        "world_size": world, "start_ns": time.time_ns()})
    now = time.time_ns()
    with open(d / "steps.jsonl", "w") as f:
        f.writelines(json.dumps({"kind": "step", "step": s, "host_start_ns": now - 10**8,
                                 "host_end_ns": now}) + "\n" for s in range(steps))
    return d


def _sleeper(run: RunDir) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "UBERPROF_RUN_DIR": str(run.root)})


def _one_node_with_a_rank(tmp_path: Path, **meta: object
                          ) -> tuple[RunDir, Path, subprocess.Popen[bytes], Path]:
    """A run with one node and a rank 0 that has finished one step: a sleeping process of the
    run, its rank.json extended by `meta`. (run, node folder, process, rank folder)."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node_dir = run.claim_node_dir("n0")
    proc = _sleeper(run)
    d = _fake_rank(run, node_dir.name, 0, proc.pid, steps=1)
    if meta:
        write_json_atomic(d / "rank.json", {**json.loads((d / "rank.json").read_text()), **meta})
    return run, node_dir, proc, d


def _watch(run: RunDir, node_dir: Path, action: str, pid: int, seen: list) -> HangWatchdog:
    dog = HangWatchdog(run, node_dir, AgentLog("node"), timeout_s=1.0, action=action,
                       on_hang=seen.append, poll_s=0.2)
    dog.start(pid)
    return dog


def test_the_watchdog_waits_for_the_first_step_then_captures_and_stops(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.create("r")
    node_dir = run.claim_node_dir("n0")
    proc = _sleeper(run)
    try:
        rank_dir = _fake_rank(run, node_dir.name, 0, proc.pid, steps=0)
        seen: list = []
        dog = _watch(run, node_dir, "stop", proc.pid, seen)
        time.sleep(2.5)
        assert not seen and not (node_dir / "hang.json").exists()  # starting up: no hang
        with open(rank_dir / "steps.jsonl", "a") as f:
            f.write(json.dumps({"kind": "step", "step": 0, "host_start_ns": time.time_ns() - 1,
                                "host_end_ns": time.time_ns()}) + "\n")
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        dog.stop()
        assert proc.returncode == -15  # --on-hang stop: SIGTERM
        rec = json.loads((node_dir / "hang.json").read_text())
        assert seen and seen[0]["detected_ns"] == rec["detected_ns"]
        assert rec["timeout_s"] == 1.0 and rec["timeout_source"] == "option"
        assert rec["ranks"][0]["rank"] == 0 and rec["ranks"][0]["last_step"] == 0
        assert rec["ranks"][0]["alive"] is True and dog.stopped_job
    finally:
        proc.kill()


def test_a_job_across_nodes_is_stopped_only_once_the_other_node_recorded_the_hang(
        tmp_path: Path) -> None:
    """Stopping this node's ranks breaks the other node's collectives; its ranks would die
    before their watchdog captured them and read as the culprit (seen in CI). The node waits
    for the other's record (not for a node whose part already ended: it records no hang),
    then stops its part of the job; `alive` is as at detection."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node_a, node_b, node_c = (run.claim_node_dir(n) for n in "abc")
    proc = _sleeper(run)
    try:
        _fake_rank(run, node_a.name, 0, proc.pid, steps=1, world=3)
        _fake_rank(run, node_b.name, 1, 999_999_999, steps=1, world=3)
        _fake_rank(run, node_c.name, 2, 999_999_998, steps=1, world=3)
        write_json_atomic(node_c / "node.json", {"end_ns": time.time_ns(), "exit_code": 1})
        seen: list = []
        dog = _watch(run, node_a, "stop", proc.pid, seen)
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen, "no hang detected"
        time.sleep(1.5)
        assert proc.poll() is None and not dog.stopped_job  # node b has not recorded yet
        write_json_atomic(node_b / "hang.json", {"detected_ns": time.time_ns(), "ranks": []})
        while proc.poll() is None and time.monotonic() < deadline + 10:
            time.sleep(0.1)
        dog.stop()
        assert proc.returncode == -15 and dog.stopped_job
        (doc,) = seen[0]["ranks"]
        assert doc["alive"] is True and doc["exited_during_capture"] is False
    finally:
        proc.kill()


def test_a_pid_of_another_process_is_never_signalled(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.create("r")
    node_dir = run.claim_node_dir("n0")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _fake_rank(run, node_dir.name, 0, other.pid, steps=1)  # its env names no run
        seen: list = []
        dog = _watch(run, node_dir, "stop", other.pid, seen)
        time.sleep(2.5)
        dog.stop()
        assert other.poll() is None and not seen
    finally:
        other.kill()


def test_a_rank_seen_before_it_armed_its_capture_is_asked_once_it_has(tmp_path: Path) -> None:
    """The rank writes rank.json before it arms its capture and again after; a watchdog that
    read the first only never asked that rank for its stacks (a hang without its stack)."""
    from uberprof.collect.rank.capture import SIGNAL

    run = RunDir(tmp_path / "run")
    run.create("r")
    node_dir = run.claim_node_dir("n0")
    d = _fake_rank(run, node_dir.name, 0, os.getpid(), steps=1)
    dog = HangWatchdog(run, node_dir, AgentLog("node"), timeout_s=1.0)
    dog._discover()
    (r,) = dog._ranks.values()
    assert (r.signal, r.helper, r.armed) == (None, False, False)
    meta = json.loads((d / "rank.json").read_text())
    write_json_atomic(d / "rank.json", {**meta, "capture": {"signal": SIGNAL, "helper": True}})
    dog._discover()
    assert dog._ranks[r.folder] is r and (r.signal, r.helper, r.armed) == (SIGNAL, True, True)


def _fr(d: Path, entries: list[tuple[int, str, list, bool]]) -> None:
    dump = {"entries": [{"collective_seq_id": s, "process_group": ["0", "default_pg"],
                         "profiling_name": f"gloo:{op}", "input_sizes": [size],
                         "input_dtypes": ["Float"], "retired": done, "state": "scheduled",
                         "time_created_ns": 10**18 + s} for s, op, size, done in entries],
            "pg_status": {"0": {"last_completed_collective": "-1"}}}
    (d / "flight-recorder-hang.json").write_text(json.dumps({"time_ns": 1, "reason": "hang",
                                                        "dump": dump}))


def test_the_rank_behind_is_stuck_and_a_mismatch_is_named(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    dirs = [_fake_rank(run, node.name, r, 10**6 + r, steps=3) for r in range(3)]
    _fr(dirs[0], [(1, "all_reduce", [4], True), (2, "all_reduce", [4], False)])
    _fr(dirs[1], [(1, "all_reduce", [4], True), (2, "all_reduce", [8], False)])
    _fr(dirs[2], [(1, "all_reduce", [4], True)])
    write_json_atomic(node / "hang.json", {
        "detected_ns": 2 * 10**18, "last_progress_ns": 10**18, "timeout_s": 5,
        "timeout_source": "option", "action": "report",
        "ranks": [{"rank": r, "alive": True} for r in range(3)]})
    assert read_flight_recorder(dirs[2], "hang")[1][0].op == "all_reduce"
    (hang,) = [f for f in failure_findings(run.root) if f.kind == "hang"]
    assert hang.cause == "mismatch" and hang.evidence["stuck_ranks"] == [2]
    (m,) = hang.evidence["mismatches"]
    assert (m["seq"], m["differs_in"]) == (2, ["sizes"]) and len(m["calls"]) == 2
    # no earlier step tells ranks 0 and 1 apart (one against one): both are named, never the
    # one with the higher index, and the title says so
    assert m["decided_by"] == "undecided" and m["ranks"] == [0, 1] and hang.ranks == [0, 1, 2]
    assert "nothing tells them apart" in hang.title
    assert hang.evidence["waiting_in"]["seq"] == 2


def _stepped_rank(run: RunDir, node: str, rank: int, calls: list[tuple[str, list]],
                  reason: str = "hang") -> None:
    """A rank that issued one collective per step for 3 finished steps (all_reduce [4]), then
    `calls` in step 3, where it waits; its Flight Recorder dump with times inside the steps."""
    d = run.claim_rank_dir(rank)
    write_json_atomic(d / "rank.json", {"rank": rank, "pid": 10**6 + rank, "node": node,
                                        "world_size": 2, "start_ns": 10**18})
    t0 = 10**18
    with open(d / "steps.jsonl", "w") as f:
        f.writelines(json.dumps({"kind": "step", "step": s, "host_start_ns": t0 + s * 10**9,
                                 "host_end_ns": t0 + (s + 1) * 10**9}) + "\n" for s in range(3))
    entries = [(s + 1, "all_reduce", [4], True, t0 + s * 10**9 + 5 * 10**8) for s in range(3)]
    entries += [(4 + i, op, size, False, t0 + 3 * 10**9 + 5 * 10**8 + i)
                for i, (op, size) in enumerate(calls)]
    dump = {"entries": [{"collective_seq_id": s, "process_group": ["0", "default_pg"],
                         "profiling_name": f"gloo:{op}", "input_sizes": [size],
                         "input_dtypes": ["Float"], "retired": done, "state": "scheduled",
                         "time_created_ns": t} for s, op, size, done, t in entries],
            "pg_status": {"0": {"last_completed_collective": "3"}}}
    (d / f"flight-recorder-{reason}.json").write_text(json.dumps({"time_ns": 1, "reason": reason,
                                                             "dump": dump}))


def test_a_mismatch_of_two_ranks_blames_the_one_that_departed_from_its_earlier_steps(
        tmp_path: Path) -> None:
    """Rank 0 issues broadcast where every earlier step (its own and rank 1's) had all_reduce:
    rank 0 departed, whatever its index; rank 1 alone waits in the all-reduce."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    _stepped_rank(run, node.name, 0, [("broadcast", [4])])
    _stepped_rank(run, node.name, 1, [("all_reduce", [4])])
    write_json_atomic(node / "hang.json", {
        "detected_ns": 2 * 10**18, "last_progress_ns": 10**18 + 3 * 10**9, "timeout_s": 5,
        "timeout_source": "option", "action": "report",
        "ranks": [{"rank": r, "alive": True, "answered": True, "stacks": True}
                  for r in range(2)]})
    (hang,) = [f for f in failure_findings(run.root) if f.kind == "hang"]
    (m,) = hang.evidence["mismatches"]
    assert m["decided_by"] == "history" and m["ranks"] == [0] and hang.ranks == [0]
    assert m["departures"]["0"]["expected"]["op"] == "all_reduce"
    assert hang.evidence["waiting_in"]["ranks"] == [1]
    assert hang.evidence["waiting_in"]["op"] == "all_reduce"
    assert "rank 0 issued broadcast [4] where the others issued all_reduce [4]" in hang.title


def test_a_stopped_rank_is_given_up_on_at_once_and_named_frozen(tmp_path: Path) -> None:
    """A rank stopped by SIGSTOP can answer neither the capture signal nor the request: the
    watchdog records it (`process_state` T, not answered) without waiting for it, and the
    hang names it frozen."""
    import signal

    from uberprof.collect.rank.capture import SIGNAL

    run, node_dir, proc, d = _one_node_with_a_rank(
        tmp_path, capture={"signal": SIGNAL, "helper": True})
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        seen: list = []
        t0 = time.monotonic()
        dog = _watch(run, node_dir, "report", proc.pid, seen)
        while not seen and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        dog.stop()
        assert seen and time.monotonic() - t0 < 8  # not the 30 s answer wait
        (doc,) = seen[0]["ranks"]
        assert doc["process_state"] == "T" and doc["answered"] is False and doc["alive"]
        (hang,) = [f for f in failure_findings(run.root) if f.kind == "hang"]
        assert hang.cause == "frozen_rank" and hang.ranks == [0]
        assert hang.evidence["frozen_ranks"] == [0]
        assert "rank 0 is frozen: stopped" in hang.title
    finally:
        proc.kill()


def test_a_hang_whose_evidence_names_no_rank_says_so_with_its_timeout(tmp_path: Path) -> None:
    """Two live ranks that answered, with equal steps and no stacks or Flight Recorder: no
    rank can be named. The title says that and how long no step finished, not a bare "no rank
    finished a step" (which read as if none ever had)."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    for r in (0, 1):
        _fake_rank(run, node.name, r, 10**6 + r, steps=3)
    write_json_atomic(node / "hang.json", {
        "detected_ns": time.time_ns(), "timeout_s": 15.0, "last_progress_ns": time.time_ns(),
        "action": "report", "resumed_ns": None,
        "ranks": [{"rank": r, "alive": True, "answered": True, "stacks": False,
                   "process_state": "S", "last_step": 2} for r in (0, 1)]})
    (hang,) = [f for f in failure_findings(run.root) if f.kind == "hang"]
    assert hang.ranks == [] and hang.cause == "unknown"
    assert hang.title == "Hang: no rank finished a step for 15 s; the evidence names no rank"


def test_the_first_failure_is_a_cause_even_when_a_victim_raised_earlier(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    write_json_atomic(node / "node.json", {"exit_code": 1, "end_ns": 5})
    dirs = [_fake_rank(run, node.name, r, 10**6 + r, steps=2) for r in range(3)]
    for r, (t, typ, msg) in enumerate([(100, "RuntimeError", "Connection reset by peer"),
                                       (200, "ValueError", "bad batch"), (None, None, None)]):
        if typ:
            (dirs[r] / "exceptions.jsonl").write_text(json.dumps(
                {"time_ns": t, "type": typ, "message": msg, "where": "excepthook",
                 "frames": [{"file": "/job/train.py", "line": 7, "function": "step"}]}) + "\n")
    (crash,) = failure_findings(run.root)
    assert crash.kind == "crash" and crash.ranks == [1] and crash.cause == "exception"
    roles = {x["rank"]: x["role"] for x in crash.evidence["failed"]}
    assert roles == {1: "first", 0: "victim", 2: "victim"}  # rank 2: no end, no record
    assert crash.evidence["first"]["exception"]["where"] == "/job/train.py:7 in step"
    # The analysis's step tails (what its map read of each steps.jsonl) give the same finding.
    ctx = load_context(run.root, workers=1)
    assert all(ctx.run.timeline_entry(d) is not None for d in dirs)
    asked: list[Path] = []

    def tail(folder: Path) -> tuple[int, int | None, int | None]:
        asked.append(folder)
        e = ctx.run.timeline_entry(folder)
        return e["rows"], e["last_step"], e["last_end_ns"]

    (again,) = failure_findings(run.root, tail)
    assert sorted(asked) == sorted(dirs) and again.evidence == crash.evidence


def _crashed_before_its_traces(tmp_path: Path) -> RunDir:
    """A run whose rank 0 raised KeyError in load() after one step, before any trace window."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    write_json_atomic(node / "node.json", {"exit_code": 1, "end_ns": 5})
    d = _fake_rank(run, node.name, 0, 10**6, steps=1)
    (d / "exceptions.jsonl").write_text(json.dumps(
        {"time_ns": 1, "type": "KeyError", "message": "'x'", "where": "excepthook",
         "frames": [{"file": "/job/train.py", "line": 3, "function": "load"}]}) + "\n")
    return run


def test_report_names_a_crash_of_a_run_without_traces(tmp_path: Path) -> None:
    from rich.console import Console

    from uberprof.analysis.diagnosis.document import failures_only_diagnosis
    from uberprof.present.report_html import render_html
    from uberprof.present.report_terminal import render_report

    run = _crashed_before_its_traces(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "uberprof", "report", "--json", str(run.root)],
                          capture_output=True, text=True, timeout=120, check=False)
    doc = json.loads(proc.stdout)
    assert doc["findings"][0]["kind"] == "crash" and doc["findings"][0]["ranks"] == [0]
    assert "KeyError" in doc["findings"][0]["title"]
    # the same findings through every presenter, with no trace tables behind them
    diag = failures_only_diagnosis(run.root, ["no traces"])
    console = Console(record=True, width=120)
    render_report(diag, console)
    text = console.export_text()
    assert "Crash: rank 0 raised KeyError" in text and "/job/train.py:3 in load" in text
    assert "Crash: rank 0 raised KeyError" in render_html(diag)


def test_the_dashboard_overview_shows_a_crash_first_with_its_stack(tmp_path: Path) -> None:
    """A run that crashed before its trace window: the overview opens on the crash (first, in
    red), its exception and the failing rank's stack, from the run directory alone."""
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.pages import overview
    from uberprof.dashboards.ui import Selection

    run = _crashed_before_its_traces(tmp_path)
    data = RunData(run.root).load()
    assert not data.has_traces
    page = overview.layout(data, Selection())
    text = str(page)
    first = page.children[0]
    assert first is not None and first.id == "failures"  # before everything else
    assert "Crash: rank 0 raised KeyError" in text and "/job/train.py:3 in load" in text


def test_a_crash_after_a_desync_names_who_departed_from_the_best_evidence(tmp_path: Path) -> None:
    """The rank that aborted in a collective is not the culprit of a desync: the ranks that
    departed are, decided from the Flight Recorder dumps' history, else the call sites'
    majority, else all named (never by index)."""
    from uberprof.analysis.diagnosis.failure_evidence import load_evidence
    from uberprof.analysis.diagnosis.findings.crash import _desync, _desync_title

    frames = [{"file": "/x/site-packages/torch/distributed/distributed_c10d.py", "line": 1,
               "function": "all_reduce"}]
    first = {"rank": 0, "kind": "signal", "signal": "SIGABRT", "stack": frames}
    none = {"mismatches": []}

    def site(where: str, ranks: list[int]) -> dict:
        return {"collective": "all_reduce", "where": where, "ranks": ranks}

    # no dumps: the site that outnumbers the others decides; one against one names both
    d = _desync({}, first, none, [site("a", [0, 1, 3]), site("b", [2])])
    assert (d["ranks"], d["decided_by"]) == ([2], "majority")
    d = _desync({}, first, none, [site("a", [0]), site("b", [1])])
    assert (d["ranks"], d["decided_by"]) == ([0, 1], "undecided")
    # not in a collective: no desync
    assert _desync({}, {"rank": 0, "kind": "signal", "stack": []}, none,
                   [site("a", [0]), site("b", [1])]) is None
    # a dump that kept to its usual step places the others: rank 1 at another site departed
    run = RunDir(tmp_path / "run")
    run.create("r")
    node = run.claim_node_dir("n0")
    _stepped_rank(run, node.name, 0, [("all_reduce", [4])], reason="exception")
    ranks, _ = load_evidence([run.root])
    d = _desync(ranks, first, none, [site("a", [0]), site("b", [1])])
    assert (d["ranks"], d["decided_by"]) == ([1], "history")
    assert "rank 1 departed first (at another call site" in _desync_title(d, first, [], [])
    # a departed dump at the site most ranks share does not make them all culprits (the odd
    # one may have departed too): the majority decides
    run2 = RunDir(tmp_path / "run2")
    run2.create("r")
    node2 = run2.claim_node_dir("n0")
    _stepped_rank(run2, node2.name, 0, [("all_reduce", [1])], reason="exception")
    ranks2, _ = load_evidence([run2.root])
    d = _desync(ranks2, first, none, [site("a", [0, 1, 3]), site("b", [2])])
    assert (d["ranks"], d["decided_by"]) == ([2], "majority")


def test_a_rank_that_closed_its_capture_is_not_ended_by_a_late_request_for_stacks(
        tmp_path: Path) -> None:
    """The watchdog may ask for stacks while a rank winds down (its steps stopped for the
    timeout as the job ended): after `close` the request must be ignored, not end the rank with
    the signal's default action (a CI job's ranks exited with -40 so)."""
    from uberprof.collect.rank.capture import SIGNAL

    if SIGNAL is None:
        pytest.skip("no real-time signals here")
    code = (
        "import os, signal, sys, time, types\n"
        "from uberprof.collect.rank.capture import Capture, SIGNAL\n"
        "from uberprof.collect.safety import AgentLog\n"
        f"c = Capture(types.SimpleNamespace(dir={str(tmp_path)!r}), AgentLog('t'))\n"
        "assert c.arm()['signal'] == SIGNAL\n"
        "os.kill(os.getpid(), SIGNAL); time.sleep(0.2)  # armed: stacks written\n"
        "c.close()\n"
        "os.kill(os.getpid(), SIGNAL); time.sleep(0.2)  # closed: ignored\n"
        "print('alive')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", proc.stderr[-2000:]


def test_a_rank_winding_down_is_no_hang_but_the_same_rank_silent_is(tmp_path: Path) -> None:
    """A rank whose capture closed (a normal exit: rank.json's closing_ns) may take longer than
    the timeout to end (its trace export on a busy machine): no hang is declared for it. The
    same rank without that mark is a hang within the timeout."""
    run, node_dir, proc, rank_dir = _one_node_with_a_rank(tmp_path, closing_ns=time.time_ns())
    try:
        meta = json.loads((rank_dir / "rank.json").read_text())
        del meta["closing_ns"]
        seen: list = []
        dog = _watch(run, node_dir, "report", proc.pid, seen)
        time.sleep(3.0)  # three timeouts
        assert not seen and not (node_dir / "hang.json").exists()
        write_json_atomic(rank_dir / "rank.json", meta)  # not winding down after all
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            time.sleep(0.2)
        dog.stop()
        assert seen and seen[0]["ranks"][0]["rank"] == 0
    finally:
        proc.kill()


def test_the_watchdog_reads_other_nodes_ranks_for_the_trigger_and_counts_the_ranks_shown(
        tmp_path: Path) -> None:
    """A shared run: the watchdog of node n0 hands its own rank's steps to `on_step` and
    rank 1's (node n1) to `on_peer_step`, each read once, and tells `on_scope` that the run
    directory shows both ranks of the world of 2; rank 1 never enters the hang watch."""
    run = RunDir(tmp_path / "run")
    run.create("r")
    node_dir = run.claim_node_dir("n0")
    run.claim_node_dir("n1")
    _fake_rank(run, "n0", 0, os.getpid(), steps=3, world=2)
    _fake_rank(run, "n1", 1, 999_999_999, steps=4, world=2)
    own: list[tuple[int, int]] = []
    peers: list[tuple[int, int]] = []
    scopes: list[tuple[int, int]] = []
    dog = HangWatchdog(run, node_dir, AgentLog("node"), timeout_s=100.0,
                       on_step=lambda rank, step, *rest: own.append((rank, step)),
                       on_peer_step=lambda rank, step, cpu: peers.append((rank, step)),
                       on_scope=lambda seen, world: scopes.append((seen, world)))
    dog._poll()
    dog._poll()
    assert own == [(0, s) for s in range(3)] and peers == [(1, s) for s in range(4)]
    assert scopes == [(2, 2), (2, 2)] and [r.rank for r in dog._ranks.values()] == [0]
