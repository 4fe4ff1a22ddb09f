"""samples/train_ddp.py's model and data under DDP for as long as a test looks at the job: after
each step the ranks agree (a one-float MAX all-reduce) whether the file named by --stop exists,
and all of them end after that same step, with exit 0. --max-seconds bounds the job, so one whose
test died still ends by itself.

Why: the tests that follow a running job (`uberprof watch` in tmux, the live dashboard) need it
running while they look and ended after. A fixed step count had to outlast the slowest look on
a loaded machine (150 steps of 60 ms waits, 1-2 minutes a test), and still depended on that
luck; here the test says when it has seen enough."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "samples"))
import train_ddp as sample


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stop", required=True, metavar="FILE", help="end once this file exists")
    p.add_argument("--max-seconds", type=float, default=540.0,
                   help="end after this long, stop file or not")
    p.add_argument("--slow-data-rank", type=int, default=-1)
    p.add_argument("--data-delay-ms", type=float, default=0.0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    dflt = sample.parse_args([])  # the sample's model and batch
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        sample.TinyTransformer(dflt.vocab, dflt.dim, dflt.layers, dflt.heads, dflt.seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    delay = args.data_delay_ms / 1e3 if rank == args.slow_data_rank else 0.0
    data = sample.SyntheticTokens(10**9, dflt.seq, dflt.vocab, delay)  # made as it is read
    batches = iter(DataLoader(data, batch_size=dflt.batch))
    loss_fn = nn.CrossEntropyLoss()
    stop = torch.zeros(1)
    t0, done = time.perf_counter(), 0
    while True:
        x, y = next(batches)
        loss = loss_fn(model(x).reshape(-1, dflt.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        done += 1
        late = time.perf_counter() - t0 > args.max_seconds
        stop.fill_(1.0 if late or os.path.exists(args.stop) else 0.0)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank ends after the same step
        if stop.item():
            break
    if rank == 0:
        print(f"trained {done} steps on {world} rank(s) in {time.perf_counter() - t0:.2f} s",
              flush=True)
    sample.leave()


if __name__ == "__main__":
    main()
