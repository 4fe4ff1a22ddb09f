"""Crashes of real CPU/Gloo jobs under `uberprof run`: the report names the first failing rank
(by kind, then time), its exception or signal and where, and lists the ranks that only lost
their peer as victims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._failures import faulty_run, first_finding, line_of
from tests._jobs import info_json, torchrun, uberprof_run


def _roles(f: dict) -> dict[int, str]:
    return {x["rank"]: x["role"] for x in f["evidence"]["failed"]}


@pytest.mark.parametrize("spawn", [True, False], ids=["mp.spawn", "torchrun"])
def test_a_rank_that_raises_is_named_not_a_victim(tmp_path: Path, spawn: bool) -> None:
    proc, _ = faulty_run(tmp_path, "raise", "raise", "--rank", "2", "--at-step", "4",
                         spawn=spawn)
    assert proc.returncode != 0
    f = first_finding(tmp_path / "raise", "crash")
    first = f["evidence"]["first"]
    assert f["ranks"] == [2] and f["cause"] == "exception" and first["step"] == 3
    assert first["exception"]["type"] == "RuntimeError"
    assert first["exception"]["message"] == "boom at step 4"
    assert first["exception"]["where"].endswith(
        f"faulty.py:{line_of('raise RuntimeError')} in train")
    assert "Crash: rank 2 raised RuntimeError: boom at step 4" in f["title"]
    roles = _roles(f)
    assert roles.pop(2) == "first" and set(roles.values()) == {"victim"}
    info = info_json(tmp_path / "raise")
    assert info["problems"][0] == f["title"]
    assert next(r for r in info["ranks"] if r["rank"] == 2)["exit"] == "exception"


def test_a_rank_killed_with_kill_9(tmp_path: Path) -> None:
    proc, _ = faulty_run(tmp_path, "kill", "kill", "--rank", "1")
    assert proc.returncode != 0
    f = first_finding(tmp_path / "kill", "crash")
    first = f["evidence"]["first"]
    assert f["ranks"] == [1] and first["signal"] == "SIGKILL" and first["seen_by"] == "torchrun"
    assert first["step"] == 2 and "kill -9 or the OOM killer" in f["title"]
    roles = _roles(f)
    assert roles.pop(1) == "first" and set(roles.values()) == {"victim"}
    # what it left the others waiting in: their Flight Recorder dumps when Gloo raised in them
    # first, and always the stacks of the victims (SIGTERM from torchrun, or the exception)
    w = f["evidence"]["others_waiting_in"]
    if w is not None:
        assert (w["op"], w["process_group"], w["sizes"]) == ("all_reduce", "default_pg", [[4]])
    sites = f["evidence"]["call_sites"]
    assert len(sites) == 1 and set(sites[0]["ranks"]) <= {0, 2, 3}
    for v in f["evidence"]["victims"]:
        # a victim is placed unless the SIGTERM found it with no Python frame at all (between
        # Gloo's exception and the excepthook: it happens under load)
        assert v["rank"] in sites[0]["ranks"] or not (v.get("stack") or v.get("exception")), v
    assert sites[0]["collective"] == "all_reduce"
    assert sites[0]["where"].endswith(f"faulty.py:{line_of('dist.all_reduce(grad)')} in train")


def test_a_collective_mismatch_that_makes_gloo_abort(tmp_path: Path) -> None:
    proc, _ = faulty_run(tmp_path, "mismatch", "mismatch", "--rank", "2")
    assert proc.returncode != 0
    f = first_finding(tmp_path / "mismatch", "crash")
    first = f["evidence"]["first"]
    # a peer of the odd rank receives more than it expects and aborts in C++
    assert first["signal"] == "SIGABRT" and first["rank"] != 2
    assert first["where"].endswith(f"faulty.py:{line_of('torch.ones(1))')} in train")
    assert first["stack"][-1]["function"] == "all_reduce"
    # the odd one out: rank 2 was in a different collective call than the others, and the
    # crash is reported as the desync it followed, with rank 2 as the rank that departed
    sites = f["evidence"]["call_sites"]
    odd = [s for s in sites if s["ranks"] == [2]]
    assert odd and odd[0]["collective"] == "all_reduce"
    assert odd[0]["where"].endswith(f"faulty.py:{line_of('torch.ones(10_000)')} in train")
    assert f["cause"] == "desync" and f["ranks"] == [2], f["title"]
    assert f["title"].startswith("Crash after a collective desync: rank 2 departed first")


@pytest.mark.parametrize(("nproc", "rank"), [(2, 1), (4, 2)], ids=["2-ranks", "4-ranks"])
def test_a_skipped_collective_names_the_rank_that_skipped_not_the_one_that_aborted(
        tmp_path: Path, nproc: int, rank: int) -> None:
    """Rank R skips one gradient all-reduce: its next all-reduce (10,000 statistics) meets the
    others' gradients, and a peer of R aborts in C++ (SIGABRT). The crash is the desync: R
    departed from what it and the others issued at that point of every earlier step."""
    proc, _ = faulty_run(tmp_path, "skip1", "skip-one", "--rank", str(rank), nproc=nproc)
    assert proc.returncode != 0
    f = first_finding(tmp_path / "skip1", "crash")
    assert f["cause"] == "desync" and f["ranks"] == [rank], f["title"]
    desync = f["evidence"]["desync"]
    assert desync["decided_by"] == "history" and desync["ranks"] == [rank]
    (d,) = desync["departures"].values()
    assert d["expected"] == {"op": "all_reduce", "sizes": [[4]], "dtypes": ["Float"]}
    assert f["title"].startswith(f"Crash after a collective desync: rank {rank} departed first")
    where = {r: c["where"] for c in f["evidence"]["call_sites"] for r in c["ranks"]}
    if rank in where:
        assert where[rank].endswith(f"faulty.py:{line_of('dist.all_reduce(stats)')} in train")
    # the aborted rank is still the first failure, and the ranks that lost it are victims
    first = f["evidence"]["first"]
    assert first["rank"] != rank or first["signal"] == "SIGABRT"
    assert _roles(f).get(rank) in ("first", "departed")


def test_a_skipped_logging_all_reduce_under_ddp_names_the_rank_that_skipped_not_the_aborted(
        tmp_path: Path) -> None:
    """Four ranks of DDP; rank 2 skips the loss's all-reduce at step 3: its next collective
    (the gradients' bucket, issued in backward) meets the others' loss and Gloo aborts a peer
    (SIGABRT) while rank 2 is in backward, in no collective call of its own and with no
    exception. torchrun's agent asks the surviving ranks for their Flight Recorder dumps
    before it ends them: rank 2's sequence departs from every earlier step, and it is named;
    the aborted rank is a victim that says it aborted on the mismatch it detected."""
    proc, _ = faulty_run(tmp_path, "skiplog", "skip-logged", "--rank", "2")
    assert proc.returncode != 0
    f = first_finding(tmp_path / "skiplog", "crash")
    assert f["cause"] == "desync" and f["ranks"] == [2], f["title"]
    assert f["title"].startswith("Crash after a collective desync: rank 2 departed first")
    m = f["evidence"]["desync"]["mismatch"]
    assert m["decided_by"] == "history" and m["ranks"] == [2]
    assert m["departures"]["2"]["expected"]["sizes"] == [[1]]  # the loss was due there
    assert (tmp_path / "skiplog" / "ranks" / "2" / "flight-recorder-peer_failed.json").exists()
    first = f["evidence"]["first"]
    if first["rank"] != 2 and first.get("signal") == "SIGABRT":
        assert _roles(f)[first["rank"]] == "aborted_on_mismatch"
        assert "a victim that aborted on the mismatch it detected" in f["title"]
    assert _roles(f)[2] in ("first", "departed")


def test_a_sigterm_during_the_exception_hook_waits_for_the_record(tmp_path: Path) -> None:
    """torchrun ends the survivors ~0.1 s after a rank dies, often while they are still
    recording the exception Gloo raised in them: the record is written whole, and the script's
    own hook runs to its end, before the SIGTERM takes its course (stacks, then death)."""
    script = Path(__file__).parents[1] / "scripts" / "sigterm_in_hook.py"
    proc = uberprof_run(tmp_path, "hook", torchrun(1, script), "--no-trace", check=False)
    assert proc.returncode != 0
    assert "the script's hook ran to its end" in proc.stderr
    rank = tmp_path / "hook" / "ranks" / "0"
    rows = [json.loads(x) for x in (rank / "exceptions.jsonl").read_text().splitlines()]
    assert [r["type"] for r in rows] == ["ValueError"]
    assert rows[0]["frames"][-1]["file"].endswith("sigterm_in_hook.py")
    assert "must not swallow" in rows[0]["traceback"]
    assert "Current thread" in (rank / "fatal.txt").read_text()  # the SIGTERM's stacks
    exits = [json.loads(x) for p in (tmp_path / "hook" / "nodes").glob("*/exits-*.jsonl")
             for x in p.read_text().splitlines()]
    assert [e["signal"] for e in exits] == ["SIGTERM"]


def test_out_of_memory_on_a_rank_is_its_own_crash_cause_with_the_memory_evidence(
        tmp_path: Path) -> None:
    """A CPU job whose rank 1 raises torch.OutOfMemoryError (samples/train_ddp.py --oom-rank:
    the error the CUDA allocator raises, raised by the sample on a CPU): the crash finding's
    cause is out_of_memory, with its memory evidence (none of device memory on a CPU rank).
    The same path on a real H100 run: tests/unit/test_gpu_samples.py."""
    from tests._jobs import SAMPLES

    proc = uberprof_run(tmp_path, "oom", torchrun(2, SAMPLES / "train_ddp.py", "--steps", "12", "--oom-rank", "1",
                                                  "--oom-step", "6"),
                        "--no-trace", check=False)
    assert proc.returncode != 0
    f = first_finding(tmp_path / "oom", "crash")
    assert f["ranks"] == [1] and f["cause"] == "out_of_memory"
    assert f["evidence"]["first"]["exception"]["type"] == "OutOfMemoryError"
    mem = f["evidence"]["memory"]
    assert mem["device_total_bytes"] is None and mem["peak_allocated_bytes"] is None
    assert "out of memory" in f["title"] and f["remedy"].startswith("Lower the memory per rank")
    assert _roles(f) == {1: "first", 0: "victim"}
