"""The per-trace map of `uberprof analyze` on a Dask cluster (`--dask ADDRESS` or `--dask local`).

Only the map moves: each worker runs the same top-level function as the local pool
(`pool.analyze_shared`, a thin wrapper around `rank.analyze_input`), reads one trace and
writes that trace's tables under the derived folder; what travels back is a status line of a
few hundred bytes. The cross-rank reduce then runs here, on the client, over those small
tables. So every worker must see the traces and the derived folder at the same paths as the
client (a shared file system), and run the same uberprof version.

Dask is optional (`pip install 'uberprof[dask]'`); nothing here imports it until asked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager

__all__ = ["DASK_MISSING", "DaskUnavailable", "dask_executor"]

DASK_MISSING = ("Dask is not installed: --dask needs dask.distributed. Install it with "
                "pip install 'uberprof[dask]' (or pip install 'dask[distributed]'), on this "
                "machine and on every worker.")

CONNECT_TIMEOUT_S = 30


class DaskUnavailable(RuntimeError):
    """Dask is missing, or the cluster cannot be reached or started; the message says which."""


@contextmanager
def dask_executor(address: str, workers: int | None = None) -> Iterator[Executor]:
    """A `concurrent.futures` executor on a Dask cluster, for `pipeline.analyze(executor=...)`.

    `address`: a scheduler (`tcp://host:8786`, or anything `distributed.Client` takes), or
    `local` for a `LocalCluster` on this machine of `workers` single-threaded processes
    (default: one per CPU; single threads because the map is CPU-bound Python). Closed on exit.
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise DaskUnavailable(DASK_MISSING) from exc

    cluster = None
    try:
        if address == "local":
            # Its HTTP endpoint on a free loopback port: nothing listens beyond this machine.
            cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1,
                                   threads_per_worker=1, processes=True,
                                   dashboard_address="127.0.0.1:0", silence_logs=40)
            client = Client(cluster)
        else:
            client = Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, RuntimeError) as exc:
        if cluster is not None:
            cluster.close()
        where = "a local Dask cluster could not start" if address == "local" else \
            f"cannot reach the Dask scheduler at {address}"
        raise DaskUnavailable(f"{where}: {exc}") from exc
    try:
        # pure=False: a key per call, so a trace changed since an earlier call with the same
        # client is read again rather than answered from Dask's cache.
        yield client.get_executor(pure=False)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
