"""Bad input files of a run directory (issue 29, item 4, and two wrong readings): a cut or
garbled counters stream, garbage in a Flight Recorder log, a damaged run.json or node.json,
files too large or not regular; a report with nothing analysed; an exposed-communication
finding on a crash's partial window; a death inside the trace window. Each is named (file and
damage, one line), with the documented exit code and no traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from tests.unit.test_bad_input_run import (
    analyze_json,
    cli,
    dashboard_problems,
    export_notes,
    make_run,
    one,
    report_json,
)
from uberprof.analysis.diagnosis.findings import exposed_comm
from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.tables.schemas import RUN_STEP_SCHEMA
from uberprof.collect.counters.store import CounterStore
from uberprof.rundir import read_rank, read_step_timeline
from uberprof.rundir.counters import iter_batches, read_counters
from uberprof.rundir.flight_log import read_flight_log
from uberprof.rundir.layout import FLIGHT_LOG_FILE, MAX_JSON_BYTES, MAX_JSONL_BYTES, RunDir

T0 = 1_700_000_000_000_000_000


def info_problems(run: Path) -> list[str]:
    code, out, _ = cli("info", str(run), "--json", "--no-verify")
    assert code == 0
    return json.loads(out)["problems"]


def with_counters(run: Path, flushes: int = 3) -> Path:
    """A host counters stream of `flushes` batches (2 samples each) in the run's node `h`."""
    store = CounterStore(run / "nodes" / "h" / "counters")
    for i in range(flushes):
        store.add("host", T0 + i, [("cpu", "cpu.util", 50.0 + i, "%"),
                                   ("mem", "mem.used", 1e9, "B")])
        store.flush()
    store.close()
    return run / "nodes" / "h" / "counters" / "host.arrows"


# --- 1: counters streams ------------------------------------------------------------------------

