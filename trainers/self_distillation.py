"""Label-free PAR: prefix self-distillation from an EMA teacher (no intermediate-state labels are read).

For iterations k < ⌈d/c⌉ inside the gradient window, the EMA teacher runs on the same prompt truncated to its first
c·k operations and is read at its own completing iteration ⌈c·k/c⌉ = k; the student's iteration k is pulled to it by
KL. Iterations k ≥ ⌈d/c⌉ take CE with the final answer z_d — the only label used.

Positions: student and teacher read the same positions, those of the step's plan (`ParTrainer.begin_batch`): the
stretch scale s of each sample, or its randomized position ids (`random_positions_max`). On a prefix, the prompt's
tokens through operation c·k keep their positions and the queries follow operation c·k as they follow the last
operation (`prefix_position_ids`: the progress shift). The KL then compares the student's iteration k with what the
(EMA) model computes on the prefix of the very input the student sees, and under a prefix-invariant view the one
teacher pass over the whole prompt equals the prefix runs. (A teacher on ordinary positions would instead pull the
student toward the readouts of another input, and for a model trained only on randomized positions, one it is not
trained on.)
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from transformers import TrainerCallback

from state_tracking import StateTrackingCollator, truncate_to_prefix

from .objectives import answer_loss, final_targets, iterations_for_depth, readout_accuracy
from .par_trainer import ParTrainer, ParTrainingArguments, StepPlan

EMA_WEIGHTS_NAME = "ema_teacher.safetensors"


@dataclass
class SelfDistillationArguments(ParTrainingArguments):
    ema_decay: float = field(default=0.999, metadata={
        "help": "EMA teacher: θ_T ← β_t · θ_T + (1 − β_t) · θ with β_t = min(decay, (1 + t) / (10 + t))"})
    distill_temperature: float = field(default=1.0, metadata={"help": "softmax temperature of the KL term"})

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"SelfDistillationArguments.ema_decay must be in [0, 1); got {self.ema_decay!r}.")
        if self.distill_temperature <= 0:
            raise ValueError(
                f"SelfDistillationArguments.distill_temperature must be > 0; got {self.distill_temperature!r}."
            )
        if self.objective != "par":
            raise ValueError(f"SelfDistillationArguments.objective must be 'par'; got {self.objective!r}.")
        if self.halting_loss_weight != 0:
            raise ValueError(
                "SelfDistillationArguments.halting_loss_weight must be 0: prefix self-distillation does not train the "
                f"halting head (got {self.halting_loss_weight!r}); train halting with ParTrainer, or evaluate with "
                "forced depth."
            )
        if self.phrasing_alignment_weight != 0:
            raise ValueError(
                "SelfDistillationArguments.phrasing_alignment_weight must be 0: prefix self-distillation's loss does "
                f"not add it (got {self.phrasing_alignment_weight!r}); train it with ParTrainer."
            )


def ema_decay_at(step: int, decay: float) -> float:
    """EMA decay with the usual warm-up: β_t = min(decay, (1 + t) / (10 + t)) after optimizer step t (0-based), so
    the teacher forgets its random initialisation within the first few hundred steps instead of keeping
    decay^t of it (0.999^1500 ≈ 22%)."""
    return min(decay, (1.0 + step) / (10.0 + step))


def ema_update(teacher: torch.nn.Module, student: torch.nn.Module, decay: float) -> None:
    """θ_T ← decay · θ_T + (1 − decay) · θ_S for every parameter; buffers are copied."""
    with torch.no_grad():
        for t, s in zip(teacher.parameters(), student.parameters()):
            t.lerp_(s.detach().to(t.dtype), 1.0 - decay)
        for t, s in zip(teacher.buffers(), student.buffers()):
            t.copy_(s)


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Σ_k T² · mean_{b,q} KL(p_T ‖ p_S) with p = softmax(logits / T).  (K, B, Q, C) twice -> ()"""
    log_p_student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)  # (K, B, Q)
    return temperature**2 * kl.mean(dim=(1, 2)).sum()


