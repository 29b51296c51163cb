"""Train a PAR looped Qwen2 on a state-tracking task, then evaluate length generalization.

The defaults train a small from-scratch model on swap-S5 (depth curriculum up to d = 8) in a few minutes on a
laptop CPU with the recipe of the length-generalization study (`results/length_generalization_cpu/`: local loop
view, progress-coupled query positions, bidirectional queries; `--loop_view full --progress_positions false
--bidirectional_queries false` is the paper's setting), then print accuracy at depths up to 8× the training depth
and write a table, JSON and plot:

    python examples/train_par.py                                  # the defaults (README's main job)
    python examples/train_par.py --max_steps 200 --output_dir runs/quick
    python examples/train_par.py config.yaml                      # or config.json: the same fields
    python examples/train_par.py --init_from_qwen2 PATH --rendering text --prelude_layers 8 --core_layers 8 \\
        --coda_layers 8 --peft lora --bf16                        # retrofit a pretrained Qwen2.5
    torchrun --nproc_per_node 2 examples/train_par.py ...         # DDP (or accelerate launch); on CPU add --use_cpu true

Every field of `ModelArguments`, `TaskArguments` and `ParTrainingArguments` (HF TrainingArguments included) is a
flag; `--self_distillation` switches to label-free prefix self-distillation (`SelfDistillationArguments`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, HfArgumentParser, set_seed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking  # noqa: E402
from state_tracking import (  # noqa: E402
    StateTrackingCollator,
    build_dataset,
    build_tokenizer,
    evaluate_length_generalization,
    get_task,
    load_task,
    model_token_ids,
    plot_accuracy_vs_depth,
    plot_progress_profile,
    prompt_format_of,
    save_results,
    save_task,
)
from state_tracking.cli import require_checkpoint, require_task, run_cli  # noqa: E402
from state_tracking.data import trained_phrasings  # noqa: E402
from state_tracking.evaluation import (  # noqa: E402
    check_attn_implementation,
    command_line,
    default_attn_implementation,
    default_workers,
    environment_info,
    repo_relative,
)
from state_tracking.flag_modes import check_flags, given_flags  # noqa: E402
from state_tracking.hf_parser import accept_none  # noqa: E402
from state_tracking.records import (  # noqa: E402
    OPERATION_TOKENS,
    ReadOptions,
    RecordColumns,
    RecordSplits,
    check_record_lengths,
    evaluate_records,
    has_step_states,
    read_record_splits,
    record_token_ids,
    records_progress_profile,
)
from trainers import (  # noqa: E402
    ParTrainer,
    ParTrainingArguments,
    PrefixSelfDistillationTrainer,
    RecordsProbeCallback,
    SelfDistillationArguments,
    StateAccuracyProbeCallback,
    apply_core_lora,
    teardown_distributed,
)

logger = logging.getLogger(__name__)


# --compile_core auto compiles from this many steps on: compiling costs ~1-2 min on a cold inductor cache (seconds once
# cached), a d = 32 step of the default model saves ~0.25 s (results/speed_cpu)
AUTO_COMPILE_MIN_STEPS = 500
AUTO_COMPILE_MIN_SECONDS = 600  # ... and not under a shorter --max_train_seconds budget


@dataclass
class ModelArguments:
    init_from_qwen2: str | None = field(default=None, metadata={
        "help": "retrofit this pretrained causal LM (path/id): a Qwen2, or a Llama-architecture one converted exactly "
                "into Qwen2 (modeling_par.parents)"})
    gguf_file: str | None = field(default=None, metadata={
        "help": "with --init_from_qwen2 FOLDER: the GGUF file in it to load (dequantized to fp32; needs the gguf "
                "package: pip install -e '.[pretrained]')"})
    truncate_parent: bool = field(default=False, metadata={
        "help": "with --init_from_qwen2: keep only the parent's first prelude + core + coda layers (a truncated "
                "parent; default: the split must cover every layer)"})
    init_from_par: str | None = field(
        default=None, metadata={"help": "fine-tune this PAR checkpoint (its config wins over the size/PAR flags)"}
    )
    hidden_size: int = field(default=128, metadata={"help": "from scratch: hidden size"})
    intermediate_size: int = field(default=256, metadata={"help": "from scratch: MLP size"})
    num_attention_heads: int = field(default=4, metadata={"help": "from scratch: attention heads"})
    num_key_value_heads: int = field(default=4, metadata={"help": "from scratch: KV heads"})
    prelude_layers: int = field(default=1)
    core_layers: int = field(default=2)
    coda_layers: int = field(default=1)
    freeze_prelude: bool = field(default=False, metadata={
        "help": "train neither the token embeddings nor the prelude (model.freeze_prelude(): a retrofit keeps the "
                "parent's reading of words; tied embeddings freeze the LM-head rows too)"})
    freeze_embeddings: bool = field(default=False, metadata={
        "help": "train not the token embeddings (model.freeze_embeddings(): most of a retrofit's parameters and AdamW "
                "state; tied embeddings freeze the LM-head rows too)"})
    parent_weights: str = field(default="pretrained", metadata={
        "help": "with --init_from_qwen2: 'pretrained' (the parent's weights) or 'random' (the parent's shape and "
                "tokenizer, every weight drawn afresh: the control for what pretraining brings)"})
    step_size: int = field(default=1, metadata={"help": "c: operations per iteration"})
    norm_anchoring: bool = field(default=True, metadata={"help": "state-norm anchoring (off: the ablation)"})
    grad_window: int = field(default=8, metadata={"help": "iterations with gradient"})
    answer_feedback: bool = field(default=False, metadata={
        "help": "the loop state is the answer: each iteration restarts from e with the previous iteration's soft "
                "answer written at the queries (config.answer_feedback; for a state the answers name whole)"})
    max_iterations: int = field(default=1100, metadata={"help": "the most iterations a forward may run"})
    checkpoint_core: bool = field(default=False, metadata={"help": "activation checkpointing of the core"})
    loop_view: str | None = field(default=None, metadata={
        "help": "what the queries see at iteration k: full | prefix | local (default: local from scratch — the "
                "recipe of results/length_generalization_cpu; full, the paper's, when retrofitting a Qwen2)"})
    progress_positions: bool | None = field(default=None, metadata={
        "help": "queries sit right after the ops of iteration k (default: on from scratch, off when retrofitting)"})
    bidirectional_queries: bool | None = field(default=None, metadata={
        "help": "the query region attends both ways (default: on from scratch, off when retrofitting)"})
    attn_implementation: str = field(default="auto", metadata={
        "help": "auto | sdpa | eager | par_eager (auto: par_eager on a CPU for the local view's few-row windows, "
                "else sdpa; par_eager is eager with compile_core's few-key blocks as fused broadcast products; "
                "benchmarks/bench_speed.py)"})
    compile_core: str = field(default="auto", metadata={
        "help": "auto | true | false: torch.compile the core update and the coda (model.compile_core()); auto: on "
                f"a CPU, for the local view's window path, when max_steps >= {AUTO_COMPILE_MIN_STEPS} (compiling "
                "costs ~1-2 min on a cold cache)"})
    causal_fast_path: bool = field(default=True, metadata={
        "help": "full view, sdpa, unpadded batch: sdpa's causal kernel instead of a materialized mask (same result)"})
    block_iterations: int = field(default=4, metadata={
        "help": "local window: no-grad iterations run this many at a time as one unit, one graph under "
                "--compile_core (model.runtime.block_iterations; 1: every iteration on its own; same result)"})
    peft: str | None = field(default=None, metadata={"help": "'lora': LoRA on the core, adapter trained in full"})
    lora_r: int = field(default=16)
    lora_alpha: int = field(default=32)


@dataclass
class TaskArguments:
    task: str = field(default="swap_s5", metadata={"help": "swap_s5 | s5 | a5"})
    task_file: str | None = field(default=None, metadata={"help": "a user state-machine task (JSON); overrides --task"})
    rendering: str = field(default="symbolic", metadata={"help": "symbolic (from scratch) | text (pretrained)"})
    random_initial: bool = field(default=False, metadata={"help": "random initial item assignment"})
    train_size: int | None = field(default=None, metadata={"help": "examples to build (default: steps × batch)"})
    eval_depths: str = field(default="8,16,32,64", metadata={"help": "comma-separated test depths"})
    eval_n: int = field(default=256, metadata={"help": "sequences per test depth (paper protocol: 1024)"})
    eval_batch_size: int = field(default=256)
    eval_halting: bool = field(default=False, metadata={"help": "also evaluate with learned halting (no R given)"})
    eval_workers: int = field(default=0, metadata={
        "help": "evaluation: parts of each batch run at once, one thread each; 0: one per CPU thread (≤ 4) on a CPU, "
                "1 with eager attention"})
    self_distillation: bool = field(default=False, metadata={"help": "label-free prefix self-distillation"})
    probe_depth: int | None = field(default=None, metadata={
        "help": "during training: overall state accuracy at this depth (forced R) on probe_n fixed sequences every "
                "probe_every_steps steps and at step 0, logged as probe_accuracy (trainer_state.json, summary.json's "
                "probe); off unless set (trainers.StateAccuracyProbeCallback)"})
    probe_n: int = field(default=256, metadata={"help": "probe: sequences (drawn once from probe_seed)"})
    probe_every_steps: int = field(default=250, metadata={"help": "probe: optimizer steps between probes"})
    probe_stop_accuracy: float | None = field(default=None, metadata={
        "help": "probe: stop training once the last probe_stop_patience probes reached this accuracy (early stop; "
                "off unless set; needs --probe_depth)"})
    probe_stop_patience: int = field(default=2, metadata={"help": "probe: consecutive probes at probe_stop_accuracy"})
    probe_seed: int | None = field(default=None, metadata={
        "help": "probe: seed of its problems (evaluation.draw_test_problems; default --seed: with probe_n = eval_n "
                "they are the final evaluation's problems at probe_depth)"})


@dataclass
class DataArguments:
    """Recorded data instead of a task generator (`state_tracking.records`): CSV / JSON Lines / Parquet files by
    extension, or anything `datasets.load_dataset` takes."""

    train_file: str | None = field(default=None, metadata={
        "help": "training records: a path, a glob, or a comma-separated list (.csv, .tsv, .jsonl, .json, .parquet)"})
    validation_file: str | None = field(default=None, metadata={
        "help": "records evaluated after training (as test); default: --validation_split_percentage of the training "
                "file"})
    test_file: str | None = field(default=None, metadata={"help": "records evaluated after training: accuracy per "
                                                                  "sequence length present"})
    dataset_name: str | None = field(default=None, metadata={"help": "a datasets.load_dataset name or folder"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "its configuration"})
    operations_column: str | None = field(default=None, metadata={
        "help": "the operations: a list of strings, or a string split by --operation_delimiter (default: the one "
                "column with a conventional name: operations, ops, sequence, events, actions, input(s), tokens)"})
    state_column: str | None = field(default=None, metadata={
        "help": "the final state: a label or a mapping query -> label (JSON text in CSV)"})
    step_states_column: str | None = field(default=None, metadata={
        "help": "the state after each operation: a list, or a string split by --operation_delimiter"})
    initial_state_column: str | None = field(default=None, metadata={"help": "the state before the operations"})
    operation_delimiter: str | None = field(default=None, metadata={
        "help": "regex splitting a string of operations (and of step states); default whitespace"})
    skip_bad_records: bool = field(default=False, metadata={
        "help": "drop records that cannot be read and report how many (default: the first one is an error)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training records"})
    data_name: str | None = field(default=None, metadata={"help": "the name the checkpoint gives the data (default: "
                                                                 "the training file's stem)"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N validation records"})
    validation_split_percentage: float = field(default=5, metadata={
        "help": "with no --validation_file (and no validation split in --dataset_name): this percent of the training "
                "records, chosen at random with --seed, is held out as the validation split (0: none)"})
    preprocessing_num_workers: int | None = field(default=None, metadata={
        "help": "processes reading and encoding the records (datasets' num_proc)"})
    overwrite_cache: bool = field(default=False, metadata={
        "help": "read and encode the records again instead of reusing datasets' cache of an earlier run"})
    cache_dir: str | None = field(default=None, metadata={"help": "datasets.load_dataset's cache_dir"})
    dataset_revision: str | None = field(default=None, metadata={
        "help": "the --dataset_name revision to read (a branch, tag or commit)"})
    token: str | None = field(default=None, metadata={
        "help": "the Hub token for a private --dataset_name (default: the one `hf auth login` stored)"})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "let --dataset_name run the loading script its repository holds"})
    operation_tokens: str = field(default="words", metadata={
        "help": "how an operation is read: 'words' (its words, one token each: an operation training never held can "
                "be read from the words of trained ones) or 'whole' (one token per distinct operation, as an RNN's "
                "embedding reads a symbol: fewer tokens per record, no untrained operation)",
        "choices": list(OPERATION_TOKENS)})
    stop_when_validation_exact: bool = field(default=True, metadata={
        "help": "records: probe the validation split (its --probe_n longest records) every --probe_every_steps steps "
                "and stop training once the last --probe_stop_patience probes were all exact, instead of running to "
                "--max_steps / --max_train_seconds (false: probe and log only)"})

    restore_best_probe: bool = field(default=True, metadata={
        "help": "records: end training with the weights of the most accurate validation probe when the final weights "
                "score lower (a late collapse, or a time budget ending mid-spike): each new best probe saves its "
                "checkpoint, which the Trainer loads back at the end (load_best_model_at_end, metric_for_best_model "
                "probe_accuracy); false: keep the final weights"})

    @property
    def given(self) -> bool:
        return self.train_file is not None or self.dataset_name is not None


DEFAULT_TRAINING = dict(
    output_dir="runs/par-swap-s5-cpu", max_steps=2000, per_device_train_batch_size=64, learning_rate=1e-3,
    adapter_learning_rate=2e-3, warmup_steps=100, lr_scheduler_type="cosine", weight_decay=0.01,
    max_train_depth=8, curriculum_start_depth=2, curriculum_every_steps=100, logging_steps=100,
    save_strategy="no", report_to="none", seed=0, dataloader_num_workers=0, max_grad_norm=1.0,
    restore_callback_states_from_checkpoint=True,  # --max_train_seconds spans resumed segments
)


# Training on records (--train_file / --dataset_name) with only the data flags given: the recipe with the mastery
# curriculum over the lengths present (d_max grows once the final answers at d_max are 90% right), the training depth
# range from the data, at most 6,000 steps of 64 (384k samples: 100k records ~4 times) and 14 minutes on one CPU
# thread (why these: results/own_data_cpu/README.md).
LONGEST_RECORD = 1_000_000  # max_train_depth's default with records: replaced by the longest training record's length
DATA_TRAINING = dict(output_dir="runs/par-records", max_steps=6000, max_train_seconds=840,
                     curriculum_advance_accuracy=0.9, curriculum_every_steps=50, max_train_depth=LONGEST_RECORD)

# Retrofitting a pretrained Qwen2 (--init_from_qwen2): the paper's AdamW schedule, not the from-scratch one above.
RETROFIT_TRAINING = dict(learning_rate=2e-5, adapter_learning_rate=1e-4, warmup_steps=200)

# summary.json's curve: every loss part the trainer logs ("loss" and each "loss_*": loss_answer, loss_halt, loss_final,
# loss_distill, ...) and these
CURVE_KEYS = ("step", "acc_last_iteration", "acc_window_mean", "depth", "iterations", "curriculum_max_depth",
              "stretch_s_max", "learning_rate")


def training_curve(log_history: list[dict]) -> list[dict]:
    """The training logs of a run's history (those with a loss), each cut to its step, loss parts and CURVE_KEYS."""
    return [{k: v for k, v in row.items() if k in CURVE_KEYS or k == "loss" or k.startswith("loss_")}
            for row in log_history if "loss" in row]


