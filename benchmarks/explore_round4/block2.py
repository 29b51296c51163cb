import sys, time, statistics, os
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
from bench_speed import *
from modeling_par.modeling_par import default_compile_options
torch.set_num_threads(2)
depth = int(sys.argv[1]); bs = int(sys.argv[2]); K = int(sys.argv[3])
view = VIEWS['recipe (local view, window)']
model, ids = default_model(view, attn="eager")
model.compile_core()
batch = training_batch(depth, bs, ids)
args = (batch["input_ids"], batch["attention_mask"], batch["query_positions"], None, batch["operation_ends"], None)
with torch.no_grad():
    ctx = model._prepare(*args)
    state = ctx.initial_state()
    state, _, ref = model.core_step(state, None, ctx, 1)
    plan = model._window_plan(ctx, 1, 16, state)
rows = torch.arange(bs)[:, None]
span = plan.index.shape[-1] - state.shape[1]
e_ops_all = [ctx.prelude_out[rows, plan.index[i][:, :span]] for i in range(16)]
def block(e_half, state, ref, prelude_out, index, mask, cos, sin):
    raws = []
    for i in range(index.shape[0]):
        e_ops = prelude_out[rows, index[i][:, :span]]
        _, state, raw = model._core_update(e_half, state, mask[i], cos[i], sin[i], ref, e_ops)
        raws.append(raw)
    return state, torch.stack(raws)
cblock = torch.compile(block, **default_compile_options({}, torch.device("cpu")))
def loop():
    s = state
    for k in range(1, 17):
        s, _, _ = model.core_step(s, ref, ctx, k)
    return s
def direct():
    s = state
    for i in range(16):
        _, s, _ = model._compiled_core(ctx.e_half, s, plan.mask[i], plan.cos[i], plan.sin[i], ref, e_ops_all[i])
    return s
def blk():
    s = state
    for j in range(0, 16, K):
        s = cblock(ctx.e_half, s, ref, ctx.prelude_out, plan.index[j:j+K], plan.mask[j:j+K], plan.cos[j:j+K], plan.sin[j:j+K])[0]
    return s
with torch.no_grad():
    t = time.perf_counter(); blk(); print("block compile s", time.perf_counter() - t)
    a, b = loop(), blk()
    print("max diff", (a - b).abs().max().item())
    res = {"loop": [], "direct": [], "block": []}
    for _ in range(3): loop(); blk(); direct()
    for r in range(15):
        for name, f in (("loop", loop), ("direct", direct), ("block", blk)):
            t = time.perf_counter(); f(); res[name].append(1000 * (time.perf_counter() - t))
for k, v in res.items(): print(k, f"{statistics.median(v):.1f} ms per 16 iterations (K={K})")
import resource
def faults(f, n=10):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with torch.no_grad():
        for _ in range(n): f()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / n
print("minor faults per 16 iterations: loop", faults(loop), "direct", faults(direct), "block", faults(blk))
