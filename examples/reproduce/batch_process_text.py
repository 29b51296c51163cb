"""The batch-process machine as raw text: train, find why accuracy decays with length, fix it, ship the checkpoint.

    python examples/reproduce/batch_process_text.py --row idle_start --seed 0     # train (or resume) + evaluate
    python examples/reproduce/batch_process_text.py --row random_start --seed 0
    python examples/reproduce/batch_process_text.py --collect                    # README.md + table
    python examples/reproduce/batch_process_text.py --export random_start --seed 0  # checkpoints/par-batch-process-text

Task: examples/tasks/batch_process_phrasings.json (the machine of examples/tasks/batch_process.json; every sentence
with 3 to 4 phrasings, the last of each held out of training). Text rendering, word-level tokenizer over every
phrasing (held-out words in the vocabulary). The recipe (local view, progress positions, bidirectional queries) with
halting labels (offset 1), train d ≤ 8 with the default curriculum, 2,000 steps × 64, one torch thread.

Rows: `idle_start` — every training prompt starts idle (the comparisons study's setting); `random_start` — the start
state is drawn uniformly (`--random_initial true`) and stated in the prompt. Test: d = 8, 16, 32, 64, 128, 1,024
fresh sequences per depth (the row's seed, apart from training data), starting idle, with canonical, seen and
held-out phrasings, forced depth and learned halting. Diagnosis (d = 64, 512 sequences, idle start, seen
phrasings): the progress readouts of every iteration against z_k, and for each wrong sample the first iteration
that goes wrong with the state it was in and the operation it read, next to how often training visited that state.

Export: the row's checkpoint with its card (model-index, curve, seen / held-out accuracy) and the pipeline, then a
fresh process with the package blocked answers 1,024 raw strings per phrasing at d = 64 through
`pipeline("state-tracking", model=checkpoints/par-batch-process-text, trust_remote_code=True)`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from par_cli.flag_values import true_or_false  # noqa: E402
from par_studies import (
    HALTING,
    LOCAL,
    REPO,
    Row,
    blocked_pipeline_check,
    combine,
    load_records,
    load_run,
    repo_module,
    row_train_seconds,
    rows_by_name,
    save_record,
    train_segment,
)

TASK_FILE = "examples/tasks/batch_process_phrasings.json"
OUT = REPO / "results" / "batch_process_text_cpu"
RUN_DIR = REPO / "runs" / "batch_process_text"
CHECKPOINT = REPO / "checkpoints" / "par-batch-process-text"
TRAIN_MAX_DEPTH = 8
GRID = [8, 16, 32, 64, 128]
N = 1024
PHRASINGS = ["canonical", "seen", "held_out"]
DIAGNOSIS_DEPTH, DIAGNOSIS_N = 64, 512
PIPELINE_DEPTH, PIPELINE_N = 64, 1024  # the export's check: >= 99% at 8x the training depth through the pipeline
STEPS = 2000
TINY_FLAGS: dict[str, str] = {}  # --tiny (tests): a small model whose untrained halting gives up quickly

COMMON = {
    "--task_file": TASK_FILE, "--rendering": "text", "--max_train_depth": str(TRAIN_MAX_DEPTH),
    "--max_steps": str(STEPS), "--per_device_train_batch_size": "64", "--learning_rate": "1e-3",
    "--eval_depths": "8", "--eval_n": "64", "--logging_steps": "50", "--disable_tqdm": "true", "--report_to": "none",
    "--save_strategy": "steps", "--save_steps": "250", "--save_total_limit": "1", "--max_train_seconds": "3600",
}
ROWS = rows_by_name(
    Row.of("idle_start", "recipe + halting, every training prompt starts idle", LOCAL, HALTING),
    Row.of("random_start", "recipe + halting, random start state (stated in the prompt)", LOCAL, HALTING,
           {"--random_initial": "true"}),
)


def run_path(row: str, seed: int) -> Path:
    return RUN_DIR / f"{row}_s{seed}"


def train(row: str, seed: int, steps: int | None = None) -> list[dict]:
    """Train (or resume) a row with examples/train_par.py: the common flags, the row's over them, then --steps and
    --tiny's (test scale) over both; returns its segments."""
    flags = {**COMMON, **ROWS[row].flags, **({} if steps is None else {"--max_steps": str(steps)}), **TINY_FLAGS}
    return train_segment(run_path(row, seed), seed, combine(row, flags), row)


