"""Clock reference of a rank, and an online estimate of its host's offset to rank 0.

Ranks on one host share a clock, so only the first local rank of each host other than rank 0's
measures. It pings rank 0 through the process group's key-value store (NTP style: the offset is
rank 0's time minus the midpoint of the round trip, the uncertainty half the shortest round trip).
Everything runs on a background thread with timeouts; the training thread never waits for it.
The thread talks through its own connection to the store (`_own_client`): a store client runs
one request at a time, so a wait here on the job's own client held the job's store calls
(a `new_group`, a barrier) until the wait ended, up to a minute when a peer was slow to start.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

PREFIX = "uberprof/clock"
ROUNDS = 8
TIMEOUT = timedelta(seconds=60)


def clock_reference() -> dict[str, Any]:
    """An (epoch, monotonic) pair read back to back, with the host it belongs to."""
    return {
        "host": socket.gethostname(),
        "epoch_ns": time.time_ns(),
        "monotonic_ns": time.monotonic_ns(),
    }


def start_offset_estimate(
    store: Any,
    rank: int,
    world_size: int,
    local_rank: int,
    host: str,
    run_id: str,
    on_result: Callable[[dict[str, Any]], None],
    on_error: Callable[[BaseException], None],
) -> threading.Thread:
    """Run the estimate on a daemon thread; `on_result` receives the `clock` fields of rank.json."""

    def body() -> None:
        try:
            own = _own_client(store)
            on_result(_estimate(own, rank, world_size, local_rank, host, run_id))
        except Exception as exc:  # noqa: BLE001 - reported by the caller's log
            on_error(exc)

    t = threading.Thread(target=body, name="uberprof-clock", daemon=True)
    t.start()
    return t


def _own_client(store: Any) -> Any:
    """A connection to the job's store of this thread's own: `clone()` (torch >= 2.8), else a
    new client of the TCPStore under the job's prefixes (its keys under a prefix of their own
    per elastic restart, as every rank of a job runs the same torch)."""
    clone = getattr(store, "clone", None)
    if clone is not None:
        return clone()
    base = store
    while getattr(base, "underlying_store", None) is not None:
        base = base.underlying_store
    host, port = getattr(base, "host", None), getattr(base, "port", None)
    if not isinstance(host, str) or not isinstance(port, int):
        raise RuntimeError(  # noqa: TRY004 - a store it cannot reach, not a caller's mistake
            "no connection of its own to the job's store (not a TCPStore, no clone()): no "
            "estimate, as waiting on the job's own client would hold the job's store calls")
    import torch.distributed as dist

    client = dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT,
                           wait_for_workers=False)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"uberprof-own/{restart}", client)


def _estimate(
    store: Any, rank: int, world_size: int, local_rank: int, host: str, run_id: str
) -> dict[str, Any]:
    store.set(f"{PREFIX}/host/{rank}", f"{local_rank}|{host}")
    if rank == 0:
        store.set(f"{PREFIX}/job", run_id)
        measured = _serve(store, world_size, host)
        return {"offset_to_rank0_ns": 0, "offset_uncertainty_ns": 0, "method": "reference",
                "job_id": run_id, "hosts_measured": measured}
    store.wait([f"{PREFIX}/job"], TIMEOUT)
    job_id = store.get(f"{PREFIX}/job").decode()
    store.wait([f"{PREFIX}/host/0"], TIMEOUT)
    host0 = store.get(f"{PREFIX}/host/0").decode().split("|", 1)[1]
    if host == host0:
        return {"offset_to_rank0_ns": 0, "offset_uncertainty_ns": 0, "method": "same-host",
                "job_id": job_id}
    if local_rank != 0:
        return {"offset_to_rank0_ns": None, "offset_uncertainty_ns": None,
                "method": "host-shared", "job_id": job_id}
    best: tuple[int, int] | None = None
    for k in range(ROUNDS):
        t1 = time.time_ns()
        store.set(f"{PREFIX}/req/{rank}/{k}", b"1")
        store.wait([f"{PREFIX}/resp/{rank}/{k}"], TIMEOUT)
        t_ref = int(store.get(f"{PREFIX}/resp/{rank}/{k}"))
        t4 = time.time_ns()
        rtt = t4 - t1
        offset = t_ref - (t1 + t4) // 2
        if best is None or rtt < best[0]:
            best = (rtt, offset)
    assert best is not None
    return {"offset_to_rank0_ns": best[1], "offset_uncertainty_ns": best[0] // 2,
            "method": "store-ping", "rounds": ROUNDS, "job_id": job_id}


def _serve(store: Any, world_size: int, host0: str) -> int:
    """Rank 0 answers the pings of the first local rank of every other host."""
    measured = 0
    for r in range(1, world_size):
        store.wait([f"{PREFIX}/host/{r}"], TIMEOUT)
        local, _, host = store.get(f"{PREFIX}/host/{r}").decode().partition("|")
        if host == host0 or local != "0":
            continue
        for k in range(ROUNDS):
            store.wait([f"{PREFIX}/req/{r}/{k}"], TIMEOUT)
            store.set(f"{PREFIX}/resp/{r}/{k}", str(time.time_ns()))
        measured += 1
    return measured
