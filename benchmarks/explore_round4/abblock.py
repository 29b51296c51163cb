import sys, time, statistics, os
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
from bench_speed import *
torch.set_num_threads(2)
Ks = [int(x) for x in sys.argv[1].split(",")]; rounds = int(sys.argv[2])
view = VIEWS['recipe (local view, window)']
model, ids = default_model(view, attn="eager")
model.compile_core()
batch = training_batch(32, 64, ids)
step = make_step(model, batch, 32)
ebatch = training_batch(64, 256, ids)
def ev():
    with torch.no_grad():
        model.predict(ebatch["input_ids"], attention_mask=ebatch["attention_mask"], query_positions=ebatch["query_positions"],
                      operation_ends=ebatch["operation_ends"], num_iterations=64)
for K in Ks:
    model.block_iterations = K
    t = time.perf_counter(); step(); t1 = time.perf_counter() - t
    t = time.perf_counter(); ev(); print(f"K={K} first step {t1:.1f}s first eval {time.perf_counter()-t:.1f}s", flush=True)
res = {(K, n): [] for K in Ks for n in ("train", "eval")}
for r in range(rounds):
    for K in Ks:
        model.block_iterations = K
        for n, f in (("train", step), ("eval", ev)):
            t = time.perf_counter(); f(); res[(K, n)].append(time.perf_counter() - t)
for (K, n), v in res.items(): print(K, n, f"{1000*statistics.median(v):.1f} ms")
