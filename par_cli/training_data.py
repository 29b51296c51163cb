"""The training data of a run (`examples/train_par.py`): problems generated from a task, or recorded data read from
files; and the record of the sentences the generated data used (the checkpoint's `prompt_format.trained`).

`task_args`, `data_args`, `model_args` are train_par.py's argument dataclasses (any objects with their fields);
`train_args` its training arguments. What the data choose for them (the depth range, the validation probe, the step
budget) is chosen on a `par_cli.resolution.Resolution` and built once, never set on the arguments.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from modeling_par import ParLoopedQwenConfig
from state_tracking.data import trained_phrasings
from state_tracking.prompts import prompt_format_of
from state_tracking.records import (
    ReadOptions,
    RecordColumns,
    RecordSplits,
    check_record_lengths,
    has_step_states,
    read_record_splits,
    record_token_ids,
    reencode_record_splits,
)
from state_tracking.tasks import get_task, load_task
from trainers.callbacks import RecordsProbeCallback
from trainers.step_budget import epochs_as_max_steps, examples_per_step, fit_curriculum_to_budget

from .flag_modes import check_flags
from .resolution import Resolution

logger = logging.getLogger(__name__)


def build_task(task_args):
    return load_task(task_args.task_file) if task_args.task_file else get_task(task_args.task)


def training_problems(task_args, train_args, world: int = 1) -> dict:
    """The `build_dataset` arguments of the training data (n, depths, seed, random_initial): by default every
    optimizer step's examples distinct (`examples_per_step` · max_steps)."""
    return dict(n=task_args.train_size or train_args.max_steps * examples_per_step(train_args, world),
                depths=(train_args.min_train_depth, train_args.max_train_depth), seed=train_args.seed,
                random_initial=task_args.random_initial)


def trained_prompt_format(task, task_args, problems: dict, init_from_par: str | None = None):
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


def read_options(data_args) -> ReadOptions:
    """How the records are read and cached (`ReadOptions`) from train_par.py's data flags."""
    return ReadOptions(num_proc=data_args.preprocessing_num_workers, overwrite_cache=data_args.overwrite_cache,
                       cache_dir=data_args.cache_dir, revision=data_args.dataset_revision, token=data_args.token,
                       trust_remote_code=data_args.trust_remote_code)


def reencode_records(records: RecordSplits, data_args) -> RecordSplits:
    """The records `prepare_records` read, encoded again with `data_args.operation_tokens` (the recipe chose another
    reading of an operation): the files are not read again (`records.reencode_record_splits`); mode and notes kept."""
    again = reencode_record_splits(records, data_args.operation_tokens, data_args.skip_bad_records,
                                   read_options(data_args))
    logger.warning("records: encoded again with --operation_tokens %s (not read again): %s", data_args.operation_tokens,
                   again.summary())
    return again


def prepare_records(run: Resolution, task_args, given: set) -> RecordSplits:
    """Read the training files, learn their vocabulary, encode them (`state_tracking.records.read_record_splits`);
    choose the depth range and curriculum start from the lengths present (unless given: `record_depths`, on `run`);
    choose the training mode and say why in one log line (kept as `.mode`)."""
    model_args, data_args, train_args = run.model, run.data, run.train
    if model_args.init_from_parent or model_args.init_from_par:
        raise ValueError("--train_file / --dataset_name train a model from scratch on the records' own vocabulary; "
                         "--init_from_parent and --init_from_par are not supported with them yet.")
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
    options = read_options(data_args)
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
    run.choose(record_depths(records, train_args, given))
    records.mode = training_mode(records, task_args.self_distillation)
    logger.warning("training mode: %s", records.mode)
    return records


def record_depths(records: RecordSplits, train_args, given: set) -> dict:
    """The training depth range of a records run: --min_train_depth / --max_train_depth from the records' lengths
    unless given, and the curriculum's start moved into them (unless given); a start outside the range is refused.
    Returns the fields chosen (field -> value)."""
    lengths, chosen = records.lengths, {}
    if "min_train_depth" not in given:
        chosen["min_train_depth"] = int(lengths.min())
    if "max_train_depth" not in given:
        chosen["max_train_depth"] = int(lengths.max())
    low = chosen.get("min_train_depth", train_args.min_train_depth)
    high = chosen.get("max_train_depth", train_args.max_train_depth)
    start = train_args.curriculum_start_depth
    if "curriculum_start_depth" not in given and start is not None:
        start = chosen["curriculum_start_depth"] = int(min(max(start, lengths.min()), high))
    if start is not None and not low <= start <= high:
        raise ValueError(f"--curriculum_start_depth {start} lies outside the training range [{low}, {high}] (the "
                         f"training records have lengths {lengths.min()}..{lengths.max()}).")
    return chosen


def training_mode(records: RecordSplits, self_distillation: bool) -> str:
    """How a records run trains, in one sentence: from the step states the records carry, by label-free prefix
    self-distillation, or from the final answers over the lengths present."""
    if self_distillation and has_step_states(records.train):
        return ("label-free prefix self-distillation (--self_distillation): iterations before the last are pulled to "
                "an EMA teacher on the prefixes; the step states the records carry are read only for the final answer")
    if has_step_states(records.train):
        return "progress-aligned targets: the records carry the state after every operation"
    if self_distillation:
        return ("label-free prefix self-distillation (--self_distillation): the records carry final states only; "
                "iterations before the last are pulled to an EMA teacher on the prefixes")
    return ("final-answer training over the lengths present: the records carry final states only, and under the "
            "local view iteration k on a record computes what it computes on the record's k-operation prefix, so "
            "a record of length k supervises iteration k (against label-free prefix self-distillation: "
            "results/own_data_cpu/README.md; --self_distillation true for the other)")