def _wants_self_distillation(argv: list[str]) -> bool:
    """Whether the command line asks for self-distillation (`--self_distillation` or its alias `--self-distillation`,
    bare, with a value or `=value`): it chooses the arguments class before parsing."""
    for i, arg in enumerate(argv):
        arg = arg.replace("--self-distillation", "--self_distillation", 1) if arg.startswith("--self-") else arg
        if arg.startswith("--self_distillation="):
            return arg.split("=", 1)[1].lower() in ("true", "1", "yes")
        if arg == "--self_distillation":
            following = argv[i + 1].lower() if i + 1 < len(argv) else ""
            return following not in ("false", "0", "no")
    return False


def parse_args(argv=None):
    """(ModelArguments, TaskArguments, training arguments) of a command line or config file; `parse_all_args` adds
    the `DataArguments` and the set of fields given."""
    model_args, task_args, _, train_args, _ = parse_all_args(argv)
    return model_args, task_args, train_args


def parse_all_args(argv=None):
    """(ModelArguments, TaskArguments, DataArguments, training arguments, the names given) of a command line or a
    config file (.json / .yaml): one parse with `HfArgumentParser` (as run_clm.py), then the defaults that depend on
    what was given (`derived_defaults`), then the dataclasses, which check the result."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    config = None
    if len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml")):
        import yaml  # a JSON file is YAML too

        config = yaml.safe_load(Path(argv[0]).read_text())
    distill = bool(config.get("self_distillation")) if config is not None else _wants_self_distillation(argv)
    training_cls = SelfDistillationArguments if distill else ParTrainingArguments
    parser = HfArgumentParser((ModelArguments, TaskArguments, DataArguments, training_cls), allow_abbrev=False)
    accept_none(parser, (ModelArguments, TaskArguments, DataArguments, training_cls))
    parser.set_defaults(**DEFAULT_TRAINING)  # what --help shows
    if config is not None:
        values, given = {**DEFAULT_TRAINING, **config}, set(config)
    else:
        namespace, unused = parser.parse_known_args(argv)
        if unused:
            raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {unused}")
        values, given = vars(namespace), given_flags(argv)
    values.update(derived_defaults(given, values))
    model_args, task_args, data_args, train_args = parser.parse_dict(values)
    return model_args, task_args, data_args, train_args, given


def derived_defaults(given: set[str], values: dict) -> dict:
    """The defaults that follow from what the command gives (`given`: the names given; `values`: every value so far),
    for the names not given:
    - records (--train_file / --dataset_name): `DATA_TRAINING`, and without --save_strategy `save_total_limit` 1 (the
      checkpoints the validation probe saves, its best and its stop, are kept to the one summary.json names);
    - --init_from_qwen2: the paper's fine-tuning schedule (`RETROFIT_TRAINING`);
    - --min_train_depth without --curriculum_start_depth starts the default curriculum at the smallest depth trained
      (a start below it is refused as a contradiction);
    - --curriculum_start_depth none (no curriculum) drops the mastery test the records default adds (it has no
      curriculum to advance)."""
    defaults = {}
    if given & {"train_file", "dataset_name"}:
        defaults.update(DATA_TRAINING)
        if "save_strategy" not in given:
            defaults["save_total_limit"] = 1
    if values.get("init_from_qwen2"):
        defaults.update(RETROFIT_TRAINING)
    if "min_train_depth" in given:
        defaults["curriculum_start_depth"] = max(DEFAULT_TRAINING["curriculum_start_depth"], values["min_train_depth"])
    if "curriculum_start_depth" in given and values.get("curriculum_start_depth") is None:
        defaults["curriculum_advance_accuracy"] = None
    return {name: value for name, value in defaults.items() if name not in given}


def is_compiler_error(error: BaseException) -> bool:
    """Whether `error` is torch.compile failing to compile a graph (inductor / a dynamo backend), not the model."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import InductorError

    return isinstance(error, (BackendCompilerFailed, InductorError))


