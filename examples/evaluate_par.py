"""Evaluate a PAR checkpoint's length generalization on a state-tracking task.

    python examples/evaluate_par.py --model DIR --task swap_s5 --depths 32,64,128,256,512 \
        --n 1024 --mode forced --out results/x.json --plot results/x.png \
        [--batch-size 256 --seed 1234 --train-max-depth 32 --device cpu]
    python examples/evaluate_par.py --model DIR --depths 8,16,32 --n 256 --out x.json \
        --profile x_profile.json --profile-plot x_profile.png [--padding-control 8]

--profile adds the progress profile (accuracy of every iteration k's readout against z_min(c·k, d), at every
test depth); --padding-control D0 adds the same on prompts of D0 random operations followed by identity
operations (answer z_D0 at every length: a failure there comes from the longer prompt, not a harder problem).

The task is read from DIR/state_tracking_task.json when the checkpoint has one (--task must then
agree or be omitted); otherwise --task names a preset (swap_s5, s5, a5) or a JSON spec file.

A checkpoint trained on recorded data (train_par.py --train_file) is scored on records instead of generated problems:

    python examples/evaluate_par.py --model DIR --test_file test.csv --out results/x.json --plot results/x.png \
        [--operations_column ops --step_states_column states --state_column state --operation_delimiter REGEX]

accuracy per sequence length present in the file (the same JSON: `per_depth` entries with depth, n, accuracy), and
with --profile the progress profile where the file records step states. The checkpoint's vocabulary decides: an
operation or label it never trained on is an error naming the file, the record and the field.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from transformers import AutoModel, AutoTokenizer

from par_cli.cli import require_checkpoint, require_task, run_cli
from par_cli.flag_modes import check_flags, given_flags
from par_cli.flag_values import true_or_false
from state_tracking import (
    GROUP_TASK_NAMES,
    RENDERINGS,
    TASK_FILE_NAME,
    evaluate_length_generalization,
    format_profile,
    load_task_from_dir,
    plot_accuracy_vs_depth,
    plot_progress_profile,
    progress_profile,
    save_results,
)
from state_tracking.evaluation import (
    ATTN_IMPLEMENTATIONS,
    MODES,
    command_line,
    default_attn_implementation,
    default_workers,
    repo_relative,
)


def add_record_file_flags(parser: argparse.ArgumentParser) -> None:
    """A records checkpoint's test data: the file or dataset scored, its columns and how bad records are treated."""
    parser.add_argument("--test_file", "--test-file", default=None,
                        help="records checkpoint: the records to score (path, glob or comma list; CSV / JSON Lines / "
                             "Parquet); accuracy per length present")
    parser.add_argument("--dataset_name", default=None, help="records checkpoint: a datasets.load_dataset name instead")
    parser.add_argument("--dataset_config_name", default=None)
    parser.add_argument("--split", default="test", help="with --dataset_name: the split scored (a --test_file is "
                                                         "scored as the test split)")
    for role in ("operations", "state", "step_states", "initial_state"):
        parser.add_argument(f"--{role}_column", default=None, help=f"records: the {role.replace('_', ' ')} column")
    parser.add_argument("--operation_delimiter", default=None, help="records: regex splitting a string of operations")
    parser.add_argument("--skip_bad_records", type=true_or_false, nargs="?", const=True, default=False,
                        help="records: drop unreadable records, report")


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """Where and how the model runs: device, dtype, progress bars, forced R, workers, compile, attention."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no_progress", "--no-progress", "--disable_tqdm", dest="no_progress", type=true_or_false,
                        nargs="?", const=True, default=False)
    parser.add_argument("--dtype", choices=["float32", "auto", "bfloat16"], default="float32",
                        help="weights at evaluation: float32 (default; fast on CPU), auto (as stored), bfloat16")
    parser.add_argument("--fixed_iterations", "--fixed-iterations", type=int, default=None,
                        help="forced mode: R at every depth (a model trained with a fixed R, e.g. R = 1 plain "
                             "Transformer)")
    parser.add_argument("--workers", type=int, default=0,
                        help="run each batch as this many parts at once, one CPU thread each; 0 (default): one per "
                             "CPU thread (≤ 4) on a CPU (1 with eager attention), 1 on an accelerator "
                             "(benchmarks/bench_speed.py)")
    parser.add_argument("--compile", type=true_or_false, nargs="?", const=True, default=False,
                        help="torch.compile the core update and the coda (model.compile_core()); pays back only on "
                             "long evaluations (compiling costs ~20-50 s)")
    parser.add_argument("--attn_implementation", "--attn-implementation", default="auto",
                        choices=list(ATTN_IMPLEMENTATIONS),
                        help="auto (default): par_eager on a CPU for the local view's few-row windows (eager "
                             "attention; under --compile its few-key blocks are fused broadcast products), else "
                             "sdpa (benchmarks/bench_speed.py)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint folder (save_pretrained output)")
    parser.add_argument("--task", default=None,
                        help=f"preset {list(GROUP_TASK_NAMES)} or task JSON; default: from the checkpoint")
    parser.add_argument("--depths", default="32,64,128,256,512", help="comma-separated test depths")
    add_record_file_flags(parser)
    parser.add_argument("--n", type=int, default=1024, help="sequences per depth")
    parser.add_argument("--mode", choices=MODES, default="forced")
    parser.add_argument("--rendering", choices=RENDERINGS, default="symbolic")
    parser.add_argument("--random_initial", "--random-initial", type=true_or_false, nargs="?", const=True,
                        default=False, help="random start assignment (shown in the prompt)")
    parser.add_argument("--phrasing", choices=["canonical", "seen", "held_out"], default="canonical",
                        help="text rendering: first forms, drawn among the phrasings training saw, or the task's "
                             "held-out phrasings")
    parser.add_argument("--out", required=True, help="results JSON path")
    parser.add_argument("--plot", default=None, help="optional PNG of accuracy vs depth")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--train_max_depth", "--train-max-depth", type=int, default=None,
                        help="longest training depth, for G = d50 / d_train")
    parser.add_argument("--step_size", "--step-size", type=int, default=None,
                        help="c for forced R = ceil(d / c); default model.config.step_size")
    add_runtime_flags(parser)
    parser.add_argument("--profile", default=None, help="also write the progress profile (JSON) here")
    parser.add_argument("--profile_plot", "--profile-plot", default=None,
                        help="heatmap PNG of the profile (and padding control)")
    parser.add_argument("--padding_control", "--padding-control", type=int, default=None, metavar="D0",
                        help="with --profile: also profile D0 random ops + identity ops up to each depth")
    args = parser.parse_args(argv)
    try:
        args.depths = [int(d) for d in args.depths.split(",") if d.strip()]
    except ValueError:
        parser.error(f"--depths must be comma-separated integers, got {args.depths!r}")
    return args


def resolve_task(model_dir: str, task_arg: str | None):
    """The checkpoint's task if it saved one (--task, if given, must be the same task), else --task
    (a preset name or a JSON spec file)."""
    requested = None if task_arg is None else require_task("--task", task_arg)
    if os.path.isfile(os.path.join(model_dir, TASK_FILE_NAME)):
        saved = load_task_from_dir(model_dir)
        if requested is not None and requested != saved:
            raise ValueError(f"--task {task_arg!r} disagrees with the checkpoint's task {saved.name!r} "
                             f"({TASK_FILE_NAME})")
        return saved
    if requested is None:
        raise ValueError(f"--model {model_dir} has no {TASK_FILE_NAME}; pass --task ({list(GROUP_TASK_NAMES)} or a "
                         "task JSON file)")
    return requested


def load_model_and_tokenizer(model_dir: str, device: str, dtype: str = "float32", attn_implementation: str = "auto"):
    dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    model = AutoModel.from_pretrained(model_dir, trust_remote_code=True, dtype=dtype).to(device)
    if attn_implementation == "auto":  # only switches to eager where it measured faster; else keeps what loaded
        attn_implementation = default_attn_implementation(getattr(model.config, "loop_view", "full"), device,
                                                          getattr(getattr(model, "runtime", None), "local_window",
                                                                  False),
                                                          current=model.config._attn_implementation)
    if model.config._attn_implementation != attn_implementation:
        model.set_attn_implementation(attn_implementation)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)  # the config names remote code
    return model, tokenizer


def write_profiles(model, tokenizer, task, args) -> dict:
    """The progress profile (and padding control) at the evaluation depths, as JSON, table and heatmap."""
    common = dict(n_per_depth=args.n, seed=args.seed, batch_size=args.batch_size, rendering=args.rendering,
                  random_initial=args.random_initial, device=args.device)
    profiles = {"progress profile": progress_profile(model, tokenizer, task, args.depths, **common)}
    if args.padding_control:
        profiles[f"padding control ({args.padding_control} ops + identity)"] = progress_profile(
            model, tokenizer, task, [d for d in args.depths if d >= args.padding_control],
            padding_control_depth=args.padding_control, **common)
    save_results({"model_dir": repo_relative(args.model), "profiles": profiles}, args.profile)
    if args.profile_plot:
        plot_progress_profile(profiles, args.profile_plot, train_max_depth=args.train_max_depth)
    for title, result in profiles.items():
        print(title)
        print(format_profile(result))
    return profiles


def records_format_of(model, args):
    """The checkpoint's RecordFormat (config.prompt_format); an error if it was not trained on records."""
    from modeling_par.record_format import RecordFormat, load_prompt_format

    spec = getattr(model.config, "prompt_format", None)
    record_format = load_prompt_format(spec) if spec is not None else None
    if not isinstance(record_format, RecordFormat):
        raise ValueError(f"--test_file scores a checkpoint trained on records; {args.model}'s config.prompt_format is "
                         f"{'missing' if spec is None else repr(spec.get('rendering'))}, not 'records' (score it on "
                         "generated problems with --depths).")
    return record_format


