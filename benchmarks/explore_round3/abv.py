"""A/B of the committed modeling (modeling_par_base) vs the working tree, interleaved in one process."""
import sys, time, statistics
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main'); sys.path.insert(0, '/tmp/exp/basepkg')
import torch
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.accumulated_recompile_limit = 4096
import modeling_par_base
from bench_speed import *
import bench_speed
view_name = sys.argv[1]  # recipe|paper
depth = int(sys.argv[2]); rounds = int(sys.argv[3])
view = VIEWS['recipe (local view, window)'] if view_name == 'recipe' else {}
steps = {}
for name, pkg in (("base", modeling_par_base), ("new", None)):
    if pkg is not None:
        saved = (bench_speed.ParLoopedQwenConfig, bench_speed.ParLoopedQwenForStateTracking)
        bench_speed.ParLoopedQwenConfig, bench_speed.ParLoopedQwenForStateTracking = pkg.ParLoopedQwenConfig, pkg.ParLoopedQwenForStateTracking
    model, ids = bench_speed.default_model(view, attn="eager")
    if pkg is not None:
        bench_speed.ParLoopedQwenConfig, bench_speed.ParLoopedQwenForStateTracking = saved
    model.compile_core()
    batch = training_batch(depth, 64, ids)
    steps[name] = make_step(model, batch, depth)
    t0 = time.perf_counter()
    for _ in range(3): steps[name]()
    print(name, type(model).__module__, "warm", round(time.perf_counter() - t0, 1), flush=True)
ts = {m: [] for m in steps}
for _ in range(rounds):
    for m in steps:
        t = time.perf_counter(); steps[m](); ts[m].append(time.perf_counter() - t)
for m in steps:
    print(m, view_name, depth, "median ms %.1f min %.1f" % (1000 * statistics.median(ts[m]), 1000 * min(ts[m])))
print("ratio base/new (median) %.3f" % (statistics.median(ts['base']) / statistics.median(ts['new'])))