def build_task(task_args: TaskArguments):
    return load_task(task_args.task_file) if task_args.task_file else get_task(task_args.task)


def training_problems(task_args: TaskArguments, train_args, world: int = 1) -> dict:
    """The `build_dataset` arguments of the training data (n, depths, seed, random_initial)."""
    return dict(n=task_args.train_size or train_args.max_steps * train_args.per_device_train_batch_size * world,
                depths=(train_args.min_train_depth, train_args.max_train_depth), seed=train_args.seed,
                random_initial=task_args.random_initial)


def trained_prompt_format(task, task_args: TaskArguments, problems: dict, init_from_par: str | None = None):
    """The task's prompt format with the record of the sentences the training data used (`PromptFormat.trained`,
    replayed by `state_tracking.data.trained_phrasings`): the pipeline refuses every other. Fine-tuning a PAR
    checkpoint adds them to its own record; a parent without one leaves the record out (its data is unknown)."""
    prompt_format = prompt_format_of(task, task_args.rendering)
    trained = trained_phrasings(task, task_args.rendering, **problems)
    if init_from_par:
        parent = getattr(ParLoopedQwenConfig.from_pretrained(init_from_par), "prompt_format", None) or {}
        before = parent.get("trained") if parent.get("rendering") == task_args.rendering else None
        if before is None:
            logger.warning("--init_from_par: %s records no training sentences; the new checkpoint records none either "
                           "(its pipeline refuses nothing for being unseen).", init_from_par)
            return prompt_format
        trained = merge_trained(prompt_format.with_trained(before).trained, prompt_format.with_trained(trained).trained)
    return prompt_format.with_trained(trained)


