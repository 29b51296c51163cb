"""`ParTrainer`: the PAR loss, depth schedules, learned halting and the positional-stretch phase on the HF Trainer."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from modeling_par import grad_window_iterations

from .callbacks import TimeBudgetCallback
from .distributed import distributed_running, teardown_distributed_at_exit
from .objectives import (
    OBJECTIVES,
    PHRASING_ALIGNMENT_FORMS,
    additive_hold_iterations,
    answer_loss,
    balanced_halt_loss,
    final_targets,
    halt_labels,
    hold_iterations,
    iterations_for_depth,
    operation_encodings,
    prefix_state_targets,
    progress_targets,
    readout_accuracy,
)
from .schedules import DepthBatchSampler, MasteryCurriculum, curriculum_cap, stretch_max_scale

DEPTH_SCHEDULES = ("forced", "hold", "fixed", "random")
HOLD_TAILS = ("additive", "pareto")
_RNG_PURPOSES = ("iterations", "stretch", "negative", "positions", "stretch_fraction")


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
        super().__post_init__()
        self.validate_par()
        # Every rank takes its slice of the same global batch, hence the same depth and loop length.
        self.accelerator_config.split_batches = True

    def validate_par(self) -> None:
        """Raise one `ValueError` naming the first invalid PAR field and what is allowed. Run when the arguments are
        parsed, and again by train_par.py once the records, the recipe, the step budget and the curriculum fit have
        set fields after parsing (so no value reaches the Trainer unchecked)."""
        for check in (self._check_schedule, self._check_curriculum, self._check_losses, self._check_positions,
                      self._check_budget, self._check_no_effect):
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


def random_sorted_positions(rng: np.random.Generator, n: int, limit: int) -> np.ndarray:
    """Randomized positions (Ruoss et al. 2023): a sorted random subset of size n of [0, N), N = `limit`.  # (n,)"""
    return np.sort(rng.choice(limit, size=n, replace=False))


def pose_positions(rng: np.random.Generator, n: int, limit: int) -> np.ndarray:
    """PoSE, positional skip-wise training (Zhu et al. 2024), two chunks: a cut c ~ U{1..n−1} and a skip
    u ~ U{0..N−n} (N = `limit`),

        p_i = i            for i < c,
        p_i = i + u        for i ≥ c,

    so a short prompt's later tokens sit at the distances of a prompt up to N tokens long while each chunk keeps
    unit steps (its local order is the ordinary one).  # (n,)"""
    if n < 2:
        return np.arange(n)
    cut, skip = int(rng.integers(1, n)), int(rng.integers(0, limit - n + 1))
    positions = np.arange(n)
    positions[cut:] += skip
    return positions


@dataclass(frozen=True, eq=False)  # tensors inside: compare fields, not plans
class StepPlan:
    """What one training micro-batch runs, drawn once by `ParTrainer.begin_batch` before any model call.

    depth: the batch's d. num_iterations: R (the depth schedule's draw). reads: the supervised readouts (the gradient
    window; [R] for final_only). extra_negative: with the halting loss, one earlier iteration read as an extra "No"
    example (None otherwise). position_scale: (B,) stretch factors, or None. position_ids: (B, T) randomized
    positions (`random_positions_max`), or None for the ordinary ones.
    """

    depth: int
    num_iterations: int
    reads: tuple[int, ...]
    extra_negative: int | None = None
    position_scale: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None

    @property
    def all_reads(self) -> tuple[int, ...]:
        """Every iteration read out (supervised reads and the extra negative), ascending."""
        extra = () if self.extra_negative is None else (self.extra_negative,)
        return tuple(sorted(set(self.reads) | set(extra)))

    def with_reads(self, reads, num_iterations: int | None = None) -> StepPlan:
        """The same positions, read at `reads` (and run to `num_iterations`, default max(reads)), no extra negative."""
        reads = tuple(int(k) for k in reads)
        return replace(self, reads=reads, extra_negative=None,
                       num_iterations=max(reads) if num_iterations is None else num_iterations)