def read_scored_records(args, model, tokenizer, record_format) -> tuple:
    """(split name, the loaded records, those encoded within the loop's reach, every skipped record)."""
    from state_tracking.records import RecordColumns, encode_records, load_record_files, within_reach

    # the columns and delimiter the checkpoint remembers from its training file, unless a flag names others
    delimiter = args.operation_delimiter if args.operation_delimiter is not None else record_format.delimiter
    columns = RecordColumns(args.operations_column, args.state_column, args.step_states_column,
                            args.initial_state_column, delimiter)
    split = "test" if args.test_file else args.split
    loaded = load_record_files(args.test_file, columns, args.dataset_name, args.dataset_config_name, args.split,
                               query_names=list(record_format.query_names), skip_bad_records=args.skip_bad_records,
                               flag="--test_file", remembered=dict(record_format.columns))
    encoded, skipped = encode_records(loaded, record_format, tokenizer, args.skip_bad_records)
    config = model.config
    step_size = int(config.step_size)
    encoded, too_long = within_reach(
        split, loaded, encoded, int(config.max_iterations) * step_size,
        f"the checkpoint's loop can run (config.max_iterations {config.max_iterations} x step_size {step_size})",
        args.skip_bad_records)
    return split, loaded, encoded, loaded.skipped + skipped + too_long


