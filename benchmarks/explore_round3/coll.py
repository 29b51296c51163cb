import sys, time, statistics
sys.path.insert(0, '/work/main')
import torch
from state_tracking import get_task, build_tokenizer, build_dataset, StateTrackingCollator, encode_batch
from state_tracking.evaluation import draw_test_problems
task = get_task("swap_s5"); tok = build_tokenizer(task, "symbolic")
ops, initial = draw_test_problems(task, 64, 256, 0, False)
enc = encode_batch(task, tok, "symbolic", ops, initial)
coll = StateTrackingCollator(tok.pad_token_id)
data = build_dataset(task, tok, n=64, depths=32, seed=0)
rows = [data[i] for i in range(64)]
def bench(fn, n=30):
    fn(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return 1000*statistics.median(ts)
print("eval columns 256 x d64 ms", bench(lambda: coll(enc)))
print("train rows 64 x d32 ms", bench(lambda: coll(rows)))
print("encode 256 ms", bench(lambda: encode_batch(task, tok, "symbolic", ops, initial)))
print("draw 256 ms", bench(lambda: draw_test_problems(task, 64, 256, 0, False)))
print("dataset row fetch 64 ms", bench(lambda: [data[i] for i in range(64)]))
idx = list(range(0, 64))
print("getitems 64 ms", bench(lambda: data.__getitems__(idx)))
print("getitems+collate ms", bench(lambda: coll(data.__getitems__(idx))))
dn = data.with_format("numpy")
print("numpy getitems 64 ms", bench(lambda: dn.__getitems__(idx)))
print("numpy getitems+collate ms", bench(lambda: coll(dn.__getitems__(idx))))
print(type(dn.__getitems__(idx)[0]["step_labels"]), dn.__getitems__(idx)[0]["step_labels"].dtype)
