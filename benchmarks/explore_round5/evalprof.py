import sys, time, statistics, os, cProfile, pstats
sys.path.insert(0, '/work/main')
import torch
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
torch.set_num_threads(2)
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="par_eager").eval()
m.compile_core()
mode=sys.argv[1]
run=lambda: evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode=mode,batch_size=256,progress=False)
t=time.perf_counter(); run(); print("first", time.perf_counter()-t)
ts=[]
for _ in range(5):
    t=time.perf_counter(); run(); ts.append(time.perf_counter()-t)
print("median s", statistics.median(ts), ts)
pr=cProfile.Profile(); pr.enable(); run(); run(); pr.disable()
pstats.Stats(pr).sort_stats(os.environ.get('SORT','cumulative')).print_stats(45)
