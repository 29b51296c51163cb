import sys, time, statistics, os
sys.path.insert(0, '/work/main')
import torch
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
torch.set_num_threads(2)
import torch._dynamo
torch._dynamo.config.recompile_limit = int(os.environ.get("RL", 8))
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
mode=sys.argv[1]
m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="eager").eval()
m.compile_core()
runs={}
for w in (1,2):
    run=lambda w=w: evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode=mode,batch_size=256,progress=False,workers=w)
    t=time.perf_counter(); r=run(); print(w,"first s",time.perf_counter()-t, r['accuracy'], r['per_depth'][0].get('mean_iterations'), flush=True)
    runs[w]=run
res={k:[] for k in runs}
for _ in range(int(sys.argv[2]) if len(sys.argv)>2 else 8):
    for k,f in runs.items():
        t=time.perf_counter(); f(); res[k].append(time.perf_counter()-t)
for k,v in res.items(): print("workers",k, f"{statistics.median(v):.3f} s", [round(x,3) for x in v])
