"""The paper's own run as one command — Qwen2.5-0.5B retrofitted 8 / 8 / 8 on swap-S5 text prompts — and a
shape-exact dry run of it on CPU.

    python examples/reproduce/paper_retrofit.py --init_from_parent PATH             # the run (seed 0), on a GPU
    python examples/reproduce/paper_retrofit.py --init_from_parent PATH --seed 3    # another of the paper's 6 seeds
    python examples/reproduce/paper_retrofit.py --init_from_parent PATH --print_command   # the train_par.py command
    accelerate launch --config_file examples/reproduce/accelerate_ddp.yaml \\
        examples/reproduce/paper_retrofit.py --init_from_parent PATH                # several GPUs (docs/paper_scale.md)
    python examples/reproduce/paper_retrofit.py --dry_run                           # 0.5B shape, random weights, CPU
    python examples/reproduce/paper_retrofit.py --dry_run --shape tiny --depths 2,4 --eval_depths 8 --out DIR

The run is `examples/train_par.py` with `PRESET` (every flag written out, one comment per hyperparameter with the
paper's value, docs/paper_scale.md for the arithmetic); flags after the script's own replace the preset's (e.g.
`--max_steps 100` for a smoke test; each flag once). PATH is a local Qwen2 folder (no download happens here):
`huggingface-cli download Qwen/Qwen2.5-0.5B --local-dir PATH`. `--init_from_qwen2` is the old name of
`--init_from_parent`, kept as an alias.

`--dry_run` (22 min on 2 CPU cores) builds a randomly initialised Qwen2ForCausalLM with Qwen2.5-0.5B's published
shape, saves it as a Qwen2 folder (bf16, as the Hub checkpoint) with a Qwen2Tokenizer over the task's words, and
retrofits it through the same path as the run (train_par.py's parser on the preset's command, then
`build_tokenizer_for`, `build_model`, `ParTrainer`'s optimizer and loss). It measures, each case in a fresh process (so
its peak memory is its own), fp32 on CPU, batch 1: two optimizer steps at d = 8, 16, 32 (window 8; at d = 32 also
window 32 — predicted, not run, where memory is short — and `--checkpoint_core`; at d = 8 also bf16 autocast) and
forced-depth evaluation forwards at d = 256, 512 for R = 1, 2 iterations, extrapolated linearly to R = d (under the full
view every iteration is the same computation). Per case: seconds, peak resident memory per phase (VmHWM), parameter /
gradient / optimizer-state bytes, the bytes autograd saves for backward (activations), FLOPs of the first step
(`torch.utils.flop_counter.FlopCounterMode`, with CPU flash attention registered) beside an analytic count, prompt
tokens; then the GPU-scale estimates. Writes results/paper_scale_cpu/dry_run.json, peak_memory.png and README.md
(`--render` rewrites them from the JSON). The measuring is `par_studies.paper_scale.harness`; the FLOP / memory model
and the GPU arithmetic `par_studies.paper_scale.flops`; the README and plot `par_studies.paper_scale.report`.
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
from par_studies import load_train_par  # noqa: E402
from par_studies.paper_scale.flops import BATCH, SAMPLES  # noqa: E402
from par_studies.paper_scale.harness import SHAPES, dry_run  # noqa: E402
from par_studies.paper_scale.report import write_outputs  # noqa: E402

RESULTS = REPO / "results" / "paper_scale_cpu"
WORK = REPO / "runs" / "paper_retrofit_dry"  # the random Qwen2 folder and scratch outputs (git-ignored)

# ------------------------------------------------------------------------------------------------------------ preset
# The batch: the paper gives "~400k samples in one epoch" but no batch size (../shared/docs/par_method.md §4). 64
# samples per optimizer step -> 400,000 / 64 = 6,250 steps. Inside the 8-iteration window a d = 32 sample keeps ~6.5 GB
# of activations for backward (dry run: 108.7 KB per token per kept layer pass in fp32, x 144 passes — the prelude,
# 8 core iterations, 9 coda readouts — x 433 tokens, x 0.93 under bf16 autocast), so one H200 (141 GB) takes 16 at a
# time next to the 8 GB of fp32 weights, gradients and AdamW states: 16 x 4 accumulation steps. With N GPUs
# (accelerate DDP) pass --gradient_accumulation_steps 4/N so that the global batch stays 64 (docs/paper_scale.md).
# BATCH and SAMPLES are par_studies.paper_scale.flops's: its GPU arithmetic counts the same budget.
PRESET = {
    # --- model: Qwen2.5-0.5B's 24 layers as prelude 1-8, weight-shared core 9-16, coda 17-24 (paper §3)
    "--prelude_layers": 8,
    "--core_layers": 8,
    "--coda_layers": 8,
    "--step_size": 1,  # c = 1: iteration k is supervised with the state after k operations (paper default)
    "--norm_anchoring": "true",  # state-norm anchoring, s_k <- s_k rms(s_1)/rms(s_k) (paper)
    "--grad_window": 8,  # the last 8 iterations carry gradient, earlier ones run without (paper §4)
    "--loop_view": "full",  # every iteration sees the whole prompt with the parent's causal attention (paper)
    "--progress_positions": "false",  # ordinary positions (paper; the local-view recipe's option is off)
    "--bidirectional_queries": "false",  # causal queries, as the parent was trained (paper)
    # --- task: swap-S5, natural-language prompts read by the pretrained tokenizer (paper §2)
    "--task": "swap_s5",
    "--rendering": "text",
    "--min_train_depth": 1,  # train d <= 32 (paper), depths uniform over 1..32 ...
    "--max_train_depth": 32,
    "--curriculum_start_depth": 32,  # ... from step 0: d_max = 32 from the start is no curriculum (paper)
    # --- objective: progress-aligned targets (PAR) with learned halting (paper §4)
    "--objective": "par",
    "--depth_schedule": "hold",  # R = d + X, X ~ U{0..7}: forced depth plus a tail past d; X = 0 is forced depth.
    #   The paper trains forced depth with halting labels; this trainer trains Yes labels only on iterations past d
    #   (the halting rule reads P(Yes) on R..R+m-1, m = 8), so the halting row needs the tail (trainers/arguments.py)
    "--hold_tail": "additive",
    "--hold_extra_iterations": 7,  # m - 1 = 7: the halting window's length minus one (paper: m = 8)
    "--halting_loss_weight": 0.5,  # class-balanced halting CE, weight 0.5, one earlier iteration as an extra "No"
    "--halt_label_offset": 0,  # Yes when c k >= d (paper)
    # --- optimisation (paper §4: AdamW, lr 2e-5, adapter 1e-4, 200 warm-up steps, ~400k samples in one epoch)
    "--optim": "adamw_torch",  # AdamW (paper)
    "--learning_rate": 2e-5,  # paper
    "--adapter_learning_rate": 1e-4,  # paper
    "--warmup_steps": 200,  # paper
    "--lr_scheduler_type": "cosine",  # not stated by the paper: the project's default decay after warm-up
    "--weight_decay": 0.01,  # not stated by the paper: the project's default
    "--max_grad_norm": 1.0,  # not stated by the paper: transformers' default clipping
    "--per_device_train_batch_size": 16,  # not stated by the paper: 16 x 4 accumulation = 64 per step (see BATCH)
    "--gradient_accumulation_steps": 4,
    "--max_steps": SAMPLES // BATCH,  # 6,250 steps x 64 = 400,000 samples, one epoch (paper: ~400k)
    "--bf16": "true",  # not stated by the paper: bf16 autocast over fp32 master weights (train_par loads fp32)
    # --- evaluation: 1,024 fresh sequences per length, 1x to 16x, forced depth and learned halting (paper §2, §5)
    "--eval_depths": "32,64,128,256,512",
    "--eval_n": 1024,
    "--eval_halting": "true",
    "--eval_batch_size": 64,
    # --- bookkeeping: resumable (run the same command again after an interruption), seed per run (paper: 6 seeds)
    "--seed": 0,
    "--output_dir": "runs/paper_retrofit/s0",
    "--logging_steps": 50,
    "--save_strategy": "steps",
    "--save_steps": 500,
    "--save_total_limit": 2,
    "--report_to": "none",
}


def flag_value(value) -> str:
    return value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)


def train_argv(init_from_parent: str, seed: int = 0, extra: list[str] | None = None) -> list[str]:
    """train_par.py's arguments of the paper's run: the preset (seed and output folder per seed), each flag once;
    a flag in `extra` replaces the preset's value, a new one is added after them."""
    flags = dict(PRESET, **{"--seed": seed, "--output_dir": f"runs/paper_retrofit/s{seed}"})
    flags = {"--init_from_parent": str(init_from_parent), **{k: flag_value(v) for k, v in flags.items()}}
    flags.update(parse_flags(extra or []))
    return [token for flag, value in flags.items() for token in (flag, value)]


