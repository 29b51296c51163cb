"""`ParTrainer`: the PAR loss, depth schedules, learned halting and the positional-stretch phase on the HF Trainer."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from modeling_par import grad_window_iterations

from .arguments import DEPTH_SCHEDULES, HOLD_TAILS, ParTrainingArguments  # noqa: F401 (the names importable here too)
from .callbacks import TimeBudgetCallback
from .distributed import distributed_running, teardown_distributed_at_exit
from .objectives import (
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
    progress_flag_loss,
    progress_targets,
    readout_accuracy,
    waiting_row_change,
)
from .schedules import DepthBatchSampler, MasteryCurriculum, curriculum_cap, stretch_max_scale

_RNG_PURPOSES = ("iterations", "stretch", "negative", "positions", "stretch_fraction")


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
            output_loop_states=max(self.args.prefix_state_weight, self.args.waiting_row_weight,
                                   self.args.progress_flag_weight) > 0,
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
        for name, objective, logged in (("waiting_row_weight", waiting_row_change, "loss_waiting_rows"),
                                        ("progress_flag_weight", progress_flag_loss, "loss_progress_flag")):
            if getattr(self.args, name) > 0:
                if inputs.get("operation_ends") is None:
                    raise ValueError(f"{name} > 0 needs batches with operation_ends (a generated task's or a records "
                                     "file's dataset).")
                value = objective(out.loop_states, inputs["operation_ends"], inputs["attention_mask"], iterations, c)
                loss = loss + getattr(self.args, name) * value
                self._log_value(logged, value.item())
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
