"""The DDP sample's transformer, sharded with FSDP (`fully_shard`) instead of replicated.

Same options as samples/train_ddp.py. On CPU it runs with Gloo; all-gathers and
reduce-scatters then show up as `gloo:all_gather` / `gloo:all_reduce` in traces.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import TinyTransformer, parse_args, setup, train

# The root module's logits are a view; nothing in this loop modifies them in place.
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank, world, device = setup(args)
    torch.manual_seed(args.seed)
    model = TinyTransformer(args.vocab, args.dim, args.layers, args.heads, args.seq).to(device)
    if world > 1:
        for layer in model.encoder.layers:
            fully_shard(layer)
        fully_shard(model)
    train(model, args, rank, world, device, "FSDP")


if __name__ == "__main__":
    main()
