"""Write into a shipped checkpoint's config what its training data was written with (`prompt_format.trained`).

    python examples/reproduce/trained_phrasings.py              # both shipped checkpoints: (re)write the record
    python examples/reproduce/trained_phrasings.py --check      # only compare: exit 1 when a config differs

Checkpoints trained before configs carried the record get it here, computed the way `train_par.py` computes it for a
new run: the checkpoint's recorded training command is parsed by `train_par.py`'s own parser, and
`par_cli.training_data.trained_prompt_format` replays the problems and phrasings `build_dataset` drew for it
(same task, seed, size, depths, start states; `state_tracking.data.trained_phrasings`). Only `config.json`'s
`prompt_format.trained` changes; the weights, the tokenizer and every other field stay as they are. Every segment of a
resumed run must have trained on the same data (they share the data flags), and the runs were single-process (world
size 1).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repository's packages without an install
from par_cli.flag_values import true_or_false  # noqa: E402

# checkpoint folder -> the JSON that records its training commands ("train_commands")
SHIPPED = {
    "checkpoints/par-batch-process-text": "results/batch_process_text_cpu/runs/random_start_s0.json",
    "checkpoints/par-swap-s5-small": "checkpoints/par-swap-s5-small/training_summary.json",
}


def training_record(folder: Path, commands: list[str]) -> dict:
    """The `prompt_format` of `folder`'s config with `trained` recomputed from its training commands."""
    from par_studies.runs import repo_module

    train_par = repo_module("examples.train_par")

    from modeling_par.prompt_format import PromptFormat
    from par_cli.training_data import build_task, trained_prompt_format, training_problems
    from state_tracking import load_task_from_dir

    problems = None
    for command in commands:
        argv = shlex.split(command)
        if "examples/train_par.py" not in argv:
            raise ValueError(f"{folder}: not a train_par.py command: {command!r}")
        argv = argv[argv.index("examples/train_par.py") + 1:]
        model_args, task_args, _, train_args, _ = train_par.parse_all_args(argv)
        these = (task_args, training_problems(task_args, train_args, world=1), model_args.init_from_par)
        if problems is not None and these[1:] != problems[1:]:
            raise ValueError(f"{folder}: the training segments drew different data ({problems[1]} vs {these[1]}).")
        problems = these
    task_args, data, init_from_par = problems
    if init_from_par:
        raise ValueError(f"{folder} was fine-tuned from {init_from_par}: record that checkpoint first.")
    task = load_task_from_dir(folder)  # the task the run saved (what --task / --task_file built)
    if task.to_dict() != build_task(task_args).to_dict():
        raise ValueError(f"{folder}: its saved task differs from the one its command builds.")
    config = json.loads((folder / "config.json").read_text())
    fresh = trained_prompt_format(task, task_args, data)
    before = PromptFormat.from_dict(config["prompt_format"])
    if before.with_trained(None) != fresh.with_trained(None):
        raise ValueError(f"{folder}: its prompt_format is not the one {task.name!r} renders; re-export it.")
    return fresh.to_dict()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", type=true_or_false, nargs="?", const=True, default=False,
                        help="only compare the configs with the recomputed records")
    args = parser.parse_args(argv)
    stale = []
    for folder, record in SHIPPED.items():
        folder = REPO / folder
        commands = json.loads((REPO / record).read_text())["train_commands"]
        prompt_format = training_record(folder, commands)
        path = folder / "config.json"
        text = path.read_text()
        config = json.loads(text)
        if config["prompt_format"] == prompt_format:
            print(f"{folder.relative_to(REPO)}: up to date")
            continue
        stale.append(folder.relative_to(REPO))
        if not args.check:
            config["prompt_format"] = prompt_format
            path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")  # as save_pretrained writes it
            print(f"{folder.relative_to(REPO)}: wrote prompt_format.trained")
    if args.check and stale:
        print(f"stale: {[str(s) for s in stale]} (run without --check)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
