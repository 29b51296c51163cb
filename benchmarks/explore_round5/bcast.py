import sys, time, statistics, os
sys.path.insert(0, '/work/main')
import torch
from torch import nn
from transformers import AutoTokenizer, AttentionInterface
from modeling_par.modeling_par import ParLoopedQwenForStateTracking
from state_tracking import load_task_from_dir, evaluate_length_generalization
torch.set_num_threads(2)
def bcast_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    # (b, h, q, d) x (b, h, k, d): scores by broadcast multiply-sum (no bmm)
    s = (query[:, :, :, None, :] * key[:, :, None, :, :]).sum(-1) * scaling
    if attention_mask is not None: s = s + attention_mask
    p = nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    out = (p[..., None] * value[:, :, None, :, :]).sum(-2)
    return out.transpose(1, 2).contiguous(), p
AttentionInterface.register("bcast", bcast_attention)
C='/work/main/checkpoints/par-swap-s5-small'
tok=AutoTokenizer.from_pretrained(C); task=load_task_from_dir(C)
mode=sys.argv[1]
runs={}
for name in ("eager","bcast"):
    m=ParLoopedQwenForStateTracking.from_pretrained(C,dtype=torch.float32,attn_implementation="eager").eval()
    if name=="bcast":
        m.config._attn_implementation="bcast"
    m.compile_core()
    run=lambda m=m: evaluate_length_generalization(m,tok,task,[64],n_per_depth=256,mode=mode,batch_size=256,progress=False)
    t=time.perf_counter(); r=run(); print(name,"first s",round(time.perf_counter()-t,1), r['accuracy'], flush=True)
    runs[name]=run
res={k:[] for k in runs}
for _ in range(int(sys.argv[2])):
    for k,f in runs.items():
        t=time.perf_counter(); f(); res[k].append(time.perf_counter()-t)
for k,v in res.items(): print(k, f"{statistics.median(v):.3f} s", [round(x,3) for x in v])
