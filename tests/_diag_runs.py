"""Real 4-rank CPU (Gloo) runs for the diagnosis tests, each made once per test session.

Registered once in tests/jobs/conftest.py: a test names the fixture as an argument and imports
nothing of it (imported into a test module, it would run again for that module)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from tests._jobs import SAMPLES, SCRIPTS, torchrun, uberprof_run
from tests._made_once import made_once

STEPS = 14
TRACE = "3-12"  # ten analysed steps: two gradient buckets each


def _ddp_run(factory: pytest.TempPathFactory, name: str, *fault: str) -> Path:
    def make(out: Path) -> Path:
        uberprof_run(out, name,
                     torchrun(4, SAMPLES / "train_ddp.py", "--steps", str(STEPS), *fault),
                     "--trace-steps", TRACE, "--counters", "none")
        return out / name
    return made_once(factory, f"diag-{name}", make)


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _ddp_run(tmp_path_factory, "healthy")


@pytest.fixture(scope="session")
def slow_compute_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 2 runs its forward pass 16 times (15 extra, outside autograd): a lead of some
    400 ms a step, well clear of the stalls a busy 2-core machine gives the other ranks (with 8
    passes, CI once saw another rank's stall leave it last in only 11 of 20 instances)."""
    return _ddp_run(tmp_path_factory, "slowcompute", "--slow-rank", "2", "--slow-compute", "16")


@pytest.fixture(scope="session")
def slow_data_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 1's data loader sleeps 20 ms per sample (160 ms per batch of 8): a lead well clear
    of the others' spread even when a busy 2-core machine stalls them by tens of ms."""
    return _ddp_run(tmp_path_factory, "slowdata", "--slow-data-rank", "1",
                    "--data-delay-ms", "20")


@pytest.fixture(scope="session")
def logging_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DDP that all-reduces its loss every step (a small collective per step), 20 traced
    steps: the run the clock alignment tests shift."""
    def make(out: Path) -> Path:
        uberprof_run(out, "logging",
                     torchrun(4, SCRIPTS / "ddp_loss_logging.py", "--steps", "25"),
                     "--trace-steps", "3-22", "--counters", "none")
        return out / "logging"
    return made_once(tmp_path_factory, "diag-logging", make)


def shift_node(src: Path, dst: Path, ranks: list[int], host: str, shift_ns: int) -> Path:
    """A copy of run `src` in which `ranks` ran on another host whose clock is `shift_ns`
    ahead: their traces and step timelines move by `shift_ns`, their rank.json names `host`,
    and their start-up clock estimate says 0 with a 2 ms uncertainty (it missed the shift)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("derived"))
    for r in ranks:
        rd = dst / "ranks" / str(r)
        meta = json.loads((rd / "rank.json").read_text())
        meta["host"] = meta["node"] = host
        meta["clock"] = {**meta.get("clock", {}), "host": host, "offset_to_rank0_ns": 0,
                         "offset_uncertainty_ns": 2_000_000, "method": "store-ping"}
        (rd / "rank.json").write_text(json.dumps(meta))
        for t in (rd / "traces").glob("*.json.gz"):
            doc = json.loads(gzip.decompress(t.read_bytes()))
            doc["baseTimeNanoseconds"] += shift_ns
            if "host_name" in doc:
                doc["host_name"] = host
            t.write_bytes(gzip.compress(json.dumps(doc).encode()))
        lines = []
        for line in (rd / "steps.jsonl").read_text().splitlines():
            row = json.loads(line)
            for k in ("host_start_ns", "host_end_ns"):
                if isinstance(row.get(k), int):
                    row[k] += shift_ns
            lines.append(json.dumps(row))
        (rd / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return dst


@pytest.fixture(scope="session")
def sleeping_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks; rank 1 sleeps 100 ms per step on its training thread (as blocking I/O or a
    lock would): late by its own doing, with the others' CPU time."""
    def make(out: Path) -> Path:
        uberprof_run(out, "sleep", torchrun(2, SAMPLES / "train_ddp.py", "--steps", str(STEPS),
                                            "--sleep-rank", "1", "--sleep-ms", "100"),
                     "--trace-steps", TRACE, "--counters", "none")
        return out / "sleep"
    return made_once(tmp_path_factory, "diag-sleep", make)
