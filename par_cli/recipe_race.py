"""The recipe race (`train_par.py --recipe race`): the recipe is measured on the user's own validation split, not only
inferred from the records' statistics. The rules (`par_cli.recipe`) order a few candidates; each trains the first
`--race_steps` optimizer steps of the real run (its own learning-rate schedule over `--max_steps`, so stopping is a
pause, not a different run); successive halving keeps the better half and lets it train twice as far; the last one
standing resumes from its own checkpoint and trains to the end. The race is recorded in summary.json's
`recipe.race`.

    race_candidates(statistics, ...)     the rules' recipe, then answer feedback flipped, then the fixed defaults
    halving_rounds(n, race_steps)        (steps reached, candidates kept) per round
    race_score(model, encoded, pad, n)   state entries and whole states right on validation records of every length
    run_race(candidates, train_to, ...)  the rounds; returns the winner, its checkpoint and the race's record

Why these candidates: the rules were measured on seven logs and were wrong on the next (a peer's variable-swap log:
answer feedback on, the loss at ln 2 for 6,000 steps; results/own_data_cpu). Answer feedback is the rule whose
mistake costs a whole run, so its opposite races the rules' choice, and the fixed records defaults (`--recipe off`)
race both.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import TrainerCallback

from .recipe import (
    Recipe,
    RecordStatistics,
    choose_recipe,
    effective_flags,
    overridden_flags,
    recipe_summary,
    record_statistics,
)
from .resolution import Resolution

logger = logging.getLogger(__name__)

RACE_STEPS = 200  # a judgement call: the first probes of the measured logs told learning runs from stuck ones by here
RACE_SCORE_N = 256  # validation records scored per candidate and round (spread over the lengths)


@dataclass(frozen=True)
class Candidate:
    """One recipe in the race: `recipe` None is the fixed records defaults (`--recipe off`)."""

    name: str
    recipe: Recipe | None

    @property
    def flags(self) -> dict:
        return {} if self.recipe is None else dict(self.recipe.chosen)


def race_candidates(statistics: RecordStatistics, user_feedback: bool | None, self_distillation: bool,
                    given: set) -> list[Candidate]:
    """The candidates in the rules' order: the rules' recipe ("rules"); the rules with answer feedback flipped
    ("feedback_on" / "feedback_off"), unless the user gave `--answer_feedback` (`user_feedback` not None); the fixed
    records defaults ("defaults"). Candidates that set the same flags once the user's (`given`) win
    (`effective_flags`) are one, the earlier kept."""
    rules = choose_recipe(statistics, user_feedback, self_distillation)
    candidates = [Candidate("rules", rules)]
    if user_feedback is None and not (statistics.step_states or self_distillation):
        feedback = bool(rules.chosen.get("answer_feedback", False))
        flipped = choose_recipe(statistics, not feedback, self_distillation)
        flipped.chosen["answer_feedback"] = not feedback
        flipped.rule_flags["answer_feedback"] = ["answer_feedback"]
        flipped.reasons["answer_feedback"] = (
            f"{'off' if feedback else 'on'}: the opposite of the rules' choice, raced against it (the rules said: "
            f"{rules.reasons['answer_feedback']})")
        candidates.append(Candidate("feedback_off" if feedback else "feedback_on", flipped))
    candidates.append(Candidate("defaults", None))
    kept, seen = [], []
    for candidate in candidates:
        settings = effective_flags(candidate.recipe, given)
        if settings not in seen:
            kept.append(candidate)
            seen.append(settings)
    return kept


def halving_rounds(n: int, race_steps: int) -> list[tuple[int, int]]:
    """Successive halving over `n` candidates: round r trains the survivors to `race_steps` · 2^r optimizer steps in all
    and keeps the better ⌈n_r / 2⌉, until one is left: [(steps reached, kept), ...]; one candidate: no round."""
    if n < 1 or race_steps < 1:
        raise ValueError(f"halving_rounds needs n >= 1 and race_steps >= 1; got n={n}, race_steps={race_steps}.")
    rounds, steps = [], race_steps
    while n > 1:
        n = math.ceil(n / 2)
        rounds.append((steps, n))
        steps *= 2
    return rounds


def check_race(race_steps, max_steps: int, n_candidates: int, has_validation: bool, world_size: int) -> None:
    """One error naming the flag when the race cannot run: `--race_steps` an integer >= 1 whose rounds end before
    `--max_steps`; a validation split to score on; one process."""
    if isinstance(race_steps, bool) or not isinstance(race_steps, int) or race_steps < 1:
        raise ValueError(f"--race_steps must be an integer >= 1 (optimizer steps each candidate trains in the first "
                         f"round); got {race_steps!r}.")
    if not has_validation:
        raise ValueError("--recipe race scores the candidate recipes on the validation split, and the records have "
                         "none: give a --validation_file or a --validation_split_percentage above 0, or --recipe auto.")
    if world_size > 1:
        raise ValueError("--recipe race runs in one process (its candidates train one after another); launch it "
                         "without torchrun / accelerate, or give --recipe auto.")
    rounds = halving_rounds(n_candidates, race_steps)
    if rounds and rounds[-1][0] >= max_steps:
        raise ValueError(f"--race_steps {race_steps}: the race's last round trains to step {rounds[-1][0]} "
                         f"({n_candidates} candidates, halved each round, twice the steps each round), not before "
                         f"--max_steps {max_steps}; give a smaller --race_steps (at most "
                         f"{max(1, (max_steps - 1) // 2 ** (len(rounds) - 1))}) or a larger --max_steps.")


def race_score(model, encoded, pad_token_id: int, n: int = RACE_SCORE_N, batch_size: int = 256) -> dict:
    """`model` on `n` validation records spread over their lengths (`records_across_lengths`):
    {"entries": share of state entries right (Σ_r Σ_q [a_rq = z_rq] / (records · queries)), "exact": share of records
    whose whole final state is right, "records"}. The race ranks by entries, then exact: a partly learned state
    shows in its entries before whole states are right."""
    from state_tracking import StateTrackingCollator
    from state_tracking.records import records_across_lengths
    from trainers.callbacks import final_answers, records_by_length

    part = records_across_lengths(encoded, n)
    answers, targets = final_answers(model, records_by_length(part),
                                     StateTrackingCollator(pad_token_id, padding_side="right"), batch_size)
    right = answers == targets
    return {"entries": round(float(right.mean()), 6), "exact": round(float(right.all(-1).mean()), 6),
            "records": int(len(targets))}


class StopAtStep(TrainerCallback):
    """Ends training after optimizer step `step` with a checkpoint (the race pauses a candidate there)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_save = control.should_training_stop = True
        return control


