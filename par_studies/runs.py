"""Running a study row and reading its run back: one torch thread per process, resumable train_par.py segments, the
newest checkpoint, a trained model ready to evaluate."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from .rows import argv, combine

REPO = Path(__file__).resolve().parents[1]


def thread_env() -> dict:
    """The environment of a row's process: one torch thread (two rows share a 2-core machine), no progress bars."""
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1", TOKENIZERS_PARALLELISM="false")


def run_logged(command: list[str], log: Path | None = None) -> None:
    """`python *command[1:]` from the repository root with `thread_env`, output to `log` (else to this process's);
    a failure is a SystemExit naming the command and the log."""
    with open(log, "w") if log else contextlib.nullcontext() as out:
        code = subprocess.run([sys.executable, *command[1:]], cwd=REPO, env=thread_env(), stdout=out,
                              stderr=subprocess.STDOUT if out else None).returncode
    if code:
        raise SystemExit(f"command failed ({code}): {' '.join(command)}" + (f"; log: {log}" if log else ""))


def previous_results(out: Path, final_key: str | None) -> dict:
    """A study's results file as it stands ({} when absent); `final_key` (a held-out set asked for) refused when the
    file already holds it: a test set is read once, at the end."""
    previous = json.loads(out.read_text()) if out.is_file() else {}
    if final_key and final_key in previous:
        raise SystemExit(f"{out} already holds {final_key} (read once, {previous[final_key]['date']}): not read again.")
    return previous


def held_out_study_start(doc: str, out: Path, final_set: str, argv=None) -> tuple[bool, dict]:
    """A held-out-set study's start: its command line (`--final_<final_set>`: also read that set, once, at the end),
    one torch thread, and its results so far (`previous_results`). -> (the final set asked for, the results)."""
    import argparse

    import torch

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False)
    shown = final_set.replace("set", "set ")
    parser.add_argument(f"--final_{final_set}", action="store_true", help=f"also read {shown} (once, at the end)")
    final = getattr(parser.parse_args(argv), f"final_{final_set}")
    torch.set_num_threads(1)
    return final, previous_results(out, final_set if final else None)


