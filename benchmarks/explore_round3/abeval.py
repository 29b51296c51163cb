import sys, time, statistics
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main'); sys.path.insert(0, '/tmp/exp/basepkg')
import torch
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.accumulated_recompile_limit = 4096
from bench_speed import *
from state_tracking.evaluation import evaluate_length_generalization
from state_tracking import load_task_from_dir
import modeling_par_base
mode = sys.argv[1]; variants = sys.argv[2].split(","); rounds = int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
task = load_task_from_dir(CHECKPOINT)
runs = {}
for v in variants:
    cls = modeling_par_base.ParLoopedQwenForStateTracking if v.startswith("base") else ParLoopedQwenForStateTracking
    model = cls.from_pretrained(CHECKPOINT, dtype=torch.float32, attn_implementation="eager").eval()
    model.compile_core(**({"options": {"cpp_wrapper": True}} if "cppwrap" in v else {}))
    runs[v] = (lambda model=model: evaluate_length_generalization(model, tokenizer, task, [64], n_per_depth=256, mode=mode, batch_size=256, progress=False, workers=1))
    t0 = time.perf_counter(); runs[v](); print(v, "first", round(time.perf_counter() - t0, 1), flush=True)
ts = {v: [] for v in variants}
for _ in range(rounds):
    for v in variants:
        t = time.perf_counter(); r = runs[v](); ts[v].append(time.perf_counter() - t)
for v in variants:
    print(v, mode, "median s %.3f min %.3f" % (statistics.median(ts[v]), min(ts[v])))