def parse_flags(argv: list[str]) -> dict[str, str]:
    """flag -> value of `--flag value`, `--flag=value` or a bare `--flag` (true); a flag given twice is an error."""
    flags, i = {}, 0
    while i < len(argv):
        if not argv[i].startswith("--"):
            raise SystemExit(f"train_par.py flags must be --name value pairs; {argv[i]!r} follows no flag")
        name, eq, inline = argv[i].partition("=")
        if eq:
            value = inline
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 1
        else:
            value = "true"
        if name in flags:
            raise SystemExit(f"{name} is given twice ({flags[name]!r} and {value!r}); give it once")
        flags[name] = value
        i += 1
    return flags


def print_command(argv: list[str]) -> str:
    return "python examples/train_par.py " + shlex.join(argv)


def check_qwen2_folder(path: str | None, split: tuple[int, int, int]) -> Path:
    """A local Qwen2 checkpoint folder whose layer count is the split's sum; else one clear error."""
    if not path:
        raise SystemExit("--init_from_parent is required for a run: a local Qwen2 folder (e.g. "
                         "`huggingface-cli download Qwen/Qwen2.5-0.5B --local-dir PATH`), or --dry_run.")
    folder = Path(path)
    if not folder.is_dir():
        raise SystemExit(f"--init_from_parent: {path} is not a folder (a local Qwen2 checkpoint folder with "
                         "config.json is required; download it first, e.g. `huggingface-cli download "
                         "Qwen/Qwen2.5-0.5B --local-dir PATH`).")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise SystemExit(f"--init_from_parent: {path} has no config.json (a Qwen2 checkpoint folder is required).")
    config = json.loads(config_file.read_text())
    if config.get("model_type") != "qwen2":
        raise SystemExit(f"--init_from_parent: {path} holds model_type {config.get('model_type')!r}; the paper's "
                         "preset retrofits a Qwen2 checkpoint (model_type 'qwen2', e.g. Qwen2.5-0.5B).")
    layers = config.get("num_hidden_layers")
    if layers != sum(split):
        raise SystemExit(f"--init_from_parent: {path} has num_hidden_layers = {layers}; the split --prelude_layers "
                         f"{split[0]} --core_layers {split[1]} --coda_layers {split[2]} needs {sum(split)} (the preset "
                         "is Qwen2.5-0.5B's 24 = 8 + 8 + 8; give the three flags for another backbone).")
    return folder


