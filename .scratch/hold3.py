import sys, torch, psutil
torch.set_num_threads(1)
pr = psutil.Process(); rss = lambda: pr.memory_info().rss >> 20
m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)) for _ in range(6)])
opt = torch.optim.Adam(m.parameters(), lr=0.01, foreach=sys.argv[2] == "foreach")
x = torch.randn(16, 256)
def fb(): m(x).sum().backward()
mode = sys.argv[1]
def step():
    for _ in range(8): fb()
    if mode == "opt": opt.step()
    if mode != "none": opt.zero_grad()
step(); step()
p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True); p.start()
r = [rss()]
for _ in range(8): step(); r.append(rss())
p.stop(); print(mode, sys.argv[2], "MB per step", [b - a for a, b in zip(r, r[1:])])
