"""`ParTrainingArguments`: the HF TrainingArguments plus PAR's fields (objective, depth schedule, curriculum, loss
weights, position schemes, budget), each checked when parsed (`validate_par`); `ParTrainer` (par_trainer.py) reads
them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

from .objectives import OBJECTIVES, PHRASING_ALIGNMENT_FORMS

DEPTH_SCHEDULES = ("forced", "hold", "fixed", "random")
HOLD_TAILS = ("additive", "pareto")
PROBE_METRIC = "probe_accuracy"  # the metric the accuracy probes log (trainers.callbacks.ProbeCallback.metric)


@dataclass
class ParTrainingArguments(TrainingArguments):
    """TrainingArguments plus the PAR knobs. `max_steps` must be set: the depth schedule is per optimizer step."""

    objective: str = field(default="par", metadata={"help": f"one of {OBJECTIVES}"})
    depth_schedule: str = field(default="forced", metadata={
        "help": "forced: R = ⌈d/c⌉; hold: R ≥ ⌈d/c⌉ (see hold_tail); ablations: fixed: R = fixed_iterations "
                "whatever d; random: R ~ U{1..random_max_iterations} whatever d"})
    fixed_iterations: int | None = field(default=None, metadata={
        "help": "depth_schedule=fixed: the R of every step (evaluate with the same R: train_par.py does)"})
    random_max_iterations: int | None = field(default=None, metadata={
        "help": "depth_schedule=random: R is drawn uniformly from 1..this each step"})
    min_train_depth: int = field(default=1, metadata={"help": "smallest depth d trained on"})
    max_train_depth: int = field(default=32, metadata={"help": "largest depth d trained on"})
    curriculum_start_depth: int | None = field(
        default=None, metadata={"help": "depth curriculum: the largest depth sampled at step 0 (None: no curriculum)"}
    )
    curriculum_every_steps: int = field(default=40, metadata={"help": "curriculum: steps between increments"})
    curriculum_increment: int = field(default=1, metadata={"help": "curriculum: depth added each time"})
    curriculum_advance_accuracy: float | None = field(default=None, metadata={
        "help": "mastery curriculum (instead of the fixed pace): d_max grows by curriculum_increment once the "
                "final-answer accuracy (all queries right) averaged over the last curriculum_window steps at depth "
                "d_max reaches this, and at least curriculum_every_steps steps after the previous growth (None: the "
                "fixed pace)"})
    curriculum_window: int = field(default=20, metadata={
        "help": "mastery curriculum: steps at depth d_max averaged for the advance test"})
    hold_tail: str = field(default="additive", metadata={
        "help": "hold: 'additive' R = ⌈d/c⌉ + X, X ~ U{0..hold_extra_iterations} (the window always overlaps the "
                "progress region), or 'pareto' R = ⌈d/c⌉·U^(−1/α) (heavy-tailed, grows with d)"})
    hold_tail_alpha: float = field(default=1.5, metadata={"help": "hold, pareto: tail index of the extra iterations"})
    hold_max_factor: float = field(default=4.0, metadata={"help": "hold, pareto: R ≤ factor · ⌈d/c⌉"})
    hold_extra_iterations: int | None = field(
        default=None, metadata={"help": "hold, additive: the most extra iterations (default grad_window − 1)"}
    )
    halt_label_offset: int = field(default=0, metadata={
        "help": "halting labels say Yes when c·(k − offset) ≥ d: 0 is the paper's; 1 (Yes once no operation is left to "
                "read) suits loop_view=local, whose queries cannot see that an operation is the last"})
    halting_loss_weight: float = field(default=0.0, metadata={
        "help": "learned halting loss weight (paper: 0.5); needs --depth_schedule hold. Scale: the answer loss is "
                "a SUM of per-iteration CEs over the window (≈ grad_window terms), the halting loss one "
                "class-balanced MEAN, so at weight 0.5 halting is ~1/16 of the answer loss with an 8-iteration window"})
    phrasing_alignment_weight: float = field(default=0.0, metadata={
        "help": "weight of the auxiliary loss that makes the phrasings of one operation read alike in the prelude "
                "(objectives.phrasing_alignment_loss: the within-operation spread of the unit-normalized encodings at "
                "each operation's last token; 0: off); needs batches with operation_ends and ops (generated tasks)"})
    prefix_state_weight: float = field(default=0.0, metadata={
        "help": "weight of the dense prefix-state loss (FPRM-style deep supervision, the wavefront): at iteration k "
                "the state head reads z_j at the last token of every operation j <= c*k (objectives.prefix_state_"
                "targets), summed over the window like the answer loss; needs a model with config.prefix_state_"
                "queries (train_par sets it) and batches with operation_ends; 0: off"})
    waiting_row_weight: float = field(default=0.0, metadata={
        "help": "weight of the waiting-row stability loss (objectives.waiting_row_change): at each supervised "
                "iteration k the mean squared relative change of the rows of operations j > c*k + 1, which the loop "
                "has not reached; asks those rows to wait at a fixed point instead of counting passes (issue 68); "
                "needs batches with operation_ends; 0: off"})
    progress_flag_weight: float = field(default=0.0, metadata={
        "help": "weight of the read-so-far flag loss (objectives.progress_flag_loss): at each supervised iteration k "
                "one channel of the state of every token of operation j, over its rms, is a logit for j <= c*k; a "
                "wave the causal convolution can carry, so the full view can find the next operation by content "
                "(issue 68); needs batches with operation_ends; 0: off"})
    phrasing_alignment_form: str = field(default="unit", metadata={
        "help": "the alignment loss's form: unit (objectives.phrasing_alignment_loss, the spread of unit-normalized "
                "encodings) or variance_ratio (objectives.within_operation_variance_ratio: the share of the centred "
                "encodings' variance within operations)"})
    stretch_steps: int = field(default=0, metadata={"help": "positional-stretch phase: the last N steps (0: off)"})
    stretch_max_scale: float = field(default=8.0, metadata={"help": "s_max reached at the end of the phase"})
    stretch_fraction: float = field(
        default=1.0, metadata={"help": "stretch: the share of batches stretched during the phase (augmentation < 1)"}
    )
    random_positions_max: int | None = field(
        default=None, metadata={"help": "randomized positions (Ruoss et al. 2023): each training sample's positions "
                                        "are a sorted random subset of [0, N) (None: ordinary positions)"}
    )
    pose_max_positions: int | None = field(
        default=None, metadata={"help": "PoSE (positional skip-wise training, Zhu et al. 2024): each training sample's "
                                        "positions are cut in two chunks at a random token and the second chunk "
                                        "shifted by a random skip, so the positions span [0, N) (None: off)"}
    )
    adapter_learning_rate: float | None = field(default=None, metadata={"help": "adapter lr (paper: 1e-4)"})
    max_train_seconds: float | None = field(
        default=None, metadata={"help": "stop after this much wall time (all ranks at the same step)"}
    )
    remove_unused_columns: bool = field(default=False, metadata={"help": "keep depth/step_labels for the loss"})

    def __post_init__(self):
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1 and not self.use_cpu and not torch.cuda.is_available():
            # transformers then leaves every rank NOT_PARALLEL: each trains alone on its own copy, same output_dir
            raise ValueError(f"ParTrainingArguments.use_cpu must be True when {launched} processes are launched "
                             "(torchrun / accelerate) on a machine without CUDA: pass --use_cpu true (gloo DDP); "
                             "otherwise transformers trains every rank separately instead of data-parallel.")
        if self.load_best_model_at_end and self.probe_selects_best:
            # TrainingArguments checks load_best_model_at_end against evaluation: the save and eval strategies must
            # match, so that the checkpoint of each evaluation that finds a new best is saved. Here no evaluation
            # chooses: the probe does, and saves each new best's checkpoint itself, whatever save_strategy says
            # (ProbeCallback._track_best). `_check_probe_best` checks this combination instead of that one.
            self.load_best_model_at_end = False
            super().__post_init__()
            self.load_best_model_at_end = True
        else:
            super().__post_init__()
        self.validate_par()
        # Every rank takes its slice of the same global batch, hence the same depth and loop length.
        self.accelerator_config.split_batches = True

    @property
    def probe_selects_best(self) -> bool:
        """Whether an accuracy probe (`trainers.ProbeCallback`: the records' validation probe, the task probe), not
        evaluation, chooses the best model: `metric_for_best_model` names the probe's metric (`PROBE_METRIC`)."""
        return self.metric_for_best_model == PROBE_METRIC

    def validate_par(self) -> None:
        """Raise one `ValueError` naming the first invalid PAR field and what is allowed. Run whenever the arguments
        are made: parsed, and built again (`dataclasses.replace`) with what train_par.py's data step chose (the
        records' depth range, the recipe, the validation probe, the step budget and the curriculum fit;
        `par_cli.resolution`), so no value reaches the Trainer unchecked."""
        for check in (self._check_schedule, self._check_curriculum, self._check_losses, self._check_positions,
                      self._check_budget, self._check_no_effect, self._check_probe_best):
            check()

    def _fail(self, name: str, allowed: str) -> None:
        raise ValueError(f"ParTrainingArguments.{name} must be {allowed}; got {getattr(self, name)!r}.")

    def _check_schedule(self) -> None:
        """The objective and the depth schedule (loop length R per batch)."""
        if self.objective not in OBJECTIVES:
            self._fail("objective", f"one of {OBJECTIVES}")
        if self.depth_schedule not in DEPTH_SCHEDULES:
            self._fail("depth_schedule", f"one of {DEPTH_SCHEDULES}")
        if (self.depth_schedule == "fixed") != (self.fixed_iterations is not None):
            self._fail("fixed_iterations", "an integer ≥ 1 with depth_schedule='fixed', and None otherwise")
        if self.fixed_iterations is not None and self.fixed_iterations < 1:
            self._fail("fixed_iterations", "≥ 1")
        if (self.depth_schedule == "random") != (self.random_max_iterations is not None):
            self._fail("random_max_iterations", "an integer ≥ 1 with depth_schedule='random', and None otherwise")
        if self.random_max_iterations is not None and self.random_max_iterations < 1:
            self._fail("random_max_iterations", "≥ 1")
        if self.hold_tail not in HOLD_TAILS:
            self._fail("hold_tail", f"one of {HOLD_TAILS}")
        if self.hold_tail == "pareto" and self.hold_extra_iterations is not None:
            self._fail("hold_extra_iterations", "None with hold_tail='pareto' (it sets the additive tail)")

    def _check_curriculum(self) -> None:
        """The training depths and the depth curriculum."""
        if self.min_train_depth < 1:
            self._fail("min_train_depth", "≥ 1")
        if self.max_train_depth < self.min_train_depth:
            self._fail("max_train_depth", f"≥ min_train_depth ({self.min_train_depth})")
        if self.curriculum_start_depth is not None and not (
            self.min_train_depth <= self.curriculum_start_depth <= self.max_train_depth
        ):
            self._fail("curriculum_start_depth", "None or within [min_train_depth, max_train_depth]")
        if self.curriculum_every_steps < 1:
            self._fail("curriculum_every_steps", "≥ 1")
        if self.curriculum_increment < 1:
            self._fail("curriculum_increment", "≥ 1")
        if self.curriculum_advance_accuracy is not None:
            if not 0.0 < self.curriculum_advance_accuracy <= 1.0:
                self._fail("curriculum_advance_accuracy", "None or in (0, 1]")
            if self.curriculum_start_depth is None:
                self._fail("curriculum_advance_accuracy", "None without a curriculum (set curriculum_start_depth)")
        if self.curriculum_window < 1:
            self._fail("curriculum_window", "≥ 1")

    def _check_losses(self) -> None:
        """The hold tail and the loss weights (halting, phrasing alignment, dense prefix targets)."""
        if self.hold_tail_alpha <= 0:
            self._fail("hold_tail_alpha", "> 0")
        if self.hold_max_factor < 1:
            self._fail("hold_max_factor", "≥ 1")
        if self.halting_loss_weight < 0:
            self._fail("halting_loss_weight", "≥ 0")
        if not self.phrasing_alignment_weight >= 0:
            self._fail("phrasing_alignment_weight", "≥ 0")
        if not self.prefix_state_weight >= 0:
            self._fail("prefix_state_weight", "≥ 0")
        if not self.waiting_row_weight >= 0:
            self._fail("waiting_row_weight", "≥ 0")
        if not self.progress_flag_weight >= 0:
            self._fail("progress_flag_weight", "≥ 0")
        if self.phrasing_alignment_form not in PHRASING_ALIGNMENT_FORMS:
            self._fail("phrasing_alignment_form", f"one of {sorted(PHRASING_ALIGNMENT_FORMS)}")
        if self.halt_label_offset < 0:
            self._fail("halt_label_offset", "≥ 0")
        if self.halting_loss_weight > 0 and self.depth_schedule in ("fixed", "random"):
            self._fail("halting_loss_weight", f"0 under depth_schedule={self.depth_schedule!r} (R does not follow d, "
                       "so there is no iteration at which the answer is complete to label)")
        if self.halting_loss_weight > 0 and self.depth_schedule == "forced":
            self._fail("halting_loss_weight", "0 under depth_schedule='forced' (forced depth never runs past d, while "
                       "the halting rule reads P(Yes) on R..R+m−1): use --depth_schedule hold (additive tail ≥ "
                       "halt_window − 1)")
        if self.halting_loss_weight > 0 and self.hold_extra_iterations == 0:
            self._fail("hold_extra_iterations", "≥ 1 with the halting loss on (0 never runs past d)")

    def _check_positions(self) -> None:
        """The position schemes: stretch, randomized positions, PoSE (one at a time)."""
        if self.stretch_steps < 0:
            self._fail("stretch_steps", "≥ 0")
        if self.stretch_max_scale < 1:
            self._fail("stretch_max_scale", "≥ 1")
        if not 0.0 < self.stretch_fraction <= 1.0:
            self._fail("stretch_fraction", "in (0, 1]")
        if self.hold_extra_iterations is not None and self.hold_extra_iterations < 0:
            self._fail("hold_extra_iterations", "None or ≥ 0")
        if self.random_positions_max is not None and self.random_positions_max < 2:
            self._fail("random_positions_max", "None or ≥ 2 (and ≥ the longest training prompt)")
        if self.random_positions_max is not None and self.stretch_steps > 0:
            self._fail("random_positions_max", "None when stretch_steps > 0 (two position schemes at once)")
        if self.pose_max_positions is not None and self.pose_max_positions < 2:
            self._fail("pose_max_positions", "None or ≥ 2 (and ≥ the longest training prompt)")
        if self.pose_max_positions is not None and (self.stretch_steps > 0 or self.random_positions_max is not None):
            self._fail("pose_max_positions", "None when stretch_steps > 0 or random_positions_max is set (two position "
                 "schemes at once)")

    def _check_budget(self) -> None:
        """The optimizer and the budget: adapter learning rate, seconds, steps."""
        if self.adapter_learning_rate is not None and self.adapter_learning_rate <= 0:
            self._fail("adapter_learning_rate", "None or > 0")
        if self.max_train_seconds is not None and self.max_train_seconds <= 0:
            self._fail("max_train_seconds", "None or > 0")
        if self.max_steps is None or self.max_steps <= 0:
            self._fail("max_steps", "> 0 (the depth schedule is defined per optimizer step)")

    def _check_probe_best(self) -> None:
        """The best model chosen by the probe (`probe_selects_best`): the probe's accuracy is better when higher (an
        evaluation strategy beside it is refused by the Trainer where no eval_dataset is given, as train_par.py gives
        none, and an evaluation's metrics hold no probe accuracy to compare where one is)."""
        if self.probe_selects_best and self.greater_is_better is not True:
            self._fail("greater_is_better", f"True when metric_for_best_model is {PROBE_METRIC!r} (an accuracy)")

    def _check_no_effect(self) -> None:
        """Options that would silently change nothing under the other settings."""
        # options that would silently change nothing
        default = {f: type(self).__dataclass_fields__[f].default for f in
                   ("hold_tail_alpha", "hold_max_factor", "stretch_max_scale", "stretch_fraction", "curriculum_window")}
        if self.halt_label_offset > 0 and self.halting_loss_weight == 0:
            self._fail("halt_label_offset", "0 when halting_loss_weight is 0 (there is no halting loss to label)")
        if self.hold_extra_iterations is not None and self.depth_schedule != "hold":
            self._fail("hold_extra_iterations", "None unless depth_schedule='hold' (only the hold schedule runs extra "
                 "iterations)")
        for name in ("hold_tail_alpha", "hold_max_factor"):
            if getattr(self, name) != default[name] and (self.depth_schedule != "hold" or self.hold_tail != "pareto"):
                self._fail(name, f"its default {default[name]} unless depth_schedule='hold' and hold_tail='pareto' (it "
                     "shapes the pareto tail only)")
        for name in ("stretch_max_scale", "stretch_fraction"):
            if getattr(self, name) != default[name] and self.stretch_steps == 0:
                self._fail(name, f"its default {default[name]} when stretch_steps is 0 (there is no stretch phase)")
        if self.curriculum_window != default["curriculum_window"] and self.curriculum_advance_accuracy is None:
            self._fail("curriculum_window", f"its default {default['curriculum_window']} without "
                       "curriculum_advance_accuracy (the fixed pace reads no accuracy)")