# --------------------------------------------------------------------------------------------------------------- CLI
def parse_ints(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{name} must be comma-separated integers >= 1; got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"{name} must be comma-separated integers >= 1; got {text!r}")
    return values


# what the wrapper owns in a run (the parent under either name); every other flag is train_par.py's
RUN_FLAGS = ("--init_from_parent", "--init_from_qwen2", "--seed", "--print_command")
RUN_BOOLEAN_FLAGS = ("--print_command",)  # bare, or with a value (true / false) as argparse's nargs="?" reads it


def build_parser(run: bool = False) -> argparse.ArgumentParser:
    """The wrapper's flags. `run=True`: only those a run owns (`RUN_FLAGS`; every other flag passes to train_par.py
    unchanged, so a run's --eval_depths or --bf16 is train_par's); otherwise the dry run's and --render's too."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from_parent", "--init_from_qwen2", dest="init_from_parent",
                        help="a local Qwen2 folder (Qwen2.5-0.5B); required for a run (--init_from_qwen2: its old "
                             "name, kept as an alias)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (output runs/paper_retrofit/s<seed>)")
    parser.add_argument("--print_command", type=true_or_false, nargs="?", const=True, default=False,
                        help="print the train_par.py command, run nothing")
    if run:
        return parser
    parser.add_argument("--dry_run", type=true_or_false, nargs="?", const=True, default=False,
                        help="the CPU dry run at the backbone's shape")
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES), help="dry run: the backbone's shape")
    parser.add_argument("--depths", default="8,16,32", help="dry run: training depths (window 8)")
    parser.add_argument("--windows", default="8,32", help="dry run: windows compared at the largest training depth")
    parser.add_argument("--eval_depths", default="256,512", help="dry run: evaluation depths")
    parser.add_argument("--eval_iterations", default="1,2", help="dry run: the R measured per evaluation depth")
    parser.add_argument("--bf16_depths", default="8", help="dry run: training depths also measured under bf16 "
                                                           "autocast (the GPU run's precision; '' for none)")
    parser.add_argument("--steps", type=int, default=2, help="dry run: optimizer steps per training case (from the "
                                                             "second on, AdamW's states are there during the step)")
    parser.add_argument("--threads", type=int, default=1, help="dry run: torch threads per case")
    parser.add_argument("--out", default=str(RESULTS), help="dry run: where dry_run.json, the plot and README go")
    parser.add_argument("--work_dir", default=str(WORK), help="dry run: the random Qwen2 folder and scratch")
    parser.add_argument("--render", type=true_or_false, nargs="?", const=True, default=False,
                        help="rewrite --out's README, plot and estimates from its dry_run.json (no measurement)")
    parser.add_argument("--inline", type=true_or_false, nargs="?", const=True, default=False,
                        help=argparse.SUPPRESS)  # cases in this process (tests)
    return parser


def split_run_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the wrapper's own flags of a run, train_par.py's): a run owns only `RUN_FLAGS`; each flag is matched by its
    whole name (no abbreviations). A boolean flag (`RUN_BOOLEAN_FLAGS`) takes the next argument as its value unless
    that is a flag, as argparse does (``--print_command false``)."""
    own, rest, i = [], [], 0
    while i < len(argv):
        name, given_value = argv[i].partition("=")[0], "=" in argv[i]
        (own if name in RUN_FLAGS else rest).append(argv[i])
        following = argv[i + 1] if i + 1 < len(argv) else None
        if name in RUN_FLAGS and not given_value and following is not None and (
                name not in RUN_BOOLEAN_FLAGS or not following.startswith("-")):
            own.append(following)
            i += 1
        i += 1
    return own, rest


