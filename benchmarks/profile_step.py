"""Where the time of one training step goes: torch.profiler over one optimizer step of bench_speed.py's default
model, with each stage of the loop tagged (prelude, window plans, core update, readouts, backward, optimizer).

    python benchmarks/profile_step.py [--view recipe|paper] [--depth 32] [--attn eager] [--compile [--python-wrapper]]

Prints the tagged stages (total CPU ms and calls) and the top operators by self time. Profiler overhead inflates
the totals by ~10-20%; read the shares, not the absolute times (those are bench_speed.py's). With inductor's C++
wrapper (compile_core's CPU default) the operators inside a compiled graph are not seen by the profiler: add
--python-wrapper to see them (matmuls vs fused kernels) at the cost of the Python wrapper's own overhead.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speed import VIEWS, default_model, make_step, training_batch  # noqa: E402

from modeling_par import ParLoopedQwenForStateTracking, ReferenceLoop  # noqa: E402
from modeling_par.window_path import WindowLoop, WindowPlans  # noqa: E402

STAGES = [(ParLoopedQwenForStateTracking, name) for name in
          ("forward", "_backend", "core_update", "readout", "_coda_block")]
STAGES += [(ReferenceLoop, "advance"), (WindowLoop, "advance"), (WindowLoop, "readouts")]  # the two loop backends
STAGES += [(WindowPlans, "covering"), (WindowLoop, "_block")]  # window plans, no-grad blocks


def tag(cls, name: str) -> None:
    """Wrap cls.name in a profiler range '## name'."""
    fn = getattr(cls, name)

    @functools.wraps(fn)
    def tagged(*args, **kwargs):
        with record_function("## " + name):
            return fn(*args, **kwargs)

    setattr(cls, name, tagged)


def main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--view", choices=["recipe", "paper"], default="recipe")
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="eager")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--python_wrapper", "--python-wrapper", action="store_true",
                        help="compile with inductor's Python wrapper")
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args(argv)
    view = next(v for k, v in VIEWS.items() if k.startswith(args.view))
    for cls, name in STAGES:
        tag(cls, name)
    model, ids = default_model(view, attn=args.attn)
    if args.compile:
        model.compile_core(**({"options": {"cpp_wrapper": False}} if args.python_wrapper else {}))
    step = make_step(model, training_batch(args.depth, 64, ids), args.depth)
    for _ in range(3):  # warm-up (compiles on --compile)
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        wall = time.perf_counter() - start
    wrapper = (", Python wrapper" if args.python_wrapper else ", C++ wrapper") if args.compile else ""
    print(f"{args.view} view, d = {args.depth}, attention {args.attn}, compile {args.compile}{wrapper}, "
          f"{torch.get_num_threads()} threads: one step {1000 * wall:.0f} ms under the profiler")
    events = {e.key: e for e in prof.key_averages()}
    for key in sorted(events):
        e = events[key]
        if key.startswith("## ") or key.startswith("Optimizer.step") or key == "TorchDynamo Cache Lookup" or (
                key.startswith("autograd::engine::evaluate_function: CompiledFunctionBackward")):
            print(f"  {key[:70]:70s} {e.cpu_time_total / 1e3:8.1f} ms  calls {e.count}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
