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
m.block_iterations=1
m.compile_core(options={"cpp_wrapper": False})
captured={}
orig=m._compiled_core
def spy(*a):
    if a[5] is not None: captured.setdefault('args', a)
    return orig(*a)
m._compiled_core=spy
evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode="forced",batch_size=256,progress=False)
a=captured['args']
print([tuple(x.shape) if torch.is_tensor(x) else x for x in a])
def bench(fn, n=200):
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