def prefix_position_ids(inputs, position_ids: torch.Tensor, j, prefix_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of each prompt's j-op prefix, from the whole prompt's: its tokens through operation j keep their
    positions, and the tokens after the prompt's last operation (the queries) follow operation j as they follow the
    last one, moved back by Δ = pos(end_d) − pos(end_j) — the progress shift of `progress_positions`, so a
    prefix-invariant view computes on the prefix what it computes at iteration j/c of the whole prompt. Ordinary
    positions give the prefix's ordinary positions. Padding gets 0.

    inputs: the whole batch (attention_mask (B, T), operation_ends (B, D+1), depth (B,)); position_ids (B, T) of it;
    j: the prefix length (an int or (B,)); prefix_mask: (B, T') attention mask of the rendered prefixes -> (B, T')
    """
    if inputs.get("operation_ends") is None:
        raise ValueError("self-distillation with random_positions_max needs operation_ends in the batch (the "
                         "prefix's tokens are found by them); build the dataset with state_tracking.build_dataset.")
    mask, ends, depth = inputs["attention_mask"].bool(), inputs["operation_ends"], inputs["depth"]
    j = torch.as_tensor(j, device=ends.device).long().expand(depth.shape[0])
    token = torch.arange(mask.shape[1], device=mask.device)[None]
    last_kept = ends.gather(1, j[:, None])  # (B, 1) last token of operation j (of the preamble for j = 0)
    last_op = ends.gather(1, depth[:, None])  # (B, 1) last token of the prompt's last operation
    after = mask & (token > last_op)  # the query region
    keep = (mask & (token <= last_kept)) | after  # (B, T)
    shift = position_ids.gather(1, last_op) - position_ids.gather(1, last_kept)  # (B, 1) Δ
    moved = torch.where(after, position_ids - shift, position_ids)
    positions = torch.zeros_like(prefix_mask, dtype=position_ids.dtype)
    for b in range(mask.shape[0]):
        real = prefix_mask[b].bool()
        if int(keep[b].sum()) != int(real.sum()):
            raise ValueError(f"the {int(j[b])}-op prefix of sample {b} has {int(real.sum())} tokens, but its prompt "
                             f"without operations {int(j[b]) + 1}..{int(depth[b])} has {int(keep[b].sum())}: the "
                             "rendering does not render a prefix as the prompt cut after operation j.")
        positions[b, real] = moved[b, keep[b]]
    return positions


class _EmaCallback(TrainerCallback):
    def __init__(self, trainer: PrefixSelfDistillationTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        ema_update(self.trainer.ema_model, self.trainer.model, ema_decay_at(state.global_step - 1, args.ema_decay))


class PrefixSelfDistillationTrainer(ParTrainer):
    """ParTrainer whose intermediate targets come from an EMA teacher on prefixes, not from step labels.

    Extra arguments: `task` (a `state_tracking` task; None for records read from files, which needs a prefix-invariant
    view), `rendering` ("symbolic" | "text"), `random_initial`;
    the tokenizer is the Trainer's `processing_class`. The EMA weights are written to every checkpoint as
    `ema_teacher.safetensors` and restored on resume.

    The student runs through `ParTrainer.forward_batch` with the step's plan (`begin_batch`: R, the window, the
    stretch scale, randomized positions), and the teacher reads the same positions (the module docstring says why).
    """

    args: SelfDistillationArguments

    def __init__(self, *args, task=None, rendering: str = "symbolic", random_initial: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, SelfDistillationArguments):
            raise ValueError("PrefixSelfDistillationTrainer needs SelfDistillationArguments.")
        if self.processing_class is None:
            raise ValueError("PrefixSelfDistillationTrainer needs the tokenizer as processing_class.")
        self.task, self.rendering, self.random_initial = task, rendering, random_initial
        if task is None and not self.prefix_invariant():
            raise ValueError("PrefixSelfDistillationTrainer without a task (records from files) reads the teacher's "
                             "prefix answers from one pass, which needs a prefix-invariant view: loop_view 'local' or "
                             "'prefix' with progress_positions=True (the recipe); got loop_view="
                             f"{self.model.config.loop_view!r}, "
                             f"progress_positions={self.model.config.progress_positions}.")
        self.ema_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.prefix_collator = StateTrackingCollator(pad_token_id=self.processing_class.pad_token_id)
        self.add_callback(_EmaCallback(self))

    def prefix_invariant(self) -> bool:
        """Whether iteration k of the loop computes on a prompt exactly what it computes on that prompt's first c·k
        operations: a restricted view (`loop_view` "local" or "prefix") with progress-coupled positions
        (tests/test_loop_views.py; for this trainer, tests/test_self_distillation.py). Then the teacher's readout on the
        c·k-op prefix at iteration k is its readout at iteration k of one pass over the whole prompt, and
        `teacher_logits` runs that one pass (O(d) iterations) instead of one run per prefix (O(d²))."""
        config = self.model.config
        return config.loop_view in ("local", "prefix") and bool(config.progress_positions)

    @torch.no_grad()
    def teacher_logits(self, inputs, depth: torch.Tensor, iterations: list[int],
                       plan: StepPlan | None = None) -> torch.Tensor:
        """The teacher's readout on each prompt truncated to c·k ops, at its completing iteration k.

        plan: the batch's step plan; the teacher reads the student's positions (its stretch scale or position ids);
        None: ordinary positions. Under a prefix-invariant view (`prefix_invariant`) this is read from one teacher
        pass over the whole prompt (the same numbers); otherwise each prefix is rendered and run.
        -> (K, B, Q, C) for K = len(iterations)
        """
        if plan is None:
            plan = StepPlan(depth=int(depth.max()), num_iterations=max(iterations), reads=tuple(iterations))
        if self.prefix_invariant():
            return self.forward_batch(self.ema_model, inputs, plan.with_reads(iterations)).answer_logits
        return self.prefix_teacher_logits(inputs, depth, iterations, plan)

    @torch.no_grad()
    def prefix_teacher_logits(self, inputs, depth: torch.Tensor, iterations: list[int],
                              plan: StepPlan | None = None) -> torch.Tensor:
        """`teacher_logits` by rendering each c·k-op prefix and running the teacher on it to iteration k (any view).

        With the plan's position ids, a prefix's positions come from the whole prompt's (`prefix_position_ids`),
        and the prefixes of each k run as one batch. -> (K, B, Q, C) for K = len(iterations)
        """
        c = self.model.config.step_size
        columns = {"ops": inputs["ops"], "step_labels": inputs["step_labels"], "depth": depth}
        scale = None if plan is None else plan.position_scale  # (B,)
        prefixes = []  # per k: the B rendered prefixes
        for k in iterations:
            prefix = truncate_to_prefix(columns, c * k, self.task, self.processing_class, self.rendering,
                                        random_initial=self.random_initial)
            prefixes.append([{key: prefix[key][b] for key in ("input_ids", "query_positions", "operation_ends")}
                             for b in range(depth.shape[0])])
        if plan is None or plan.position_ids is None:  # one batch of all K·B prefixes, each read at its own k
            rows = [row for rows_k in prefixes for row in rows_k]
            num_iterations = [k for k in iterations for _ in range(depth.shape[0])]  # completing iteration ⌈c·k/c⌉ = k
            batch = {key: v.to(depth.device) for key, v in self.prefix_collator(rows).items()}
            prediction = self.ema_model.predict(
                batch["input_ids"], attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                num_iterations=torch.tensor(num_iterations, device=depth.device),
                operation_ends=batch["operation_ends"],
                position_scale=None if scale is None else scale.repeat(len(iterations)),
            )
            return prediction.answer_logits.view(len(iterations), depth.shape[0],
                                                 *prediction.answer_logits.shape[1:])
        logits = []
        for k, rows in zip(iterations, prefixes):
            batch = {key: v.to(depth.device) for key, v in self.prefix_collator(rows).items()}
            positions = prefix_position_ids(inputs, plan.position_ids, c * k, batch["attention_mask"])
            out = self.ema_model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                query_positions=batch["query_positions"], num_iterations=k, readout_iterations=[k],
                operation_ends=batch["operation_ends"], position_ids=positions, position_scale=scale,
            )
            logits.append(out.answer_logits[0])
        return torch.stack(logits)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        plan = self.begin_batch(inputs)  # the halting loss is off: plan.all_reads == plan.reads, the gradient window
        depth, d = inputs["depth"], plan.depth
        out = self.forward_batch(model, inputs, plan)
        completing = iterations_for_depth(d, self.model.config.step_size)
        iterations = torch.tensor(plan.reads, device=depth.device)
        distilled = iterations < completing
        loss = out.answer_logits.new_zeros((), dtype=torch.float32)
        if (~distilled).any():  # k ≥ ⌈d/c⌉: the final answer z_d, the only label this trainer reads
            finals = iterations[~distilled]
            targets = final_targets(inputs["step_labels"], depth, finals)
            loss_final = answer_loss(out.answer_logits[~distilled], targets)
            loss = loss + loss_final
            self._log_value("loss_final", loss_final.item())
            final_accuracy = readout_accuracy(out.answer_logits[-1:], targets[-1:])[0].item()
            self._log_value("acc_last_iteration", final_accuracy)
            self.observe_final_accuracy(d, final_accuracy)
        if distilled.any():
            teacher = self.teacher_logits(inputs, depth, iterations[distilled].tolist(), plan)
            loss_kl = distillation_kl(out.answer_logits[distilled], teacher, self.args.distill_temperature)
            loss = loss + loss_kl
            self._log_value("loss_distill", loss_kl.item())
        self.log_loop(out, d, plan.num_iterations)
        return (loss, out) if return_outputs else loss

    # ------------------------------------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            save_model(self.ema_model, os.path.join(self.checkpoint_folder(trial), EMA_WEIGHTS_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = os.path.join(resume_from_checkpoint, EMA_WEIGHTS_NAME)
        if not os.path.isfile(path):
            raise ValueError(f"resume_from_checkpoint: {resume_from_checkpoint} has no {EMA_WEIGHTS_NAME}; "
                             "it was not written by PrefixSelfDistillationTrainer.")
        load_model(self.ema_model, path)