def resume_flags(command: list[str]) -> list[str]:
    """A run continues where it stopped: with a complete checkpoint in its --output_dir
    (`trainers.last_complete_checkpoint`) and no --resume_from_checkpoint given, the command gains one (so
    save_total_limit rotates the continued run's checkpoints instead of a fresh run's deleting the earlier ones); a
    finished run (summary.json) is an error."""
    from trainers import last_complete_checkpoint

    flags = parse_flags(command)
    output_dir = Path(flags["--output_dir"])
    if (output_dir / "summary.json").is_file():
        raise SystemExit(f"{output_dir} holds a finished run (summary.json); give another --output_dir or --seed.")
    if "--resume_from_checkpoint" in flags or not output_dir.is_dir():
        return command
    last = last_complete_checkpoint(output_dir)
    return command if last is None else [*command, "--resume_from_checkpoint", str(last)]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if not any(a.partition("=")[0] in ("--dry_run", "--render") for a in argv):
        return run(argv)
    args, extra = build_parser().parse_known_args(argv)  # abbreviations refused (allow_abbrev=False)
    if extra:
        raise SystemExit(f"--dry_run takes no train_par.py flags; got {extra}")
    if args.render:
        path = Path(args.out) / "dry_run.json"
        if not path.is_file():
            raise SystemExit(f"--render: {path} does not exist (run --dry_run first)")
        record = json.loads(path.read_text())
        write_outputs(record, Path(args.out))
        return record
    if args.dry_run:
        if args.steps < 1 or args.threads < 1:
            raise SystemExit("--steps and --threads must be integers >= 1")
        args.depths = parse_ints(args.depths, "--depths")
        args.windows = parse_ints(args.windows, "--windows")
        args.eval_depths = parse_ints(args.eval_depths, "--eval_depths") if args.eval_depths else []
        args.eval_iterations = parse_ints(args.eval_iterations, "--eval_iterations")
        args.bf16_depths = parse_ints(args.bf16_depths, "--bf16_depths") if args.bf16_depths else []
        if len(args.eval_iterations) < 2:
            raise SystemExit("--eval_iterations needs two or more R (the slope per iteration comes from them)")
        record = dry_run(args, argv, lambda folder, flags: train_argv(folder, seed=0, extra=flags),
                         print_command(train_argv("<Qwen2.5-0.5B folder>")))
        write_outputs(record, Path(args.out))
        print(f"wrote {Path(args.out) / 'dry_run.json'}", file=sys.stderr)
        return record
    raise SystemExit("give --dry_run or --render (or neither, for a run)")


def run(argv: list[str]):
    """The paper's run: the preset with every flag the wrapper does not own passed to train_par.py unchanged,
    resumed from the newest checkpoint of its output folder."""
    own, extra = split_run_argv(argv)
    args = build_parser(run=True).parse_args(own)
    flags = parse_flags(train_argv("x", args.seed, extra))
    split = tuple(int(flags[f"--{part}_layers"]) for part in ("prelude", "core", "coda"))
    folder = check_qwen2_folder(args.init_from_parent, split)
    command = train_argv(str(folder), args.seed, extra)
    if args.print_command:
        print(print_command(command))
        return command
    return load_train_par().main(resume_flags(command))


if __name__ == "__main__":
    main()
