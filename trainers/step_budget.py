"""The step budget: --num_train_epochs as steps (`steps_for_epochs`); the depth curriculum against the budget, checked
(and, when the user chose no pace, adapted) before training, and what it reached recorded after (summary.json's
"curriculum").

`train_args` is a `ParTrainingArguments` (or any object with its curriculum fields: train_par.py hands the arguments
as resolved so far, `par_cli.resolution`); `given` the flags the user typed. Nothing here sets a field: each function
returns the fields it chooses (field -> value), which the caller builds the arguments with.
"""

from __future__ import annotations

import logging
import math

from .schedules import curriculum_steps_needed, fixed_pace_levels

logger = logging.getLogger(__name__)

CURRICULUM_SHARE = 0.75  # the share of --max_steps the depth curriculum may take; the rest trains at every length
PACE_FLAGS = ("curriculum_start_depth", "curriculum_increment", "curriculum_every_steps", "curriculum_window",
              "curriculum_advance_accuracy")


def examples_per_step(train_args, world: int | None = None) -> int:
    """Training examples one optimizer step reads: per-device batch · processes · gradient accumulation steps (the one
    count, for the data to build, the samples a run saw and epochs as steps). `world` None: `train_args.world_size`."""
    world = max(1, train_args.world_size if world is None else world)
    accumulation = max(1, getattr(train_args, "gradient_accumulation_steps", 1))
    return train_args.per_device_train_batch_size * world * accumulation


def steps_for_epochs(epochs: float, examples: int, per_step: int) -> int:
    """--num_train_epochs as optimizer steps: ⌈epochs · N / per_step⌉, N the training examples, `per_step` the
    examples one optimizer step reads (`examples_per_step`)."""
    if not epochs > 0:
        raise ValueError(f"--num_train_epochs must be > 0; got {epochs!r}.")
    return max(1, math.ceil(epochs * examples / per_step))


def epochs_as_max_steps(train_args, examples: int | None, given: set, what: str) -> dict:
    """Honour --num_train_epochs (the Trainer would ignore it: this package's runs are budgeted by max_steps): returns
    {"max_steps": `steps_for_epochs` over the `examples` training examples}, and says so ({} without
    --num_train_epochs). Refused with --max_steps (give one of them) and where the examples are drawn per step
    (`examples` None: generated problems without --train_size)."""
    if "num_train_epochs" not in given:
        return {}
    if "max_steps" in given:
        raise ValueError(f"--num_train_epochs {train_args.num_train_epochs:g} and --max_steps {train_args.max_steps} "
                         "both set the length of training: give one of them.")
    if examples is None:
        raise ValueError("--num_train_epochs counts passes over a fixed training set, and generated problems are "
                         "drawn for the run's steps: give --max_steps, or --train_size with --num_train_epochs.")
    a, per_step = train_args, examples_per_step(train_args)
    max_steps = steps_for_epochs(a.num_train_epochs, examples, per_step)
    logger.warning("--num_train_epochs %g over %d %s: --max_steps %d (%d examples per optimizer step).",
                   a.num_train_epochs, examples, what, max_steps, per_step)
    return {"max_steps": max_steps}


def fit_curriculum_to_budget(train_args, lengths, given: set) -> tuple[dict | None, dict]:
    """Check, before training, that the depth curriculum reaches the longest training length within the step budget.

    needed = `trainers.schedules.curriculum_steps_needed` (the fixed pace's exact count; the mastery curriculum's
    expected count if every length were mastered at once). needed ≤ ¾ · max_steps: nothing changes. Otherwise, when
    the user gave none of the pace flags (`PACE_FLAGS`), the pace is adapted and the log says so: the fixed pace
    grows every e' = ⌊¾ · max_steps / growths⌋ steps instead (each length still visited), or, where e' < 1 and for the
    mastery curriculum, grows by the smallest curriculum_increment whose needed steps fit ¾ of the budget; where none
    does (a budget of a few steps), training has no curriculum (every length from the first step). When they
    gave one, a pace that cannot reach the longest length within max_steps is refused naming the numbers (one that
    leaves less than ¼ of the budget is warned about). Returns summary.json's "curriculum" plan (None without a
    curriculum) and the curriculum fields adapted (field -> value; {} where nothing changes). `lengths`: the training
    lengths present."""
    a = train_args
    if a.curriculum_start_depth is None or a.curriculum_start_depth >= a.max_train_depth:
        return None, {}
    window = a.curriculum_window if a.curriculum_advance_accuracy is not None else None
    kind = "mastery" if window is not None else "fixed pace"

    def needed(increment: int, every: int) -> int:
        return curriculum_steps_needed(a.curriculum_start_depth, increment, a.max_train_depth, every, window, lengths)

    steps, share = needed(a.curriculum_increment, a.curriculum_every_steps), int(CURRICULUM_SHARE * a.max_steps)
    plan = {"kind": kind, "longest_length": int(a.max_train_depth), "start": int(a.curriculum_start_depth),
            "increment": int(a.curriculum_increment), "every_steps": int(a.curriculum_every_steps),
            "steps_needed": steps, "max_steps": int(a.max_steps), "adapted": None}
    message = _budget_message(a, kind, window, steps)
    if steps <= share:
        return plan, {}
    mine = [f"--{name}" for name in PACE_FLAGS if name in given]
    if mine:
        if steps > a.max_steps:
            raise ValueError(f"{message}, so the longest lengths would never be trained. Give --max_steps >= {steps}, "
                             f"a larger --curriculum_increment, or a shorter --max_train_depth (you set "
                             f"{', '.join(mine)}).")
        logger.warning("%s: less than a quarter of the budget trains at every length.", message)
        return plan, {}
    return _adapt_pace(a, plan, message, needed, window, share)


