"""The all-reduce sweep of `uberprof calibrate`, run under the job's own launcher.

This file is started as a script by torchrun, srun, mpirun, ... (one process per rank, like the
training script), so it needs nothing but torch and the standard library. Every rank all-reduces
buffers of growing size over the whole job (the slowest link the job crosses) and, when the job
spans several hosts with several ranks each, within each host; rank 0 writes what it measured
to `--out` (the run's calibration.json). nccl-tests' conventions: time = the slowest rank's
mean over the iterations, algbw = bytes / time, busbw = algbw * 2(n-1)/n.

`run_sweep` is the other side, in `uberprof calibrate`'s process: it starts this file under the
launcher (`launcher_prefix` reads it from the command a run recorded) and waits for it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="where rank 0 writes the results (JSON)")
    p.add_argument("--min-bytes", type=int, default=64 << 10)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--max-iter-s", type=float, default=0.5,
                   help="stop growing the size once one iteration takes this long")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    return p.parse_args(argv)


def _sweep(dist: Any, torch: Any, group: Any, n: int, device: Any, args: argparse.Namespace
           ) -> list[dict[str, float]]:
    points = []
    size = args.min_bytes
    while size <= args.max_bytes:
        buf = torch.ones(max(size // 4, 1), dtype=torch.float32, device=device)
        dist.all_reduce(buf, group=group)  # warm-up (connections, algorithms)
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64,
                               device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        t = float(elapsed.item())
        nbytes = buf.numel() * 4
        alg = nbytes / t if t > 0 else 0.0
        points.append({"bytes": nbytes, "time_us": round(t * 1e6, 3), "algbw_Bps": alg,
                       "busbw_Bps": alg * (2.0 * (n - 1) / n if n > 1 else 1.0)})
        if t > args.max_iter_s:
            break
        size *= 2
    return points


# A point counts toward the peak only if one iteration lasted this long: a shaper's burst (tc's
# token bucket lets its first few hundred KB through at line rate) or a cache then weighs little.
SUSTAINED_S = 0.02


def _summary(points: list[dict[str, float]]) -> tuple[float | None, int | None]:
    """The sustained peak busbw (over the points long enough to show it, else all of them) and
    the smallest size reaching half of it."""
    if not points:
        return None, None
    sustained = [p for p in points if p["time_us"] >= SUSTAINED_S * 1e6] or points
    peak = max(p["busbw_Bps"] for p in sustained)
    half = next((p["bytes"] for p in points if p["busbw_Bps"] >= 0.5 * peak), None)
    return peak, int(half) if half is not None else None


def local_device(backend: str = "auto") -> Any:
    """This process's torch.device: the GPU its LOCAL_RANK picks (made current) unless `backend`
    is gloo or there is none; on the CPU, one thread per process, as the ranks of a host share
    its cores. The samples set their ranks up with it too."""
    import torch

    if torch.cuda.is_available() and backend != "gloo":
        local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    torch.set_num_threads(1)
    return torch.device("cpu")


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    import torch
    import torch.distributed as dist

    device = local_device(args.backend)
    use_cuda = device.type == "cuda"
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    multi = len(by_host) > 1
    groups = [{"scope": "world", "ranks": list(range(world)), "hosts": sorted(by_host),
               "link": "inter-node" if multi else ("intra-node" if use_cuda else "loopback"),
               "kind": None if multi else ("NVLink/PCIe" if use_cuda else "loopback"),
               "points": _sweep(dist, torch, None, world, device, args)}]
    if multi and max(len(v) for v in by_host.values()) > 1:
        # every rank must create every group, in the same order
        local_groups = {h: dist.new_group(ranks) for h, ranks in sorted(by_host.items())}
        mine = hosts[rank]
        pts = _sweep(dist, torch, local_groups[mine], len(by_host[mine]), device, args) \
            if len(by_host[mine]) > 1 else []
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, (mine, pts))
        seen = set()
        for h, p in gathered:
            if h in seen or not p:
                continue
            seen.add(h)
            groups.append({"scope": "host", "ranks": by_host[h], "hosts": [h],
                           "link": "intra-node" if use_cuda else "loopback",
                           "kind": "NVLink/PCIe" if use_cuda else "loopback", "points": p})
    if rank == 0:
        for g in groups:
            g["peak_busbw_Bps"], g["half_peak_bytes"] = _summary(g["points"])
        doc = {"format": "uberprof-calibration", "version": 1, "created_ns": time.time_ns(),
               "backend": backend, "world_size": world, "hosts": {str(r): h for r, h in
                                                                  enumerate(hosts)},
               "iters": args.iters, "groups": groups}
        out = os.path.abspath(args.out)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out), prefix=".calibration.")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, out)
    dist.barrier()
    dist.destroy_process_group()


class SweepFailed(Exception):
    """The sweep gave no result: why (one line) and the exit status to leave with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def launcher_prefix(command: list[str]) -> list[str]:
    """The launcher part of a recorded job command: everything before the training script
    (the first argument ending in .py after the launcher's own), or [] if there is none."""
    for i, arg in enumerate(command):
        if i > 0 and arg.endswith(".py") and not arg.startswith("-"):
            return list(command[:i])
    return []


def recorded_launcher(run: Any) -> list[str]:
    """The launcher of the job a run directory (a `RunDir`) recorded in its nodes' node.json,
    or [] when none can be told."""
    from uberprof.rundir import NODE_FILE, read_json

    for nd in run.node_dirs():
        try:
            prefix = launcher_prefix(read_json(nd / NODE_FILE).get("command") or [])
        except (OSError, ValueError):
            continue
        if prefix:
            return prefix
    return []


def run_sweep(prefix: list[str], out: str | os.PathLike[str], max_bytes: int, iters: int,
              timeout: float, starting: Callable[[list[str]], None] = lambda cmd: None) -> None:
    """Run this file under the launcher `prefix` (rank 0 writes `out`), told to `starting`
    first; raises `SweepFailed` when it gives no result."""
    cmd = [*prefix, __file__, "--out", str(out), "--max-bytes", str(max_bytes), "--iters",
           str(iters)]
    starting(cmd)
    try:
        proc = subprocess.run(cmd, timeout=timeout, check=False)
    except FileNotFoundError:
        raise SweepFailed(f"{prefix[0]}: command not found", 127) from None
    except subprocess.TimeoutExpired:
        raise SweepFailed(f"no result after {timeout:.0f} s", 124) from None
    if proc.returncode != 0:
        raise SweepFailed(f"the sweep failed (exit code {proc.returncode})", proc.returncode)


if __name__ == "__main__":
    main()
