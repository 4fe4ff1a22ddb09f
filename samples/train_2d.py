"""Two parallelisms at once on a 2x2 device mesh (4 ranks), CPU/Gloo.

    torchrun --standalone --nproc_per_node=4 samples/train_2d.py --layout fsdp_tp --steps 20
    torchrun --standalone --nproc_per_node=4 samples/train_2d.py --layout pp_dp --steps 20

--layout fsdp_tp   mesh ("dp", "tp") = [[0, 1], [2, 3]]: tensor parallel inside each row
                   (ranks 0+1, 2+3; the train_tp.py plan on every block), then FSDP2
                   (`fully_shard(..., mesh=mesh["dp"])`) across rows (ranks 0+2, 1+3), so
                   parameters are 2-D DTensors. Per step: TP all-reduces in the (0,1) and
                   (2,3) groups; all-gathers and reduce-scatters (Gloo: all_reduce of the full
                   buffer) in the (0,2) and (1,3) groups. Each row trains on its own batch.
                   No activation checkpointing here (train_fsdp2.py has it).
--layout pp_dp     mesh ("pp", "dp") = [[0, 1], [2, 3]]: 2 pipeline stages (ranks 0,1 hold
                   stage 0; ranks 2,3 stage 1; the pipes are 0->2 and 1->3, Gloo send/recv
                   in the (0,2) and (1,3) groups) x 2 data-parallel replicas: each stage
                   module wrapped in DDP on its dp group ((0,1) and (2,3)); the pipelining
                   schedule runs DDP's no_sync for all but the last micro-batch's backward,
                   so DDP all-reduces its gradient buckets once per step (2 buckets with the
                   defaults). Each replica trains on its own batch. The train_pipeline.py
                   options apply (--schedule, --microbatches, --heavy-stage, --heavy-factor,
                   --layers-per-stage).

What a test can inject: with pp_dp, --heavy-stage K --heavy-factor F (an unbalanced pipeline:
stage K's ranks are the slow ones, the other stage's wait in recv); with fsdp_tp,
--slow-rank R --slow-factor F (rank R does about F times its block compute, as extra matrix
products outside autograd: its TP peer waits in the all-reduces, its DP peer in the
all-gathers / reduce-scatters). Weights and batches are seeded, so runs are deterministic.

Needs exactly 4 ranks. The mesh creates the default process group (--pg-init mesh, the
default; `dist.get_backend()` then says "undefined" on torch 2.13 though every group runs
Gloo); --pg-init explicit calls `init_process_group("gloo")` first. One line is printed at the
end (rank 0 for fsdp_tp; the last stage of replica 0, rank 2, for pp_dp).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_common import (
    Timer,
    TinyLM,
    add_pg_init_option,
    base_parser,
    exit_after_python,
    finish,
    init_mesh,
    train_lm,
)
from train_fsdp2 import shard
from train_pipeline import (
    add_pipeline_options,
    build_schedule,
    check_pipeline_options,
    train_steps,
)
from train_tp import tensor_parallel

warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


def fsdp_tp(args: argparse.Namespace, rank: int, mesh: DeviceMesh) -> None:
    replica = mesh.get_local_rank("dp")
    torch.manual_seed(args.seed)  # the same full weights on every rank before splitting
    model = TinyLM(args.vocab, args.dim, args.layers, args.heads, args.seq)
    tensor_parallel(model, mesh["tp"])
    shard(model, mesh=mesh["dp"])
    loss, timer = train_lm(model, args, rank, replica, shards=2)
    finish(rank, 0, f"trained {args.steps} FSDP2 x TP steps (2x2 mesh) in {timer}, "
                    f"final loss {loss.item():.3f}")


def pp_dp(args: argparse.Namespace, rank: int, mesh: DeviceMesh) -> None:
    stage, replica = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    dp_group = mesh["dp"].get_group()
    module, schedule = build_schedule(args, stage, 2, group=mesh["pp"].get_group(),
                                      wrap=lambda m: DDP(m, process_group=dp_group))
    timer = Timer()
    loss = train_steps(args, module, schedule, stage, 2, replica)
    finish(rank, 2, f"trained {args.steps} PP x DP steps ({args.schedule}, "
                    f"{args.microbatches} micro-batches, 2 stages x 2 replicas) in {timer}, "
                    f"final loss {loss:.3f}")


def main(argv: list[str] | None = None) -> None:
    p = base_parser(__doc__)
    p.add_argument("--layout", choices=["fsdp_tp", "pp_dp"], required=True)
    p.add_argument("--slow-rank", type=int, default=-1, metavar="R")
    p.add_argument("--slow-factor", type=float, default=1.0, metavar="F")
    add_pipeline_options(p)
    add_pg_init_option(p)
    args = p.parse_args(argv)
    check_pipeline_options(p, args, 2)
    if args.fault_steps is not None:  # blocks left out on some steps: DDP wants every gradient
        p.error("--fault-steps is train_pipeline.py's (no DDP over the stages)")
    names = ("dp", "tp") if args.layout == "fsdp_tp" else ("pp", "dp")
    rank, mesh = init_mesh((2, 2), names, args.pg_init)
    (fsdp_tp if args.layout == "fsdp_tp" else pp_dp)(args, rank, mesh)


if __name__ == "__main__":
    main()
    exit_after_python()
