import sys, torch, psutil, gc
pr = psutil.Process(); rss = lambda: pr.memory_info().rss >> 20
for shapes in (True, False):
    p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes); p.start()
    a = torch.ones(64, 1024, 1024)  # 256 MB
    b = a * 2; del a
    r1 = rss(); del b; gc.collect(); r2 = rss()
    c = torch.zeros(64, 1024, 1024); c.add_(1); del c
    r3 = rss()
    p.stop(); print("shapes", shapes, "rss with b", r1, "after del b", r2, "after add_ on new", r3, "after stop", rss())
