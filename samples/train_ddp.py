"""A small transformer trained with DDP on synthetic data: uberprof's demo and test workload.

CPU/Gloo or GPU/NCCL is chosen automatically. Fault knobs make one rank misbehave, for demos
and tests of the diagnosis:
  --slow-rank R --slow-compute X   rank R does X times the compute (a straggler)
  --slow-rank R --slow-factor F    rank R computes F times as long per step as it otherwise
                                   would (extra matrix products; fractional, e.g. 1.3)
  --slow-data-rank R --data-delay-ms D   rank R's data loader waits D ms per batch
  --host-work-ms H                 every rank does H ms of extra host work per step
  --sleep-rank R --sleep-ms S      rank R sleeps S ms per step on its training thread (off the
                                   CPU by its own doing, as blocking I/O or a lock would be)
  --sleep-steps A-B[,C-D]          the sleep fault on these steps instead of --fault-steps
                                   (a rank that leaves the others slack all along, and a
                                   slow rank from a later step inside it)
  --fault-steps A-B[,C-D]          the slow-rank, slow-data and sleep faults above only on
                                   these steps (0-based, inclusive); the job's other steps are
                                   healthy (a problem and its fix measured in one job:
                                   benchmarks/whatif.py --in-job)
  --link-rates SLOW,FAST           this rank's node link (the tc tbf qdisc on the interface
                                   GLOO_SOCKET_IFNAME names) at SLOW on the --fault-steps, at
                                   FAST on the others, set at each step's start (root in the
                                   node's network namespace: benchmarks/whatif.py's link pair
                                   in one job)
  --extra-matmul N                 every rank multiplies two 256x256 matrices N more times
                                   per step (a code change that costs compute: uberprof diff)
  --bucket-cap-mb MB --no-overlap  DDP buckets of MB; each all-reduced inside backward,
                                   blocking it (communication exposed)
  --tiny-allreduces N              every rank all-reduces N separate 4-float tensors per step
                                   (many small collectives: latency-bound)
  --accum N                        gradient accumulation: N micro-batches per optimizer step,
                                   all but the last under DDP's no_sync() (gradients reduced
                                   once per step; a healthy job with uneven collectives)
  --start-gate FILE                each rank adds a line to FILE.ready, then waits for FILE to
                                   exist before its first step (jobs side by side start
                                   together: tests of `uberprof diff`)
  --oom-rank R --oom-step S        rank R runs out of memory at step S: on a GPU it asks for
                                   more than the device holds (torch.OutOfMemoryError from the
                                   CUDA allocator); on the CPU, where Linux would rather kill
                                   the process, it raises the same error itself
  --device cuda --backend gloo     Gloo on CUDA tensors: several ranks share one GPU (NCCL
                                   refuses two ranks on one device)
  --backend nccl (or gloo)         a process group and DDP even with one rank (NCCL kernels
                                   on a single GPU)
Run it alone (`python samples/train_ddp.py`) or under torchrun.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Container

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from uberprof.collect.calibrate import local_device
from uberprof.collect.config import TraceSchedule


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos))


class SyntheticTokens(Dataset):
    """Seeded random tokens; `delay_s` per sample read (a slow loader), only for the samples of
    steps `delayed` (step numbers, `per_step` samples a step) when given."""

    def __init__(self, n: int, seq: int, vocab: int, delay_s: float,
                 delayed: Container[int] | None = None, per_step: int = 1) -> None:
        self.n, self.seq, self.vocab, self.delay_s = n, seq, vocab, delay_s
        self.delayed, self.per_step = delayed, per_step

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s and (self.delayed is None or i // self.per_step in self.delayed):
            time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        return x[:-1], x[1:]


class LinkShaper:
    """Switches this node's link between two tc rates (`tc qdisc change` of the tbf qdisc that
    tests/netns.py puts on the node's veth); a change only where the rate differs. It runs at a
    step's start, when the last step's all-reduce is over, so each step runs at one rate."""

    def __init__(self, dev: str, slow: str, fast: str) -> None:
        self.dev, self.slow, self.fast = dev, slow, fast
        self.now: str | None = None

    @classmethod
    def from_option(cls, text: str | None) -> LinkShaper | None:
        if not text:
            return None
        slow, _, fast = text.partition(",")
        dev = os.environ.get("GLOO_SOCKET_IFNAME")
        if not (slow and fast and dev):
            raise SystemExit("--link-rates needs SLOW,FAST and GLOO_SOCKET_IFNAME naming the "
                             "node's shaped interface")
        return cls(dev, slow, fast)

    def set(self, slow: bool) -> None:
        rate = self.slow if slow else self.fast
        if rate != self.now:
            subprocess.run(["tc", "qdisc", "change", "dev", self.dev, "root", "tbf", "rate",
                            rate, "burst", "256kb", "latency", "50ms"], check=True,
                           capture_output=True)
            self.now = rate


def step_set(text: str) -> frozenset[int]:
    """`A-B[,C-D]` (inclusive, as `uberprof run --trace-steps` reads it) as step numbers."""
    try:
        windows = TraceSchedule.parse_steps(text).windows
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return frozenset(s for a, b in windows for s in range(a, b + 1))


def model_parser(doc: str | None, steps: int) -> argparse.ArgumentParser:
    """The options every sample shares: how many steps, the model's shape and the seed."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = model_parser(__doc__, steps=30)
    p.add_argument("--workers", type=int, default=0, help="data-loader worker processes")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-compute", type=float, default=1.0)
    p.add_argument("--slow-factor", type=float, default=1.0, metavar="F")
    p.add_argument("--slow-data-rank", type=int, default=-1)
    p.add_argument("--data-delay-ms", type=float, default=0.0)
    p.add_argument("--fault-steps", type=step_set, default=None, metavar="A-B[,C-D]")
    p.add_argument("--link-rates", default=None, metavar="SLOW,FAST")
    p.add_argument("--host-work-ms", type=float, default=0.0)
    p.add_argument("--sleep-rank", type=int, default=-1)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--sleep-steps", type=step_set, default=None, metavar="A-B[,C-D]")
    p.add_argument("--extra-matmul", type=int, default=0, metavar="N")
    p.add_argument("--bucket-cap-mb", type=float, default=None, metavar="MB")
    p.add_argument("--no-overlap", action="store_true")
    p.add_argument("--tiny-allreduces", type=int, default=0, metavar="N")
    p.add_argument("--accum", type=int, default=1, metavar="N",
                   help="micro-batches per optimizer step (gradient accumulation)")
    p.add_argument("--start-gate", metavar="FILE")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: the GPU when there is one, unless --backend gloo")
    p.add_argument("--oom-rank", type=int, default=-1)
    p.add_argument("--oom-step", type=int, default=-1)
    p.add_argument("--memory-file", metavar="FILE",
                   help="each rank writes its device's torch.cuda.max_memory_allocated() and\n"
                        "memory_allocated() at the end to FILE.<rank> (JSON; checks of the\n"
                        "memory view)")
    p.add_argument("--step-times", metavar="FILE",
                   help="rank 0 writes each step's wall time (s) here, as JSON (benchmarks)")
    p.add_argument("--step-cpu-times", metavar="FILE",
                   help="rank 0 writes each step's CPU time of the training thread (s) here, "
                        "as JSON: what the work cost, whatever the OS scheduler did (benchmarks)")
    return p.parse_args(argv)


