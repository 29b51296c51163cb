"""Shared tiny fixtures: random Qwen2 parents and PAR models small enough for CPU tests."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread_per_process():
    """One intra-op thread in this process and in every process a test starts (OMP_NUM_THREADS, inherited), as each
    study's row process runs (`par_studies.thread_env`). The models here are tiny, so a second thread gains little; on
    a 2-core machine that is busy with other work, two threads per process make some runs many times slower. (Before
    this fixture the session was one-threaded anyway once test_cot.py was collected, but not its subprocesses.)"""
    import os

    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp


@pytest.fixture(scope="module", autouse=True)
def _long_lived_objects_out_of_the_cycle_collector():
    """At each test module's start, what is alive then (imported libraries, collected test modules, what earlier
    modules left) is moved out of the cyclic garbage collector's reach (`gc.freeze`): still freed by reference
    counting, never scanned again. Every `Trainer.train` runs a full `gc.collect()` (accelerate's `free_memory`), and
    the paper-scale dry run collects around each measured step: each walked every object torch, transformers and the
    collected tests had made (~0.2 s of CPU a collection on a 2-core CI machine, ~17 s over the suite). Now one walks
    the objects the current module made; what a test creates is collected as before."""
    import gc

    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True)
def _no_datasets_cache():
    """Every map in a test runs (datasets' cache off): a test that swaps a code path must see it run, never a cached
    result of another test. The cache test turns it on for itself."""
    import datasets

    datasets.disable_caching()
    yield
    datasets.enable_caching()


VOCAB = 40
ANSWER_IDS = [10, 11, 12, 13, 14]
HALT_IDS = (20, 21)


def tiny_qwen2_config(**overrides) -> Qwen2Config:
    kwargs = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0,
    )
    kwargs.update(overrides)
    return Qwen2Config(**kwargs)


def tiny_par_config(**overrides) -> ParLoopedQwenConfig:
    kwargs = tiny_qwen2_config().to_dict()
    for key in ("model_type", "transformers_version", "architectures"):
        kwargs.pop(key, None)
    kwargs.update(prelude_layers=2, core_layers=2, coda_layers=2, answer_token_ids=ANSWER_IDS, halt_token_ids=HALT_IDS)
    kwargs.update(overrides)
    return ParLoopedQwenConfig(**kwargs)


def make_model(seed: int = 0, **overrides) -> ParLoopedQwenForStateTracking:
    """A random tiny PAR model whose adapter is perturbed away from [0 | I] so e feeds every iteration."""
    torch.manual_seed(seed)
    model = ParLoopedQwenForStateTracking(tiny_par_config(**overrides)).eval()
    with torch.no_grad():
        model.adapter.weight.add_(0.05 * torch.randn_like(model.adapter.weight))
    return model


@pytest.fixture
def tiny_parent():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_qwen2_config()).eval()


@pytest.fixture
def tiny_model():
    return make_model()


def load_example(relative_path: str):
    """Import a script under examples/ as a module (registered, so its dataclasses resolve)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / relative_path
    name = "example_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


IN_PROCESS_SCRIPTS = ("examples/train_par.py", "examples/baselines/rnn.py")


@pytest.fixture
def scripts_in_process(monkeypatch):
    """`par_studies.runs` (train_segment, run_logged) runs train_par.py and rnn.py in this process instead of a fresh
    `python` each: the same argv through the scripts' own `run_cli(main, argv)` (a bad input still exits 2), from the
    repository root, one torch thread (the rows' `thread_env`), output to the segment's log. For tests of a study's
    bookkeeping (segments, resumes, records, tables), where the process boundary is not what is tested; yields the
    list of each run's [script, *argv]. Any other command is a real subprocess; the thread count is restored."""
    import contextlib
    import os
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from par_cli.cli import run_cli
    from par_studies import runs

    repo = Path(__file__).resolve().parents[1]
    calls, threads = [], torch.get_num_threads()

    def run(command, *args, cwd=None, env=None, stdout=None, stderr=None, **kwargs):
        script = command[1] if len(command) > 1 and command[0] == sys.executable else None
        if script not in IN_PROCESS_SCRIPTS:
            return subprocess.run(command, *args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, **kwargs)
        module = runs.load_train_par() if script == "examples/train_par.py" else load_example(script)
        calls.append(command[1:])
        here, code = os.getcwd(), 0
        out = stdout if stdout is not None and stdout is not subprocess.PIPE else sys.stdout
        try:
            os.chdir(cwd or repo)
            torch.set_num_threads(1)  # as the row's own process (runs.thread_env)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                run_cli(module.main, list(command[2:]))
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else 1
        finally:
            os.chdir(here)
            torch.set_num_threads(threads)
        return subprocess.CompletedProcess(command, code)

    monkeypatch.setattr(runs, "subprocess", SimpleNamespace(run=run, STDOUT=subprocess.STDOUT, PIPE=subprocess.PIPE))
    yield calls
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------- one fresh process
FRESH_PROCESS_JOBS: dict = {}  # name -> ((unblocked, order), builder, the test module that registered it)

FRESH_PROCESS_RUNNER = """
import builtins, contextlib, io, os, traceback
results, (jobs_file, repository) = {}, sys.argv[1:3]
meta_path, path = list(sys.meta_path), list(sys.path)  # with BLOCK_THIS_REPOSITORY's blocker, without the repository
for job in json.loads(open(jobs_file).read()):
    if job["blocked"]:
        sys.meta_path[:], sys.path[:] = meta_path, path  # what a job added (a finder, a path) goes with it
    else:  # the repository importable again, as in a plain `python -c` there; the blocked jobs have all run
        sys.meta_path[:] = [f for f in meta_path if type(f).__name__ != "Block"]
        sys.path[:] = [repository, *path]
    os.chdir(job["folder"])  # as `run_blocked`'s cwd
    sys.argv = ["-c", job["folder"], repository, *job["args"]]  # as `run_blocked`'s command line
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(job["script"], "<" + job["name"] + ">", "exec"),
                 {"__name__": "__main__", "__builtins__": builtins, "importlib": importlib, "json": json, "sys": sys})
        lines = out.getvalue().strip().splitlines()
        results[job["name"]] = {"output": lines[-1] if lines else None, "error": None}
    except BaseException:
        results[job["name"]] = {"output": None, "error": traceback.format_exc()[-3000:]}
with open(jobs_file + ".out", "w") as f:
    json.dump(results, f)
"""


def build_jobs(request, tmp_path_factory, registry: dict, fixture: str) -> tuple[dict, dict]:
    """The jobs of `registry` that a collected test needs (one of its module's tests uses `fixture`), in their
    order, each built by its builder in a new temporary folder; and the traceback of each builder that failed."""
    import traceback

    used = {item.module.__name__ for item in request.session.items
            if fixture in getattr(item, "fixturenames", ()) and getattr(item, "module", None)}
    built, failed = {}, {}
    for _, name, builder in sorted((key, name, builder) for name, (key, builder, module) in registry.items()
                                   if module in used):
        try:
            built[name] = builder(tmp_path_factory.mktemp(name))
        except Exception:
            failed[name] = "building the job failed:\n" + traceback.format_exc()[-3000:]
    return built, failed


def fresh_process_job(name: str, order: int = 1, blocked: bool = True):
    """Register a test module's check for the session's one fresh process (`fresh_process`): `builder(folder)` writes
    what the check needs under `folder` (a new temporary folder) and returns a dict with `script` (a
    `tests.test_modeling_par.run_blocked` script: sys.argv is [folder, repository, *args], `json` and `sys`
    imported; its last line of stdout is JSON), `folder` (its working folder and sys.argv[1]), `args` (strings) and
    anything else the tests read back. Package-blocked jobs run first, by `order`, then name; `blocked=False` jobs
    (the package importable: checks of what importing it loads) after them all."""
    def register(builder):
        FRESH_PROCESS_JOBS[name] = ((not blocked, order), builder, builder.__module__)
        return builder
    return register


@pytest.fixture(scope="session")
def fresh_process(request, tmp_path_factory):
    """The fresh-process checks of every collected test module that uses this fixture (registered with
    `fresh_process_job`), run in ONE fresh offline process, one after another, each as `run_blocked` runs it (its own
    sys.argv, working folder and namespace). First the package-blocked ones: `BLOCK_THIS_REPOSITORY` keeps
    modeling_par, state_tracking and trainers out until they have all run, so every one can load only its folder's
    remote code (each folder has its own name, so its own `transformers_modules` package); what one must see first
    in a fresh process (no remote code loaded yet) has `order` 0. Then the unblocked ones, in a process that has
    never imported the package. The process's module cache (HF_MODULES_CACHE) is a fresh folder, `modules_cache`. A
    fresh `python` costs ~4 s of CPU to import torch and transformers: one process instead of one per check.
    Returns, per job name, its builder's dict with `output` (the job's last line of stdout, parsed as JSON) and
    `error` (its traceback, or None); `fresh_process_result` asserts."""
    import json
    import os
    import subprocess
    import sys
    import textwrap

    from tests.test_modeling_par import BLOCK_THIS_REPOSITORY, REPO

    built, failed = build_jobs(request, tmp_path_factory, FRESH_PROCESS_JOBS, "fresh_process")
    root = tmp_path_factory.mktemp("fresh_process")
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps([{"name": name, "script": textwrap.dedent(built[name]["script"]),
                                      "folder": str(built[name]["folder"]), "args": list(built[name]["args"]),
                                      "blocked": not FRESH_PROCESS_JOBS[name][0][0]} for name in built]))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(root / "modules"))
    proc = subprocess.run([sys.executable, "-c", BLOCK_THIS_REPOSITORY + FRESH_PROCESS_RUNNER, str(jobs_file),
                           str(REPO)], capture_output=True, text=True, cwd=root, env=env, timeout=600)
    done = json.loads(jobs_file.with_name("jobs.json.out").read_text()) if proc.returncode == 0 else {}
    results = {}
    for name, job in built.items():
        result = done.get(name) or {"output": None, "error": f"the process failed ({proc.returncode}):\n"
                                                              + proc.stderr[-3000:]}
        output, error = None, result["error"]
        if result["output"] is not None:
            try:
                output = json.loads(result["output"])
            except ValueError:
                error = f"its last line is not JSON: {result['output'][:1000]}"
        results[name] = {**job, "output": output, "error": error, "modules_cache": root / "modules"}
    results.update({name: {"output": None, "error": error} for name, error in failed.items()})
    return results


def fresh_process_result(fresh_process, name: str) -> dict:
    """Job `name`'s dict from `fresh_process`, asserting that it ran to the end and printed its line."""
    job = fresh_process[name]
    assert job["error"] is None, job["error"]
    assert job["output"] is not None, f"{name} printed nothing"
    return job