# the probe's settings: with --probe_depth they set the task probe; with records, the first three set the validation
# probe (the other two are refused there by check_flags)
PROBE_SETTINGS = ("probe_n", "probe_every_steps", "probe_stop_patience", "probe_seed", "probe_stop_accuracy",
                  "probe_phrasing")


@dataclass
class TrainingData:
    """What the data step hands on: generated problems of a `task`, or `records` read from files."""

    tokenizer: Any
    dataset: Any  # the encoded training examples
    prompt_format: Any  # PromptFormat (generated) or RecordFormat (records): written into the checkpoint's config
    token_ids: dict  # model_token_ids / record_token_ids: vocabulary size, pad, answer and halt tokens
    task: Any = None
    records: RecordSplits | None = None
    recipe: dict | None = None  # records: summary.json's "recipe" (par_cli.recipe.use_recipe)
    curriculum: dict | None = None  # summary.json's "curriculum" plan (trainers.step_budget)
    # (model_args, data_args, train_args) the run trains with, built once the data chose their fields
    # (par_cli.resolution.Resolution.build); None: the caller's own
    arguments: tuple | None = None


def records_data(records: RecordSplits, given: set, run: Resolution, recipe: dict | None = None) -> TrainingData:
    """The TrainingData of records read once (`prepare_records`) under the arguments `run` resolves (a recipe's flags
    among them): encoded again (not read again) if the recipe reads operations otherwise, with the validation probe
    (`use_validation_probe`), --num_train_epochs as steps and the curriculum fitted to the budget chosen on `run`,
    whose arguments are then built once (`TrainingData.arguments`); `records` itself is left as it was (the recipe race
    prepares it once per candidate)."""
    if run.data.operation_tokens != records.operation_tokens:
        records = reencode_records(records, run.data)
    else:
        records = dataclasses.replace(records, notes=list(records.notes))
    run.choose(use_validation_probe(records, run.data, given))
    run.choose(epochs_as_max_steps(run.train, len(records.encoded), given, "training records"))
    train_args = run.train
    lengths = [d for d in records.lengths.tolist() if train_args.min_train_depth <= d <= train_args.max_train_depth]
    curriculum, fitted = fit_curriculum_to_budget(train_args, lengths, given)
    run.choose(fitted)
    return TrainingData(records.tokenizer, records.encoded, records.record_format,
                        record_token_ids(records.tokenizer, records.record_format), records=records, recipe=recipe,
                        curriculum=curriculum, arguments=run.build())


def use_validation_probe(records: RecordSplits, data_args, given: set) -> dict:
    """The validation probe of a records run (`RecordsProbeCallback`). Without a validation split there is none: the
    flags that set it are refused by name (they would change nothing). With --restore_best_probe the Trainer's
    best-model machinery follows the probe's metric (`metric_for_best_model`, `load_best_model_at_end`; see
    `trainers.ProbeCallback`, and `ParTrainingArguments.probe_selects_best`): the best probe's checkpoint is saved, and
    loaded back when training ends; on a split too small to choose weights by it is off, and said so in the records'
    notes. Returns the fields chosen (field -> value)."""
    if "validation" not in records.splits:
        named = [f"--{name}" for name in ("stop_when_validation_exact", "restore_best_probe",
                                          "stop_when_learning_nothing_after")
                 if name in given and getattr(data_args, name)]
        named += [f"--{name}" for name in PROBE_SETTINGS[:3] if name in given]
        if named:
            one = len(named) == 1
            raise ValueError(
                f"{', '.join(named)} {'sets' if one else 'set'} the validation probe, and the records have no "
                f"validation split to probe (no --validation_file, and --validation_split_percentage "
                f"{data_args.validation_split_percentage:g} holds none out): give a --validation_file or a "
                f"--validation_split_percentage above 0, or leave {'it' if one else 'them'} out.")
        return {}
    if data_args.restore_best_probe and records.stop_rule_off:
        why = records.stop_rule_off.split(":")[0]  # "the validation split (…) holds n records, fewer than N"
        if "restore_best_probe" in given:
            raise ValueError(f"--restore_best_probe keeps the weights of the best validation probe, and {why}: too few "
                             "to choose weights by. Give a larger validation split (--validation_file or "
                             "--validation_split_percentage), or --restore_best_probe false.")
        records.notes.append(f"--restore_best_probe is off: {why}, too few to choose weights by (the run keeps its "
                             "final weights)")
        logger.warning("records: %s", records.notes[-1])
        return {"restore_best_probe": False}
    if data_args.restore_best_probe:
        return {"metric_for_best_model": RecordsProbeCallback.metric, "greater_is_better": True,
                "load_best_model_at_end": True}
    return {}


__all__ = ["PROBE_SETTINGS", "TrainingData", "build_task", "merge_trained", "prepare_records", "read_options",
           "record_depths", "records_data", "reencode_records", "trained_prompt_format", "training_mode",
           "training_problems", "use_validation_probe"]
