import time, sys, torch, psutil
torch.set_num_threads(1)
shapes = sys.argv[1] == "on"
m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)) for _ in range(6)])
opt = torch.optim.Adam(m.parameters(), lr=0.01)
x = torch.randn(16, 256)
def step():
    for _ in range(8):
        y = m(x).sum(); y.backward()
    opt.step(); opt.zero_grad()
pr = psutil.Process()
step()
p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes); p.start()
for i in range(20):
    t = time.perf_counter(); step(); print(f"{(time.perf_counter()-t)*1e3:.0f}ms/{pr.memory_info().rss>>20}MB", end=" ", flush=True)
p.stop(); print()
