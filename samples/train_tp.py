"""Tensor parallelism (Megatron-style) with DTensor on CPU/Gloo: every transformer block's
projections are split across all ranks of a 1-D device mesh.

    torchrun --standalone --nproc_per_node=2 samples/train_tp.py --steps 20

`init_device_mesh("cpu", (N,))` and `parallelize_module` with, per block, q/k/v and the MLP's
w1 as `ColwiseParallel` (each rank holds heads/N heads and 4*dim/N hidden units) and the
attention output wo and the MLP's w2 as `RowwiseParallel`. Each RowwiseParallel output is
all-reduced in forward (wo, w2) and each ColwiseParallel input's gradient in backward (q, k,
v, w1), through functional collectives (`_c10d_functional::all_reduce`, then
`_c10d_functional::wait_tensor`, where the rank blocks): 6 all-reduces of batch x seq x dim
floats per block per step (12 with the default 2 blocks), all on the critical path.
Embedding, final norm and head stay replicated (every rank the same data: one replica).
Weights are seeded, so runs are deterministic. --heads and 4*dim must divide by N.

By default the mesh creates the default process group (`init_device_mesh` with no prior
`init_process_group`, --pg-init mesh); then `dist.get_backend()` says "undefined" on torch
2.13, though the mesh's group runs Gloo (its `_get_backend_name()`). --pg-init explicit calls
`init_process_group("gloo")` first.

What a test can inject:
  --layers L        more blocks: more all-reduces per step
  --dim D           wider layers: larger all-reduces (B x seq x D floats each)
  --slow-rank R --slow-factor F   rank R does about F times its share of the blocks'
                    matrix products (the extra ones outside autograd): TP peers wait for it
                    inside the all-reduces
Rank 0 prints one line.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parallel_common as pc

# Megatron-style plan for one parallel_common.Block
BLOCK_PLAN = {
    "wq": ColwiseParallel(),
    "wk": ColwiseParallel(),
    "wv": ColwiseParallel(),
    "wo": RowwiseParallel(),
    "w1": ColwiseParallel(),
    "w2": RowwiseParallel(),
}


def tensor_parallel(model: pc.TinyLM, tp_mesh: DeviceMesh) -> pc.TinyLM:
    for block in model.blocks:
        parallelize_module(block, tp_mesh, BLOCK_PLAN)
    return model


def main(argv: list[str] | None = None) -> None:
    p = pc.base_parser(__doc__)
    p.add_argument("--slow-rank", type=int, default=-1, metavar="R")
    p.add_argument("--slow-factor", type=float, default=1.0, metavar="F")
    pc.add_pg_init_option(p)
    args = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2 or args.heads % world or (4 * args.dim) % world:
        p.error(f"needs 2 or more ranks under torchrun, dividing --heads {args.heads} "
                f"and 4 x --dim {args.dim}; got {world}")
    rank, mesh = pc.init_mesh((world,), ("tp",), args.pg_init)
    torch.manual_seed(args.seed)  # the same full weights on every rank before splitting
    model = tensor_parallel(pc.TinyLM(args.vocab, args.dim, args.layers, args.heads, args.seq),
                            mesh["tp"])
    loss, timer = pc.train_lm(model, args, rank, 0, shards=world, passes=3)  # fwd + bwd ~ 3x fwd
    pc.finish(rank, 0, f"trained {args.steps} TP steps on {world} rank(s) in {timer}, "
                    f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
    pc.exit_after_python()