def state_visits(task, depth_max: int, n: int = 20000, seed: int = 0, random_initial: bool = False) -> dict:
    """How often each state is the one an operation is applied to, over problems of depth U{1..depth_max}."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(task.num_candidates)
    for depth in range(1, depth_max + 1):
        ops = task.sample_ops(rng, n // depth_max, depth)
        initial = task.sample_initial(rng, len(ops)) if random_initial else None
        before = task.prefix_states(ops, initial)[:, :-1, 0]
        counts += np.bincount(before.reshape(-1), minlength=task.num_candidates)
    return {name: round(float(c / counts.sum()), 4) for name, c in zip(task.candidate_names, counts)}


def diagnose(model, tokenizer, task, seed: int, phrasing: str = "seen") -> dict:
    """Progress readouts at every iteration of d = DIAGNOSIS_DEPTH prompts (idle start) against z_k, and where each
    wrong sample first goes wrong: (state before, operation read) at its first wrong iteration."""
    from state_tracking.data import derive_seed
    from state_tracking.diagnostics import iteration_readouts
    from state_tracking.evaluation import draw_test_problems

    ops, initial = draw_test_problems(task, DIAGNOSIS_DEPTH, DIAGNOSIS_N, seed + 1, False)
    states = task.prefix_states(ops, initial)[..., 0]  # (n, d + 1)
    answers = iteration_readouts(model, tokenizer, task, ops, initial, DIAGNOSIS_DEPTH, rendering="text",
                                 batch_size=64, phrasing=phrasing,
                                 rng=np.random.default_rng(derive_seed("diagnosis", seed)))[..., 0]  # (n, d)
    right = answers == states[:, 1:]
    first_wrong = np.where(right.all(1), -1, np.argmin(right, axis=1))
    names, ops_names = task.candidate_names, task.op_names
    pairs: dict[str, int] = {}
    for i in np.flatnonzero(first_wrong >= 0):
        k = first_wrong[i]
        key = f"{names[states[i, k]]} + {ops_names[ops[i, k]]} → {names[states[i, k + 1]]}"
        pairs[key] = pairs.get(key, 0) + 1
    return {"depth": DIAGNOSIS_DEPTH, "n": DIAGNOSIS_N, "phrasing": phrasing,
            "profile": right.mean(0).round(4).tolist(), "final_accuracy": float(right[:, -1].mean()),
            "wrong_samples": int((first_wrong >= 0).sum()),
            "first_wrong_iteration": sorted(int(k) + 1 for k in first_wrong if k >= 0),
            "first_wrong_transition": dict(sorted(pairs.items(), key=lambda kv: -kv[1])),
            "test_state_visits": state_visits(task, DIAGNOSIS_DEPTH, n=DIAGNOSIS_N * 8, seed=seed)}


def evaluate(row: str, seed: int, segments: list[dict]) -> dict:
    import torch

    from state_tracking import evaluate_until_failed

    torch.set_num_threads(1)
    folder = run_path(row, seed)
    summary = json.loads((folder / "summary.json").read_text())
    model, tokenizer, task = load_run(folder, max(GRID[-1], DIAGNOSIS_DEPTH))
    evaluation = {}
    for phrasing in PHRASINGS:
        for mode in ("forced", "halting"):
            started = time.time()
            result = evaluate_until_failed(model, tokenizer, task, GRID, mode=mode, train_max_depth=TRAIN_MAX_DEPTH,
                                           n_per_depth=N, seed=seed, rendering="text", phrasing=phrasing,
                                           progress=False)
            evaluation[f"{phrasing}/{mode}"] = {
                **{k: result[k] for k in ("depths", "accuracy", "d50", "extrapolation_factor", "stopped_early")},
                "mean_iterations": [p["mean_iterations"] for p in result["per_depth"]],
                "fraction_not_halted": [p["fraction_not_halted"] for p in result["per_depth"]],
                "seconds": round(time.time() - started, 1)}
            print(f"{row} s{seed} {phrasing}/{mode}: " + " ".join(
                f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])), flush=True)
    random_initial = ROWS[row].flags.get("--random_initial") == "true"
    return dict(row=row, label=ROWS[row].label, seed=seed, task_file=TASK_FILE,
                command=f"python examples/reproduce/batch_process_text.py --row {row} --seed {seed}",
                train_commands=[s["command"] for s in segments], segments=segments, steps=summary["steps"],
                samples_seen=summary["samples_seen"], train_seconds=row_train_seconds(segments),
                curve=summary.get("curve"), evaluation=evaluation,
                diagnosis=diagnose(model, tokenizer, task, seed),
                train_state_visits=state_visits(task, TRAIN_MAX_DEPTH, seed=seed, random_initial=random_initial),
                environment=result["environment"], parameters=sum(p.numel() for p in model.parameters()))


def record_path(row: str, seed: int) -> Path:
    return OUT / "runs" / f"{row}_s{seed}.json"


def run_row(row: str, seed: int, steps: int | None = None) -> dict:
    segments = train(row, seed, steps)
    record = evaluate(row, seed, segments)
    save_record(record, record_path(row, seed))
    return record


# ------------------------------------------------------------------------------------------------------ export
PIPELINE_CHECK = """
    import numpy as np
    import torch
    from transformers import pipeline
    torch.set_num_threads(1)
    tracker = pipeline("state-tracking", model=sys.argv[1], trust_remote_code=True)
    assert type(tracker).__module__.startswith("transformers_modules"), type(tracker).__module__
    cases = json.loads(open(sys.argv[3]).read())
    out = {}
    for phrasing, case in cases.items():
        results = tracker(case["prompts"], batch_size=64, allow_untrained=phrasing == "held_out")
        answers = [r["answers"]["state"] for r in results]
        out[phrasing] = {"accuracy": float(np.mean([a == t for a, t in zip(answers, case["targets"])])),
                         "mode": results[0]["mode"],
                         "mean_iterations": float(np.mean([r["iterations"] for r in results])),
                         "halted": float(np.mean([r["halted"] for r in results])), "n": len(answers)}
    print(json.dumps(out))
