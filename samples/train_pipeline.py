"""Pipeline parallelism: a tiny language model cut into stages, one stage per rank, trained
with `torch.distributed.pipelining` on CPU/Gloo (activations and their gradients travel as
Gloo point-to-point `send`/`recv` between neighbouring stages; there is no collective in a
step).

    torchrun --standalone --nproc_per_node=2 samples/train_pipeline.py --steps 20
    torchrun --standalone --nproc_per_node=2 samples/train_pipeline.py --steps 20 \\
        --schedule 1f1b --microbatches 8 --heavy-stage 1 --heavy-factor 3

Stage i holds --layers-per-stage transformer blocks; stage 0 also the embedding, the last
stage the final norm, the vocabulary head and the loss. Every rank builds only its own stage
(`PipelineStage` given each stage's module by hand, with example input/output shapes: static
metadata, so no shape exchange at start), seeded per stage, so runs are deterministic. The
batch (--batch sequences) is cut into --microbatches micro-batches; --schedule gpipe runs all
forwards then all backwards (ScheduleGPipe), 1f1b interleaves them (Schedule1F1B, needs
micro-batches >= stages). Each stage has its own AdamW: one optimizer step per rank per step.

What a test can inject:
  --heavy-stage K --heavy-factor F   stage K holds round(F x layers-per-stage) blocks instead
                                     of layers-per-stage: an unbalanced pipeline whose other
                                     stages wait (idle in recv) for stage K
  --fault-steps A-B[,C-D]            the --heavy-stage split only on these steps (0-based,
                                     inclusive); on the others the same blocks in all are
                                     shared evenly between the stages (the imbalance and its
                                     fix measured in one job: benchmarks/whatif.py --in-job)
  --microbatches M                   fewer micro-batches, a larger pipeline bubble
The world size is the number of stages (2 or more). The last stage prints one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_common import (
    Block,
    Timer,
    base_parser,
    batch,
    exit_after_python,
    finish,
    init_gloo,
    lm_loss,
    step_set,
)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
Schedule = ScheduleGPipe | Schedule1F1B


class StageModule(nn.Module):
    """One pipeline stage: [embedding] -> blocks -> [norm -> head]. With --fault-steps it holds
    the blocks of both splits and runs `active` of them (set per step by `train_steps`); a
    block left out gets no gradient, so the optimizer skips it too."""

    def __init__(self, args: argparse.Namespace, stage: int, num_stages: int) -> None:
        super().__init__()
        self.first, self.last = stage == 0, stage == num_stages - 1
        n_blocks = stage_blocks(args, stage)
        self.active = n_blocks
        if args.fault_steps is not None:
            n_blocks = max(n_blocks, balanced_blocks(args, num_stages))
        if self.first:
            self.embed = nn.Embedding(args.vocab, args.dim)
            self.pos = nn.Parameter(torch.zeros(1, args.seq, args.dim))
        self.blocks = nn.ModuleList(Block(args.dim, args.heads) for _ in range(n_blocks))
        if self.last:
            self.norm = nn.LayerNorm(args.dim)
            self.head = nn.Linear(args.dim, args.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.pos
        for block in self.blocks[:self.active]:
            x = block(x)
        return self.head(self.norm(x)) if self.last else x


def stage_blocks(args: argparse.Namespace, stage: int) -> int:
    if stage == args.heavy_stage:
        return max(1, round(args.heavy_factor * args.layers_per_stage))
    return args.layers_per_stage


def total_blocks(args: argparse.Namespace, num_stages: int) -> int:
    """The blocks of all stages together (the same in either split)."""
    return sum(stage_blocks(args, s) for s in range(num_stages))


def balanced_blocks(args: argparse.Namespace, num_stages: int) -> int:
    """Each stage's blocks once the split's blocks in all are shared evenly."""
    return total_blocks(args, num_stages) // num_stages


def add_pipeline_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4, metavar="M")
    p.add_argument("--layers-per-stage", type=int, default=2)
    p.add_argument("--heavy-stage", type=int, default=-1, metavar="K")
    p.add_argument("--heavy-factor", type=float, default=1.0, metavar="F")
    p.add_argument("--fault-steps", type=step_set, default=None, metavar="A-B[,C-D]")


def check_pipeline_options(p: argparse.ArgumentParser, args: argparse.Namespace,
                           num_stages: int) -> None:
    if args.batch % args.microbatches:
        p.error(f"--batch {args.batch} is not a multiple of --microbatches {args.microbatches}")
    if args.schedule == "1f1b" and args.microbatches < num_stages:
        p.error(f"1f1b needs --microbatches >= {num_stages} stages")
    if args.heavy_stage >= num_stages:
        p.error(f"--heavy-stage {args.heavy_stage}: there are only {num_stages} stages")
    if args.fault_steps is not None:
        total = total_blocks(args, num_stages)
        if args.heavy_stage < 0 or total % num_stages:
            p.error(f"--fault-steps needs --heavy-stage and blocks that share evenly "
                    f"({total} over {num_stages} stages)")


def build_schedule(args: argparse.Namespace, stage: int, num_stages: int,
                   group: dist.ProcessGroup | None = None,
                   wrap: Callable[[nn.Module], nn.Module] | None = None,
                   ) -> tuple[nn.Module, Schedule]:
    """This rank's stage module (wrapped by `wrap`, e.g. DDP, when given), its PipelineStage
    on `group` (default: the world) and the schedule; returns (module, schedule)."""
    torch.manual_seed(args.seed * 1000 + stage)  # each stage's weights, the same every run
    module: nn.Module = StageModule(args, stage, num_stages)
    if wrap is not None:
        module = wrap(module)
    mb = args.batch // args.microbatches
    cpu = torch.device("cpu")
    # example tensors (static metadata); float ones require grad: their gradients travel back
    x_in = (torch.zeros(mb, args.seq, dtype=torch.long) if stage == 0
            else torch.zeros(mb, args.seq, args.dim, requires_grad=True))
    x_out = torch.zeros(mb, args.seq, args.vocab if stage == num_stages - 1 else args.dim,
                        requires_grad=True)
    pipe_stage = PipelineStage(module, stage, num_stages, cpu, input_args=x_in,
                               output_args=x_out, group=group)
    sched_cls = SCHEDULES[args.schedule]
    schedule = sched_cls(pipe_stage, n_microbatches=args.microbatches, loss_fn=lm_loss)
    return module, schedule


def train_steps(args: argparse.Namespace, module: nn.Module, schedule: Schedule, stage: int,
                num_stages: int, replica: int) -> float:
    """--steps pipeline steps; the last stage's mean micro-batch loss of the last step."""
    opt = torch.optim.AdamW(module.parameters(), lr=args.lr)
    loss = float("nan")
    even = balanced_blocks(args, num_stages)
    for step in range(args.steps):
        x, y = batch(step, replica, args)
        if args.fault_steps is not None:  # the heavy split on the fault steps, else even
            module.active = (
                stage_blocks(args, stage) if step in args.fault_steps else even)
        opt.zero_grad(set_to_none=True)
        if stage == 0:
            schedule.step(x)
        elif stage == num_stages - 1:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
            loss = torch.stack(losses).mean().item()
        else:
            schedule.step()
        opt.step()
    return loss


def main(argv: list[str] | None = None) -> None:
    p = base_parser(__doc__)
    add_pipeline_options(p)
    args = p.parse_args(argv)
    check_pipeline_options(p, args, int(os.environ.get("WORLD_SIZE", "2")))
    rank, world = init_gloo()
    timer = Timer()
    module, schedule = build_schedule(args, rank, world)
    loss = train_steps(args, module, schedule, rank, world, replica=0)
    finish(rank, world - 1,
           f"trained {args.steps} pipeline steps ({args.schedule}, {args.microbatches} "
           f"micro-batches, {world} stages) in {timer}, final loss {loss:.3f}")


if __name__ == "__main__":
    main()
    exit_after_python()
