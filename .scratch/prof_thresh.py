import time, sys, torch
torch.set_num_threads(1)
x = torch.randn(16, 64); w = torch.randn(64, 64)
p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=sys.argv[1]=="on"); p.start()
n = 0
for blk in range(40):
    t = time.perf_counter()
    for i in range(20000):
        y = torch.mm(x, w)
    n += 20000
    print(f"{n//1000}k:{(time.perf_counter()-t)/20000*1e6:.1f}us", end=" ", flush=True)
p.stop(); print()