def merge_trained(a: dict, b: dict) -> dict:
    """Two `PromptFormat.trained` records of one format as one (each slot's sentences: a's, then b's new ones)."""
    def union(x, y):
        return list(dict.fromkeys([*x, *y]))

    names = list(dict.fromkeys([*a["operations"], *b["operations"]]))
    return {"operations": {n: union(a["operations"].get(n, ()), b["operations"].get(n, ())) for n in names},
            "preamble": [union(x, y) for x, y in zip(a["preamble"], b["preamble"])] if a["preamble"] and b["preamble"]
            else [list(p) for p in (a["preamble"] or b["preamble"])],
            "queries": [union(x, y) for x, y in zip(a["queries"], b["queries"])],
            "source": "; ".join(s for s in (a["source"], b["source"]) if s)}


RECIPE_VIEW = dict(loop_view="local", progress_positions=True, bidirectional_queries=True)  # from scratch
PAPER_VIEW = dict(loop_view="full", progress_positions=False, bidirectional_queries=False)  # retrofit


def resolve_view(model_args: ModelArguments) -> dict:
    """The loop-view fields: given flags win; unset ones take the from-scratch recipe, or the paper's full view when
    retrofitting a pretrained Qwen2 (whose causal attention the options would change)."""
    defaults = PAPER_VIEW if model_args.init_from_qwen2 else RECIPE_VIEW
    return {k: v if (v := getattr(model_args, k)) is not None else defaults[k] for k in defaults}


