"""Expert parallelism (a mixture of experts) on CPU/Gloo: every rank holds its own experts, and
tokens travel to the rank of the expert their router picks and back, through all-to-alls.

    torchrun --standalone --nproc_per_node=2 samples/train_moe.py --steps 20

The model: an embedding, `--layers` MoE layers (a top-1 router over `--experts` experts a rank,
each expert an MLP of dim -> 4*dim -> dim) and a vocabulary head. In each MoE layer the ranks
first exchange how many tokens each sends to each (an all-to-all of counts), then dispatch the
tokens (`all_to_all_single` with unequal splits, `c10d::alltoall_base_`), run their experts and
combine the results back (a second all-to-all); backward runs both all-to-alls again. The
embedding, router and head are replicated: their gradients are averaged with one all-reduce a
step (`--dense ddp`: DistributedDataParallel over them instead, as a job that wraps its dense
part in DDP would).

What a test can inject:
  --optimizer fused|foreach|plain   AdamW's implementation (fused=True, foreach=True, or the
                    per-parameter loop): what the host-work remedy reads
  --skew S          the router sends a share S of every rank's tokens to rank 0's experts
                    (unequal splits: the ranks wait for the one that receives most)
Weights and batches are seeded, so runs are deterministic. Rank 0 prints one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

# torch.distributed.nn's all_to_all_single (c10d::alltoall_base_ with autograd) is deprecated
# for the functional one; kept: it is what EP code written before torch 2.5 calls
warnings.filterwarnings("ignore", message=".*all_to_all_single is deprecated")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_common import Timer, base_parser, batch, exit_after_python, finish, init_gloo


class Expert(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class MoELayer(nn.Module):
    """Top-1 routing over `local * world` experts, `local` of them on this rank."""

    def __init__(self, dim: int, local: int, world: int, skew: float) -> None:
        super().__init__()
        self.router = nn.Linear(dim, local * world)
        self.experts = nn.ModuleList(Expert(dim) for _ in range(local))
        self.local, self.world, self.skew = local, world, skew

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        gate = F.softmax(self.router(x), dim=-1)
        weight, choice = gate.max(dim=-1)
        if self.skew > 0:  # send a share `skew` of the tokens to rank 0's first expert
            n = int(self.skew * choice.numel())
            choice = torch.cat([torch.zeros(n, dtype=choice.dtype), choice[n:]])
        dest = choice // self.local
        order = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=self.world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # how many tokens each rank sends to each
        s, r = send.tolist(), recv.tolist()
        tokens = all_to_all_single(x.new_empty(sum(r), shape[-1]), x[order], r, s)
        which = all_to_all_single(choice.new_empty(sum(r)), choice[order], r, s) % self.local
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            mask = which == e
            if mask.any():
                out = out.index_put((mask.nonzero(as_tuple=True)[0],), expert(tokens[mask]))
        back = all_to_all_single(x.new_empty(sum(s), shape[-1]), out, s, r)
        y = torch.empty_like(back).index_put((order,), back)
        return (y * weight.unsqueeze(-1)).reshape(shape)


class MoELM(nn.Module):
    def __init__(self, args: argparse.Namespace, world: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.dim)
        self.moe = nn.ModuleList(MoELayer(args.dim, args.experts, world, args.skew)
                                 for _ in range(args.layers))
        self.norm = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.moe:
            x = x + layer(x)
        return self.head(self.norm(x))


def dense_params(model: MoELM) -> list[nn.Parameter]:
    """The replicated parameters (everything but the experts)."""
    experts = {id(p) for layer in model.moe for p in layer.experts.parameters()}
    return [p for p in model.parameters() if id(p) not in experts]


def main(argv: list[str] | None = None) -> None:
    p = base_parser(__doc__)
    p.add_argument("--experts", type=int, default=2, help="experts per rank")
    p.add_argument("--optimizer", choices=["fused", "foreach", "plain"], default="foreach")
    p.add_argument("--skew", type=float, default=0.0, metavar="S")
    args = p.parse_args(argv)
    rank, world = init_gloo(2)
    torch.manual_seed(args.seed)  # replicated parts the same on every rank
    model = MoELM(args, world)
    for layer in model.moe:  # each rank's experts its own
        torch.manual_seed(args.seed + 1 + rank)
        for expert in layer.experts:
            for q in expert.parameters():
                nn.init.normal_(q, std=0.02)
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True},
            "plain": {"foreach": False}}[args.optimizer]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, **impl)
    dense = dense_params(model)
    timer = Timer()
    for step in range(args.steps):
        x, y = batch(step, rank, args)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        flat = torch.cat([q.grad.reshape(-1) for q in dense if q.grad is not None])
        dist.all_reduce(flat)  # the replicated parts' gradients, averaged
        flat /= world
        at = 0
        for q in dense:
            if q.grad is not None:
                q.grad.copy_(flat[at:at + q.numel()].view_as(q))
                at += q.numel()
        opt.step()
    finish(rank, 0, f"trained {args.steps} expert-parallel steps on {world} rank(s) in {timer}, "
                    f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
    exit_after_python()
