import sys, time, statistics, os
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
import torch._inductor.config as ic
ic.cpp.enable_kernel_profile = True
from bench_speed import *
torch.set_num_threads(int(os.environ.get("NT", 2)))
depth=32
view = VIEWS['recipe (local view, window)']
model, ids = default_model(view, attn="eager")
model.compile_core(options={"cpp_wrapper": False})
batch = training_batch(depth, 64, ids)
captured = {}
orig = model._compiled_core
def spy(*a):
    if not torch.is_grad_enabled() and a[5] is not None: captured.setdefault('args', a)
    return orig(*a)
model._compiled_core = spy
with torch.no_grad():
    model(batch["input_ids"], attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
          operation_ends=batch["operation_ends"], num_iterations=3, readout_iterations=[3])
a = captured['args']
def bench(fn, n=300):
    for _ in range(10): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return 1000*statistics.median(ts)
from torch.profiler import profile, ProfilerActivity
with torch.no_grad():
    print("ms", bench(lambda: orig(*a)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50): orig(*a)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
