import sys, time, statistics, os
sys.path.insert(0, '/work/main')
import torch
import torch._inductor.config as ic
from transformers import AutoTokenizer
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
torch.set_num_threads(2)
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="eager").eval()
m.block_iterations=1
m.compile_core()
captured={}
orig=m._compiled_core
def spy(*a):
    if a[5] is not None: captured.setdefault('args', a)
    return orig(*a)
m._compiled_core=spy
evaluate_length_generalization(m,tok,task,[16],n_per_depth=256,mode="forced",batch_size=256,progress=False)
a=captured['args']
variants={"default": dict(options={"cpp_wrapper": True}),
          "freeze+autotune": dict(options={"cpp_wrapper": True, "freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}),
          "autotune": dict(options={"cpp_wrapper": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}),
          }
fns={}
with torch.no_grad():
  for k,v in variants.items():
    torch._dynamo.reset()
    f=torch.compile(m._core_update, **v)
    t=time.perf_counter(); out=f(*a); print(k,"compile s",time.perf_counter()-t, flush=True)
    fns[k]=(f,out)
  ref=fns["default"][1][1]
  for k,(f,o) in fns.items(): print(k,"maxdiff",(f(*a)[1]-ref).abs().max().item())
  res={k:[] for k in fns}
  for r in range(30):
    for k,(f,_) in fns.items():
      t=time.perf_counter()
      for _ in range(5): f(*a)
      res[k].append((time.perf_counter()-t)/5*1000)
for k,v in res.items(): print(k, f"{statistics.median(v):.2f} ms")
