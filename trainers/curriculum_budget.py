"""The depth curriculum against the step budget: checked (and, when the user chose no pace, adapted) before training,
and what it reached recorded after (summary.json's "curriculum").

`train_args` is a `ParTrainingArguments` (or any object with its curriculum fields); `given` the flags the user typed.
"""

from __future__ import annotations

import logging

from .schedules import curriculum_steps_needed

logger = logging.getLogger(__name__)

CURRICULUM_SHARE = 0.75  # the share of --max_steps the depth curriculum may take; the rest trains at every length
PACE_FLAGS = ("curriculum_start_depth", "curriculum_increment", "curriculum_every_steps", "curriculum_window",
              "curriculum_advance_accuracy")


def fit_curriculum_to_budget(train_args, lengths, given: set) -> dict | None:
    """Check, before training, that the depth curriculum reaches the longest training length within the step budget.

    needed = `trainers.schedules.curriculum_steps_needed` (the fixed pace's exact count; the mastery curriculum's
    expected count if every length were mastered at once). needed ≤ ¾ · max_steps: nothing changes. Otherwise, when
    the user gave none of the pace flags (`PACE_FLAGS`), the pace is adapted and the log says so: the fixed pace
    grows every e' = ⌊¾ · max_steps / growths⌋ steps instead (each length still visited), or, where e' < 1 and for the
    mastery curriculum, grows by the smallest curriculum_increment whose needed steps fit ¾ of the budget. When they
    gave one, a pace that cannot reach the longest length within max_steps is refused naming the numbers (one that
    leaves less than ¼ of the budget is warned about). Returns summary.json's "curriculum" plan, or None without a
    curriculum. `lengths`: the training lengths present."""
    a = train_args
    if a.curriculum_start_depth is None or a.curriculum_start_depth >= a.max_train_depth:
        return None
    window = a.curriculum_window if a.curriculum_advance_accuracy is not None else None
    kind = "mastery" if window is not None else "fixed pace"

    def needed(increment: int, every: int) -> int:
        return curriculum_steps_needed(a.curriculum_start_depth, increment, a.max_train_depth, every, window, lengths)

    steps, share = needed(a.curriculum_increment, a.curriculum_every_steps), int(CURRICULUM_SHARE * a.max_steps)
    plan = {"kind": kind, "longest_length": int(a.max_train_depth), "start": int(a.curriculum_start_depth),
            "increment": int(a.curriculum_increment), "every_steps": int(a.curriculum_every_steps),
            "steps_needed": steps, "max_steps": int(a.max_steps), "adapted": None}
    pace = (f"+{a.curriculum_increment} every {a.curriculum_every_steps} steps" if window is None else
            f"+{a.curriculum_increment} per growth, window {a.curriculum_window} at the frontier length, growths at "
            f"least {a.curriculum_every_steps} steps apart, if every length were mastered at once")
    message = (f"the {kind} curriculum from length {a.curriculum_start_depth} ({pace}) needs {steps} optimizer steps "
               f"to reach the longest training length {a.max_train_depth}; --max_steps is {a.max_steps}")
    if steps <= share:
        return plan
    mine = [f"--{name}" for name in PACE_FLAGS if name in given]
    if mine:
        if steps > a.max_steps:
            raise ValueError(f"{message}, so the longest lengths would never be trained. Give --max_steps >= {steps}, "
                             f"a larger --curriculum_increment, or a shorter --max_train_depth (you set "
                             f"{', '.join(mine)}).")
        logger.warning("%s: less than a quarter of the budget trains at every length.", message)
        return plan
    every, increment = a.curriculum_every_steps, a.curriculum_increment
    growths = needed(increment, 1)  # the fixed pace's number of growths
    if window is None and share // growths >= 1:
        every = min(every, share // growths)
    else:
        increment = next((k for k in range(increment + 1, a.max_train_depth - a.curriculum_start_depth + 1)
                          if needed(k, every if window is not None else 1) <= share), None)
        if increment is None:
            raise ValueError(f"{message}: too short for any depth curriculum to reach the longest length within "
                             f"{CURRICULUM_SHARE:.0%} of it. Give a larger --max_steps, a shorter --max_train_depth, "
                             "or --curriculum_start_depth none.")
        every = every if window is not None else 1
    adapted = {"curriculum_increment": increment, "curriculum_every_steps": every}
    changed = {k: v for k, v in adapted.items() if v != getattr(a, k)}
    logger.warning("%s, more than %d%% of it: the curriculum is adapted to %s (needs %d steps); give a pace flag "
                   "(%s) or a larger --max_steps to choose otherwise.", message, round(100 * CURRICULUM_SHARE),
                   " ".join(f"--{k} {v}" for k, v in changed.items()), needed(increment, every),
                   ", ".join(f"--{n}" for n in PACE_FLAGS[1:3]))
    plan["adapted"] = {**changed, "steps_needed": needed(increment, every)}
    for name, value in changed.items():
        setattr(a, name, value)
    return plan


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


__all__ = ["CURRICULUM_SHARE", "PACE_FLAGS", "curriculum_outcome", "fit_curriculum_to_budget"]