"""


def pipeline_check(folder: Path, task, seed: int, depth: int | None = None, n: int | None = None) -> dict:
    """Raw strings (idle start, `depth` operations) through the folder's pipeline in a fresh process with the package
    blocked; accuracy per phrasing (`par_studies.blocked_pipeline_check`)."""
    check = blocked_pipeline_check(folder, task, PIPELINE_CHECK, PHRASINGS, depth or PIPELINE_DEPTH, n or PIPELINE_N,
                                   seed)
    check["command"] = f"python examples/reproduce/batch_process_text.py --export <row> --seed {seed}"
    return check


def export(row: str, seed: int, target: Path | None = None) -> Path:
    import shutil

    from state_tracking import load_task_from_dir

    hub = repo_module("examples.push_to_hub")

    target = target or CHECKPOINT
    record = json.loads(record_path(row, seed).read_text())
    folder = run_path(row, seed)
    if target.exists():
        shutil.rmtree(target)
    ev = record["evaluation"]
    rows = {f"{mode} ({phrasing.replace('_', '-')} phrasing)": ev[f"{phrasing}/{mode}"]["accuracy"]
            for phrasing in PHRASINGS for mode in ("forced", "halting")}
    intro = (f"Overall state accuracy (%) on {N} fresh prompts per depth (idle start, seed {seed}; trained on d ≤ "
             f"{TRAIN_MAX_DEPTH}), by phrasing: canonical (each sentence's first form), seen (drawn among the "
             "phrasings training drew from), held-out (the phrasing of each sentence kept out of training). "
             f"`{record['command']}`.")
    markdown = hub.results_section(intro, GRID, rows, curve=record.get("curve"))
    measured = {"depths": GRID, "rows": rows, "train_max_depth": TRAIN_MAX_DEPTH, "n_sequences": N}
    hub.export_for_hub(folder, target, repo_id="par-batch-process-text", results=None, measured=measured,
                       rendering="text", learned_halting=ROWS[row].halting,
                       training_data=(f"{record['samples_seen']:,} random text problems of {TASK_FILE} (d ≤ "
                                      f"{TRAIN_MAX_DEPTH}, {ROWS[row].label}), {record['steps']} steps, seed {seed}."),
                       limits="From scratch at CPU scale; a small word-level vocabulary: only the task's sentences.")
    card = (target / "README.md").read_text().replace("No results were attached to this export.", markdown)
    (target / "README.md").write_text(card)
    check = pipeline_check(target, load_task_from_dir(folder), seed)
    check["command"] = check["command"].replace("<row>", row)
    (target / "pipeline_check.json").write_text(json.dumps(check, indent=1))
    line = (f"\nThrough the pipeline (this folder alone, a fresh process with the package blocked), {check['n']:,} raw "
            f"strings of {check['depth']} operations from an idle start (fresh generator, seed "
            f"{check['fresh_generator_seed']}): " + ", ".join(
                f"{p.replace('_', '-')} phrasing {100 * v['accuracy']:.2f}%" for p, v in check["by_phrasing"].items())
            + f" ({next(iter(check['by_phrasing'].values()))['mode']}; `pipeline_check.json`).\n")
    card = (target / "README.md").read_text()
    (target / "README.md").write_text(card.replace("\nTraining curve (loss,", line + "\nTraining curve (loss,", 1))
    record["pipeline_check"] = check
    record_path(row, seed).write_text(json.dumps(record, indent=1))
    print(json.dumps(check["by_phrasing"], indent=1))
    return target


# ------------------------------------------------------------------------------------------------------ collect
def collect() -> None:
    records = load_records(OUT / "runs")
    lines = ["| row | seed | phrasing | mode | " + " | ".join(f"d={d}" for d in GRID) + " | train s |",
             "|---|---|---|---|" + "---|" * len(GRID) + "---|"]
    for r in records:
        for phrasing in PHRASINGS:
            for mode in ("forced", "halting"):
                acc = r["evaluation"][f"{phrasing}/{mode}"]["accuracy"]
                cells = [f"{100 * a:.2f}" for a in acc] + ["0 (stop rule)"] * (len(GRID) - len(acc))
                lines.append(f"| {r['row']} | {r['seed']} | {phrasing} | {mode} | " + " | ".join(cells)
                             + f" | {r['train_seconds']:.0f} |")
    diag = ["| row | seed | final acc d=64 (seen) | wrong / n | first wrong iteration (median) | top first-wrong "
            "transitions | train visits (holding / draining / fault) | test visits d=64 |",
            "|---|---|---|---|---|---|---|---|"]
    for r in records:
        d = r["diagnosis"]
        firsts = d["first_wrong_iteration"]
        top = "; ".join(f"{k}: {v}" for k, v in list(d["first_wrong_transition"].items())[:3]) or "—"
        tv, sv = r["train_state_visits"], d["test_state_visits"]
        diag.append(f"| {r['row']} | {r['seed']} | {100 * d['final_accuracy']:.2f} | {d['wrong_samples']} / {d['n']} | "
                    f"{int(np.median(firsts)) if firsts else '—'} | {top} | {tv['holding']} / {tv['draining']} / "
                    f"{tv['fault']} | {sv['holding']} / {sv['draining']} / {sv['fault']} |")
    checks = [f"- `{r['row']}` seed {r['seed']}: " + ", ".join(
        f"{p}: {100 * v['accuracy']:.2f}% ({v['mode']})" for p, v in r["pipeline_check"]["by_phrasing"].items())
        for r in records if "pipeline_check" in r]
    env = records[0]["environment"] if records else {}
    text = f"""# The batch-process machine as raw text (CPU scale)

