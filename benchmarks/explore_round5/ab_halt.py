import sys, time, statistics, os
sys.path.insert(0, '/work/main')
import torch
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
torch.set_num_threads(2)
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
runs={}; res_first={}
for name,K in (("single",1),("blocks",4)):
    m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="par_eager").eval()
    m.compile_core(); m.block_iterations=K
    run=lambda m=m: evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode="halting",batch_size=256,progress=False)
    t=time.perf_counter(); r=run(); print(name,"first s",round(time.perf_counter()-t,1), r['accuracy'], r['per_depth'][0]['mean_iterations'], flush=True)
    runs[name]=run
    with torch.no_grad():
        pass
res={k:[] for k in runs}
for _ in range(int(sys.argv[1])):
    for k,f in runs.items():
        t=time.perf_counter(); f(); res[k].append(time.perf_counter()-t)
for k,v in res.items(): print(k, f"{statistics.median(v):.3f} s", [round(x,3) for x in v])
