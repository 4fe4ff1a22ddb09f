"""Ranks started by `torch.multiprocessing.spawn` instead of torchrun (no RANK in the env).

    python samples/train_spawn.py --nprocs 2 --steps 20
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_ddp


def worker(rank: int, world: int, port: int, rest: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    train_ddp.main(rest + ["--backend", "gloo"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nprocs", type=int, default=2)
    args, rest = parser.parse_known_args()
    mp.spawn(worker, args=(args.nprocs, free_port(), rest), nprocs=args.nprocs)