@dataclass
class RaceRun:
    """What `train_to` returns for one candidate and round: the trained model, its validation split (encoded as that
    candidate reads operations), the pad token, the checkpoint it saved, its step and why it stopped early (or None)."""

    model: object
    validation: object
    pad_token_id: int
    checkpoint: Path
    step: int
    stopped_early: str | None = None


def run_race(candidates: list[Candidate], train_to: Callable[[Candidate, int, Path | None], RaceRun],
             race_steps: int, n: int = RACE_SCORE_N) -> tuple[Candidate, Path | None, dict]:
    """The rounds of `halving_rounds`: `train_to(candidate, step, checkpoint)` trains it (from `checkpoint`, or from
    the start) to `step` and saves; each is scored (`race_score`) and ranked by (entries, exact), ties to the
    earlier candidate (the rules' order). Returns the winner, its checkpoint (None: one candidate, no race) and
    summary.json's `recipe.race`."""
    started, alive, checkpoints, rounds = time.time(), list(candidates), {}, []
    for steps, keep in halving_rounds(len(candidates), race_steps):
        rows = []
        for candidate in alive:
            began = time.time()
            run = train_to(candidate, steps, checkpoints.get(candidate.name))
            checkpoints[candidate.name] = run.checkpoint
            score = race_score(run.model, run.validation, run.pad_token_id, n)
            rows.append({"candidate": candidate.name, "step": run.step, **score,
                         "seconds": round(time.time() - began, 1), "stopped_early": run.stopped_early})
            del run
        order = sorted(range(len(rows)), key=lambda i: (-rows[i]["entries"], -rows[i]["exact"], i))
        for rank, i in enumerate(order):
            rows[i]["kept"] = rank < keep
        rounds.append({"steps": steps, "candidates": rows})
        alive = [alive[i] for i in sorted(order[:keep])]  # in the rules' order: later ties go the same way
    winner = alive[0]
    return winner, checkpoints.get(winner.name), {
        "candidates": [{"name": c.name, "flags": c.flags} for c in candidates], "race_steps": race_steps,
        "score_records": n, "rounds": rounds, "winner": winner.name, "seconds": round(time.time() - started, 1),
        "rule": "successive halving: each round trains the survivors to race_steps * 2^round steps of the real run "
                "and keeps the better half by the share of validation state entries right (then whole states), ties "
                "to the rules' order; the winner resumes from its own checkpoint"}