def speed_options(model_args: ModelArguments, train_args, loop_view: str) -> tuple[str, bool]:
    """(attention implementation, compile?) for this run: given values win, "auto" follows the measured defaults."""
    check_attn_implementation(model_args.attn_implementation, "--attn_implementation")
    if model_args.compile_core not in ("auto", "true", "false"):
        raise ValueError(f"--compile_core must be auto, true or false; got {model_args.compile_core!r}.")
    if model_args.block_iterations < 1:
        raise ValueError(f"--block_iterations must be an integer >= 1; got {model_args.block_iterations!r}.")
    device = train_args.device if train_args is not None else torch.device("cpu")
    attn = model_args.attn_implementation
    if attn == "auto":
        attn = default_attn_implementation(loop_view, device)
    compile_core = model_args.compile_core == "true"
    if model_args.compile_core == "auto":
        budget = getattr(train_args, "max_train_seconds", None)
        compile_core = (device.type == "cpu" and loop_view == "local" and train_args is not None
                        and train_args.max_steps >= AUTO_COMPILE_MIN_STEPS
                        and (budget is None or budget >= AUTO_COMPILE_MIN_SECONDS) and inductor_can_compile_for_cpu())
    return attn, compile_core


def inductor_can_compile_for_cpu() -> bool:
    """Whether `--compile_core auto` may compile here: torch.compile's CPU backend builds C++ kernels, tested on Linux
    with a C++ compiler on PATH (elsewhere auto stays eager and says so; `--compile_core true` still forces it)."""
    compiler = os.environ.get("CXX") or "c++"
    if sys.platform.startswith("linux") and (shutil.which(compiler) or shutil.which("g++") or shutil.which("clang++")):
        return True
    logger.warning("--compile_core auto: no C++ compiler on PATH or not Linux; training eager "
                   "(set --compile_core true to force torch.compile).")
    return False


def build_model(model_args: ModelArguments, token_ids: dict, train_args=None):
    par_fields = dict(
        step_size=model_args.step_size, norm_anchoring=model_args.norm_anchoring, grad_window=model_args.grad_window,
        max_iterations=model_args.max_iterations, checkpoint_core=model_args.checkpoint_core,
        answer_feedback=model_args.answer_feedback, **resolve_view(model_args),
    )
    if model_args.init_from_par:
        model = ParLoopedQwenForStateTracking.from_pretrained(model_args.init_from_par, dtype=torch.float32)
        if list(model.config.answer_token_ids) != token_ids["answer_token_ids"]:
            raise ValueError(f"--init_from_par: the checkpoint's answer_token_ids {model.config.answer_token_ids} do "
                             f"not match the task's tokenizer ({token_ids['answer_token_ids']}).")
    elif model_args.init_from_qwen2:
        # fp32 master weights whatever the parent was saved in: Qwen2.5 ships bf16, from_pretrained's dtype="auto" would
        # keep it, and AdamW's lr-2e-5 steps then mostly round away; --bf16 autocasts the compute
        model = ParLoopedQwenForStateTracking.from_qwen2(
            model_args.init_from_qwen2, model_args.prelude_layers, model_args.core_layers, model_args.coda_layers,
            answer_token_ids=token_ids["answer_token_ids"], halt_token_ids=token_ids["halt_token_ids"],
            dtype=torch.float32, gguf_file=model_args.gguf_file, truncate=model_args.truncate_parent, **par_fields,
        )
    else:
        config = ParLoopedQwenConfig(
            vocab_size=token_ids["vocab_size"], pad_token_id=token_ids["pad_token_id"],
            hidden_size=model_args.hidden_size, intermediate_size=model_args.intermediate_size,
            num_attention_heads=model_args.num_attention_heads, num_key_value_heads=model_args.num_key_value_heads,
            prelude_layers=model_args.prelude_layers, core_layers=model_args.core_layers,
            coda_layers=model_args.coda_layers, max_position_embeddings=4096,
            answer_token_ids=token_ids["answer_token_ids"], halt_token_ids=token_ids["halt_token_ids"],
            **par_fields,
        )
        model = ParLoopedQwenForStateTracking(config)
    if model_args.parent_weights not in ("pretrained", "random"):
        raise ValueError(f"--parent_weights must be pretrained or random; got {model_args.parent_weights!r}.")
    if model_args.parent_weights == "random":
        if not model_args.init_from_qwen2:
            raise ValueError("--parent_weights random draws a parent's weights afresh: it needs --init_from_qwen2.")
        model.reinitialize_weights(seed=train_args.seed if train_args is not None else 0)
    if model_args.freeze_prelude:
        model.freeze_prelude()
    if model_args.freeze_embeddings:
        model.freeze_embeddings()
    model.runtime.causal_fast_path = model_args.causal_fast_path
    attn, compile_core = speed_options(model_args, train_args, model.config.loop_view)
    model.runtime.block_iterations = model_args.block_iterations
    if model.config._attn_implementation != attn:
        model.set_attn_implementation(attn)
    if compile_core:
        model.compile_core()
    if model_args.peft is not None:
        if model_args.peft != "lora":
            raise ValueError(f"--peft must be 'lora' or unset; got {model_args.peft!r}.")
        model = apply_core_lora(model, r=model_args.lora_r, alpha=model_args.lora_alpha)
    return model


def use_tokenizer_special_tokens(config, tokenizer) -> None:
    """The model is built for this tokenizer: its config takes the tokenizer's pad / bos / eos ids wherever the
    tokenizer defines one (an eos list that already holds the tokenizer's eos stays). This is what the Trainer would
    otherwise do itself at the start of training, with a warning that the config was changed behind the user's back."""
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        token_id = getattr(tokenizer, name, None)
        current = getattr(config, name, None)
        if token_id is None or current == token_id or (isinstance(current, list) and token_id in current):
            continue
        setattr(config, name, int(token_id))


def build_tokenizer_for(task, task_args: TaskArguments, model_args: ModelArguments):
    if model_args.init_from_qwen2:
        if task_args.rendering != "text":
            raise ValueError("--init_from_qwen2 needs --rendering text (the pretrained tokenizer reads words).")
        kwargs = {} if model_args.gguf_file is None else {"gguf_file": model_args.gguf_file}
        tokenizer = AutoTokenizer.from_pretrained(model_args.init_from_qwen2, **kwargs)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    if model_args.init_from_par:
        return AutoTokenizer.from_pretrained(model_args.init_from_par, trust_remote_code=True)
    return build_tokenizer(task, task_args.rendering)


