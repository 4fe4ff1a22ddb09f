"""DDP on CPU (Gloo) that all-reduces its loss every step for logging, as many scripts do: a
small synchronous collective per step besides the gradient buckets (clock alignment tests)."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 256)
for _ in range(args.steps):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    logged = loss.detach().clone()
    dist.all_reduce(logged)  # the mean loss over ranks, for the log
dist.destroy_process_group()