def race_log(race: dict) -> str:
    """The race as one block of the log."""
    lines = [f"recipe race ({len(race['candidates'])} candidates, {race['race_steps']} steps in the first round, "
             f"{race['seconds']:.0f} s):"]
    for row in (row for r in race["rounds"] for row in r["candidates"]):
        lines.append(f"  step {row['step']:>5}  {row['candidate']:<12} entries {100 * row['entries']:6.2f}%  exact "
                     f"{100 * row['exact']:6.2f}%  {'kept' if row['kept'] else 'out'}")
    lines.append(f"  winner: {race['winner']} (resumes from its checkpoint)")
    return "\n".join(lines)


def race_recipe(records, given: set, task_args, run: Resolution, prepare: Callable, build: Callable) -> tuple:
    """`--recipe race` on a run's records (read once by the caller, `run` holding what reading them chose): the
    candidates (`race_candidates`), each on its own copy of `run` with its recipe's flags chosen where the user gave no
    flag of their rule; `prepare(records, run)` -> the candidate's TrainingData, its arguments built
    (`TrainingData.arguments`), and `build(data)` -> its Trainer (train_par.py's steps 2-4); the race (`run_race`),
    each candidate in <output_dir>/race/<name> (the losers' folders deleted after the race, the winner's kept: the run
    resumes from its checkpoint). Returns the winner's (TrainingData, checkpoint to resume from); the TrainingData's
    `recipe` is summary.json's "recipe" with the race under "race"."""
    from trainers.callbacks import last_complete_checkpoint

    statistics = record_statistics(records)
    model_args, data_args, train_args = run.model, run.data, run.train

    def candidate_run(recipe: Recipe | None, **race_fields) -> Resolution:
        mine = run.copy()
        mine.choose(effective_flags(recipe, given))
        mine.choose(race_fields)
        return mine

    user_feedback = model_args.answer_feedback if "answer_feedback" in given else None
    candidates = race_candidates(statistics, user_feedback, task_args.self_distillation, given)
    check_race(data_args.race_steps, train_args.max_steps, len(candidates), "validation" in records.splits,
               train_args.world_size)

    def train_to(candidate: Candidate, step: int, checkpoint: Path | None) -> RaceRun:
        # each candidate in its own folder, scored on the weights it stopped with (no best probe restored)
        data = prepare(records, candidate_run(candidate.recipe, restore_best_probe=False, output_dir=str(
            Path(train_args.output_dir) / "race" / candidate.name)))
        trainer = build(data)
        trainer.add_callback(StopAtStep(step))
        trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
        done, folder = trainer.state.global_step, trainer.args.output_dir
        saved = last_complete_checkpoint(folder)
        if saved is None or saved.name != f"checkpoint-{done}":
            trainer._save_checkpoint(trainer.model, trial=None)  # a stop that saved nothing (a time budget)
            saved = last_complete_checkpoint(folder)
        return RaceRun(trainer.model, data.records.splits["validation"][1], data.token_ids["pad_token_id"], saved,
                       done, None if done >= step else stop_reason(trainer.state.log_history))

    winner, checkpoint, race = run_race(candidates, train_to, data_args.race_steps)
    logger.warning(race_log(race))
    for candidate in candidates:  # the losers' checkpoints; the winner's is the one the run resumes from
        if candidate is not winner:
            shutil.rmtree(Path(train_args.output_dir) / "race" / candidate.name, ignore_errors=True)
    data = prepare(records, candidate_run(winner.recipe))
    overridden = [] if winner.recipe is None else overridden_flags(winner.recipe, given)
    data.recipe = {**recipe_summary(winner.recipe, statistics, overridden), "mode": "race",
                   "statistics": asdict(statistics), "race": race}  # the statistics even when the defaults win
    return data, None if checkpoint is None else str(checkpoint)


def stop_reason(log_history: list[dict]) -> str:
    """Why a candidate stopped before its round's step, from the Trainer's log (the validation probe, the
    learned-nothing stop, or a time budget)."""
    for row in reversed(log_history):
        for key, why in (("probe_stop", "validation exact"), ("probe_at_chance_stop", "learned nothing"),
                         ("time_budget_stop", "time budget")):
            if key in row:
                return why
    return "stopped by a callback"


__all__ = ["RACE_SCORE_N", "RACE_STEPS", "Candidate", "RaceRun", "StopAtStep", "check_race", "halving_rounds",
           "race_candidates", "race_log", "race_recipe", "race_score", "run_race"]
