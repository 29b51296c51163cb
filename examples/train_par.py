"""Train a PAR looped Qwen2 on a state-tracking task, then evaluate length generalization.

The defaults train a small from-scratch model on swap-S5 (depth curriculum up to d = 8) in a few minutes on a
laptop CPU with the recipe of the length-generalization study (`results/length_generalization_cpu/`: local loop
view, progress-coupled query positions, bidirectional queries; `--loop_view full --progress_positions false
--bidirectional_queries false` is the paper's setting), then print accuracy at depths up to 8× the training depth
and write a table, JSON and plot:

    python examples/train_par.py                                  # the defaults (README's main job)
    python examples/train_par.py --max_steps 200 --output_dir runs/quick
    python examples/train_par.py config.yaml                      # or config.json: the same fields
    python examples/train_par.py --init_from_parent PATH --rendering text --prelude_layers 8 --core_layers 8 \\
        --coda_layers 8 --peft lora --bf16                        # retrofit a pretrained Qwen2.5 (or a Llama)
    torchrun --nproc_per_node 2 examples/train_par.py ...         # DDP (or accelerate launch); CPU: --use_cpu true

Every field of `ModelArguments`, `TaskArguments`, `DataArguments` and `ParTrainingArguments` (HF TrainingArguments
included) is a flag; `--self_distillation` switches to label-free prefix self-distillation
(`SelfDistillationArguments`). `main` runs the steps in order: parse, data (with records, the recipe chosen from
them unless `--recipe off`), model, trainer, train, save, evaluate (and with `--baselines lstm,rpni`, the baselines on
the same files); each step's work is in the library (`par_cli.training_data`, `par_cli.recipe`,
`trainers.model_setup`, `par_cli.reports`, `par_cli.baselines_table`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, set_seed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from par_cli.baselines_table import check_baselines, parse_baselines, run_baselines  # noqa: E402
from par_cli.cli import require_checkpoint, require_task, run_cli  # noqa: E402
from par_cli.flag_modes import check_flags, given_flags  # noqa: E402
from par_cli.hf_parser import accept_none  # noqa: E402
from par_cli.recipe import RECIPE_MODES, check_recipe, use_recipe  # noqa: E402
from par_cli.recipe_race import RACE_STEPS, race_recipe  # noqa: E402
from par_cli.record_flags import RecordFlags  # noqa: E402
from par_cli.reports import (  # noqa: E402
    evaluate_and_report,
    evaluate_records_and_report,
    run_summary,
)
from par_cli.resolution import Resolution  # noqa: E402
from par_cli.training_data import (  # noqa: E402
    PROBE_SETTINGS,
    TrainingData,
    build_task,
    prepare_records,
    records_data,
    trained_prompt_format,
    training_problems,
)
from state_tracking import StateTrackingCollator, build_dataset, model_token_ids, save_task  # noqa: E402
from state_tracking.evaluation import command_line  # noqa: E402
from state_tracking.records import OPERATION_TOKENS  # noqa: E402
from state_tracking.tasks import Task  # noqa: E402
from trainers import (  # noqa: E402
    FreezePreludeCallback,
    ParTrainer,
    ParTrainingArguments,
    PrefixSelfDistillationTrainer,
    RecordsProbeCallback,
    SelfDistillationArguments,
    StateAccuracyProbeCallback,
    require_complete_checkpoint,
    teardown_distributed,
)
from trainers.callbacks import learning_outcome  # noqa: E402
from trainers.model_setup import (  # noqa: E402
    AUTO_COMPILE_MIN_STEPS,
    build_model,
    build_tokenizer_for,
    check_freeze_prelude_from_step,
    eager_if_compile_fails,
    use_tokenizer_special_tokens,
)
from trainers.step_budget import curriculum_outcome, epochs_as_max_steps, fit_curriculum_to_budget  # noqa: E402


@dataclass
class ModelArguments:
    init_from_parent: str | None = field(default=None, metadata={
        "aliases": ["--init_from_qwen2", "--init-from-qwen2"],
        "help": "retrofit this pretrained causal LM (a folder or Hub id): a Qwen2, or a Llama-architecture one "
                "converted exactly into Qwen2 (modeling_par.parent_conversion); a GGUF file in the folder with "
                "--gguf_file. --init_from_qwen2 is its old name, kept as an alias"})
    gguf_file: str | None = field(default=None, metadata={
        "help": "with --init_from_parent FOLDER: the GGUF file in it to load (dequantized to fp32; needs the gguf "
                "package: pip install -e '.[pretrained]')"})
    truncate_parent: bool = field(default=False, metadata={
        "help": "with --init_from_parent: keep only the parent's first prelude + core + coda layers (a truncated "
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
    freeze_prelude_from_step: int | None = field(default=None, metadata={
        "help": "train the prelude for this many optimizer steps, then stop training it (trainers.FreezePrelude"
                "Callback): the reading of sentences learned early is kept while core and coda train on"})
    freeze_embeddings: bool = field(default=False, metadata={
        "help": "train not the token embeddings (model.freeze_embeddings(): most of a retrofit's parameters and AdamW "
                "state; tied embeddings freeze the LM-head rows too)"})
    parent_weights: str = field(default="pretrained", metadata={
        "help": "with --init_from_parent: 'pretrained' (the parent's weights) or 'random' (the parent's shape and "
                "tokenizer, every weight drawn afresh: the control for what pretraining brings)"})
    step_size: int = field(default=1, metadata={"help": "c: operations per iteration"})
    norm_anchoring: bool = field(default=True, metadata={"help": "state-norm anchoring (off: the ablation)"})
    grad_window: int = field(default=8, metadata={"help": "iterations with gradient"})
    position_encoding: str = field(default="rope", metadata={
        "help": "rope (Qwen2's rotary) | nope (no positional encoding: order only from the causal mask and "
                "--core_conv_kernel; config.position_encoding)"})
    core_conv_kernel: int = field(default=0, metadata={
        "help": "K > 0: a causal depthwise convolution of K taps on the core input at every iteration (FPRM; full "
                "view only; config.core_conv_kernel); 0: off"})
    loop_state_noise: float = field(default=0.0, metadata={
        "help": "σ ≥ 0: in training, each iteration's anchored state gets σ · rms(s_1) · N(0, I) added (full view "
                "only; config.loop_state_noise; also set on an --init_from_par checkpoint when > 0); 0: off"})
    answer_feedback: bool = field(default=False, metadata={
        "help": "the loop state is the answer: each iteration restarts from e with the previous iteration's soft "
                "answer written at the queries (config.answer_feedback; for a state the answers name whole)"})
    answer_feedback_rows: str = field(default="all", metadata={
        "help": "with --answer_feedback: all (every row restarts from e) | queries (only the query rows restart, with "
                "the soft answer; the other rows keep the core's output: the full view's place in the prompt; "
                "config.answer_feedback_rows)"})
    max_iterations: int = field(default=1100, metadata={"help": "the most iterations a forward may run"})
    checkpoint_core: bool = field(default=False, metadata={"help": "activation checkpointing of the core"})
    loop_view: str | None = field(default=None, metadata={
        "help": "what the queries see at iteration k: full | prefix | local (default: local from scratch — the "
                "recipe of results/length_generalization_cpu; full, the paper's, when retrofitting a parent)"})
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
    lora_layers: str = field(default="core", metadata={
        "help": "--peft lora on the core layers' projections (core) or on every layer's, prelude and coda too (all: "
                "a pretrained parent kept whole under low-rank updates); embeddings stay frozen"})


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
    probe_phrasing: str = field(default="canonical", metadata={
        "help": "probe (text rendering): the prompts' sentences, canonical | seen | held_out (the task's held-out "
                "wordings, drawn as the evaluator's --phrasing held_out draws them)"})
    probe_every_steps: int = field(default=250, metadata={"help": "probe: optimizer steps between probes"})
    probe_stop_accuracy: float | None = field(default=None, metadata={
        "help": "probe: stop training once the last probe_stop_patience probes reached this accuracy (early stop; "
                "off unless set; needs --probe_depth)"})
    probe_stop_patience: int = field(default=2, metadata={"help": "probe: consecutive probes at probe_stop_accuracy"})
    probe_seed: int | None = field(default=None, metadata={
        "help": "probe: seed of its problems (evaluation.draw_test_problems; default --seed: with probe_n = eval_n "
                "they are the final evaluation's problems at probe_depth)"})


@dataclass
class DataArguments(RecordFlags):
    """Recorded data instead of a task generator (`state_tracking.records`): CSV / JSON Lines / Parquet files by
    extension, or anything `datasets.load_dataset` takes. Which records and columns: `RecordFlags` (defined once, the
    baselines' too); the rest here."""

    data_name: str | None = field(default=None, metadata={"help": "the name the checkpoint gives the data (default: "
                                                                 "the training file's stem)"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N validation records"})
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

    stop_when_learning_nothing_after: int | None = field(default=None, metadata={
        "help": "records: from this optimizer step on, stop once the last --probe_stop_patience validation probes were "
                "no better than answering every probed record with their most common final state (the majority "
                "answer; trainers.RecordsProbeCallback). Off by default: logs measured near chance for 1,250-3,500 "
                "steps before they learned (results/own_data_cpu/defaults.md). Every run reports the majority answer "
                "beside its probes (summary.json's \"learning\") and warns when it ends at chance"})
    restore_best_probe: bool = field(default=True, metadata={
        "help": "records: end training with the weights of the most accurate validation probe when the final weights "
                "score lower (a late collapse, or a time budget ending mid-spike): each new best probe saves its "
                "checkpoint, which the Trainer loads back at the end (load_best_model_at_end, metric_for_best_model "
                "probe_accuracy); false: keep the final weights"})

    recipe: str = field(default="auto", metadata={
        "help": "records: 'auto' chooses the model size, answer feedback, operation tokens, curriculum and Adam's "
                "beta2 from the training records by rules measured in results/own_data_cpu (par_cli.recipe; the "
                "choice and its reasons go to the log and summary.json's \"recipe\"; every flag you give wins); "
                "'off': the fixed records defaults; 'race': the rules' recipe, it with answer feedback flipped and "
                "the fixed defaults each train the run's first --race_steps steps, the better half twice as far, "
                "and the last one standing resumes to the end (par_cli.recipe_race; summary.json's \"recipe\".race)",
        "choices": list(RECIPE_MODES)})
    race_steps: int = field(default=RACE_STEPS, metadata={
        "help": "--recipe race: optimizer steps each candidate trains in the race's first round (each later round "
                "doubles them for the better half)"})

    baselines: str | None = field(default=None, metadata={
        "help": "after PAR, train these baselines on the same records files and print one table beside PAR's "
                "(accuracy per test length, seconds, RPNI's learned states; summary.json's \"baselines\"): a "
                "comma-separated list of lstm (examples/baselines/rnn.py's defaults), rpni (automata.py; needs "
                "AALpy); needs --train_file (par_cli.baselines_table)"})

    @property
    def given(self) -> bool:
        return self.train_file is not None or self.dataset_name is not None


logger = logging.getLogger("train_par")

DEFAULT_TRAINING = dict(
    output_dir="runs/par-swap-s5-cpu", max_steps=2000, per_device_train_batch_size=64, learning_rate=1e-3,
    adapter_learning_rate=2e-3, warmup_steps=100, lr_scheduler_type="cosine", weight_decay=0.01,
    max_train_depth=8, curriculum_start_depth=2, curriculum_every_steps=100, logging_steps=100,
    save_strategy="no", report_to="none", seed=0, dataloader_num_workers=0, max_grad_norm=1.0,
    restore_callback_states_from_checkpoint=True,  # --max_train_seconds spans resumed segments
)


# Training on records (--train_file / --dataset_name) with only the data flags given: the recipe with the mastery
# curriculum over the lengths present (d_max grows once the final answers at d_max are 90% right), the training depth
# range from the data, and a budget in steps, not seconds: training stops on the validation rule or after 6,000 steps
# of 64 (384k samples: 100k records ~4 times), so the same command and seed train the same model on a busy machine and
# an idle one. 6,000 steps is what the earlier 14-minute default (840 s) let a run train on an idle machine
# (results/own_data_cpu/README.md: the register3 default rows, 5,782-6,000 steps in 773-849 s; 3,000 steps were
# measured too short there). --max_train_seconds still adds a wall-clock cap; the log and summary.json say when it
# ended a run (summary.json's "stopped_by").
LONGEST_RECORD = 1_000_000  # max_train_depth's default with records: replaced by the longest training record's length
DATA_TRAINING = dict(output_dir="runs/par-records", max_steps=6000, curriculum_advance_accuracy=0.9,
                     curriculum_every_steps=50, max_train_depth=LONGEST_RECORD)

# Retrofitting a pretrained parent (--init_from_parent): the paper's AdamW schedule, not the from-scratch one above.
RETROFIT_TRAINING = dict(learning_rate=2e-5, adapter_learning_rate=1e-4, warmup_steps=200)

# old flag name -> the field it sets (the option is an alias in ModelArguments; a config file may use it too)
FLAG_ALIASES = {"init_from_qwen2": "init_from_parent"}


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
    what was given (`derived_defaults`), then the dataclasses, which check the result. An old flag name
    (`FLAG_ALIASES`) counts as its field's."""
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
        given = _new_names(set(config))
        values = {**DEFAULT_TRAINING, **{FLAG_ALIASES.get(k, k): v for k, v in config.items()}}
    else:
        namespace, unused = parser.parse_known_args(argv)
        if unused:
            raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {unused}")
        values = vars(namespace)
        given = _new_names(given_flags(argv, fields=values))
    values.update(derived_defaults(given, values))
    model_args, task_args, data_args, train_args = parser.parse_dict(values)
    return model_args, task_args, data_args, train_args, given


def _new_names(given: set[str]) -> set[str]:
    """The field names given, an old name (`FLAG_ALIASES`) as its field's; the old and new name together are refused."""
    for old, new in FLAG_ALIASES.items():
        if old in given and new in given:
            raise ValueError(f"--{old} is the old name of --{new}; give one of them.")
    return {FLAG_ALIASES.get(name, name) for name in given}


def derived_defaults(given: set[str], values: dict) -> dict:
    """The defaults that follow from what the command gives (`given`: the names given; `values`: every value so far),
    for the names not given:
    - records (--train_file / --dataset_name): `DATA_TRAINING`, and without --save_strategy `save_total_limit` 1 (the
      checkpoints the validation probe saves, its best and its stop, are kept to the one summary.json names);
    - --init_from_parent: the paper's fine-tuning schedule (`RETROFIT_TRAINING`);
    - --min_train_depth without --curriculum_start_depth starts the default curriculum at the smallest depth trained
      (a start below it is refused as a contradiction);
    - --curriculum_start_depth none (no curriculum) drops the mastery test the records default adds (it has no
      curriculum to advance);
    - --save_steps without --save_strategy saves every save_steps steps (the default strategy "no" would save
      nothing: a user who asks for checkpoints gets them)."""
    defaults = {}
    if "save_steps" in given:
        defaults["save_strategy"] = "steps"
    if given & {"train_file", "dataset_name"}:
        defaults.update(DATA_TRAINING)
        if "save_strategy" not in given:
            defaults["save_total_limit"] = 1
    if values.get("init_from_parent"):
        defaults.update(RETROFIT_TRAINING)
    if "min_train_depth" in given:
        defaults["curriculum_start_depth"] = max(DEFAULT_TRAINING["curriculum_start_depth"], values["min_train_depth"])
    if "curriculum_start_depth" in given and values.get("curriculum_start_depth") is None:
        defaults["curriculum_advance_accuracy"] = None
    return {name: value for name, value in defaults.items() if name not in given}


# the records' flags, which need --train_file or --dataset_name
RECORD_FLAGS = ("validation_file", "test_file", "operations_column", "state_column", "step_states_column",
                "initial_state_column", "operation_delimiter")


def check_arguments(model_args: ModelArguments, task_args: TaskArguments, data_args: DataArguments, train_args,
                    given: set) -> None:
    """Refuse, before anything loads, a path that is not there and flags that contradict each other."""
    require_task("--task_file", task_args.task_file, presets=False)
    require_checkpoint("--init_from_par", model_args.init_from_par)
    require_checkpoint("--init_from_parent", model_args.init_from_parent, gguf_file=model_args.gguf_file)
    if model_args.init_from_parent and model_args.init_from_par:
        raise ValueError("give at most one of --init_from_parent and --init_from_par.")
    if not model_args.init_from_parent and (model_args.gguf_file is not None or model_args.truncate_parent):
        raise ValueError("--gguf_file and --truncate_parent describe the parent of a retrofit; they need "
                         "--init_from_parent.")
    if train_args.depth_schedule == "fixed" and task_args.eval_halting:  # checked before training, not after it
        raise ValueError("--eval_halting needs a model trained to halt; depth_schedule='fixed' trains no halting.")
    check_freeze_prelude_from_step(model_args)
    if "save_steps" in given and "save_strategy" in given and train_args.save_strategy != "steps":
        raise ValueError(f"--save_steps {train_args.save_steps:g} saves every that many steps, and --save_strategy "
                         f"{train_args.save_strategy.value} says otherwise: give --save_strategy steps, or leave "
                         "--save_steps out.")
    if isinstance(train_args.resume_from_checkpoint, str):  # a cut-off save would restart the schedule silently
        require_complete_checkpoint(train_args.resume_from_checkpoint)
    check_baselines(parse_baselines(data_args.baselines), data_args)
    check_recipe(data_args.recipe)
    if task_args.probe_phrasing not in Task.PHRASINGS:
        raise ValueError(f"--probe_phrasing must be one of {', '.join(Task.PHRASINGS)}; got "
                         f"{task_args.probe_phrasing!r}.")
    if task_args.probe_phrasing != "canonical" and task_args.rendering != "text":
        raise ValueError(f"--probe_phrasing {task_args.probe_phrasing} needs --rendering text (the "
                         f"{task_args.rendering} rendering has one phrasing).")
    if train_args.probe_selects_best and task_args.probe_depth is None and not data_args.given:
        raise ValueError(f"--metric_for_best_model {train_args.metric_for_best_model} follows the probe, and no probe "
                         "runs: give --probe_depth (generated problems), or train on records with a validation split, "
                         "or choose another metric.")
    if task_args.probe_depth is None and not data_args.given and given & set(PROBE_SETTINGS):
        raise ValueError("--probe_n, --probe_every_steps, --probe_seed, --probe_phrasing and --probe_stop_* need "
                         "--probe_depth "
                         "(without it no probe runs; with records, --probe_n, --probe_every_steps and "
                         "--probe_stop_patience set the validation probe).")


def load_data(model_args: ModelArguments, task_args: TaskArguments, data_args: DataArguments, train_args,
              given: set) -> TrainingData:
    """Step 2: the records of --train_file / --dataset_name, with the recipe chosen from them (--recipe auto; encoded
    again, not read again, if it reads operations otherwise), or problems generated from the task. What the data
    choose for the arguments (the depth range, the recipe's flags, the validation probe, epochs as steps, the
    curriculum fitted to the budget) is chosen on a `Resolution` of the parsed ones, and the arguments the run trains
    with are built from it once (`TrainingData.arguments`: model, data and training arguments, validated again)."""
    run = Resolution(model_args, data_args, train_args)
    if data_args.given:
        records = prepare_records(run, task_args, given)
        recipe = use_recipe(records, given, task_args, run)
        return records_data(records, given, run, recipe)
    if any(getattr(data_args, name) is not None for name in RECORD_FLAGS):
        raise ValueError("the record flags (--validation_file, --test_file, --*_column, --operation_delimiter) "
                         "need --train_file or --dataset_name.")
    check_flags("train_par.py", records=False, given=given)
    task = build_task(task_args)
    run.choose(epochs_as_max_steps(run.train, task_args.train_size, given, "generated problems (--train_size)"))
    curriculum, fitted = fit_curriculum_to_budget(
        run.train, range(run.train.min_train_depth, run.train.max_train_depth + 1), given)
    run.choose(fitted)
    model_args, data_args, train_args = arguments = run.build()
    tokenizer = build_tokenizer_for(task, task_args, model_args)
    problems = training_problems(task_args, train_args, max(1, train_args.world_size))
    return TrainingData(tokenizer, build_dataset(task, tokenizer, task_args.rendering, **problems),
                        trained_prompt_format(task, task_args, problems, model_args.init_from_par),
                        model_token_ids(tokenizer, task), task=task, curriculum=curriculum, arguments=arguments)


def load_model(data: TrainingData, model_args: ModelArguments, train_args):
    """Step 3: the model (`trainers.model_setup.build_model`), seeded by --seed (the from-scratch initialisation and a
    retrofit's adapter), with what its checkpoint needs to read raw text (the state-tracking pipeline) and whether it
    may halt by itself."""
    set_seed(train_args.seed)
    queries = data.task.num_queries if data.task is not None else len(data.prompt_format.query_names)
    model = build_model(model_args, data.token_ids, train_args, num_queries=queries)
    use_tokenizer_special_tokens(model.config, data.tokenizer)
    model.config.prompt_format = data.prompt_format.to_dict()
    model.config.learned_halting = train_args.halting_loss_weight > 0
    return model


def build_trainer(model, data: TrainingData, task_args: TaskArguments, data_args: DataArguments, train_args,
                  model_args: ModelArguments):
    """Step 4: the Trainer (`ParTrainer`, or `PrefixSelfDistillationTrainer` with --self_distillation) and its probes:
    the task probe of --probe_depth, or the validation probe of a records run; --freeze_prelude_from_step's callback."""
    common = dict(model=model, args=train_args, train_dataset=data.dataset, processing_class=data.tokenizer,
                  data_collator=StateTrackingCollator(pad_token_id=data.token_ids["pad_token_id"]))
    if task_args.self_distillation:
        trainer = PrefixSelfDistillationTrainer(**common, task=data.task, rendering=task_args.rendering,
                                                random_initial=task_args.random_initial)
    else:
        trainer = ParTrainer(**common)
    if task_args.probe_depth is not None:  # generated problems only (check_flags refuses it with records)
        trainer.add_callback(StateAccuracyProbeCallback(
            data.tokenizer, data.task, task_args.probe_depth, n=task_args.probe_n,
            every_steps=task_args.probe_every_steps,
            seed=train_args.seed if task_args.probe_seed is None else task_args.probe_seed,
            rendering=task_args.rendering, random_initial=task_args.random_initial,
            batch_size=task_args.eval_batch_size, fixed_iterations=train_args.fixed_iterations,
            stop_accuracy=task_args.probe_stop_accuracy, stop_patience=task_args.probe_stop_patience,
            phrasing=task_args.probe_phrasing))
    records = data.records
    if records is not None and "validation" in records.splits:
        trainer.add_callback(RecordsProbeCallback(
            records.splits["validation"][1], data.token_ids["pad_token_id"], n=task_args.probe_n,
            every_steps=task_args.probe_every_steps, batch_size=task_args.eval_batch_size,
            stop_accuracy=1.0 if data_args.stop_when_validation_exact and not records.stop_rule_off else None,
            stop_patience=task_args.probe_stop_patience, curriculum_cap=trainer.curriculum_cap,
            stop_at_chance_after=data_args.stop_when_learning_nothing_after))
    if model_args.freeze_prelude_from_step is not None:
        trainer.add_callback(FreezePreludeCallback(model_args.freeze_prelude_from_step))
    return trainer


def candidate_trainer(data: TrainingData, task_args: TaskArguments):
    """Steps 3-4 for a candidate of the recipe race: its model and Trainer on the arguments its data step built."""
    model_args, data_args, train_args = data.arguments
    return build_trainer(load_model(data, model_args, train_args), data, task_args, data_args, train_args, model_args)


def save(trainer, model, data: TrainingData, model_args: ModelArguments, output_dir: Path):
    """Step 6: the trained model (and the task of generated problems) in --output_dir; returns the model to evaluate.
    With --peft lora the folder holds the model with the LoRA factors merged into it (the folder loads alone, as every
    checkpoint of this package does) and `lora_adapter/` peft's adapter files (to load onto the parent with
    `PeftModel.from_pretrained`): not both in one folder, where transformers would load the merged model and then
    apply the adapter a second time."""
    if model_args.peft:
        trainer.save_model(str(output_dir / "lora_adapter"))
        trainer.model = model = model.merge_and_unload()
    trainer.save_model(str(output_dir))
    if data.records is None:
        save_task(data.task, output_dir)
    return model.eval()


def evaluate(model, data: TrainingData, task_args: TaskArguments, train_args, output_dir: Path) -> dict:
    """Step 7: accuracy per test depth (generated problems) or per length of every evaluation split (records); once
    more eagerly if the compiled graphs fail on the evaluation's shapes."""
    def run():
        if data.records is None:
            return evaluate_and_report(model, data.tokenizer, data.task, task_args, train_args, output_dir)
        return evaluate_records_and_report(model, data.records, task_args, train_args, output_dir)

    return eager_if_compile_fails(model, run)


def main(argv=None):
    model_args, task_args, data_args, train_args, given = parse_all_args(argv)  # 1. parse
    check_arguments(model_args, task_args, data_args, train_args, given)
    output_dir = Path(train_args.output_dir)
    started, resume = time.time(), train_args.resume_from_checkpoint
    if data_args.given and data_args.recipe == "race":  # 2. data, each candidate recipe raced on it (2-5)
        run = Resolution(model_args, data_args, train_args)
        data, resume = race_recipe(
            prepare_records(run, task_args, given), given, task_args, run,
            prepare=lambda records, candidate: records_data(records, given, candidate),
            build=lambda data: candidate_trainer(data, task_args))
    else:
        data = load_data(model_args, task_args, data_args, train_args, given)  # 2. data
    # the arguments the run trains with: built once, with what the data chose (validated again), never set after
    model_args, data_args, train_args = data.arguments
    model = load_model(data, model_args, train_args)  # 3. model
    trainer = build_trainer(model, data, task_args, data_args, train_args, model_args)  # 4. trainer
    trainer.train(resume_from_checkpoint=resume)  # 5. train
    train_seconds = time.time() - started
    if not trainer.is_world_process_zero():
        teardown_distributed([trainer])  # waits for rank 0's save and evaluation (trainers/distributed.py)
        return None
    eval_model = save(trainer, model, data, model_args, output_dir)  # 6. save
    results = evaluate(eval_model, data, task_args, train_args, output_dir)  # 7. evaluate
    command = command_line(sys.argv[0] if argv is None else __file__, sys.argv[1:] if argv is None else argv)
    summary = run_summary(trainer, train_args, results, train_seconds, max(1, train_args.world_size), model.device,
                          command, data.records)
    if data.recipe is not None:
        summary["recipe"] = data.recipe
    summary["curriculum"] = curriculum_outcome(data.curriculum, trainer.curriculum_cap, trainer.state.global_step)
    if data.records is not None:
        summary["learning"] = learning_outcome(trainer.state.log_history)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    teardown_distributed([trainer])
    if data_args.baselines:  # 8. the baselines on the same files, one table beside PAR
        summary["baselines"] = run_baselines(data_args, task_args, train_args, given, results, summary)
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    run_cli(main)