def finished_par_runs(run_dir: Path, rows: list[str]):
    """The finished `train_par.py` runs `rows` (folder names under `run_dir`), each as (row, model in eval mode, its
    summary.json's max_train_depth), loaded one at a time; one SystemExit naming every row without a summary.json
    before any is loaded (the full-view studies' --rows)."""
    missing = [row for row in rows if not (run_dir / row / "summary.json").is_file()]
    if missing:
        raise SystemExit(f"--rows: no finished run under {run_dir} for {missing}")
    from modeling_par import ParLoopedQwenForStateTracking

    for row in rows:
        folder = run_dir / row
        train_depth = int(json.loads((folder / "summary.json").read_text())["max_train_depth"])
        yield row, ParLoopedQwenForStateTracking.from_pretrained(folder).eval(), train_depth


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest *complete* checkpoint-<step> folder of a run, or None: `trainers.last_complete_checkpoint`
    (a checkpoint whose saving was cut off, e.g. by the end of a session, has no trainer_state.json and is
    skipped with a warning; other names such as checkpoint-foo are ignored)."""
    from trainers import last_complete_checkpoint

    return last_complete_checkpoint(folder)


def row_train_seconds(segments: list[dict]) -> float:
    """The row's training time: what its checkpoint had counted when the last segment began, plus that segment's
    wall time (time an interrupted segment spent after its last checkpoint is not counted: those steps were redone)."""
    last = segments[-1]
    return round(last.get("trained_seconds_before", 0.0) + last.get("wall_seconds", 0.0), 1)


def stopped_on_time(summary: Mapping) -> bool:
    """Whether a finished train_par.py run ended on its time budget (so training it on is the same run, its
    learning-rate schedule unchanged): its summary's `stopped_by`, or for a summary written before that field, no
    probe stopped it and it trained fewer than its `max_steps`."""
    if "stopped_by" in summary:
        return summary["stopped_by"] == "max_train_seconds"
    return summary.get("probe_stopped_at") is None and summary.get("steps", 0) < summary.get("max_steps", 0)


def train_segment(folder: Path, seed: int, flags: Mapping[str, str], name: str,
                  more_seconds: float | None = None) -> list[dict]:
    """Train (or resume from the newest checkpoint in `folder`) `examples/train_par.py --output_dir folder --seed seed
    <flags>`, one thread; returns the run's segments (command, start, resume point, time trained before it, wall
    seconds, status), kept in <folder>/segments.json. A folder with summary.json is finished: nothing runs, unless
    `more_seconds` is given and the run ended on its time budget (`stopped_on_time`): then its summary is kept as
    summary_segment<N>.json and the run trains on from its newest checkpoint with a time budget `more_seconds` past
    what it had trained (same flags, same `max_steps`, so the same schedule)."""
    from state_tracking.evaluation import repo_relative
    from trainers import trained_seconds

    folder.mkdir(parents=True, exist_ok=True)
    segments_file = folder / "segments.json"
    segments = json.loads(segments_file.read_text()) if segments_file.is_file() else []
    summary_file = folder / "summary.json"
    if summary_file.is_file():
        if more_seconds is None or not stopped_on_time(json.loads(summary_file.read_text())):
            return segments
        summary_file.rename(folder / f"summary_segment{len(segments)}.json")
    resume = latest_checkpoint(folder)
    if more_seconds is not None:
        if more_seconds <= 0:
            raise ValueError(f"more_seconds must be > 0, got {more_seconds}")
        before = 0.0 if resume is None else trained_seconds(resume)
        flags = {**flags, "--max_train_seconds": str(round(before + more_seconds))}
    command = ["python", "examples/train_par.py", *argv(combine(
        name, {"--output_dir": repo_relative(folder), "--seed": str(seed)}, flags,
        {} if resume is None else {"--resume_from_checkpoint": repo_relative(resume)}))]
    for segment in segments:  # a segment without an end was cut off (its process was stopped)
        segment.setdefault("status", "interrupted")
    segments.append({"command": " ".join(command), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "resumed_from": None if resume is None else resume.name,
                     "trained_seconds_before": 0.0 if resume is None else trained_seconds(resume)})
    segments_file.write_text(json.dumps(segments, indent=1))
    started = time.time()
    log_file = folder / f"train_segment{len(segments)}.log"
    with open(log_file, "w") as log:
        code = subprocess.run([sys.executable, *command[1:]], cwd=REPO, env=thread_env(), stdout=log,
                              stderr=subprocess.STDOUT).returncode
    segments[-1].update(wall_seconds=round(time.time() - started, 1),
                        status="finished" if code == 0 else f"exit {code}", peak_rss_gb=children_peak_rss_gb())
    segments_file.write_text(json.dumps(segments, indent=1))
    if code != 0:
        raise SystemExit(f"{name} seed {seed}: train_par.py exited {code}; see {log_file}")
    return segments


def children_peak_rss_gb() -> float:
    """The peak resident memory (GB) of this process's finished children (getrusage RUSAGE_CHILDREN: the largest
    of them, so a segment's training process when it is the first child)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2)


def peak_rss_gb(segments: list[dict]) -> float | None:
    """A run's peak resident memory (GB): the largest its training segments recorded; None where none recorded it
    (segments trained before the field existed). A record assembled in a process that did not train reads this,
    not its own children (which would read 0)."""
    peaks = [s["peak_rss_gb"] for s in segments if s.get("peak_rss_gb")]
    return max(peaks) if peaks else None


def curriculum_growth(folder: Path) -> list[int] | None:
    """The steps from which a mastery curriculum grew d_max, from the newest checkpoint of a run folder (trainers'
    CURRICULUM_STATE_NAME); None without one (the fixed pace, or nothing saved yet)."""
    from trainers.par_trainer import CURRICULUM_STATE_NAME

    checkpoint = latest_checkpoint(folder)
    state = checkpoint / CURRICULUM_STATE_NAME if checkpoint is not None else None
    return json.loads(state.read_text())["advances"] if state is not None and state.is_file() else None