class ParTrainer(Trainer):
    """Trainer for PAR: `compute_loss` runs the loop for the batch's depth and supervises the gradient window.

    Batches come from `DepthBatchSampler` (one depth per batch). Logged beside the loss: the loss parts, readout
    accuracy at the first/last windowed iteration and over the window, the state-norm ratio rms(s_R)/rms(s_1)
    before anchoring, depth d, iterations R, the curriculum cap and the stretch s_max.
    """

    args: ParTrainingArguments

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, ParTrainingArguments):
            raise ValueError("ParTrainer needs ParTrainingArguments (got TrainingArguments).")
        self.model_accepts_loss_kwargs = False  # our loss is a per-batch mean: let the Trainer scale accumulation
        scheme = next((n for n in ("stretch_steps", "random_positions_max", "pose_max_positions")
                       if getattr(self.args, n)), None)
        if scheme is not None and getattr(self.model.config, "position_encoding", "rope") == "nope":
            raise ValueError(f"ParTrainingArguments.{scheme} must be unset with position_encoding='nope' (the model "
                             f"reads no positions); got {getattr(self.args, scheme)!r}.")
        if self.args.prefix_state_weight > 0 and getattr(self.model.config, "prefix_state_queries", 0) < 1:
            raise ValueError("ParTrainingArguments.prefix_state_weight > 0 needs a model with a state head "
                             "(ParLoopedQwenConfig.prefix_state_queries = the task's number of queries); got "
                             f"prefix_state_weight={self.args.prefix_state_weight!r} and no state head.")
        self._logged = defaultdict(list)
        self._micro_batch, self._micro_batch_step = 0, -1
        self.mastery = self._build_mastery()
        if self.mastery is not None:
            self.add_callback(_MasteryCallback(self))
        if distributed_running():  # gloo could abort at exit otherwise (trainers/distributed.py says why)
            teardown_distributed_at_exit(self)
        if self.args.max_train_seconds is not None:
            self.add_callback(TimeBudgetCallback(self.args.max_train_seconds))
            if 0 < self.args.stretch_steps < self.args.max_steps:
                warnings.warn(
                    f"the stretch phase starts at step max_steps − stretch_steps = "
                    f"{self.args.max_steps - self.args.stretch_steps}; with max_train_seconds="
                    f"{self.args.max_train_seconds} training may stop before it, and then no batch is stretched. "
                    "Set stretch_steps = max_steps to stretch from the start.", stacklevel=2)

    def _load_callback_state(self) -> None:
        """Restore the callbacks' state from the checkpoint (the Trainer rebuilds each from its saved arguments), except
        the time budget's length: the resumed command's `max_train_seconds` applies, and the time trained so far still
        comes from the checkpoint, so a budget raised (or lowered) on resume takes effect instead of being ignored."""
        super()._load_callback_state()
        if self.args.max_train_seconds is not None:
            for callback in self.callback_handler.callbacks:
                if isinstance(callback, TimeBudgetCallback):
                    callback.seconds = self.args.max_train_seconds

    # ------------------------------------------------------------------------------------------------ data
    def _build_mastery(self) -> MasteryCurriculum | None:
        a = self.args
        if a.curriculum_advance_accuracy is None:
            return None
        # batches the loader may have drawn ahead of the step being trained: accelerate's one-batch lookahead, plus
        # what worker processes prefetch; a growth applies only past them
        ahead = 2 + (a.dataloader_num_workers * (a.dataloader_prefetch_factor or 2) if a.dataloader_num_workers else 0)
        lengths = None
        if self.train_dataset is not None and "depth" in getattr(self.train_dataset, "column_names", ()):
            present = np.unique(np.asarray(self.train_dataset["depth"]))
            lengths = present[(present >= a.min_train_depth) & (present <= a.max_train_depth)].tolist()
        return MasteryCurriculum(a.curriculum_start_depth, a.curriculum_increment, a.max_train_depth,
                                 a.curriculum_advance_accuracy, a.curriculum_window, a.curriculum_every_steps,
                                 lookahead=1 + math.ceil(ahead / a.gradient_accumulation_steps), lengths=lengths)

    def curriculum_cap(self, step: int) -> int:
        """The largest depth sampled at optimizer step `step` (fixed pace or mastery)."""
        a = self.args
        return curriculum_cap(step, a.max_train_depth, a.curriculum_start_depth, a.curriculum_every_steps,
                              a.curriculum_increment, mastery=self.mastery)

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None or "depth" not in self.train_dataset.column_names:
            raise ValueError("ParTrainer needs a train_dataset with a 'depth' column (state_tracking.build_dataset).")
        a = self.args
        sampler = DepthBatchSampler(
            np.asarray(self.train_dataset["depth"]),
            batch_size=a.per_device_train_batch_size * max(1, a.world_size),
            num_batches=a.max_steps * a.gradient_accumulation_steps,
            seed=a.seed, min_depth=a.min_train_depth, max_depth=a.max_train_depth,
            curriculum_start=a.curriculum_start_depth, curriculum_every=a.curriculum_every_steps,
            curriculum_increment=a.curriculum_increment, accumulation=a.gradient_accumulation_steps,
            mastery=self.mastery,
        )
        loader = DataLoader(self.train_dataset, batch_sampler=sampler, collate_fn=self.data_collator,
                            num_workers=a.dataloader_num_workers,
                            # pinning is for copies to an accelerator
                            pin_memory=a.dataloader_pin_memory and a.device.type != "cpu")
        return self.accelerator.prepare(loader)

    # ------------------------------------------------------------------------------------------------ per-step rng
    def _step_rng(self, purpose: str) -> np.random.Generator:
        """Randomness keyed on (seed, step, micro-batch, purpose): identical on every rank and after a resume, and each
        purpose its own stream, so no draw depends on another or on the order of the calls."""
        return np.random.default_rng([self.args.seed, self.state.global_step, self._micro_batch,
                                      _RNG_PURPOSES.index(purpose)])

    def num_iterations(self, depth: int) -> int:
        c = self.model.config.step_size
        if self.args.depth_schedule == "forced":
            return iterations_for_depth(depth, c)
        if self.args.depth_schedule == "fixed":
            return self.args.fixed_iterations
        if self.args.depth_schedule == "random":
            return int(self._step_rng("iterations").integers(1, self.args.random_max_iterations + 1))
        if self.args.hold_tail == "additive":
            extra = self.args.hold_extra_iterations
            extra = self.model.config.grad_window - 1 if extra is None else extra
            return additive_hold_iterations(depth, c, self._step_rng("iterations"), extra,
                                            self.model.config.max_iterations)
        return hold_iterations(depth, c, self._step_rng("iterations"), self.args.hold_tail_alpha,
                               self.args.hold_max_factor, self.model.config.max_iterations)

    def position_scale(self, batch_size: int, device) -> torch.Tensor | None:
        a = self.args
        s_max = stretch_max_scale(self.state.global_step, a.max_steps - a.stretch_steps, a.stretch_steps,
                                  a.stretch_max_scale)
        self._log_value("stretch_s_max", s_max)
        if s_max <= 1.0 or self._step_rng("stretch_fraction").random() >= a.stretch_fraction:
            return None
        # drawn for the global batch, then this rank's slice (split_batches: rank r holds rows r·b .. (r+1)·b − 1)
        world, rank = max(1, a.world_size), a.process_index
        u = self._step_rng("stretch").random(batch_size * world)[rank * batch_size : (rank + 1) * batch_size]
        return torch.tensor(1.0 + (s_max - 1.0) * u, dtype=torch.float32, device=device)

    def position_ids(self, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """The training positions of a position scheme, placed on each sample's real tokens (padding keeps 0):
        randomized positions (`random_positions_max`, `random_sorted_positions`) or PoSE (`pose_max_positions`,
        `pose_positions`). None when neither is set (ordinary positions)."""
        a = self.args
        limit = a.random_positions_max or a.pose_max_positions
        if limit is None:
            return None
        name = "random_positions_max" if a.random_positions_max is not None else "pose_max_positions"
        draw = random_sorted_positions if a.random_positions_max is not None else pose_positions
        rng = self._step_rng("positions")
        lengths = attention_mask.sum(-1).tolist()
        if max(lengths) > limit:
            raise ValueError(f"{name}={limit} is shorter than a training prompt ({max(lengths)} tokens).")
        positions = torch.zeros_like(attention_mask, dtype=torch.long)
        for b, n in enumerate(lengths):
            positions[b, attention_mask[b].bool()] = torch.as_tensor(draw(rng, n, limit), device=positions.device)
        return positions

    def readout_iterations(self, num_iterations: int, depth: int) -> tuple[list[int], int | None]:
        """The gradient window (the last iteration only for `final_only`), plus with halting one earlier
        iteration with c·k < d as an extra "No" example (None if the window already starts at 1)."""
        window = grad_window_iterations(num_iterations, self.model.config.grad_window)
        reads = [num_iterations] if self.args.objective == "final_only" else window
        extra = None
        if self.args.halting_loss_weight > 0:
            if self.args.objective == "final_only":
                reads = window
            # negatives are the iterations k < ⌈d/c⌉; under `hold` the window may start past them
            below = min(window[0],
                        iterations_for_depth(depth, self.model.config.step_size) + self.args.halt_label_offset)
            if below > 1:
                extra = int(self._step_rng("negative").integers(1, below))
        return reads, extra

    # ------------------------------------------------------------------------------------------------ loss
    def begin_batch(self, inputs) -> StepPlan:
        """Check the batch has one depth d, count micro-batches within the optimizer step, and draw the step's plan.

        Every random choice of the micro-batch is made here, in a fixed order (loop length, extra halting negative,
        stretch, positions), each from its own keyed stream (`_step_rng`): the plan is a function of (seed, step,
        micro-batch, batch) alone, whatever runs after it (a teacher, a probe) and in whatever order."""
        depth = inputs["depth"]
        d = int(depth[0])
        if not bool((depth == d).all()):
            raise ValueError(f"{type(self).__name__} needs one depth per batch (its DepthBatchSampler provides "
                             f"that); got depths {sorted(set(depth.tolist()))}.")
        step = self.state.global_step  # micro-batches of one optimizer step: 0, 1, … (gradient accumulation)
        self._micro_batch = self._micro_batch + 1 if self._micro_batch_step == step else 0
        self._micro_batch_step = step
        num_iterations = self.num_iterations(d)
        reads, extra = self.readout_iterations(num_iterations, d)
        return StepPlan(depth=d, num_iterations=num_iterations, reads=tuple(reads), extra_negative=extra,
                        position_scale=self.position_scale(depth.shape[0], depth.device),
                        position_ids=self.position_ids(inputs["attention_mask"]))

    def forward_batch(self, model, inputs, plan: StepPlan):
        """The model on a training batch as `plan` says: R iterations, the readouts `plan.all_reads`, the plan's
        positions (stretch scale or position ids). The one call of the loop on a batch: ParTrainer's, and the student's
        and the one-pass teacher's in self-distillation.  -> ParLoopedOutput, answer_logits (K, B, Q, C)"""
        return model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
            query_positions=inputs["query_positions"], num_iterations=plan.num_iterations,
            readout_iterations=list(plan.all_reads), position_scale=plan.position_scale,
            operation_ends=inputs.get("operation_ends"), position_ids=plan.position_ids,
            output_prelude_states=self.args.phrasing_alignment_weight > 0,
            output_loop_states=self.args.prefix_state_weight > 0,
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        plan = self.begin_batch(inputs)
        depth, d, num_iterations = inputs["depth"], plan.depth, plan.num_iterations
        c = self.model.config.step_size
        reads, all_reads = plan.reads, plan.all_reads
        out = self.forward_batch(model, inputs, plan)
        read_index = torch.tensor(all_reads, device=depth.device)
        supervised = torch.tensor([k in reads for k in all_reads], device=depth.device)
        iterations = read_index[supervised]
        logits = out.answer_logits[supervised]  # (K, B, Q, C)
        if self.args.objective == "par":
            targets = progress_targets(inputs["step_labels"], depth, iterations, c)
        else:
            targets = final_targets(inputs["step_labels"], depth, iterations)
        if self.args.objective == "final_only":
            logits, targets, iterations = logits[-1:], targets[-1:], iterations[-1:]
        loss_answer = answer_loss(logits, targets)
        loss = loss_answer
        if self.args.halting_loss_weight > 0:
            if out.halt_logits is None:
                raise ValueError("halting_loss_weight > 0 needs ParLoopedQwenConfig.halt_token_ids.")
            halting_labels = halt_labels(read_index, depth, c, self.args.halt_label_offset)
            loss_halt = balanced_halt_loss(out.halt_logits, halting_labels)
            loss = loss + self.args.halting_loss_weight * loss_halt
            self._log_value("loss_halt", loss_halt.item())
        if self.args.prefix_state_weight > 0:
            loss_prefix = self.prefix_state_loss(inputs, out, iterations)
            loss = loss + self.args.prefix_state_weight * loss_prefix
            self._log_value("loss_prefix_state", loss_prefix.item())
        if self.args.phrasing_alignment_weight > 0:
            if inputs.get("operation_ends") is None or inputs.get("ops") is None:
                raise ValueError("phrasing_alignment_weight > 0 needs batches with operation_ends and ops (a generated "
                                 "task's dataset; records files hold no operation ids to align).")
            alignment = PHRASING_ALIGNMENT_FORMS[self.args.phrasing_alignment_form]
            loss_align = alignment(*operation_encodings(out.prelude_states, inputs["operation_ends"], inputs["ops"]))
            loss = loss + self.args.phrasing_alignment_weight * loss_align
            self._log_value("loss_align", loss_align.item())

        with torch.no_grad():
            accuracy = readout_accuracy(logits, targets)
            self._log_value("loss_answer", loss_answer.item())
            self._log_value("acc_last_iteration", accuracy[-1].item())
            self._log_value("acc_first_windowed", accuracy[0].item())
            self._log_value("acc_window_mean", accuracy.mean().item())
            self.log_loop(out, d, num_iterations)
            self.observe_final_accuracy(d, accuracy[-1].item())
        return (loss, out) if return_outputs else loss

    def prefix_state_loss(self, inputs, out, iterations: torch.Tensor) -> torch.Tensor:
        """Σ_k mean CE of the state head at each operation's last token against `prefix_state_targets` (the
        supervised iterations k of the window; operations not yet reached at k, or past d, carry no loss)."""
        if inputs.get("operation_ends") is None:
            raise ValueError("prefix_state_weight > 0 needs batches with operation_ends (a generated task's or a "
                             "records file's dataset).")
        ends = inputs["operation_ends"][:, 1:]  # (B, D): operation j's last token
        states = torch.stack([out.loop_states[k - 1] for k in iterations.tolist()])  # (K, B, T, H)
        logits = self.model.state_logits(states.flatten(0, 1), ends.repeat(len(states), 1))
        logits = logits.unflatten(0, states.shape[:2])  # (K, B, D, Q, C)
        targets = prefix_state_targets(inputs["step_labels"][:, : ends.shape[1] + 1], inputs["depth"], iterations,
                                       self.model.config.step_size)
        return answer_loss(logits.flatten(2, 3), targets.flatten(2, 3))

    def observe_final_accuracy(self, depth: int, accuracy: float) -> None:
        """Log the curriculum cap and feed a mastery curriculum this micro-batch's final-answer accuracy."""
        self._log_value("curriculum_max_depth", self.curriculum_cap(self.state.global_step))
        if self.mastery is not None and self.model.training:
            self.mastery.observe(self.state.global_step, depth, accuracy)

    # ------------------------------------------------------------------------------------------------ logging
    def log_loop(self, out, depth: int, num_iterations: int) -> None:
        """Depth d, loop length R and the state-norm ratio rms(s_R)/rms(s_1) before anchoring."""
        self._log_value("depth", depth)
        self._log_value("iterations", num_iterations)
        self._log_value("state_norm_ratio", (out.state_rms[-1] / out.state_rms[0]).mean().item())

    def _log_value(self, name: str, value: float) -> None:
        if self.model.training:
            self._logged[name].append(float(value))

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:  # a training log: attach the means since the last one
            logs.update({k: round(float(np.mean(v)), 5) for k, v in self._logged.items() if v})
            self._logged.clear()
        super().log(logs, *args, **kwargs)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def checkpoint_folder(self, trial) -> str:
        """The folder `Trainer._save_checkpoint` has just written for this step (where extra state goes beside it)."""
        return os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.mastery is not None and self.args.should_save:
            with open(os.path.join(self.checkpoint_folder(trial), CURRICULUM_STATE_NAME), "w") as f:
                json.dump(self.mastery.state_dict(), f)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self.mastery is None:
            return
        path = os.path.join(resume_from_checkpoint, CURRICULUM_STATE_NAME)
        if not os.path.isfile(path):
            raise ValueError(f"resume_from_checkpoint: {resume_from_checkpoint} has no {CURRICULUM_STATE_NAME}; it was "
                             "not trained with curriculum_advance_accuracy (the mastery curriculum).")
        with open(path) as f:
            self.mastery.load_state_dict(json.load(f))

    # ------------------------------------------------------------------------------------------------ optimizer
    def create_optimizer(self, model=None):
        """The Trainer's optimizer, with the adapter's parameters in groups of their own at `adapter_learning_rate`."""
        optimizer = super().create_optimizer(model)
        lr = self.args.adapter_learning_rate
        if lr is None:
            return optimizer
        named = (self.model if model is None else model).named_parameters()
        adapter = {id(p) for n, p in named if is_adapter_parameter(n)}
        if not adapter:
            raise ValueError("adapter_learning_rate is set but the model has no trainable adapter parameters.")
        extra_groups = []
        for group in optimizer.param_groups:
            mine = [p for p in group["params"] if id(p) in adapter]
            if mine:
                group["params"] = [p for p in group["params"] if id(p) not in adapter]
                extra_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": mine, "lr": lr})
        for group in extra_groups:
            optimizer.add_param_group(group)
        return optimizer


CURRICULUM_STATE_NAME = "curriculum_state.json"


class _MasteryCallback(TrainerCallback):
    """Closes each optimizer step of a mastery curriculum: the step's final-answer accuracy at d_max, averaged over
    micro-batches and ranks (every rank decides the same growth), goes to `MasteryCurriculum.end_step`."""

    def __init__(self, trainer: ParTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        mastery = self.trainer.mastery
        total = torch.tensor(mastery.pending_accuracy(), dtype=torch.float64, device=args.device)
        if distributed_running():
            torch.distributed.all_reduce(total)
        accuracy = None if total[1].item() == 0 else total[0].item() / total[1].item()
        if mastery.end_step(state.global_step - 1, accuracy) and state.is_world_process_zero:
            print(f"curriculum: d_max {mastery.max_depth_at(state.global_step - 1)} mastered at step "
                  f"{state.global_step}; d_max {mastery.max_depth_at(mastery.advances[-1])} from step "
                  f"{mastery.advances[-1] + 1}", flush=True)
        return control


def is_adapter_parameter(name: str) -> bool:
    """`adapter.weight`, or its PEFT forms (`base_model.model.adapter.modules_to_save.default.weight`, …)."""
    parts = name.split(".")
    return "adapter" in parts and "lora_A" not in parts and "lora_B" not in parts and "original_module" not in parts
