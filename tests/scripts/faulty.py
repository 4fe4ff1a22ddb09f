"""A tiny distributed loop (CPU/Gloo) where one rank misbehaves at one step, for the hang and
crash tests. Under torchrun, or with --spawn N (torch.multiprocessing.spawn, no torchrun).

    --fault sleep     rank R sleeps forever in Python before its collective of step S
    --fault spin      rank R spins forever in a Python loop there (busy, on the CPU)
    --fault pause     rank R sleeps --pause-s seconds there, then goes on
    --fault skip      rank R skips step S's all-reduce and waits in a collective of another group
    --fault mismatch  rank R skips a 1-element all-reduce that the others issue at step S
                      (its next one is 10,000 elements: Gloo aborts in C++)
    --fault mismatch-op  rank R calls broadcast where the others all-reduce, at step S
    --fault barrier   rank R skips step S's all-reduce and waits in a barrier
    --fault skip-one  every step all-reduces the gradients, then 10,000 statistics; rank R
                      skips the gradients' at step S (its statistics meet the others'
                      gradients: Gloo aborts on the size mismatch)
    --fault skip-logged  the model is wrapped in DDP (its gradients all-reduced by the reducer
                      in backward) and every step all-reduces the loss for logging after the
                      optimizer step; rank R skips that at step S: its next collective (the
                      bucket, in step S+1's backward) meets the others' loss and Gloo aborts
                      in a peer, while rank R is in backward, in no collective of its own
    --fault stop      rank R sends itself SIGSTOP at step S (frozen: alive, never answering)
    --fault raise     rank R raises RuntimeError at step S
    --fault kill      rank R kills itself with SIGKILL at step S
    --fault segv      rank R reads address 0 at step S (a segmentation fault, SIGSEGV)
    --fault exit      rank R ends with os._exit(3) at step S (no exception, no Python exit)
    --own-profiler    the script steps its own torch.profiler every step
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist

STATS = 10_000  # elements of the statistics that --fault skip-one all-reduces every step


def stuck_forever() -> None:
    while True:
        time.sleep(1)


def spin_forever() -> None:
    n = 0
    while True:  # pure Python work: the GIL is taken and given back, signals are handled
        n += 1


def train(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    pair = dist.new_group(sorted({0, args.rank}))  # every rank creates it, in the same order
    model = torch.nn.Linear(8, 8)
    if args.fault == "skip-logged":
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = None
    if args.own_profiler:
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1000, warmup=1, active=1))
        prof.start()
    bad = rank == args.rank
    for step in range(args.steps):
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        grad = torch.ones(4)
        if bad and step == args.at_step:
            if args.fault == "sleep":
                stuck_forever()
            if args.fault == "pause":
                time.sleep(args.pause_s)
            if args.fault == "raise":
                raise RuntimeError(f"boom at step {step}")
            if args.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.fault == "spin":
                spin_forever()
            if args.fault == "segv":
                import ctypes

                ctypes.string_at(0)  # reads address 0: SIGSEGV
            if args.fault == "exit":
                os._exit(3)
            if args.fault == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if args.fault == "skip":
                dist.all_reduce(grad, group=pair)  # rank 0 is in the default group: deadlock
        if args.fault == "mismatch" and step == args.at_step:
            if not bad:
                dist.all_reduce(torch.ones(1))
            dist.all_reduce(torch.ones(10_000))
        if bad and step == args.at_step and args.fault == "mismatch-op":
            dist.broadcast(grad, src=0)  # the others all-reduce
        elif bad and step == args.at_step and args.fault == "barrier":
            dist.barrier()  # the others all-reduce
        elif not (bad and step == args.at_step and args.fault == "skip-one"):
            dist.all_reduce(grad)
        if args.fault == "skip-one":
            stats = torch.ones(STATS)
            dist.all_reduce(stats)
        opt.step()
        opt.zero_grad()
        if args.fault == "skip-logged" and not (bad and step == args.at_step):
            dist.all_reduce(loss.detach().reshape(1))  # the loss, for logging
        if prof is not None:
            prof.step()
        time.sleep(args.step_s)
    if prof is not None:
        prof.stop()
    dist.destroy_process_group()


def spawned(i: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=world)
    train(args)


def main() -> None:
    ap = argparse.ArgumentParser()
    faults = ("none", "sleep", "pause", "skip", "mismatch", "mismatch-op", "barrier",
              "skip-one", "skip-logged", "stop", "raise", "kill", "spin", "segv", "exit")
    ap.add_argument("--fault", choices=faults, default="none")
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--at-step", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--step-s", type=float, default=0.05)
    ap.add_argument("--pause-s", type=float, default=20)
    ap.add_argument("--spawn", type=int, default=0, metavar="N")
    ap.add_argument("--own-profiler", action="store_true")
    args = ap.parse_args()
    if args.spawn:
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(spawned, args=(args.spawn, port, args), nprocs=args.spawn)
        return
    dist.init_process_group("gloo")
    train(args)


if __name__ == "__main__":
    sys.exit(main())
