"""Two jobs side by side on two cores, on equal terms: for comparisons that must not depend on
which job the machine favoured (`uberprof diff` tests, the collector's overhead benchmark).

Runs made one after the other differ by tens of percent on a shared machine (78 vs 53 ms median
for the same job), so the two jobs run at once. That alone is not enough: left to the
scheduler, one job can keep the better core (98 vs 63 ms median for identical jobs); pinned each
to a core of its own, the core that other work (or the hypervisor's other tenants) lands on is
slower for the whole run (57 vs 99 ms in a CI clone; on this VM one core's CPU time per step
once read 46 ms against the other's 26 ms). So:

- the jobs start their steps together: every rank waits at a gate (the sample's
  `--start-gate FILE`) that `open_gate_when_ready` opens once all of them are there. Otherwise
  the one that imports torch sooner runs ahead, and its trace export at its window's end lands in
  the other's traced steps (0.3 s apart made the second of identical jobs 7-24 % slower);
- they trade cores every `SWAP_S` (`trading_cores`), the one that moves first alternating too,
  so each spends the same share of every step on each core. At 50 ms identical jobs beside a
  busy core still read 1.18x; with the same mover first every time, 1.07-1.10x; as here,
  0.98-1.06x.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import psutil

__all__ = ["SWAP_S", "job_threads", "open_gate_when_ready", "start_on", "trading_cores",
           "two_cpus"]

SWAP_S = 0.01  # how often the two jobs trade cores: a sample step lasts ~30-100 ms
REFRESH = 11  # swaps between two scans for the jobs' threads (new ones inherit a core); odd,
# so that the scan's own CPU time falls on both placements alike (at 10, always on the same
# one, it made the second job of identical pairs 7-10 % slower)


def two_cpus() -> list[int]:
    """The two cores the jobs share (this process's first two; fewer on a 1-core machine)."""
    return sorted(os.sched_getaffinity(0))[:2]


def job_threads(marker: str) -> list[int]:
    """Every thread of the processes this process started whose command line holds the
    argument `marker` (a job's `--run-id` value, its output file), and of all their
    descendants (the agent, torchrun, the ranks)."""
    pids: set[int] = set()
    for top in psutil.Process().children(recursive=True):
        if top.pid in pids:
            continue
        try:
            if marker not in top.cmdline():
                continue
            pids.update(p.pid for p in (top, *top.children(recursive=True)))
        except psutil.Error:
            continue  # ended meanwhile
    tids: list[int] = []
    for pid in pids:
        try:
            tids.extend(t.id for t in psutil.Process(pid).threads())
        except psutil.Error:
            pass
    return tids


def _alternate(markers: Sequence[str], cpus: list[int], done: threading.Event) -> None:
    """Until `done`, swap the two jobs' cores every SWAP_S, finding their threads again every
    REFRESH swaps (a scan of the process tree costs milliseconds, a swap microseconds)."""
    turn = 0
    threads: list[list[int]] = [[], []]
    while not done.wait(SWAP_S):
        if turn % REFRESH == 0:
            threads = [job_threads(m) for m in markers]
        turn += 1
        order = (0, 1) if turn % 2 else (1, 0)  # who moves first alternates too
        for i in order:
            for tid in threads[i]:
                try:
                    os.sched_setaffinity(tid, {cpus[(i + turn) % 2]})
                except OSError:
                    pass  # the thread ended meanwhile


@contextmanager
def trading_cores(markers: tuple[str, str], cpus: list[int]) -> Iterator[None]:
    """While inside, the jobs named by `markers` (see `job_threads`) trade `cpus` every
    SWAP_S. Nothing happens with fewer than two cores."""
    if len(cpus) < 2:
        yield
        return
    done = threading.Event()
    swapper = threading.Thread(target=_alternate, args=(markers, cpus, done), daemon=True)
    swapper.start()
    try:
        yield
    finally:
        done.set()
        swapper.join()


def open_gate_when_ready(gate: Path, ranks: int, runs: Sequence[Future[object]],
                         limit_s: float) -> None:
    """Open the jobs' start gate once all their `ranks` wait at it, or once one of the jobs
    ended (it failed: its error is the caller's) or `limit_s` passed."""
    ready = gate.with_name(gate.name + ".ready")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not any(r.done() for r in runs):
        if ready.exists() and len(ready.read_text().split()) >= ranks:
            break
        time.sleep(0.02)
    gate.touch()


def start_on(cpu: int, cpus: list[int]) -> None:
    """Pin the calling thread (and so the job it starts next) to `cpu`, where there are two."""
    if len(cpus) == 2:
        os.sched_setaffinity(0, {cpu})
