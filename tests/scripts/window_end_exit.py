"""A short CPU/Gloo loop whose ranks end right after uberprof's trace window, for the tests of
the window's export (tests/jobs/test_window_export_jobs.py).

`torch.profiler.profile.export_chrome_trace` (uberprof's profiler inherits it) is wrapped:
it notes in `--record`.<rank> which thread ran it, writes `--record`.<rank>.started when it
begins, and waits `--export-delay` seconds first (sleeping, so the GIL is free), which makes
the export outlast whatever the training thread does next, so an exit that would cut it is
certain.

    --end none      run all --steps steps
    --end os_exit   every rank calls os._exit(3) right after the window's last step
    --end raise     every rank raises RuntimeError there
    --end kill      every rank SIGKILLs itself there
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import profile


def wrap_export(record: Path, delay_s: float) -> None:
    original = profile.export_chrome_trace

    def export_chrome_trace(self: profile, path: str, *args: object, **kwargs: object) -> None:
        rank = dist.get_rank()
        Path(f"{record}.{rank}.started").write_text(path)
        time.sleep(delay_s)
        original(self, path, *args, **kwargs)
        doc = {"main_thread": threading.current_thread() is threading.main_thread(),
               "thread": threading.current_thread().name, "path": path}
        Path(f"{record}.{rank}").write_text(json.dumps(doc))

    profile.export_chrome_trace = export_chrome_trace  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--window-last", type=int, required=True, help="the window's last step")
    ap.add_argument("--end", choices=["none", "os_exit", "raise", "kill"], default="none")
    ap.add_argument("--record", type=Path, required=True)
    ap.add_argument("--export-delay", type=float, default=0.0)
    args = ap.parse_args()
    wrap_export(args.record, args.export_delay)
    dist.init_process_group("gloo")
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        model(torch.randn(4, 16)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()  # uberprof's step boundary: the window stops in the last one's
        opt.zero_grad()
        if step == args.window_last and args.end != "none":
            if args.end == "os_exit":
                os._exit(3)
            if args.end == "raise":
                raise RuntimeError("ended right after the trace window")
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