def test_a_cut_counters_file_keeps_its_whole_batches_and_is_named(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    path = with_counters(run)
    data = path.read_bytes()
    path.write_bytes(data[:-60])  # the last batch and the end-of-stream marker cut
    damage: list[str] = []
    assert sum(b.num_rows for b in iter_batches(path, damage.append)) == 4
    assert damage == [(f"{path}: cut off in its last batch (the writer stopped mid-write); 2 "
                       "whole batch(es) before it kept (4 sample(s)), the rest left out")]
    assert len(read_counters(run)) == 4
    said = one(info_problems(run), str(path), "cut off")
    assert said == damage[0]
    code, rep = report_json(run)
    assert code == 0 and said in rep["run"]["problems"]


def test_a_garbled_counters_file_keeps_the_batches_before_the_damage_and_is_named(
        tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    path = with_counters(run)
    batches = [b.num_rows for b in iter_batches(path)]
    assert batches == [2, 2, 2]
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 40] = b"\xff" * 40  # inside the second batch
    path.write_bytes(bytes(data))
    damage: list[str] = []
    assert sum(b.num_rows for b in iter_batches(path, damage.append)) == 2
    assert len(damage) == 1 and damage[0].startswith(f"{path}: ")
    assert ("damaged at byte" in damage[0] or "damaged batch" in damage[0]) and \
        "1 whole batch(es)" in damage[0]
    assert one(analyze_json(run)["problems"], str(path)) == damage[0]
    assert one(info_problems(run), str(path)) == damage[0]


def test_no_one_byte_damage_of_a_counters_file_raises(tmp_path: Path) -> None:
    """A damaged length can make Arrow ask for more memory than there is (ArrowMemoryError):
    that is damage, never a traceback."""
    path = with_counters(tmp_path / "run", flushes=2)
    data = path.read_bytes()
    broken = tmp_path / "broken.arrows"
    for pos in range(0, len(data), 3):
        for flip in (0xFF, 0x7F):
            b = bytearray(data)
            b[pos] ^= flip
            broken.write_bytes(bytes(b))
            assert sum(x.num_rows for x in iter_batches(broken)) <= 4


# --- 2: Flight Recorder logs ----------------------------------------------------------------------

def test_garbage_lines_in_a_flight_log_are_skipped_counted_and_named(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    path = run / "ranks" / "0" / FLIGHT_LOG_FILE
    good = {"reason": "exit", "lost": 0, "entries": [["0", 1, "all_reduce", T0],
                                                     ["0", 2, "all_reduce", T0 + 5]]}
    path.write_text("not json at all\n" + json.dumps(good) + "\n\x00\x01garbage{\n"
                    + json.dumps({"no": "dump"}) + "\n")
    log = read_flight_log(path.parent)
    assert log is not None and [a.seq for a in log.arrivals] == [1, 2]
    said = (f"{path}: 3 line(s) that are not a Flight Recorder dump skipped; its 2 other "
            "arrival(s) are kept")
    assert log.problem(path) == said
    assert said in info_problems(run)
    assert said in analyze_json(run)["problems"]
    code, rep = report_json(run)
    assert code == 0 and said in rep["run"]["problems"]


# --- 3: run.json and node.json named by every command ---------------------------------------------

@pytest.mark.parametrize("damage,words", [
    (b'{"run_id": "x", ', "unreadable"),
    (b"[1, 2]", "not a JSON object"),
])
def test_a_damaged_run_json_is_named_by_every_command(tmp_path: Path, damage: bytes,
                                                      words: str) -> None:
    run = make_run(tmp_path / "run")
    (run / "run.json").write_bytes(damage)
    said = one(info_problems(run), str(run / "run.json"), words)
    code, rep = report_json(run)
    assert code == 0 and said in rep["run"]["problems"]  # and the rest is analysed
    assert rep["run"]["analysed_steps"] == [1, 2]
    code, err = export_notes(run, tmp_path / "out.json")
    assert code == 0 and said in " ".join(err.split())
    assert said in dashboard_problems(run)
    code, out, _ = cli("diff", str(run), str(run), "--json", "--workers", "1")
    assert code == 0 and f"A: {said}" in json.loads(out)["notes"]


def test_a_damaged_node_json_is_named_by_report_diff_and_export(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    node = run / "nodes" / "h"
    node.mkdir(parents=True)
    (node / "node.json").write_bytes(b"\x00\x01 not json")
    said = one(info_problems(run), str(node / "node.json"), "unreadable")
    code, rep = report_json(run)
    assert code == 0 and said in rep["run"]["problems"]
    code, out, _ = cli("diff", str(run), str(run), "--json", "--workers", "1")
    assert code == 0 and f"B: {said}" in json.loads(out)["notes"]
    code, err = export_notes(run, tmp_path / "out.json")
    assert code == 0 and said in " ".join(err.split())


# --- 4: bounded reads -------------------------------------------------------------------------------

def test_a_rank_json_linked_to_dev_zero_is_named_not_read(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    p = run / "ranks" / "0" / "rank.json"
    p.unlink()
    p.symlink_to("/dev/zero")
    meta = read_rank(p.parent)
    assert meta.rank == 0 and meta.problem == \
        f"{p}: unreadable (not a regular file); rank 0 taken from the folder name"
    one(info_problems(run), str(p), "not a regular file")
    code, _ = report_json(run)
    assert code == 0


def test_json_files_over_their_limit_are_named_with_the_limit(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    p = run / "ranks" / "1" / "rank.json"
    os.truncate(p, MAX_JSON_BYTES + 1)  # sparse: nothing is written
    node = run / "nodes" / "h"
    node.mkdir(parents=True)
    with open(node / "node.json", "wb") as f:
        f.truncate(3 << 30)
    problems = info_problems(run)
    one(problems, str(p), "64.0 MiB, over the 64 MiB limit for this file")
    one(problems, str(node / "node.json"), "3 GiB, over the 64 MiB limit for this file")
    code, rep = report_json(run)
    assert code == 0
    one(rep["run"]["problems"], str(node / "node.json"), "over the 64 MiB limit")


def test_step_and_flight_logs_over_their_limit_or_not_regular_are_named(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    steps = run / "ranks" / "1" / "steps.jsonl"
    os.truncate(steps, MAX_JSONL_BYTES + 10)
    assert read_step_timeline(steps.parent).problem(steps) == \
        f"{steps}: not read (1.0 GiB, over the 1 GiB limit for this file); this rank's step " \
        "timeline is empty"
    flight = run / "ranks" / "0" / FLIGHT_LOG_FILE
    flight.symlink_to("/dev/zero")
    fifo = run / "ranks" / "1" / FLIGHT_LOG_FILE
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    problems = info_problems(run)
    one(problems, str(steps), "over the 1 GiB limit")
    for p in (flight, fifo):
        assert one(problems, str(p)) == f"{p}: not read (not a regular file); this rank's " \
                                        "Flight Recorder arrivals are left out"
    code, rep = report_json(run)
    assert code == 0
    one(rep["run"]["problems"], str(flight), "not a regular file")


def test_a_run_json_fifo_is_named_not_waited_on(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    assert RunDir(run).run_id() is None
    one(info_problems(run), str(run / "run.json"), "not a regular file")


# --- 5: report's exit code when nothing was analysed ------------------------------------------------

def test_report_exits_1_when_no_rank_has_a_trace_window(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", traced=False)
    code, _, err = cli("report", str(run), "--workers", "1")
    assert code == 1
    assert "nothing could be analysed" in " ".join(err.split())
    code, rep = report_json(run)
    assert code == 1 and rep["run"]["analysed_steps"] == []


# --- 6: claims about every rank rest on complete steps only ---------------------------------------

def _traced(rows: list[tuple[int, int, int, int]]) -> pa.Table:
    """RUN_STEP_SCHEMA rows of (rank, step, exposed_comm_ns, comm_ns)."""
    cols = {f.name: pa.nulls(len(rows), f.type) for f in RUN_STEP_SCHEMA}
    for i, name in enumerate(("rank", "step", "exposed_comm_ns", "comm_ns")):
        cols[name] = pa.array([r[i] for r in rows], pa.int64())
    return pa.table(cols, schema=RUN_STEP_SCHEMA)


def _facts(traced: pa.Table, found: list[Finding]) -> SimpleNamespace:
    return SimpleNamespace(
        traced=traced, lateness=pa.table({"rank": pa.array([], pa.int64())}),
        wall_ns=1_000_000_000, classes=[], p2p=None, found=found, exposed_around=None,
        parallelism=SimpleNamespace(kinds=()), traits={}, rank_comm={},
        claimed=lambda rank, part: 0.0,
        first=lambda kind: next((f for f in found if f.kind == kind), None),
        of_kind=lambda kind: [f for f in found if f.kind == kind])


def test_exposed_comm_on_every_rank_leaves_out_a_dead_ranks_partial_step() -> None:
    """Rank 1 died in step 5 inside its trace window: its trace ends at step 4, rank 0's step 5
    is 800 ms waiting for the dead peer. That wait is not what every rank pays."""
    ms = 1_000_000
    traced = _traced([(0, 3, 5 * ms, 20 * ms), (1, 3, 4 * ms, 20 * ms),
                      (0, 4, 5 * ms, 20 * ms), (1, 4, 4 * ms, 20 * ms),
                      (0, 5, 800 * ms, 800 * ms)])
    crash = Finding("crash", "high", "Crash: rank 1 ...", [1], [5], "exception", 0.0, {}, "",
                    role="failure")
    out = exposed_comm.exposed_comm_findings(_facts(traced, [crash]))  # type: ignore[arg-type]
    assert out == []  # 8 ms of 1 s: below the threshold once step 5 is left out
    traced = _traced([(0, 3, 300 * ms, 400 * ms), (1, 3, 200 * ms, 400 * ms),
                      (0, 4, 5 * ms, 20 * ms), (0, 5, 800 * ms, 800 * ms),
                      (1, 5, 0, 0)])
    (f,) = exposed_comm.exposed_comm_findings(_facts(traced, [crash]))  # type: ignore[arg-type]
    assert f.steps == [3] and f.observed_ms == 200.0
    assert f.evidence["steps_left_out"] == {
        "4": "not traced on rank(s) 1", "5": "at or after step 5, where a rank failed"}
    assert "step(s) 4, 5 left out, not complete on every rank" in f.evidence["test"]["sentence"]


# --- 7: a death inside the trace window -------------------------------------------------------------

def test_a_job_that_died_inside_its_trace_window_is_not_said_to_have_died_before_it(
        tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", traced=False, finished=False, steps=1)
    said = one(analyze_json(run)["problems"], "no trace window in this run")
    assert "inside its trace window (steps 1-2): it stopped in step 1, before the window's " \
           "trace was written" in said
    assert "before its trace window" not in said


def test_failure_records_linked_to_dev_zero_are_not_read_to_exhaustion(tmp_path: Path) -> None:
    """The hang and crash readers load whole files too (stacks, exceptions, dumps): a link to
    /dev/zero must end as an unreadable record, not a MemoryError."""
    run = make_run(tmp_path / "run", finished=False)
    rd = run / "ranks" / "1"
    for name in ("fatal.txt", "stacks.txt", "exceptions.jsonl", "hang.json",
                 "flight-recorder-exception.json"):
        (rd / name).symlink_to("/dev/zero")
    assert info_problems(run)
    code, doc = report_json(run)
    # the run is unfinished (no end recorded): a crash, whose verdict is the exit code
    assert code == 3 and any(f["kind"] == "crash" for f in doc["findings"])
