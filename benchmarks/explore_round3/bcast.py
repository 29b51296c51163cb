import sys, time, statistics
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
from torch import nn
from transformers import AttentionInterface
from transformers.models.qwen2.modeling_qwen2 import repeat_kv
from bench_speed import *

def small_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    w = (query.unsqueeze(-2) * key.unsqueeze(-3)).sum(-1) * scaling
    if attention_mask is not None:
        w = w + attention_mask
    w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    out = (w.unsqueeze(-1) * value.unsqueeze(-3)).sum(-2)
    return out.transpose(1, 2).contiguous(), w
AttentionInterface.register("small", small_attention)

modes = sys.argv[1].split(",")
depth = int(sys.argv[2])
view = VIEWS['recipe (local view, window)']
batch = None
steps = {}
for mode in modes:
    model, ids = default_model(view, attn="eager")
    if mode == "small":
        model.config._attn_implementation = "small"
    model.compile_core()
    batch = batch or training_batch(depth, 64, ids)
    steps[mode] = make_step(model, batch, depth)
    t0 = time.perf_counter()
    for _ in range(3): steps[mode]()
    print(mode, "warm", time.perf_counter() - t0, flush=True)
ts = {m: [] for m in modes}
for _ in range(12):
    for m in modes:
        t = time.perf_counter(); steps[m](); ts[m].append(time.perf_counter() - t)
for m in modes:
    print(m, depth, "median ms %.1f min %.1f" % (1000 * statistics.median(ts[m]), 1000 * min(ts[m])))
