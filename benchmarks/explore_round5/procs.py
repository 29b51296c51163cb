import sys, time, statistics, os
sys.path.insert(0, '/work/main')
import torch
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
nt=int(sys.argv[1]); n=int(sys.argv[2]); mode=sys.argv[3]; start_at=float(sys.argv[4])
torch.set_num_threads(nt)
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="eager").eval()
m.compile_core()
run=lambda: evaluate_length_generalization(m,tok,task,[64],n_per_depth=n,mode=mode,batch_size=n,progress=False)
run(); run()
while time.time()<start_at: time.sleep(0.01)
ts=[]
t0=time.perf_counter()
for _ in range(8):
    t=time.perf_counter(); run(); ts.append(time.perf_counter()-t)
print(nt,n,mode,"median",round(statistics.median(ts),3),"total",round(time.perf_counter()-t0,2))