Generated by `python examples/reproduce/batch_process_text.py --collect` from `runs/*.json` (one per row and seed:
commands, segments and wall times, curve, accuracy per phrasing and mode, diagnosis). Task `{TASK_FILE}`, text
rendering, train d ≤ {TRAIN_MAX_DEPTH} ({STEPS} steps × 64), test {N} fresh prompts per depth starting idle; the
stop rule ends a grid after two depths under 2%. Machine: {env.get('platform', '?')}, torch {env.get('torch', '?')}; \
{env.get('date', '')}.

{chr(10).join(lines)}

Diagnosis at d = {DIAGNOSIS_DEPTH} ({DIAGNOSIS_N} prompts, seen phrasings): where each wrong prompt first goes wrong,
and how often training (d ≤ {TRAIN_MAX_DEPTH}) and the test (d = {DIAGNOSIS_DEPTH}) apply an operation in the rarest
states.

{chr(10).join(diag)}

Pipeline check (exported checkpoint, fresh process, package blocked, 1,024 raw strings at d = 64 per phrasing):

{chr(10).join(checks) or '- not exported yet'}
"""
    OUT.mkdir(parents=True, exist_ok=True)
    readme = OUT / "README.md"
    findings = ""
    if readme.is_file() and "\n## Findings" in readme.read_text():
        findings = readme.read_text()[readme.read_text().index("\n## Findings"):]
    readme.write_text(text + findings)
    print(text)


def main(argv=None) -> None:
    global OUT, RUN_DIR, CHECKPOINT, GRID, N, DIAGNOSIS_N, PIPELINE_N, TINY_FLAGS
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--row", choices=sorted(ROWS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override the steps (tests)")
    parser.add_argument("--tiny", default=None, metavar="DIR",
                        help="tests: runs, results and the export under DIR, test d = 8, 16 with 32 prompts")
    parser.add_argument("--collect", type=true_or_false, nargs="?", const=True, default=False)
    parser.add_argument("--export", choices=sorted(ROWS))
    args = parser.parse_args(argv)
    if args.tiny:
        tiny = Path(args.tiny)
        OUT, RUN_DIR, CHECKPOINT = tiny / "results", tiny / "runs", tiny / "checkpoint"
        GRID, N, DIAGNOSIS_N, PIPELINE_N = [8, 16], 16, 16, 16
        TINY_FLAGS = {"--hidden_size": "32", "--intermediate_size": "64", "--num_attention_heads": "2",
                      "--num_key_value_heads": "2", "--max_iterations": "40", "--eval_n": "8"}
    if args.row:
        run_row(args.row, args.seed, args.steps)
    if args.export:
        export(args.export, args.seed)
    if args.collect:
        collect()
    if not (args.row or args.export or args.collect):
        parser.error("give --row, --export or --collect")


if __name__ == "__main__":
    main()
