"""Two optimizers stepping every iteration (GAN-style) and gradient accumulation on one."""

import sys

import torch

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 6
g, d = torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)
opt_g = torch.optim.SGD(g.parameters(), lr=0.01)
opt_d = torch.optim.Adam(d.parameters(), lr=0.01)
for _ in range(iters):
    for _ in range(3):  # gradient accumulation: three micro-batches per optimizer step
        d(g(torch.randn(4, 16))).mean().backward()
    opt_d.step()
    opt_g.step()
    opt_d.zero_grad()
    opt_g.zero_grad()
print("two optimizers done", flush=True)
