"""Shared pieces of the parallelism samples (train_pipeline, train_tp, train_fsdp2, train_2d).

Not a script. A tiny decoder-style language model built from plain `nn.Linear` layers (so
tensor parallelism can name its projections), deterministic synthetic token batches, the
common options, and Gloo set-up / tear-down on CPU. Everything here is public PyTorch API.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import exit_after_python, model_parser, step_set  # noqa: F401  (re-exported for the samples)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (q/k/v/o projections) and an MLP
    (w1/w2). Head count is inferred from the projection's width at run time (`view(..., -1,
    head_dim)`), so a column-parallel q/k/v with local outputs runs heads/N heads per rank."""

    def __init__(self, dim: int, heads: int, checkpointed: bool = False) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.norm1 = nn.LayerNorm(dim)
        self.wq = nn.Linear(dim, dim)
        self.wk = nn.Linear(dim, dim)
        self.wv = nn.Linear(dim, dim)
        self.wo = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, dim)
        self.checkpointed = checkpointed

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm1(x)
        q, k, v = (w(h).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.w2(F.gelu(self.w1(self.norm2(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            # activation checkpointing: the block's forward runs again inside backward
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class TinyLM(nn.Module):
    """Embedding, `layers` blocks, final norm and a vocabulary head."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int,
                 checkpointed: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, checkpointed) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batch(step: int, replica: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of data-parallel replica `replica` at `step`: the same on every run, and the
    same on ranks of one replica (tensor-parallel peers, pipeline stages)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + replica)
    x = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def base_parser(doc: str | None) -> argparse.ArgumentParser:
    p = model_parser(doc, steps=20)
    p.add_argument("--lr", type=float, default=1e-3)
    return p


def init_gloo(min_world: int = 2) -> tuple[int, int]:
    """Join the default process group with Gloo on CPU (torchrun's env:// variables)."""
    if "RANK" not in os.environ:
        sys.exit(f"run under torchrun with at least {min_world} ranks, e.g. "
                 f"torchrun --standalone --nproc_per_node={min_world} {sys.argv[0]} --steps 20")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < min_world:
        sys.exit(f"needs at least {min_world} ranks, got {world}")
    return rank, world


def init_mesh(shape: tuple[int, ...], names: tuple[str, ...],
              pg_init: str = "mesh") -> tuple[int, DeviceMesh]:
    """A CPU device mesh of `shape`; returns (rank, mesh). pg_init "mesh": `init_device_mesh`
    creates the default process group itself (no init_process_group call, as TP/2-D training
    code often does; on torch 2.13 `dist.get_backend()` then says "undefined", though the
    group runs Gloo); "explicit": `init_process_group("gloo")` first, then the mesh."""
    want = 1
    for n in shape:
        want *= n
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) != want:
        sys.exit(f"needs exactly {want} ranks under torchrun, e.g. torchrun --standalone "
                 f"--nproc_per_node={want} {sys.argv[0]} --steps 20")
    if pg_init == "explicit":
        dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    return dist.get_rank(), mesh


def add_pg_init_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pg-init", choices=["mesh", "explicit"], default="mesh",
                   help="mesh: init_device_mesh creates the default process group (then\n"
                        "dist.get_backend() says 'undefined' on torch 2.13); explicit:\n"
                        "init_process_group('gloo') first")


def finish(rank: int, print_rank: int, line: str) -> None:
    """One summary line from `print_rank`, then leave the process group once every rank is
    done with it (a barrier first, so no rank tears Gloo down under a peer's collective)."""
    if rank == print_rank:
        print(line, flush=True)
    dist.barrier()
    dist.destroy_process_group()


class Timer:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.t0:.2f} s"


def straggle(extra: float, args: argparse.Namespace, shards: int = 1, passes: int = 4) -> None:
    """About `extra` x this rank's share (1/shards) of the blocks' matrix products, outside
    autograd; `passes`: forward + backward ~ 3x forward, 4x with activation recompute."""
    a = torch.ones(args.batch * args.seq, args.dim)
    w = torch.ones(args.dim, 12 * args.dim // shards)  # q,k,v,o + w1,w2 = 12 dim^2 per block
    with torch.no_grad():
        for _ in range(round(extra * args.layers * passes)):
            torch.mm(a, w)


def train_lm(model: nn.Module, args: argparse.Namespace, rank: int, replica: int,
             shards: int = 1, passes: int = 4) -> tuple[torch.Tensor, Timer]:
    """`args.steps` AdamW steps of `model` on replica `replica`'s batches, rank
    `args.slow_rank` made `args.slow_factor` times as slow (`straggle`): the last loss and the
    time it took."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    extra = args.slow_factor - 1.0 if rank == args.slow_rank else 0.0
    timer = Timer()
    for step in range(args.steps):
        x, y = batch(step, replica, args)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        if extra > 0:
            straggle(extra, args, shards, passes)
        loss.backward()
        opt.step()
    return loss, timer
