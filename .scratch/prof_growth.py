import time, sys, torch
torch.set_num_threads(1)
shapes = sys.argv[1] == "on"
m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(6)])
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(16, 256)
def step():
    for _ in range(8):  # microbatches
        y = m(x).sum(); y.backward()
    opt.step(); opt.zero_grad()
for _ in range(3): step()
ts = []
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes) as p:
    for i in range(30):
        t = time.perf_counter(); step(); ts.append((time.perf_counter() - t) * 1e3)
print(shapes, " ".join(f"{t:.0f}" for t in ts))
