"""The DDP sample's transformer, sharded with FSDP (`fully_shard`) instead of replicated.

Same options as samples/train_ddp.py. On CPU it runs with Gloo; all-gathers and
reduce-scatters then show up as `gloo:all_gather` / `gloo:all_reduce` in traces.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import SyntheticTokens, TinyTransformer, parse_args, setup  # noqa: E402


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
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    delay = args.data_delay_ms / 1e3 if rank == args.slow_data_rank else 0.0
    data = SyntheticTokens(args.steps * args.batch, args.seq, args.vocab, delay)
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers)
    loss_fn = nn.CrossEntropyLoss()
    t_start = time.perf_counter()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model(x).reshape(-1, args.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step + 1 >= args.steps:
            break
    if rank == 0:
        print(f"trained {args.steps} FSDP steps on {world} rank(s) in "
              f"{time.perf_counter() - t_start:.2f} s, final loss {loss.item():.3f}", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
