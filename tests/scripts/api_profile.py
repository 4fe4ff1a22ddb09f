"""Profiling without the CLI: `with uberprof.profile(...)` around a plain training loop."""

import sys

import torch

import uberprof

out = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with uberprof.profile(out=out, run_id="api", trace_steps="2-3") as run:
    for _ in range(6):
        model(torch.randn(16, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
# After the block, steps are no longer recorded.
for _ in range(3):
    model(torch.randn(16, 32)).sum().backward()
    opt.step()
print("run at", run.root, flush=True)