def write_records_profile(args, model, loaded, encoded) -> None:
    """--profile on records: the progress profile as JSON (and heatmap); the records must carry step states."""
    from state_tracking.records import has_step_states, records_progress_profile

    if not has_step_states(loaded):
        raise ValueError("--profile needs records with step states (--step_states_column): the file has final "
                         "states only")
    profile = records_progress_profile(model, encoded, batch_size=args.batch_size, device=args.device,
                                       max_records_per_depth=args.n)
    save_results({"model_dir": repo_relative(args.model), "profiles": {"progress profile": profile}}, args.profile)
    if args.profile_plot:
        plottable = dict(profile, profile=[[float("nan") if a is None else a for a in row]
                                           for row in profile["profile"]])
        plot_progress_profile({"progress profile": plottable}, args.profile_plot,
                              train_max_depth=args.train_max_depth)


def evaluate_record_file(args) -> dict:
    """Score a records checkpoint on --test_file / --dataset_name (see the module docstring)."""
    from state_tracking.records import evaluate_records

    model, tokenizer = load_model_and_tokenizer(args.model, args.device, args.dtype, args.attn_implementation)
    record_format = records_format_of(model, args)
    if args.no_progress:
        import datasets

        datasets.disable_progress_bars()
    split, loaded, encoded, skipped = read_scored_records(args, model, tokenizer, record_format)
    if skipped:
        print(f"skipped {len(skipped)} record(s) (--skip_bad_records); the first: {skipped[0]}")
    results = evaluate_records(model, encoded, record_format, mode=args.mode, batch_size=args.batch_size,
                               train_max_depth=args.train_max_depth,
                               workers=args.workers or default_workers(args.device, model.config._attn_implementation),
                               device=args.device, sources=[repo_relative(p) for p in loaded.sources],
                               progress=not args.no_progress, split=split)
    results.update(model_dir=repo_relative(args.model), skipped=len(skipped),
                   command=command_line(__file__, sys.argv[1:] if args.argv is None else args.argv))
    save_results(results, args.out)
    if args.plot:
        plot_accuracy_vs_depth({f"{os.path.basename(os.path.normpath(args.model))}, {split}": [results]}, args.plot,
                               title=f"{record_format.task_name}, {args.mode}")
    if args.profile:
        write_records_profile(args, model, loaded, encoded)
    for row in results["per_depth"]:
        print(f"length {row['depth']:>5} (n = {row['n']}): accuracy {row['accuracy']:.4f}")
    print(f"saved {args.out}")
    return results


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    args.argv = argv  # for the recorded command
    records = args.test_file is not None or args.dataset_name is not None
    given = given_flags(sys.argv[1:] if argv is None else argv)
    check_flags("evaluate_par.py", records, given)
    if args.test_file is not None and "split" in given:
        raise ValueError("--split chooses the split of --dataset_name; a --test_file is scored whole, as the test "
                         "split: drop --split, or give the records as --dataset_name with --split.")
    require_checkpoint("--model", args.model)  # after the flags: a flag error does not depend on the folder
    if records:
        return evaluate_record_file(args)
    task = resolve_task(args.model, args.task)
    model, tokenizer = load_model_and_tokenizer(args.model, args.device, args.dtype, args.attn_implementation)
    if args.compile:
        model.compile_core()
    results = evaluate_length_generalization(
        model, tokenizer, task, args.depths,
        n_per_depth=args.n, mode=args.mode, seed=args.seed, batch_size=args.batch_size,
        rendering=args.rendering, train_max_depth=args.train_max_depth, step_size=args.step_size,
        random_initial=args.random_initial, device=args.device, progress=not args.no_progress,
        workers=args.workers or default_workers(args.device, model.config._attn_implementation),
        fixed_iterations=args.fixed_iterations, phrasing=args.phrasing,
    )
    results["model_dir"] = repo_relative(args.model)
    results["command"] = command_line(__file__, sys.argv[1:] if argv is None else argv)
    save_results(results, args.out)
    if args.plot:
        plot_accuracy_vs_depth({os.path.basename(os.path.normpath(args.model)): [results]}, args.plot,
                               title=f"{task.name}, {args.mode}")
    if args.profile:
        write_profiles(model, tokenizer, task, args)
    elif args.profile_plot or args.padding_control:
        raise ValueError("--profile-plot and --padding-control need --profile PATH")
    for depth, accuracy in zip(results["depths"], results["accuracy"]):
        print(f"depth {depth:>5}: accuracy {accuracy:.4f}")
    if results["extrapolation_factor"] is not None:
        bound = " (lower bound)" if results["extrapolation_factor_is_lower_bound"] else ""
        print(f"d50 = {results['d50']}, G = {results['extrapolation_factor']:.2f}{bound}")
    print(f"saved {args.out}")
    return results


if __name__ == "__main__":
    run_cli(main)