def evaluate_and_report(model, tokenizer, task, task_args, train_args, output_dir: Path) -> dict:
    depths = [int(d) for d in task_args.eval_depths.split(",")]
    modes = ["forced"] + (["halting"] if task_args.eval_halting else [])
    results = {}
    for mode in modes:
        results[mode] = evaluate_length_generalization(
            model, tokenizer, task, depths, n_per_depth=task_args.eval_n, mode=mode, seed=train_args.seed,
            batch_size=task_args.eval_batch_size, rendering=task_args.rendering,
            train_max_depth=train_args.max_train_depth, random_initial=task_args.random_initial,
            workers=task_args.eval_workers or default_workers(model.device, model.config._attn_implementation),
            fixed_iterations=train_args.fixed_iterations if mode == "forced" else None,
        )
        save_results(results[mode], output_dir / f"eval_{mode}.json")
    plot_accuracy_vs_depth({f"{task.name} ({m})": [r] for m, r in results.items()}, output_dir / "accuracy_vs_depth.png")
    lines = ["| depth | " + " | ".join(f"acc ({m})" for m in modes) + " |", "|---|" + "---|" * len(modes)]
    for i, d in enumerate(depths):
        marker = " (train)" if d <= train_args.max_train_depth else ""
        lines.append(f"| {d}{marker} | " + " | ".join(f"{results[m]['accuracy'][i]:.3f}" for m in modes) + " |")
    lines.append("")
    lines.append("G = d50 / d_train: " + ", ".join(f"{m}: {results[m]['extrapolation_factor']}" for m in modes))
    table = "\n".join(lines)
    (output_dir / "eval_table.md").write_text(table + "\n")
    print(table)
    return results


def prepare_records(data_args: DataArguments, model_args: ModelArguments, task_args: TaskArguments, train_args,
                    given: set) -> RecordSplits:
    """Read the training files, learn their vocabulary, encode them (`state_tracking.records.read_record_splits`);
    set the depth range and curriculum from the lengths present (unless given); choose the training mode and say why
    in one log line (kept as `.mode`)."""
    if model_args.init_from_qwen2 or model_args.init_from_par:
        raise ValueError("--train_file / --dataset_name train a model from scratch on the records' own vocabulary; "
                         "--init_from_qwen2 and --init_from_par are not supported with them yet.")
    for name in ("task", "task_file", "rendering", "random_initial", "train_size"):
        if name in given:
            raise ValueError(f"--{name} describes generated data; it has no effect with --train_file / --dataset_name "
                             "(the records are the data).")
    check_flags("train_par.py", records=True, given=given)
    if train_args.disable_tqdm:  # --disable_tqdm silences every bar: datasets' reading and encoding ones too
        import datasets

        datasets.disable_progress_bars()
    columns = RecordColumns(data_args.operations_column, data_args.state_column, data_args.step_states_column,
                            data_args.initial_state_column, data_args.operation_delimiter)
    options = ReadOptions(num_proc=data_args.preprocessing_num_workers, overwrite_cache=data_args.overwrite_cache,
                          cache_dir=data_args.cache_dir, revision=data_args.dataset_revision, token=data_args.token,
                          trust_remote_code=data_args.trust_remote_code)
    with train_args.main_process_first(desc="reading the records"):  # DDP: rank 0 fills datasets' cache first
        records = read_record_splits(
            columns, data_args.train_file, data_args.validation_file, data_args.test_file, data_args.dataset_name,
            data_args.dataset_config_name, data_args.skip_bad_records, data_args.max_train_samples,
            data_args.data_name, max_eval_samples=data_args.max_eval_samples,
            validation_split_percentage=data_args.validation_split_percentage, seed=train_args.seed, options=options,
            operation_tokens=data_args.operation_tokens)
    for note in records.notes:
        logger.warning("records: %s", note)
    check_record_lengths(records, model_args.max_iterations, model_args.step_size, data_args.skip_bad_records)
    for split, bad in records.skipped.items():
        if bad:
            logger.warning("skipped %d %s record(s) (--skip_bad_records); the first: %s", len(bad), split, bad[0])
    logger.warning("records: %s", records.summary())
    lengths = records.lengths
    if "min_train_depth" not in given:
        train_args.min_train_depth = int(lengths.min())
    if "max_train_depth" not in given:
        train_args.max_train_depth = int(lengths.max())
    if "curriculum_start_depth" not in given and train_args.curriculum_start_depth is not None:
        train_args.curriculum_start_depth = int(min(max(train_args.curriculum_start_depth, lengths.min()),
                                                    train_args.max_train_depth))
    start = train_args.curriculum_start_depth
    if start is not None and not train_args.min_train_depth <= start <= train_args.max_train_depth:
        raise ValueError(f"--curriculum_start_depth {start} lies outside the training range "
                         f"[{train_args.min_train_depth}, {train_args.max_train_depth}] (the training records have "
                         f"lengths {lengths.min()}..{lengths.max()}).")
    if task_args.self_distillation and has_step_states(records.train):
        mode = ("label-free prefix self-distillation (--self_distillation): iterations before the last are pulled to "
                "an EMA teacher on the prefixes; the step states the records carry are read only for the final answer")
    elif has_step_states(records.train):
        mode = "progress-aligned targets: the records carry the state after every operation"
    elif task_args.self_distillation:
        mode = ("label-free prefix self-distillation (--self_distillation): the records carry final states only; "
                "iterations before the last are pulled to an EMA teacher on the prefixes")
    else:
        mode = ("final-answer training over the lengths present: the records carry final states only, and under the "
                "local view iteration k on a record computes what it computes on the record's k-operation prefix, so "
                "a record of length k supervises iteration k (against label-free prefix self-distillation: "
                "results/own_data_cpu/README.md; --self_distillation true for the other)")
    logger.warning("training mode: %s", mode)
    records.mode = mode
    return records


