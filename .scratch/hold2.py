import sys, torch, psutil
torch.set_num_threads(1)
pr = psutil.Process(); rss = lambda: pr.memory_info().rss >> 20
m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)) for _ in range(6)])
opt = torch.optim.Adam(m.parameters(), lr=0.01)
x = torch.randn(16, 256)
def fwd():
    with torch.no_grad(): m(x)
def fb(): m(x).sum().backward()
def optstep(): opt.step(); opt.zero_grad()
fb(); optstep()
for name, f in [("fwd", fwd), ("fwd+bwd", fb), ("opt", optstep), ("fb+opt", lambda: (fb(), optstep()))]:
    p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True); p.start()
    r0 = rss()
    for _ in range(20): f()
    print(name, "MB per call", (rss() - r0) / 20); p.stop()
