# usage: python oldnew.py ROOT MODE PATHKIND start_epoch
import sys, time, statistics, os
root, mode, kind = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, root)
import torch
torch.set_num_threads(2)
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="sdpa").eval()
if kind=="before":
    m.causal_fast_path=False; m.window_plan_iterations=1; m.split_adapter=False; m.block_iterations=1
run=lambda: evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode=mode,batch_size=256,progress=False)
r=run(); print(root, kind, mode, "acc", r['accuracy'], flush=True)
ts=[]
for _ in range(int(sys.argv[4])):
    t=time.perf_counter(); run(); ts.append(time.perf_counter()-t)
print(root, kind, mode, "median", round(statistics.median(ts),3), [round(x,2) for x in ts], flush=True)
