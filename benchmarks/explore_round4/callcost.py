import sys, time, statistics
sys.path.insert(0, '/work/main/benchmarks'); sys.path.insert(0, '/work/main')
import torch
from bench_speed import *
from modeling_par.modeling_par import default_compile_options
torch.set_num_threads(2)
model, ids = default_model(VIEWS['recipe (local view, window)'], attn="eager")
x = torch.randn(64, 5, 128)
opts = default_compile_options({}, torch.device("cpu"))
f1 = torch.compile(lambda x: x + 1, **opts)
def g(x): return model.model.layers[1].mlp.down_proj.weight.sum() + x
f2 = torch.compile(g, **opts)
def h(x):
    for p in model.parameters(): x = x + p.flatten()[0]
    return x
f3 = torch.compile(h, **opts)
f4 = torch.compile(lambda x: x + 1, options={"cpp_wrapper": False})
def bench(fn, n=2000):
    for _ in range(20): fn()
    t = time.perf_counter()
    for _ in range(n): fn()
    return 1e6 * (time.perf_counter() - t) / n
with torch.no_grad():
    print("eager x+1 us", bench(lambda: x + 1))
    print("compiled x+1 (cpp wrapper) us", bench(lambda: f1(x)))
    print("compiled x+1 (py wrapper) us", bench(lambda: f4(x)))
    print("compiled reads 1 param us", bench(lambda: f2(x)))
    print("compiled reads all params us", bench(lambda: f3(x)), len(list(model.parameters())))
ps = [p.detach().clone() for p in model.parameters()]
def k(x, *ts):
    for p in ts: x = x + p.flatten()[0]
    return x
f5 = torch.compile(k, **opts)
with torch.no_grad():
    print("compiled 52 plain tensor inputs us", bench(lambda: f5(x, *ps)))
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        print("all params, skip guards us", bench(lambda: f3(x)))
import torch._dynamo.config as dc
print("inline_inbuilt_nn_modules", dc.inline_inbuilt_nn_modules)
