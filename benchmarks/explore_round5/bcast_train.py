import sys, time, statistics, os
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
from bench_speed import *
sys.path.insert(0,'/tmp/r5')
from torch import nn
from transformers import AttentionInterface
def bcast_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    s = (query[:, :, :, None, :] * key[:, :, None, :, :]).sum(-1) * scaling
    if attention_mask is not None: s = s + attention_mask
    p = nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    out = (p[..., None] * value[:, :, None, :, :]).sum(-2)
    return out.transpose(1, 2).contiguous(), p
AttentionInterface.register("bcast", bcast_attention)
torch.set_num_threads(2)
torch._dynamo.config.recompile_limit, torch._dynamo.config.accumulated_recompile_limit = 64, 512
depth=int(sys.argv[1])
view = VIEWS['recipe (local view, window)']
steps={}
for name in ("eager","bcast"):
    model, ids = default_model(view, attn="eager")
    if name=="bcast": model.config._attn_implementation="bcast"
    model.compile_core()
    batch = training_batch(depth, 64, ids)
    step = make_step(model, batch, depth)
    t=time.perf_counter(); step(); print(name,"first",round(time.perf_counter()-t,1),flush=True)
    step(); steps[name]=step
res={k:[] for k in steps}
for _ in range(int(sys.argv[2])):
    for k,f in steps.items():
        t=time.perf_counter(); f(); res[k].append(time.perf_counter()-t)
for k,v in res.items(): print(k, f"{1000*statistics.median(v):.1f} ms", [round(1000*x) for x in v])
