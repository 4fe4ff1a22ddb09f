"""tests/_made_once.py: a shared run is made by one worker of a session and read by the others."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from tests._made_once import copy_run, made_once


class _Worker:
    """What made_once asks of pytest's TempPathFactory, as a worker of one session has it."""

    def __init__(self, session: Path, worker: str) -> None:
        self.base = session / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self) -> Path:
        return self.base

    def mktemp(self, name: str) -> Path:  # pragma: no cover - only outside xdist
        raise AssertionError("a worker uses the shared folder")


def _make_counted(out: Path) -> dict[str, str]:
    with (out.parent / "made.log").open("a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(0.3)  # long enough that the other worker asks while it is being made
    (out / "trace.json").write_text("{}")
    return {"path": str(out), "by": str(os.getpid())}


def _ask(session: str, worker: str, queue: multiprocessing.Queue) -> None:
    os.environ["PYTEST_XDIST_WORKER"] = worker
    try:
        queue.put(made_once(_Worker(Path(session), worker), "run", _make_counted))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        queue.put(f"{type(e).__name__}: {e}")


def test_two_workers_asking_at_once_get_one_run_made_by_one_of_them(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_ask, args=(str(tmp_path), w, queue)) for w in ("gw0", "gw1")]
    for p in procs:
        p.start()
    got = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert got[0] == got[1] and isinstance(got[0], dict)
    assert (tmp_path / "made.log").read_text().count("\n") == 1
    assert Path(got[0]["path"]) == tmp_path / "run" and (tmp_path / "run" / "trace.json").exists()


def test_a_run_that_failed_fails_the_next_worker_with_the_first_ones_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    calls = []

    def broken(out: Path) -> None:
        calls.append(out)
        raise AssertionError("uberprof run failed (1): no traces")

    with pytest.raises(AssertionError):
        made_once(_Worker(tmp_path, "gw0"), "run", broken)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    with pytest.raises(pytest.fail.Exception, match="failed on another worker:\n.*no traces"):
        made_once(_Worker(tmp_path, "gw1"), "run", broken)
    assert len(calls) == 1


def test_a_copy_with_derived_leaves_out_the_temporary_files_of_an_analysis_under_way(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "derived").mkdir(parents=True)
    (run / "rank.json").write_text("{}")
    (run / "derived" / "summary.json").write_text("{}")
    (run / "derived" / ".summary.json.123-ab-0.tmp").write_text("{")
    assert sorted(p.name for p in copy_run(run, tmp_path / "a").rglob("*")) == ["rank.json"]
    with_derived = copy_run(run, tmp_path / "b", derived=True)
    assert sorted(p.name for p in with_derived.rglob("*")) == \
        ["derived", "rank.json", "summary.json"]
