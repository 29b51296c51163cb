"""Prefix self-distillation (PrefixSelfDistillationTrainer: resume, the EMA teacher, what it reads, the one-pass
teacher) and the step plan (drawn once in begin_batch, the positions the student and teacher read, the logged loss
parts). Moved whole from test_trainers.py; its shared helpers are imported from there."""

import numpy as np
import pytest
import torch

from tests.test_trainers import COLLATOR, DATASET, IDS, TASK, TOKENIZER, losses, tiny_args, tiny_model
from trainers import ParTrainer, PrefixSelfDistillationTrainer, SelfDistillationArguments


def run_distillation(tmp_path, max_steps, resume=None, save_steps=2):
    args = tiny_args(tmp_path, cls=SelfDistillationArguments, max_steps=max_steps, save_strategy="steps",
                     save_steps=save_steps, depth_schedule="hold", curriculum_start_depth=2,
                     curriculum_every_steps=2, stretch_steps=3, ema_decay=0.5, warmup_steps=0)
    trainer = PrefixSelfDistillationTrainer(
        model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR, processing_class=TOKENIZER,
        task=TASK,
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_resume_gives_the_same_next_step_loss(tmp_path):
    full = run_distillation(tmp_path / "a", max_steps=6)
    checkpoint = tmp_path / "a" / "out" / "checkpoint-4"
    assert (checkpoint / "ema_teacher.safetensors").is_file()
    resumed = run_distillation(tmp_path / "b", max_steps=6, resume=str(checkpoint))
    a, b = losses(full), losses(resumed)
    assert {5, 6} <= set(b) and max(b) == 6
    for step in (5, 6):
        assert a[step] == pytest.approx(b[step], rel=1e-5, abs=1e-6), (step, a, b)
    for p, q in zip(full.ema_model.parameters(), resumed.ema_model.parameters()):
        torch.testing.assert_close(p, q)
    distill_logged = [e for e in full.state.log_history if "loss_distill" in e]
    assert distill_logged, "the teacher term never ran"


def test_self_distillation_rejects_missing_ema(tmp_path):
    trainer = run_distillation(tmp_path / "a", max_steps=2)
    checkpoint = tmp_path / "a" / "out" / "checkpoint-2"
    (checkpoint / "ema_teacher.safetensors").unlink()
    with pytest.raises(ValueError, match="ema_teacher.safetensors"):
        trainer._load_from_checkpoint(str(checkpoint))


def test_self_distillation_rejects_halting_and_warms_up_its_ema(tmp_path):
    from trainers.self_distillation import ema_decay_at

    with pytest.raises(ValueError, match="halting_loss_weight must be 0"):
        tiny_args(tmp_path, cls=SelfDistillationArguments, halting_loss_weight=0.5, depth_schedule="hold")
    assert ema_decay_at(0, 0.999) == pytest.approx(0.1) and ema_decay_at(90, 0.999) == pytest.approx(0.91)
    assert ema_decay_at(10**6, 0.999) == 0.999
    remaining = np.prod([ema_decay_at(t, 0.999) for t in range(1500)])  # share of the initial teacher left
    assert remaining < 1e-3 < 0.999**1500


def test_self_distillation_reads_no_step_label_but_the_final_one(tmp_path, monkeypatch):
    """Scrambling z_1..z_{d−1} in the batch leaves the self-distillation loss unchanged (z_0 and z_d are kept)."""
    args = tiny_args(tmp_path, cls=SelfDistillationArguments, max_steps=1, ema_decay=0.5)  # forced: R = d = 5
    trainer = PrefixSelfDistillationTrainer(model=tiny_model(), args=args, train_dataset=DATASET,
                                            data_collator=COLLATOR, processing_class=TOKENIZER, task=TASK)
    rows = [DATASET[i] for i in range(len(DATASET)) if DATASET[i]["depth"] == 5][:6]
    batch = COLLATOR(rows)
    scrambled = {k: v.clone() for k, v in batch.items()}
    g = torch.Generator().manual_seed(0)
    scrambled["step_labels"][:, 1:5] = torch.randint(0, 5, scrambled["step_labels"][:, 1:5].shape, generator=g)
    assert not torch.equal(scrambled["step_labels"], batch["step_labels"])
    trainer.model.train()
    losses_ = []
    for inputs in (batch, scrambled):
        trainer.state.global_step = 0
        with torch.no_grad():
            losses_.append(trainer.compute_loss(trainer.model, inputs).item())
    assert losses_[0] == losses_[1]
    logged = trainer._logged
    assert logged["loss_distill"] and logged["loss_final"]  # iterations 2..4 distilled, 5 on z_d


@pytest.mark.parametrize("view, bidirectional", [("local", True), ("local", False), ("prefix", True)])
def test_self_distillation_one_pass_teacher_equals_the_prefix_runs(tmp_path, view, bidirectional):
    """Under a prefix-invariant view (restricted view + progress positions) the teacher's readouts come from one pass
    over the whole prompt, equal to running it on each c·k-op prefix to iteration k; the full view keeps the prefix
    runs (there the prompt's later operations do change iteration k)."""
    args = tiny_args(tmp_path, cls=SelfDistillationArguments, max_steps=1)
    model = tiny_model(loop_view=view, progress_positions=True, bidirectional_queries=bidirectional)
    trainer = PrefixSelfDistillationTrainer(model=model, args=args, train_dataset=DATASET, data_collator=COLLATOR,
                                            processing_class=TOKENIZER, task=TASK)
    assert trainer.prefix_invariant()
    batch = COLLATOR([DATASET[i] for i in range(len(DATASET)) if DATASET[i]["depth"] == 6][:5])
    iterations = [1, 2, 3, 5]
    fast = trainer.teacher_logits(batch, batch["depth"], iterations)
    slow = trainer.prefix_teacher_logits(batch, batch["depth"], iterations)
    assert fast.shape == slow.shape == (4, 5, TASK.num_queries, len(IDS["answer_token_ids"]))
    torch.testing.assert_close(fast, slow, atol=2e-5, rtol=0)
    full = PrefixSelfDistillationTrainer(model=tiny_model(progress_positions=True), args=args, train_dataset=DATASET,
                                         data_collator=COLLATOR, processing_class=TOKENIZER, task=TASK)
    assert not full.prefix_invariant()


# ---------------------------------------------------------------------------------------------------------- step plan
LOCAL_VIEW = dict(loop_view="local", progress_positions=True, bidirectional_queries=True)


def record_position_ids(module, calls: list, tag: str) -> None:
    """Appends (tag, the position_ids keyword) for every forward call of `module` (None: ordinary positions)."""
    module.register_forward_pre_hook(lambda mod, args, kwargs: calls.append((tag, kwargs.get("position_ids"))),
                                     with_kwargs=True)


@pytest.mark.parametrize("view", ["local", "full"])
def test_self_distillation_trains_on_random_positions_and_its_teacher_reads_them(tmp_path, view):
    """random_positions_max under self-distillation: the student's forward gets sorted random positions (not the
    ordinary 0..T−1), new ones every step; the teacher reads the same positions (one pass: the student's very ids;
    prefix runs: the student's ids through the prefix's operations). Unset: both get the ordinary positions."""
    def train(random_positions_max):
        args = tiny_args(tmp_path, cls=SelfDistillationArguments, max_steps=4, ema_decay=0.5,
                         random_positions_max=random_positions_max)
        model = tiny_model(**(LOCAL_VIEW if view == "local" else {}))
        trainer = PrefixSelfDistillationTrainer(model=model, args=args, train_dataset=DATASET, data_collator=COLLATOR,
                                                processing_class=TOKENIZER, task=TASK)
        calls = []
        record_position_ids(trainer.model, calls, "student")
        record_position_ids(trainer.ema_model, calls, "teacher")
        trainer.train()
        return trainer, calls

    trainer, calls = train(64)
    assert trainer.prefix_invariant() == (view == "local")
    student = [ids for tag, ids in calls if tag == "student"]
    assert len(student) == 4 and any(tag == "teacher" for tag, _ in calls)
    for ids in student:
        assert ids is not None and (ids.diff(dim=-1) > 0).all() and ids.max() < 64
        assert not torch.equal(ids, torch.arange(ids.shape[1]).expand_as(ids))  # no padding: ordinary = 0..T−1
    assert len({tuple(ids[0].tolist()) for ids in student}) == 4  # new positions every step
    last_student = None
    for tag, ids in calls:
        if tag == "student":
            last_student = ids
            continue
        assert ids is not None
        if view == "local":  # one pass over the whole prompt: the student's positions
            assert torch.equal(ids, last_student)
        else:  # a prefix: the preamble and its operations where the student has them
            kept = ids.shape[1] - TASK.num_queries
            assert ids.shape[1] < last_student.shape[1] and torch.equal(ids[:, :kept], last_student[:, :kept])
    if view == "local":
        _, ordinary = train(None)
        assert ordinary and all(ids is None for _, ids in ordinary)


def test_teacher_on_the_plans_positions_one_pass_equals_the_prefix_runs(tmp_path):
    """With randomized positions the one-pass teacher (prefix-invariant view) still equals the prefix runs, whose
    positions `prefix_position_ids` takes from the whole prompt's; ordinary positions map to the prefix's own."""
    from modeling_par.loop_views import positions_from_mask
    from trainers import prefix_position_ids

    args = tiny_args(tmp_path, cls=SelfDistillationArguments, max_steps=1, random_positions_max=64)
    trainer = PrefixSelfDistillationTrainer(model=tiny_model(**LOCAL_VIEW), args=args, train_dataset=DATASET,
                                            data_collator=COLLATOR, processing_class=TOKENIZER, task=TASK)
    batch = COLLATOR([DATASET[i] for i in range(len(DATASET)) if DATASET[i]["depth"] == 6][:5])
    plan = trainer.begin_batch(batch)
    assert plan.position_ids is not None
    iterations = [1, 2, 3, 5]
    fast = trainer.teacher_logits(batch, batch["depth"], iterations, plan)
    slow = trainer.prefix_teacher_logits(batch, batch["depth"], iterations, plan)
    torch.testing.assert_close(fast, slow, atol=2e-5, rtol=0)
    ordinary = trainer.teacher_logits(batch, batch["depth"], iterations)
    assert (fast - ordinary).abs().max() > 1e-4  # the positions reached the teacher
    prefix = COLLATOR([DATASET[i] for i in range(len(DATASET)) if DATASET[i]["depth"] == 2][:1])  # a 2-op prompt
    whole = COLLATOR([DATASET[i] for i in range(len(DATASET)) if DATASET[i]["depth"] == 6][:1])
    got = prefix_position_ids(whole, positions_from_mask(whole["attention_mask"]), 2, prefix["attention_mask"])
    assert torch.equal(got, positions_from_mask(prefix["attention_mask"]))


def plan_fields(plan):
    ids = None if plan.position_ids is None else plan.position_ids.tolist()
    scale = None if plan.position_scale is None else plan.position_scale.tolist()
    return plan.depth, plan.num_iterations, plan.reads, plan.extra_negative, scale, ids


def test_step_plan_is_drawn_in_begin_batch_whatever_runs_after_or_before(tmp_path):
    """One plan per micro-batch (R, the window, the extra negative, stretch, positions), drawn in begin_batch: the same
    seed gives the same plans whether the teacher ran before the plan was drawn or after it (inside compute_loss),
    and whatever the global random state is; ParTrainer draws the same plan; a second micro-batch of a step gets its
    own."""
    batches = [COLLATOR([DATASET[i] for i in range(len(DATASET)) if DATASET[i]["depth"] == d][:4]) for d in (3, 5, 6)]
    options = dict(max_steps=6, depth_schedule="hold", random_positions_max=64)

    def distiller():
        args = tiny_args(tmp_path, cls=SelfDistillationArguments, ema_decay=0.5, **options)
        return PrefixSelfDistillationTrainer(model=tiny_model(**LOCAL_VIEW), args=args, train_dataset=DATASET,
                                             data_collator=COLLATOR, processing_class=TOKENIZER, task=TASK)

    first, plans = distiller(), []
    first.model.train()
    real_begin = first.begin_batch
    first.begin_batch = lambda inputs: plans.append(real_begin(inputs)) or plans[-1]
    for step in range(6):
        first.state.global_step = step
        with torch.no_grad():
            first.compute_loss(first.model, batches[step % 3])  # the plan, the student, then the teacher
    teacher_first, par = distiller(), ParTrainer(model=tiny_model(**LOCAL_VIEW), args=tiny_args(tmp_path, **options),
                                                 train_dataset=DATASET, data_collator=COLLATOR)
    for step in range(6):
        batch = batches[step % 3]
        teacher_first.state.global_step = par.state.global_step = step
        teacher_first.teacher_logits(batch, batch["depth"], [1, 2])  # the teacher first this time
        torch.manual_seed(100 + step), np.random.seed(step), torch.rand(3), np.random.rand(3)  # global state moved
        assert plan_fields(teacher_first.begin_batch(batch)) == plan_fields(plans[step]), step
        assert plan_fields(par.begin_batch(batch)) == plan_fields(plans[step]), step
    assert len({plan.num_iterations - plan.depth for plan in plans}) > 1  # the hold tail was drawn
    again = par.begin_batch(batches[2])  # micro-batch 1 of step 5 (gradient accumulation): its own draws
    assert plan_fields(again)[-1] != plan_fields(plans[5])[-1]


def test_train_par_curve_carries_every_logged_loss_part(tmp_path):
    """summary.json's curve (par_cli.reports.training_curve) keeps every loss part a trainer logs:
    self-distillation's loss_final and loss_distill, ParTrainer's loss_answer and loss_halt, with the logged values."""
    from par_cli.reports import training_curve

    distill = PrefixSelfDistillationTrainer(
        model=tiny_model(**LOCAL_VIEW), args=tiny_args(tmp_path / "sd", cls=SelfDistillationArguments, max_steps=3,
                                                       ema_decay=0.5),
        train_dataset=DATASET, data_collator=COLLATOR, processing_class=TOKENIZER, task=TASK)
    halting = ParTrainer(model=tiny_model(), args=tiny_args(tmp_path / "par", max_steps=3, depth_schedule="hold",
                                                            halting_loss_weight=0.5),
                         train_dataset=DATASET, data_collator=COLLATOR)
    for trainer, parts in ((distill, {"loss", "loss_final", "loss_distill"}),
                           (halting, {"loss", "loss_answer", "loss_halt"})):
        trainer.train()
        logs = [row for row in trainer.state.log_history if "loss" in row]
        curve = training_curve(trainer.state.log_history)
        logged = {k for row in logs for k in row if k == "loss" or k.startswith("loss_")}
        assert parts <= logged and len(curve) == len(logs) == 3
        for row, point in zip(logs, curve):
            assert {k: row[k] for k in row if k == "loss" or k.startswith("loss_")}.items() <= point.items()
            assert point["step"] == row["step"] and "grad_norm" not in point
