import sys, time, statistics, os
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
from bench_speed import *
from modeling_par.modeling_par import default_compile_options
torch.set_num_threads(2)
depth = int(sys.argv[1]); bs = int(sys.argv[2]); K = 16
view = VIEWS['recipe (local view, window)']
model, ids = default_model(view, attn="eager")
model.compile_core()
batch = training_batch(depth, bs, ids)
args = (batch["input_ids"], batch["attention_mask"], batch["query_positions"], None, batch["operation_ends"], None)
with torch.no_grad():
    ctx = model._prepare(*args)
    state = ctx.initial_state()
    state, _, ref = model.core_step(state, None, ctx, 1)
    plan = model._window_plan(ctx, 1, K, state)
rows = torch.arange(bs)[:, None]
def block(e_half, state, ref, prelude_out, index, mask, cos, sin):
    span = index.shape[-1] - state.shape[1]
    raws = []
    for i in range(index.shape[0]):
        e_ops = prelude_out[rows, index[i][:, :span]]
        _, state, raw = model._core_update(e_half, state, mask[i], cos[i], sin[i], ref, e_ops)
        raws.append(raw)
    return state, torch.stack(raws)
cblock = torch.compile(block, **default_compile_options({}, torch.device("cpu")))
def loop():
    s = state
    for k in range(1, K + 1):
        s, _, _ = model.core_step(s, ref, ctx, k)
    return s
def blk():
    return cblock(ctx.e_half, state, ref, ctx.prelude_out, plan.index, plan.mask, plan.cos, plan.sin)
with torch.no_grad():
    t = time.perf_counter(); blk(); print("block compile s", time.perf_counter() - t)
    a, b = loop(), blk()[0]
    print("max diff", (a - b).abs().max().item())
    res = {"loop": [], "block": []}
    for _ in range(5): loop(); blk()
    for r in range(20):
        for name, f in (("loop", loop), ("block", blk)):
            t = time.perf_counter(); f(); res[name].append(1000 * (time.perf_counter() - t))
for k, v in res.items(): print(k, f"{statistics.median(v):.1f} ms per {K} iterations")
