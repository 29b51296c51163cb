import sys, time, statistics, os
sys.path.insert(0, '/work/main')
import torch
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
torch.set_num_threads(2)
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
mode=sys.argv[1]
AT={"cpp_wrapper": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
models={}
for name,opts in (("default",{}),("autotune",dict(options=AT))):
    m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="eager").eval()
    m.compile_core(**opts)
    run=lambda m=m: evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode=mode,batch_size=256,progress=False)
    t=time.perf_counter(); r=run(); print(name,"first s",time.perf_counter()-t, r['accuracy'], flush=True)
    models[name]=run
res={k:[] for k in models}
for _ in range(8):
    for k,f in models.items():
        t=time.perf_counter(); f(); res[k].append(time.perf_counter()-t)
for k,v in res.items(): print(k, f"{statistics.median(v):.3f} s", [round(x,3) for x in v])