def load_run(folder: Path, longest_depth: int):
    """(model, tokenizer, task) of a train_par.py output folder, ready to evaluate up to `longest_depth`: the loop
    cap is an inference setting, raised so that forced depth reaches it and halting can confirm there."""
    from transformers import AutoTokenizer

    from modeling_par import ParLoopedQwenForStateTracking
    from state_tracking import load_task_from_dir

    model = ParLoopedQwenForStateTracking.from_pretrained(folder).eval()
    model.config.max_iterations = max(model.config.max_iterations, longest_depth + model.config.halt_window + 8)
    return model, AutoTokenizer.from_pretrained(folder), load_task_from_dir(folder)


def blocked_pipeline_check(folder: Path, task, script: str, phrasings, depth: int, n: int, seed: int) -> dict:
    """`n` raw strings of `depth` operations per phrasing (idle start, fresh problems: generator seed `seed + 4242`,
    phrasings drawn from `derive_seed("pipeline check", phrasing, seed)`) through the pipeline of a checkpoint folder:
    `script` (a tests.test_modeling_par.run_blocked script reading the cases file named by sys.argv[3]) runs in a fresh
    process with this package blocked; its JSON result is `by_phrasing`."""
    import numpy as np

    from state_tracking.data import derive_seed
    from state_tracking.evaluation import draw_test_problems
    from state_tracking.prompts import text_prompt

    ops, _ = draw_test_problems(task, depth, n, seed + 4242, False)
    targets = task.final_states(ops)[:, 0]
    cases = {}
    for phrasing in phrasings:
        rng = np.random.default_rng(derive_seed("pipeline check", phrasing, seed))
        cases[phrasing] = {"prompts": [text_prompt(task, o, None, phrasing, rng)[0] for o in ops],
                           "targets": [task.candidate_names[t] for t in targets]}
    cases_file = folder.parent / f".{folder.name}_pipeline_cases.json"
    cases_file.write_text(json.dumps(cases))
    try:
        result = json.loads(repo_module("tests.test_modeling_par").run_blocked(script, folder, str(cases_file),
                                                                                timeout=None))
    finally:
        cases_file.unlink()
    return {"depth": depth, "n": n, "start": "idle", "fresh_generator_seed": seed + 4242, "by_phrasing": result}


def load_train_par():
    """examples/train_par.py as a module (its parser and `main`), loaded once per process under the name tests'
    `load_example` gives it ("example_train_par")."""
    name = "example_train_par"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "train_par.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def repo_module(dotted: str):
    """A module of this repository outside its installed packages, by its dotted path from the repository root
    (`examples.push_to_hub`, `tests.test_modeling_par`): the folders on the way are registered as packages at their
    place in the repository, so the module's own imports of its siblings resolve; sys.path is not changed."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        package, folder = ".".join(parts[:i]), REPO.joinpath(*parts[:i])
        if package in sys.modules:
            continue
        init = folder / "__init__.py"
        spec = (importlib.util.spec_from_file_location(package, init, submodule_search_locations=[str(folder)])
                if init.is_file() else importlib.machinery.ModuleSpec(package, None, is_package=True))
        if not init.is_file():
            spec.submodule_search_locations = [str(folder)]
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        if spec.loader is not None:
            spec.loader.exec_module(module)
    return importlib.import_module(dotted)


SHIPPED_MAX_MIB = 16  # a checkpoint committed under checkpoints/


def write_shipped_summary(target: Path, summary: dict) -> None:
    """The last step of shipping a study row as a committed checkpoint: its training_summary.json written beside the
    exported files, and the folder refused (`SystemExit`) when it holds more than `SHIPPED_MAX_MIB`."""
    (target / "training_summary.json").write_text(json.dumps(summary, indent=1))
    size = sum(f.stat().st_size for f in target.iterdir())
    if size > SHIPPED_MAX_MIB * 2**20:
        raise SystemExit(f"the checkpoint is {size / 2**20:.1f} MiB; the shipped one must be ≤ {SHIPPED_MAX_MIB} MiB.")
