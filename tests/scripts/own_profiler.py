"""A script that drives its own torch.profiler with a schedule and calls prof.step()."""

import sys
import tempfile

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
out = tempfile.mkdtemp()
sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
with torch.profiler.profile(schedule=sched,
                            on_trace_ready=torch.profiler.tensorboard_trace_handler(out)) as prof:
    for _ in range(steps):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
print("own profiler done", flush=True)
