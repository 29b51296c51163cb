import sys, time, statistics
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
from bench_speed import *
torch.set_num_threads(2)
depth=32
view = VIEWS['recipe (local view, window)']
model, ids = default_model(view, attn="eager")
model.compile_core()
batch = training_batch(depth, 64, ids)
step = make_step(model, batch, depth)
def fwd(n):
    with torch.no_grad():
        model(batch["input_ids"], attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
              operation_ends=batch["operation_ends"], num_iterations=n, readout_iterations=[n])
def prep():
    with torch.no_grad():
        model._prepare(batch["input_ids"], batch["attention_mask"], batch["query_positions"], None, batch["operation_ends"], None)
for f in (step, lambda: fwd(8), lambda: fwd(32), prep):
    for _ in range(3): f()
res = {k: [] for k in ("step", "fwd8", "fwd32", "prep")}
for r in range(15):
    for k, f in (("step", step), ("fwd8", lambda: fwd(8)), ("fwd32", lambda: fwd(32)), ("prep", prep)):
        t = time.perf_counter(); f(); res[k].append(1000 * (time.perf_counter() - t))
for k, v in res.items(): print(k, round(statistics.median(v), 1))
