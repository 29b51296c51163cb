import sys, time, statistics
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
import torch._inductor.config as ic

from bench_speed import *
depth=32
view = VIEWS['recipe (local view, window)']
model, ids = default_model(view, attn="eager")
model.compile_core()
batch = training_batch(depth, 64, ids)
captured = {}
orig = model._compiled_core
def spy(*a):
    captured.setdefault('args', a)
    return orig(*a)
model._compiled_core = spy
step = make_step(model, batch, depth)
for _ in range(3): step()
model._compiled_core = orig
args = captured['args']
print([None if x is None else tuple(x.shape) for x in args])
def bench(fn, n=200):
    for _ in range(10): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return 1000*statistics.median(ts)
with torch.no_grad():
    a = list(args)
    a[5] = torch.ones(64, 5, 1)  # reference rms (anchored path)
    print("compiled core call no-grad ms", bench(lambda: orig(*a)))
    print("eager core call no-grad ms", bench(lambda: model._core_update(*a)))
    x = torch.randn(384, 128); x2 = torch.randn(384, 256)
    W = torch.randn(128, 128); Wup = torch.randn(256, 128); Wd = torch.randn(128, 256); Wa = torch.randn(128, 256)
    F = torch.nn.functional
    def mms():
        F.linear(x2, Wa)
        for _ in range(2):
            for _ in range(4): F.linear(x, W)
            F.linear(x, Wup); F.linear(x, Wup); F.linear(x2, Wd)
    print("15 matmuls ms", bench(mms))
    h = torch.randn(256, 6, 32)
    def att():
        for _ in range(2):
            torch.bmm(h, h.transpose(1, 2)); torch.bmm(torch.randn(256, 6, 6), h)
    print("attention bmm x2 layers ms", bench(att))
from torch.profiler import profile, ProfilerActivity
with torch.no_grad():
    for _ in range(5): orig(*a)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50): orig(*a)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
