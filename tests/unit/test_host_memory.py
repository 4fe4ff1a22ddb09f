"""The host-memory evidence of a rank that died without a trace (`diagnosis/host_memory.py`),
read from counters written by the collector's own store."""

from __future__ import annotations

import json
from pathlib import Path

from uberprof.analysis.diagnosis.host_memory import host_memory_at
from uberprof.collect.counters.store import CounterStore

GB = 1 << 30
T0 = 1_800_000_000_000_000_000


def _run(tmp_path: Path, available_gb: list[float]) -> Path:
    """A run directory of one node `n0` (host `h0`) with rank 1 as pid 4242, and host memory
    samples one second apart: 64 GB in all, `available_gb` free in turn; rank 1's RSS grows."""
    (tmp_path / "ranks" / "1").mkdir(parents=True)
    (tmp_path / "ranks" / "1" / "rank.json").write_text(json.dumps(
        {"rank": 1, "world_size": 2, "pid": 4242, "host": "h0", "node": "n0"}))
    store = CounterStore(tmp_path / "nodes" / "n0" / "counters")
    store.write_meta({"host": "h0", "node": "n0"})
    for i, free in enumerate(available_gb):
        t = T0 + i * 1_000_000_000
        store.add("host", t, [("mem", "mem.total", 64.0 * GB, "B"),
                              ("mem", "mem.available", free * GB, "B")])
        store.add("proc", t, [("pid:4242", "mem.rss", (10 + 10 * i) * GB, "B")])
    store.close()
    return tmp_path


def test_a_host_nearly_out_of_memory_at_the_death_is_said_near_full(tmp_path: Path) -> None:
    run = _run(tmp_path, [40, 20, 2])
    ev = host_memory_at(run, "n0", 1, T0 + 2_300_000_000)  # died 0.3 s after the last sample
    assert ev is not None and ev["near_full"] is True
    assert ev["host_used_pct"] == round(100 * (1 - 2 / 64), 1)
    assert ev["rank_rss_bytes"] == 30 * GB and ev["sample_age_ms"] == 300.0


def test_memory_to_spare_at_the_death_is_not_near_full(tmp_path: Path) -> None:
    run = _run(tmp_path, [40, 30, 20])
    ev = host_memory_at(run, "n0", 1, T0 + 2_300_000_000)
    assert ev is not None and ev["near_full"] is False and ev["host_used_pct"] == 68.8


def test_samples_from_long_before_the_death_say_nothing(tmp_path: Path) -> None:
    run = _run(tmp_path, [40, 20, 2])
    assert host_memory_at(run, "n0", 1, T0 + 60_000_000_000) is None  # a minute later
    assert host_memory_at(run, "n0", 1, None) is None
    assert host_memory_at(run, None, 1, T0) is None


def _killed_run(tmp_path: Path, available_gb: list[float]) -> Path:
    """`_run`'s node and counters, with a 2-rank job whose rank 1 (pid 4242) torchrun saw
    killed by SIGKILL 0.3 s after the last sample, and rank 0 terminated after it."""
    run = _run(tmp_path, available_gb)
    death = T0 + (len(available_gb) - 1) * 1_000_000_000 + 300_000_000
    (run / "run.json").write_text(json.dumps({"run_id": "killed"}))
    node = run / "nodes" / "n0"
    (node / "node.json").write_text(json.dumps({"run_id": "killed", "node": "n0", "host": "h0",
                                                "start_ns": T0 - 10**10, "end_ns": death + 10**9,
                                                "exit_code": -9}))
    (node / "exits-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"time_ns": death, "pid": 4242, "local_rank": 1, "exitcode": -9, "signal": "SIGKILL",
         "source": "torchrun"},
        {"time_ns": death + 10**8, "pid": 4241, "local_rank": 0, "exitcode": -15,
         "signal": "SIGTERM", "source": "torchrun"})))
    (run / "ranks" / "0").mkdir()
    (run / "ranks" / "0" / "rank.json").write_text(json.dumps(
        {"rank": 0, "world_size": 2, "pid": 4241, "host": "h0", "node": "n0"}))
    for r in (0, 1):
        (run / "ranks" / str(r) / "steps.jsonl").write_text("".join(json.dumps(
            {"kind": "step", "step": s, "host_start_ns": T0 + s * 10**8,
             "host_end_ns": T0 + (s + 1) * 10**8, "data_wait_ns": 0}) + "\n" for s in range(5)))
    return run


def test_a_rank_killed_while_its_host_was_nearly_out_of_memory_is_an_out_of_memory_crash(
        tmp_path: Path) -> None:
    from uberprof.analysis.diagnosis.findings.failures import failure_findings

    (f,) = [x for x in failure_findings(_killed_run(tmp_path, [40, 20, 2])) if x.kind == "crash"]
    assert f.ranks == [1] and f.cause == "out_of_memory", f.as_dict()
    mem = f.evidence["memory"]
    assert mem["near_full"] and mem["host_used_pct"] == 96.9 and mem["rank_rss_bytes"] == 30 * GB
    assert "out of host memory (suspected): 96.9% of" in f.title
    assert f.evidence["first"]["signal"] == "SIGKILL"


def test_a_rank_killed_with_memory_to_spare_stays_a_signal_crash(tmp_path: Path) -> None:
    from uberprof.analysis.diagnosis.findings.failures import failure_findings

    (f,) = [x for x in failure_findings(_killed_run(tmp_path, [40, 30, 20])) if x.kind == "crash"]
    assert f.ranks == [1] and f.cause == "signal" and "memory" not in f.evidence
