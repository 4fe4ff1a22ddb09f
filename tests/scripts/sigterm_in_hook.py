"""A rank whose own excepthook receives a SIGTERM (as from a launcher ending it after a peer
died) before it prints: the crash record is written whole and the hook runs to its end before
the signal takes its course."""

from __future__ import annotations

import os
import signal
import sys

import torch
import torch.distributed as dist


def own_hook(t: type[BaseException], v: BaseException, tb: object) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    print("the script's hook ran to its end", file=sys.stderr, flush=True)


sys.excepthook = own_hook  # before uberprof's capture arms (at the process group): chained
dist.init_process_group("gloo")
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
raise ValueError("the error the launcher's SIGTERM must not swallow")
