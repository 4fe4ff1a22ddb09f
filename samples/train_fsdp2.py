"""FSDP2 (`torch.distributed.fsdp.fully_shard`) with activation checkpointing, on CPU/Gloo.

    torchrun --standalone --nproc_per_node=2 samples/train_fsdp2.py --steps 20

A tiny transformer; each block is its own FSDP2 unit (`fully_shard(block)`), then the root
(embedding, norm, head). Every step each unit all-gathers its parameters before forward and
again before backward (reshard_after_forward, the default), and reduce-scatters its gradients
after backward: all-gather and reduce-scatter on every step. Gloo has no native
reduce-scatter: `c10d::_reduce_scatter_base_` launches show up, run as `gloo:all_reduce` of
the full gradient buffer. Each rank trains on its own batch (data parallel).

Activation checkpointing uses `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`
inside each block's forward (public API; `checkpoint_wrapper` lives in a private module,
torch.distributed.algorithms._checkpoint): in backward the block's forward runs again, so its
compute ops appear twice. --no-checkpoint turns it off.

What a test can inject:
  --layers L              more FSDP units: more all-gathers / reduce-scatters per step
  --dim D                 larger parameters: larger collectives
  --no-reshard            reshard_after_forward=False: no second all-gather in backward
  --slow-rank R --slow-factor F   rank R does about F times its block compute (extra
                          matrix products outside autograd): the others wait in the
                          collectives
Weights and batches are seeded, so runs are deterministic. Rank 0 prints one line.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_common import TinyLM, base_parser, exit_after_python, finish, init_gloo, train_lm

# The root module's logits are a view; nothing in this loop modifies them in place.
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


def shard(model: TinyLM, mesh: DeviceMesh | None = None, reshard: bool = True) -> TinyLM:
    """Each block one FSDP2 unit, then the root module (on `mesh`, default: the world)."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def main(argv: list[str] | None = None) -> None:
    p = base_parser(__doc__)
    p.add_argument("--no-checkpoint", action="store_true")
    p.add_argument("--no-reshard", action="store_true")
    p.add_argument("--slow-rank", type=int, default=-1, metavar="R")
    p.add_argument("--slow-factor", type=float, default=1.0, metavar="F")
    args = p.parse_args(argv)
    rank, world = init_gloo()
    torch.manual_seed(args.seed)  # the same full weights on every rank before sharding
    model = TinyLM(args.vocab, args.dim, args.layers, args.heads, args.seq,
                   checkpointed=not args.no_checkpoint)
    shard(model, reshard=not args.no_reshard)
    loss, timer = train_lm(model, args, rank, rank)  # fwd + recompute + bwd ~ 4x fwd
    finish(rank, 0, f"trained {args.steps} FSDP2 steps on {world} rank(s) in {timer}, "
                    f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
    exit_after_python()
