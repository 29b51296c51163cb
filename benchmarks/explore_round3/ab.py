import sys, time, statistics
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.accumulated_recompile_limit = 4096
from bench_speed import *
modes = sys.argv[1].split(",")
depth = int(sys.argv[2])
view = VIEWS['recipe (local view, window)']
batch = None
steps = {}
for mode in modes:
    model, ids = default_model(view, attn="eager")
    if mode == "plain":
        model.compile_core()
    elif mode == "cppwrap":
        model.compile_core(options={"cpp_wrapper": True})
    elif mode == "autotune":
        model.compile_core(options={"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"})
    batch = batch or training_batch(depth, 64, ids)
    steps[mode] = make_step(model, batch, depth)
    t0 = time.perf_counter()
    for _ in range(3): steps[mode]()
    print(mode, "warm", time.perf_counter() - t0, flush=True)
ts = {m: [] for m in modes}
for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 12):
    for m in modes:
        t = time.perf_counter(); steps[m](); ts[m].append(time.perf_counter() - t)
for m in modes:
    print(m, depth, "median ms %.1f min %.1f" % (1000 * statistics.median(ts[m]), 1000 * min(ts[m])))