# the probe's settings: with --probe_depth they set the task probe; with records, the first three set the validation
# probe (the other two are refused there by check_flags)
PROBE_SETTINGS = ("probe_n", "probe_every_steps", "probe_stop_patience", "probe_seed", "probe_stop_accuracy")


def use_validation_probe(records: RecordSplits, data_args: DataArguments, train_args, given: set) -> None:
    """The validation probe of a records run (`RecordsProbeCallback`). Without a validation split there is none: the
    flags that set it are refused by name (they would change nothing). With --restore_best_probe the Trainer's
    best-model machinery follows the probe's metric (`metric_for_best_model`, `load_best_model_at_end`; see
    `trainers.ProbeCallback`): the best probe's checkpoint is saved, and loaded back when training ends."""
    if "validation" not in records.splits:
        named = [f"--{name}" for name in ("stop_when_validation_exact", "restore_best_probe")
                 if name in given and getattr(data_args, name)]
        named += [f"--{name}" for name in PROBE_SETTINGS[:3] if name in given]
        if named:
            one = len(named) == 1
            raise ValueError(
                f"{', '.join(named)} {'sets' if one else 'set'} the validation probe, and the records have no "
                f"validation split to probe (no --validation_file, and --validation_split_percentage "
                f"{data_args.validation_split_percentage:g} holds none out): give a --validation_file or a "
                f"--validation_split_percentage above 0, or leave {'it' if one else 'them'} out.")
        return
    if data_args.restore_best_probe:
        train_args.metric_for_best_model, train_args.greater_is_better = RecordsProbeCallback.metric, True
        train_args.load_best_model_at_end = True


def evaluate_records_and_report(model, records: RecordSplits, task_args: TaskArguments, train_args,
                                output_dir: Path) -> dict:
    """Every evaluation split: accuracy per length present (eval_<split>.json, a table, one plot), and where the
    split records step states, the progress profile (profile_<split>.json / .png)."""
    results = {}
    workers = task_args.eval_workers or default_workers(model.device, model.config._attn_implementation)
    modes = ["forced"] + (["halting"] if task_args.eval_halting else [])
    lines = []
    for split, (loaded, encoded) in records.splits.items():
        for mode in modes:
            result = evaluate_records(model, encoded, records.record_format, mode=mode,
                                      batch_size=task_args.eval_batch_size, train_max_depth=train_args.max_train_depth,
                                      workers=workers, sources=[repo_relative(p) for p in loaded.sources],
                                      progress=not train_args.disable_tqdm, split=split)
            results[f"{split}_{mode}" if mode != "forced" else split] = result
            save_results(result, output_dir / f"eval_{split}{'' if mode == 'forced' else '_' + mode}.json")
            lines += [f"{split} ({mode}):", "| length | n | accuracy |", "|---|---|---|"]
            lines += [f"| {r['depth']} | {r['n']} | {r['accuracy']:.4f} |" for r in result["per_depth"]]
            lines.append("")
        if has_step_states(loaded):
            profile = records_progress_profile(model, encoded, batch_size=task_args.eval_batch_size,
                                               max_records_per_depth=task_args.eval_n)
            save_results(profile, output_dir / f"profile_{split}.json")
            plottable = dict(profile, profile=[[np.nan if a is None else a for a in row] for row in profile["profile"]])
            plot_progress_profile({f"progress profile ({split})": plottable}, output_dir / f"profile_{split}.png",
                                  train_max_depth=train_args.max_train_depth)
    if results:
        plot_accuracy_vs_depth({name: [r] for name, r in results.items()}, output_dir / "accuracy_vs_depth.png",
                               title=records.record_format.task_name)
        table = "\n".join(lines)
        (output_dir / "eval_table.md").write_text(table + "\n")
        print(table)
    return results


