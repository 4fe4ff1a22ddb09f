"""A 2-rank CPU (Gloo) job whose idle gaps and exposed communication have known neighbours:
each step sleeps between an `aten::mm` and an `aten::tanh` (a device-idle gap the host
causes) and all-reduces a large tensor synchronously between an `aten::sigmoid` and an
`aten::relu` (communication under no compute), then takes an optimizer step."""

import argparse
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--sleep-ms", type=float, default=15.0)
p.add_argument("--elements", type=int, default=2_000_000)
args = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(256, 256))
opt = torch.optim.SGD([w], lr=1e-4)
x = torch.randn(128, 256)
buf = torch.ones(args.elements)
for _ in range(args.steps):
    y = torch.mm(x, w)
    time.sleep(args.sleep_ms / 1e3)  # the host keeps the "device" idle
    z = torch.tanh(y)
    s = torch.sigmoid(z)
    with torch.no_grad():
        dist.all_reduce(buf)  # synchronous: nothing computes while it runs
    loss = torch.relu(s).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
