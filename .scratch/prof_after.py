import time, sys, torch
torch.set_num_threads(1)
shapes = sys.argv[1] == "on"
m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)) for _ in range(6)])
opt = torch.optim.Adam(m.parameters(), lr=0.01)
x = torch.randn(16, 256)
def step():
    for _ in range(8):
        y = m(x).sum(); y.backward()
    opt.step(); opt.zero_grad()
import resource
def run(n):
    ts = []
    for i in range(n):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t = time.perf_counter(); step(); ts.append((time.perf_counter() - t) * 1e3); ts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return ts
fmt = lambda ts: " ".join(f"{t:.0f}" for t in ts)
print("before", fmt(run(15)))
p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes); p.start()
print("during", fmt(run(20)))
t = time.perf_counter(); p.stop(); print("stop", round(time.perf_counter() - t, 2))
print("after ", fmt(run(15)))
t = time.perf_counter(); p.export_chrome_trace("/tmp/x.json"); print("export", round(time.perf_counter() - t, 2))
print("after2", fmt(run(15)))