def main(argv=None):
    model_args, task_args, data_args, train_args, given = parse_all_args(argv)
    require_task("--task_file", task_args.task_file, presets=False)  # the paths flags name, before anything loads
    require_checkpoint("--init_from_par", model_args.init_from_par)
    require_checkpoint("--init_from_qwen2", model_args.init_from_qwen2, gguf_file=model_args.gguf_file)
    if model_args.init_from_qwen2 and model_args.init_from_par:
        raise ValueError("give at most one of --init_from_qwen2 and --init_from_par.")
    if not model_args.init_from_qwen2 and (model_args.gguf_file is not None or model_args.truncate_parent):
        raise ValueError("--gguf_file and --truncate_parent describe the parent of a retrofit; they need "
                         "--init_from_qwen2.")
    if train_args.depth_schedule == "fixed" and task_args.eval_halting:  # checked before training, not after it
        raise ValueError("--eval_halting needs a model trained to halt; depth_schedule='fixed' trains no halting.")
    if task_args.probe_depth is None and not data_args.given and given & set(PROBE_SETTINGS):
        raise ValueError("--probe_n, --probe_every_steps, --probe_seed and --probe_stop_* need --probe_depth "
                         "(without it no probe runs; with records, --probe_n, --probe_every_steps and "
                         "--probe_stop_patience set the validation probe).")
    output_dir = Path(train_args.output_dir)
    world = max(1, train_args.world_size)
    started = time.time()
    records = task = None
    if data_args.given:
        records = prepare_records(data_args, model_args, task_args, train_args, given)
        tokenizer, dataset, prompt_format = records.tokenizer, records.encoded, records.record_format
        token_ids = record_token_ids(tokenizer, prompt_format)
        use_validation_probe(records, data_args, train_args, given)
    else:
        if any(getattr(data_args, f) is not None for f in ("validation_file", "test_file", "operations_column",
                                                            "state_column", "step_states_column",
                                                            "initial_state_column", "operation_delimiter")):
            raise ValueError("the record flags (--validation_file, --test_file, --*_column, --operation_delimiter) "
                             "need --train_file or --dataset_name.")
        check_flags("train_par.py", records=False, given=given)
        task = build_task(task_args)
        tokenizer = build_tokenizer_for(task, task_args, model_args)
        token_ids = model_token_ids(tokenizer, task)
        problems = training_problems(task_args, train_args, world)
        dataset = build_dataset(task, tokenizer, task_args.rendering, **problems)
        prompt_format = trained_prompt_format(task, task_args, problems, model_args.init_from_par)
    set_seed(train_args.seed)  # the from-scratch initialisation (and the adapter of a retrofit) follow --seed
    model = build_model(model_args, token_ids, train_args)
    use_tokenizer_special_tokens(model.config, tokenizer)
    # what the checkpoint needs to read raw text (the state-tracking pipeline) and whether it may halt by itself
    model.config.prompt_format = prompt_format.to_dict()
    model.config.learned_halting = train_args.halting_loss_weight > 0
    collator = StateTrackingCollator(pad_token_id=token_ids["pad_token_id"])
    common = dict(model=model, args=train_args, train_dataset=dataset, data_collator=collator,
                  processing_class=tokenizer)
    if task_args.self_distillation:
        trainer = PrefixSelfDistillationTrainer(**common, task=task, rendering=task_args.rendering,
                                                random_initial=task_args.random_initial)
    else:
        trainer = ParTrainer(**common)
    if task_args.probe_depth is not None:  # generated problems only (check_flags refuses it with records)
        trainer.add_callback(StateAccuracyProbeCallback(
            tokenizer, task, task_args.probe_depth, n=task_args.probe_n, every_steps=task_args.probe_every_steps,
            seed=train_args.seed if task_args.probe_seed is None else task_args.probe_seed,
            rendering=task_args.rendering, random_initial=task_args.random_initial,
            batch_size=task_args.eval_batch_size, fixed_iterations=train_args.fixed_iterations,
            stop_accuracy=task_args.probe_stop_accuracy, stop_patience=task_args.probe_stop_patience))
    if records is not None and "validation" in records.splits:
        trainer.add_callback(RecordsProbeCallback(
            records.splits["validation"][1], token_ids["pad_token_id"], n=task_args.probe_n,
            every_steps=task_args.probe_every_steps, batch_size=task_args.eval_batch_size,
            stop_accuracy=1.0 if data_args.stop_when_validation_exact and not records.stop_rule_off else None,
            stop_patience=task_args.probe_stop_patience, curriculum_cap=trainer.curriculum_cap))
    trainer.train(resume_from_checkpoint=train_args.resume_from_checkpoint)
    train_seconds = time.time() - started
    if not trainer.is_world_process_zero():
        teardown_distributed([trainer])  # waits for rank 0's save and evaluation (trainers/distributed.py)
        return None
    trainer.save_model(str(output_dir))
    eval_model = model.merge_and_unload() if model_args.peft else model
    eval_model.eval()
    if records is None:
        save_task(task, output_dir)

    def evaluate_trained():
        if records is None:
            return evaluate_and_report(eval_model, tokenizer, task, task_args, train_args, output_dir)
        return evaluate_records_and_report(eval_model, records, task_args, train_args, output_dir)

    try:
        results = evaluate_trained()
    except Exception as error:  # the trained model is saved; its compiled graphs may fail on evaluation shapes
        if getattr(eval_model, "compiled", None) is None or not is_compiler_error(error):
            raise
        logger.warning("evaluation: torch.compile failed on the evaluation's shapes (%s: %s); evaluating eagerly "
                       "(the same computation).", type(error).__name__, str(error).splitlines()[0][:200])
        eval_model.compile_core(disable=True)
        results = evaluate_trained()
    steps = trainer.state.global_step
    summary = {
        "train_seconds": round(train_seconds, 1), "steps": steps, "max_steps": train_args.max_steps,
        "samples_seen": steps * train_args.per_device_train_batch_size * world * train_args.gradient_accumulation_steps,
        "seed": train_args.seed, "max_train_depth": train_args.max_train_depth,
        "accuracy": {m: dict(zip(r["depths"], r["accuracy"])) for m, r in results.items()},
        "extrapolation_factor": {m: r["extrapolation_factor"] for m, r in results.items()},
        "mean_iterations": {m: dict(zip(r["depths"], (row["mean_iterations"] for row in r["per_depth"])))
                            for m, r in results.items()},
        "curve": training_curve(trainer.state.log_history),
        "probe": [{"step": row["step"], "accuracy": row["probe_accuracy"]} for row in trainer.state.log_history
                  if "probe_accuracy" in row],
        "probe_stopped_at": next((row["step"] for row in trainer.state.log_history if "probe_stop" in row), None),
        "probe_restored_step": next((row["probe_restored_step"] for row in trainer.state.log_history
                                     if "probe_restored_step" in row), None),
        # the checkpoint holding the weights the run ends with, when the validation probe keeps the best
        "best_model_checkpoint": trainer.state.best_model_checkpoint,
        "environment": next(iter(results.values()))["environment"] if results else environment_info(model.device),
        "command": command_line(sys.argv[0] if argv is None else __file__, sys.argv[1:] if argv is None else argv),
    }
    if records is not None:
        summary["records"] = {"training_mode": records.mode, "train_records": len(records.encoded),
                              "prepare_seconds": round(records.seconds, 2),
                              "train_sources": [repo_relative(p) for p in records.train.sources],
                              "operations": len(records.record_format.operations),
                              "labels": len(records.record_format.candidates),
                              "queries": list(records.record_format.query_names),
                              "skipped": {k: len(v) for k, v in records.skipped.items()}}
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    teardown_distributed([trainer])
    return summary


if __name__ == "__main__":
    run_cli(main)
