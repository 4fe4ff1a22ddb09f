"""A small torch.compile'd MLP trained for 5 steps on CPU under torch.profiler, every step
traced (ProfilerStep#0-4): the first step holds Dynamo's, AOTAutograd's and Inductor's
compilation of the forward and the backward. Writes OUT (a .pt.trace.json.gz)."""
import gzip
import os
import shutil
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, schedule

out = sys.argv[1]
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
compiled = torch.compile(model)
x, y = torch.randn(32, 64), torch.randn(32, 8)
tmp = tempfile.mktemp(suffix=".json")
with profile(activities=[ProfilerActivity.CPU],
             schedule=schedule(wait=0, warmup=0, active=5, repeat=1),
             on_trace_ready=lambda p: p.export_chrome_trace(tmp)) as prof:
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        opt.step()
        prof.step()
with open(tmp, "rb") as f, gzip.open(out, "wb", compresslevel=9) as g:
    shutil.copyfileobj(f, g)
os.unlink(tmp)
