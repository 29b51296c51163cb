import sys, time, statistics, os
sys.path.insert(0, '/work/main')
import torch
import torch._inductor.config as ic
ic.cpp.enable_kernel_profile = True
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
torch.set_num_threads(2)
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="eager").eval()
m.compile_core(options={"cpp_wrapper": False})
captured={}
orig=m._compiled_prelude
def spy(*a):
    captured.setdefault('args', a)
    return orig(*a)
m._compiled_prelude=spy
evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode="forced",batch_size=256,progress=False)
a=captured['args']
print([(tuple(x.shape), x.dtype) if torch.is_tensor(x) else x for x in a])
print("mask allowed fraction", (a[1]==0).float().mean().item() if a[1] is not None else None)
def bench(fn, n=50):
    for _ in range(5): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return 1000*statistics.median(ts)
from torch.profiler import profile, ProfilerActivity
with torch.no_grad():
    print("ms", bench(lambda: orig(*a)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10): orig(*a)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