def setup(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    """Rank, world size and device; joins the process group unless the caller already did."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = "RANK" in os.environ and (world > 1 or args.backend != "auto")
    device = _device(args)
    if dist.is_initialized():  # started by something else, e.g. samples/train_spawn.py
        return dist.get_rank(), dist.get_world_size(), device
    if distributed:
        backend = args.backend if args.backend != "auto" else (
            "nccl" if device.type == "cuda" else "gloo")
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
        return dist.get_rank(), dist.get_world_size(), device
    return 0, 1, device


def _device(args: argparse.Namespace) -> torch.device:
    """The rank's device: `local_device` unless --device names one (Gloo on CUDA tensors)."""
    if args.device == "auto":
        return local_device(args.backend)
    if args.device == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return local_device("gloo")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run(argv, "DDP", lambda model, device: ddp(model, device, args))


def ddp(model: nn.Module, device: torch.device, args: argparse.Namespace) -> DDP:
    """DDP with the sample's bucket size; with --no-overlap every bucket is all-reduced
    synchronously inside backward, so no communication hides under compute."""
    extra = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **extra)
    if args.no_overlap:
        wrapped.register_comm_hook(None, _blocking_allreduce)
    return wrapped


def _wait_at_gate(gate: str) -> None:
    """Say this rank is ready (a line in `gate`.ready), then wait until `gate` exists: whoever
    runs several jobs side by side opens it once all are ready, so their steps line up."""
    with open(gate + ".ready", "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    while not os.path.exists(gate):
        time.sleep(0.005)


def _blocking_allreduce(state, bucket):  # type: ignore[no-untyped-def]
    # unannotated: DDP rejects the string annotations of `from __future__ import annotations`
    t = bucket.buffer()
    dist.all_reduce(t)  # backward waits here until the bucket is reduced
    t.div_(dist.get_world_size())
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


def run(argv: list[str] | None, kind: str,
        wrap: Callable[[TinyTransformer, torch.device], nn.Module]) -> None:
    """The samples' main: options, process group, the model on its device, wrapped by `wrap`
    (DDP, FSDP, ...) when there is more than one rank, then the training loop."""
    args = parse_args(argv)
    rank, world, device = setup(args)
    torch.manual_seed(args.seed)
    model: nn.Module = TinyTransformer(args.vocab, args.dim, args.layers, args.heads,
                                       args.seq).to(device)
    if dist.is_initialized():
        model = wrap(model, device)  # type: ignore[arg-type]
    train(model, args, rank, world, device, kind)
    if args.memory_file and device.type == "cuda":
        with open(f"{args.memory_file}.{rank}", "w") as f:
            json.dump({"max_memory_allocated": torch.cuda.max_memory_allocated(device),
                       "memory_allocated": torch.cuda.memory_allocated(device)}, f)
    if dist.is_initialized():
        leave()


def leave() -> None:
    """Leave the process group only once every rank is done with it (a barrier), so no rank
    tears its Gloo connections down while a peer's collective is still in flight on them.

    This does not end Gloo's `pt_gloo_runloop`/`gloo_tcp_loop` threads: after DDP (torch
    2.13) something keeps the group alive past `destroy_process_group()`, even with the model
    deleted and collected, so they still end during interpreter shutdown.
    """
    dist.barrier()
    dist.destroy_process_group()


def train(model: nn.Module, args: argparse.Namespace, rank: int, world: int,
          device: torch.device, kind: str) -> None:
    """The training loop shared by the samples, with the fault knobs applied on their rank."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    delay = args.data_delay_ms / 1e3 if rank == args.slow_data_rank else 0.0
    accum = max(1, args.accum)
    faulty = args.fault_steps if args.fault_steps is not None else range(args.steps)
    data = SyntheticTokens(args.steps * accum * args.batch, args.seq, args.vocab, delay,
                           faulty, accum * args.batch)
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers)
    batches = iter(loader)
    extra_set = max(0, round(args.slow_compute) - 1) if rank == args.slow_rank else 0
    slow_set = args.slow_factor if rank == args.slow_rank else 1.0
    own: list[float] = []  # this rank's steps so far, without the slow-factor work
    loss_fn = nn.CrossEntropyLoss()
    if args.start_gate:
        _wait_at_gate(args.start_gate)
    t_start = t_prev = time.perf_counter()
    cpu_prev = time.thread_time()
    durations, cpu_times = [], []
    shaper = LinkShaper.from_option(args.link_rates)
    for step in range(args.steps):
        extra, slow_factor = (extra_set, slow_set) if step in faulty else (0, 1.0)
        if shaper is not None:
            shaper.set(step in faulty)
        micro = [next(batches) for _ in range(accum)]
        t_step = time.perf_counter()
        if rank == args.oom_rank and step == args.oom_step:
            _run_out_of_memory(device)
        if accum > 1:  # all micro-batches but the last: gradients kept local, added up
            opt.zero_grad(set_to_none=True)
            _accumulate(model, loss_fn, micro[:-1], accum, args.vocab, device)
        x, y = micro[-1]
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, args.vocab), y.reshape(-1))
        if accum > 1:
            loss = loss / accum
        for _ in range(extra):  # a straggler: the same work again, outside autograd
            with torch.no_grad():
                model(x)
        if args.host_work_ms:
            _busy_wait(args.host_work_ms / 1e3)
        if rank == args.sleep_rank and args.sleep_ms and step in (
                faulty if args.sleep_steps is None else args.sleep_steps):
            time.sleep(args.sleep_ms / 1e3)
        if args.extra_matmul:  # extra aten::mm work on every rank, outside autograd
            m = torch.ones(256, 256, device=device)
            for _ in range(args.extra_matmul):
                m = torch.mm(m, m).clamp_(-1.0, 1.0)
        t_slow = time.perf_counter()
        if slow_factor > 1.0 and own:  # a straggler by a fraction of its own step
            _compute_for((slow_factor - 1.0) * statistics.median(own[-9:]), device)
        t_slow = time.perf_counter() - t_slow
        if accum == 1:
            opt.zero_grad(set_to_none=True)
        loss.backward()  # with DDP: the step's one gradient all-reduce
        opt.step()
        for _ in range(args.tiny_allreduces if world > 1 else 0):  # metrics, one at a time
            dist.all_reduce(torch.ones(4, device=device))
        own.append(time.perf_counter() - t_step - t_slow)
        if args.step_times:
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            durations.append(now - t_prev)
            t_prev = now
        if args.step_cpu_times:
            cpu_now = time.thread_time()
            cpu_times.append(cpu_now - cpu_prev)
            cpu_prev = cpu_now
    if args.step_times and rank == 0:
        with open(args.step_times, "w") as f:
            json.dump(durations, f)
    if args.step_cpu_times and rank == 0:
        with open(args.step_cpu_times, "w") as f:
            json.dump(cpu_times, f)
    if device.type == "cuda":
        torch.cuda.synchronize()
    if rank == 0:
        elapsed = time.perf_counter() - t_start
        what = "steps" if kind == "DDP" else f"{kind} steps"
        print(f"trained {args.steps} {what} on {world} rank(s) in {elapsed:.2f} s, "
              f"final loss {loss.item():.3f}", flush=True)


def _accumulate(model: nn.Module, loss_fn: nn.Module,
                micro: list[tuple[torch.Tensor, torch.Tensor]], accum: int, vocab: int,
                device: torch.device) -> None:
    """Forward and backward of micro-batches whose gradients are only added up locally: under
    DDP's `no_sync()` no all-reduce runs, so the step's last micro-batch reduces them all."""
    sync_off = model.no_sync() if isinstance(model, DDP) else contextlib.nullcontext()
    with sync_off:
        for x, y in micro:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = loss_fn(model(x).reshape(-1, vocab), y.reshape(-1)) / accum
            loss.backward()


def _compute_for(seconds: float, device: torch.device) -> None:
    """Matrix products (device compute, outside autograd) for about `seconds`."""
    end = time.perf_counter() + seconds
    m = torch.ones(128, 128, device=device)
    while time.perf_counter() < end:
        m = torch.mm(m, m).clamp_(-1.0, 1.0)
        if device.type == "cuda":
            torch.cuda.synchronize()


def _run_out_of_memory(device: torch.device) -> None:
    """Ask for more memory than there is: on a GPU the CUDA allocator raises
    torch.OutOfMemoryError; on the CPU Linux would overcommit and kill the process later, so
    the sample raises the error the CUDA allocator would have."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.empty(total + (1 << 30), dtype=torch.uint8, device=device)
    raise torch.OutOfMemoryError(
        "CUDA out of memory (raised by samples/train_ddp.py --oom-rank on the CPU)")


def _busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def exit_after_python() -> None:
    """End the script once Python's exit work is done (atexit handlers, a profiler's included),
    skipping only the interpreter's final C++ teardown. After DDP, torch 2.13 leaves Gloo's
    threads running past `destroy_process_group()`; tearing them down at interpreter exit now
    and then aborts a finished rank ("terminate called without an active exception", SIGABRT)
    on busy machines. A sample that trained fine should exit 0."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_after_python()
