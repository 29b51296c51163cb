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
captured = {}
orig = model._compiled_core
def spy(*a):
    if not torch.is_grad_enabled() and a[5] is not None: captured.setdefault('args', a)
    return orig(*a)
model._compiled_core = spy
step = make_step(model, batch, depth)
def bench(fn, n=300):
    for _ in range(10): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return 1000*statistics.median(ts)
with torch.no_grad():
    model(batch["input_ids"], attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
          operation_ends=batch["operation_ends"], num_iterations=3, readout_iterations=[3])
a = captured['args']
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
code = type(model)._core_update.__code__
with torch.no_grad():
    print("entries", len(_debug_get_cache_entry_list(code)), "ms", bench(lambda: orig(*a)))
    model._compiled_core = spy
for _ in range(2): step()
with torch.no_grad():
    print("entries", len(_debug_get_cache_entry_list(code)), "ms", bench(lambda: orig(*a)))
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        print("skip-guard ms", bench(lambda: orig(*a)))
    print("eager ms", bench(lambda: model._core_update(*a)))