def _budget_message(a, kind: str, window: int | None, steps: int) -> str:
    """What the curriculum needs against the budget, the opening of `fit_curriculum_to_budget`'s warnings and
    errors."""
    pace = (f"+{a.curriculum_increment} every {a.curriculum_every_steps} steps" if window is None else
            f"+{a.curriculum_increment} per growth, window {a.curriculum_window} at the frontier length, growths at "
            f"least {a.curriculum_every_steps} steps apart, if every length were mastered at once")
    return (f"the {kind} curriculum from length {a.curriculum_start_depth} ({pace}) needs {steps} optimizer steps "
            f"to reach the longest training length {a.max_train_depth}; --max_steps is {a.max_steps}")


def _adapt_pace(a, plan: dict, message: str, needed, window: int | None, share: int) -> tuple[dict, dict]:
    """The pace chosen when the user gave none and the curriculum needs more than `share` steps (see
    `fit_curriculum_to_budget`): the plan with its "adapted" entry and the fields changed, logged; no curriculum
    (`_no_curriculum`) where no pace fits. `needed(increment, every)`: the steps a pace needs."""
    every, increment = a.curriculum_every_steps, a.curriculum_increment
    growths = len(fixed_pace_levels(a.curriculum_start_depth, increment, a.max_train_depth)) - 1
    if window is None and share // growths >= 1:
        every = min(every, share // growths)
    else:
        increment = next((k for k in range(increment + 1, a.max_train_depth - a.curriculum_start_depth + 1)
                          if needed(k, every if window is not None else 1) <= share), None)
        if increment is None:  # no pace fits: train every length from the first step
            return _no_curriculum(a, plan, message)
        every = every if window is not None else 1
    adapted = {"curriculum_increment": increment, "curriculum_every_steps": every}
    changed = {k: v for k, v in adapted.items() if v != getattr(a, k)}
    logger.warning("%s, more than %d%% of it: the curriculum is adapted to %s (needs %d steps); give a pace flag "
                   "(%s) or a larger --max_steps to choose otherwise.", message, round(100 * CURRICULUM_SHARE),
                   " ".join(f"--{k} {v}" for k, v in changed.items()), needed(increment, every),
                   ", ".join(f"--{n}" for n in PACE_FLAGS[1:3]))
    plan["adapted"] = {**changed, "steps_needed": needed(increment, every)}
    return plan, changed


def _no_curriculum(a, plan: dict, message: str) -> tuple[dict, dict]:
    """Where no pace fits the budget: training has no depth curriculum (every length from the first step), logged;
    the plan with its "adapted" entry and the curriculum fields turned off."""
    logger.warning("%s: no pace reaches the longest length within %d%% of it, so training has no depth "
                   "curriculum (every length from the first step); give a larger --max_steps for one.",
                   message, round(100 * CURRICULUM_SHARE))
    plan["adapted"] = {"curriculum_start_depth": None, "curriculum_advance_accuracy": None, "steps_needed": 0}
    off = {"curriculum_start_depth": None, "curriculum_advance_accuracy": None}
    window_field = getattr(a, "__dataclass_fields__", {}).get("curriculum_window")
    if window_field is not None:  # a window with no mastery test to read it is refused (validate_par)
        off["curriculum_window"] = window_field.default
    return plan, off


def curriculum_outcome(plan: dict | None, cap_at, steps: int) -> dict | None:
    """summary.json's "curriculum": the plan, with the longest length the last trained step could sample
    (`cap_at(steps − 1)`) and whether that was the longest training length; a warning when it was not."""
    if plan is None:
        return None
    reached = int(cap_at(max(steps - 1, 0)))
    outcome = dict(plan, steps=steps, longest_trained=reached, complete=reached >= plan["longest_length"])
    if not outcome["complete"]:
        logger.warning("the depth curriculum reached length %d of %d by step %d: lengths %d..%d were never trained "
                       "(summary.json's curriculum). Give more --max_steps or a larger --curriculum_increment.",
                       reached, plan["longest_length"], steps, reached + 1, plan["longest_length"])
    return outcome


__all__ = ["CURRICULUM_SHARE", "PACE_FLAGS", "curriculum_outcome", "epochs_as_max_steps", "fit_curriculum_to_budget",
           "examples_per_step", "steps_for_epochs"]
