"""Like Lightning with profiler="pytorch": each rank steps its own torch.profiler before
init_process_group, and the launcher sets LOCAL_RANK and WORLD_SIZE but no RANK (rank 0 is this
process; it starts rank 1 as a copy of itself)."""

import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
if local_rank == 0:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_PORT=str(port), WORLD_SIZE="2")
    child = subprocess.Popen([sys.executable, *sys.argv],
                             env={**os.environ, "LOCAL_RANK": "1"})
port = os.environ["MASTER_PORT"]
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=1)) as prof:
    prof.step()  # before the process group exists: the rank agent starts now
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank,
                            world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(model)
    for _ in range(6):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        prof.step()
dist.destroy_process_group()
if local_rank == 0:
    sys.exit(child.wait())
print(f"rank {local_rank} done", flush=True)
