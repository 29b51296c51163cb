import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking
from state_tracking import StateTrackingCollator, build_dataset, build_tokenizer, get_task, model_token_ids
from trainers import (
    DepthBatchSampler,
    ParTrainer,
    ParTrainingArguments,
    PrefixSelfDistillationTrainer,
    SelfDistillationArguments,
    apply_core_lora,
    balanced_halt_loss,
    curriculum_max_depth,
    final_targets,
    halt_labels,
    additive_hold_iterations,
    hold_iterations,
    is_adapter_parameter,
    iterations_for_depth,
    progress_targets,
    stretch_max_scale,
)

REPO = Path(__file__).resolve().parents[1]
TASK = get_task("swap_s5")
TOKENIZER = build_tokenizer(TASK, "symbolic")
IDS = model_token_ids(TOKENIZER, TASK)


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    kwargs = dict(
        vocab_size=IDS["vocab_size"], pad_token_id=IDS["pad_token_id"], hidden_size=32, intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=2, prelude_layers=1, core_layers=1, coda_layers=1,
        answer_token_ids=IDS["answer_token_ids"], halt_token_ids=IDS["halt_token_ids"], max_position_embeddings=256,
        grad_window=4,
    )
    kwargs.update(overrides)
    return ParLoopedQwenForStateTracking(ParLoopedQwenConfig(**kwargs))


def tiny_args(tmp_path, cls=ParTrainingArguments, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=8, learning_rate=3e-3,
        logging_steps=1, save_strategy="no", report_to="none", seed=0, use_cpu=True, disable_tqdm=True,
        max_train_depth=6,
    )
    kwargs.update(overrides)
    return cls(**kwargs)


DATASET = build_dataset(TASK, TOKENIZER, n=600, depths=(1, 6), seed=0)
COLLATOR = StateTrackingCollator(pad_token_id=IDS["pad_token_id"])


def losses(trainer):
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


# ---------------------------------------------------------------------------------------------------- targets
def hand_batch():
    # two samples, one query, depths 3 and 5; z_t = 10·b + t so every target names its (sample, step)
    step_labels = torch.full((2, 6, 1), -100)
    step_labels[0, :4, 0] = torch.tensor([0, 1, 2, 3])
    step_labels[1, :6, 0] = torch.tensor([10, 11, 12, 13, 14, 15])
    return step_labels, torch.tensor([3, 5])


def test_progress_targets_follow_min_ck_d():
    step_labels, depth = hand_batch()
    k = torch.tensor([1, 2, 3, 4])
    assert progress_targets(step_labels, depth, k, 1)[..., 0].tolist() == [[1, 11], [2, 12], [3, 13], [3, 14]]
    # c = 2: iteration k reads z_min(2k, d); hold iterations past d/c stay at z_d
    assert progress_targets(step_labels, depth, k, 2)[..., 0].tolist() == [[2, 12], [3, 14], [3, 15], [3, 15]]
    assert final_targets(step_labels, depth, k)[..., 0].tolist() == [[3, 15]] * 4
    with pytest.raises(ValueError, match="≥ 1"):
        progress_targets(step_labels, depth, [0], 1)
    with pytest.raises(ValueError, match="step_size"):
        progress_targets(step_labels, depth, k, 0)


def test_halt_labels_flip_at_ck_ge_d():
    _, depth = hand_batch()
    labels = halt_labels(torch.tensor([1, 2, 3, 4, 5]), depth, 1)  # 0 = Yes, 1 = No
    assert labels.tolist() == [[1, 1], [1, 1], [0, 1], [0, 1], [0, 0]]
    assert halt_labels(torch.tensor([1, 2, 3]), depth, 2).tolist() == [[1, 1], [0, 1], [0, 0]]
    # offset 1: Yes only once no operation is left to read (k − 1 ≥ d)
    assert halt_labels(torch.tensor([2, 3, 4]), torch.tensor([3]), 1, offset=1)[:, 0].tolist() == [1, 1, 0]


def test_balanced_halt_loss_weighs_classes_equally():
    logits = torch.tensor([[[2.0, 0.0]], [[2.0, 0.0]], [[2.0, 0.0]], [[0.0, 2.0]]])  # (K=4, B=1, 2)
    labels = torch.tensor([[1], [1], [1], [0]])  # 3 × No (all wrong), 1 × Yes (wrong)
    ce_wrong = torch.nn.functional.cross_entropy(torch.tensor([[0.0, 2.0]]), torch.tensor([0]))
    torch.testing.assert_close(balanced_halt_loss(logits, labels), ce_wrong)


def test_iteration_counts():
    assert iterations_for_depth(7, 1) == 7 and iterations_for_depth(7, 2) == 4
    draws = [hold_iterations(8, 1, np.random.default_rng(i), 1.5, 4.0, 1000) for i in range(300)]
    assert min(draws) == 8 and max(draws) == 32 and np.mean(np.array(draws) > 8) > 0.3
    assert hold_iterations(8, 1, np.random.default_rng(0), 1.5, 4.0, 10) <= 10


def test_schedules():
    assert [curriculum_max_depth(t, 2, 10, 1, 5) for t in (0, 9, 10, 35, 100)] == [2, 2, 3, 5, 5]
    assert curriculum_max_depth(0, None, 10, 1, 5) == 5
    assert stretch_max_scale(4, 5, 5, 8.0) == 1.0 and stretch_max_scale(9, 5, 5, 8.0) == 8.0
    assert 1.0 < stretch_max_scale(6, 5, 5, 8.0) < 8.0


def test_depth_batch_sampler_one_depth_per_batch_and_curriculum():
    depths = np.asarray(DATASET["depth"])
    sampler = DepthBatchSampler(depths, batch_size=8, num_batches=40, seed=3, min_depth=1, max_depth=6,
                                curriculum_start=2, curriculum_every=5, curriculum_increment=1, accumulation=2)
    batches = list(sampler)
    assert len(batches) == 40 and all(len(b) == 8 for b in batches)
    for i, batch in enumerate(batches):
        batch_depths = set(depths[batch].tolist())
        assert len(batch_depths) == 1
        assert batch_depths.pop() <= curriculum_max_depth(i // 2, 2, 5, 1, 6)
    assert batches == list(sampler)  # a pure function of (seed, batch index)
    assert len({depths[b[0]] for b in batches[-10:]}) > 1
    with pytest.raises(ValueError, match="max_train_depth"):
        DepthBatchSampler(depths, 8, 4, 0, min_depth=7, max_depth=9)


@pytest.mark.parametrize("field,value", [
    ("objective", "final"), ("depth_schedule", "random"), ("min_train_depth", 0), ("max_train_depth", 0),
    ("curriculum_start_depth", 99), ("hold_tail_alpha", 0.0), ("halting_loss_weight", -1.0),
    ("stretch_max_scale", 0.5), ("adapter_learning_rate", 0.0), ("max_steps", -1), ("stretch_fraction", 0.0),
    ("hold_extra_iterations", -1), ("random_positions_max", 1),
])
def test_invalid_training_arguments(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"ParTrainingArguments\.{field} must be"):
        tiny_args(tmp_path, **{field: value})


# ---------------------------------------------------------------------------------------------------- training
def test_loss_falls_within_a_few_dozen_steps(tmp_path):
    args = tiny_args(tmp_path, max_steps=40, max_train_depth=2, learning_rate=5e-3, warmup_steps=0,
                     halting_loss_weight=0.5, adapter_learning_rate=1e-2)
    trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    trainer.train()
    curve = list(losses(trainer).values())
    assert np.mean(curve[-8:]) < 0.8 * np.mean(curve[:8]), curve
    lrs = sorted(g["lr"] for g in trainer.optimizer.param_groups)
    assert len(trainer.optimizer.param_groups) == 3  # decay, no decay, adapter
    assert any(is_adapter_parameter(n) for n, _ in trainer.model.named_parameters())
    assert lrs[-1] > lrs[0] or lrs[-1] == 0.0


@pytest.mark.parametrize("objective", ["par", "final_every_iteration", "final_only"])
def test_every_objective_trains_a_step(tmp_path, objective):
    args = tiny_args(tmp_path, max_steps=2, objective=objective, depth_schedule="hold", stretch_steps=1)
    trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert np.isfinite(logs["loss"]) and logs["iterations"] >= logs["depth"]


def test_extra_halting_negative_is_a_no_example(tmp_path):
    args = tiny_args(tmp_path, halting_loss_weight=0.5, depth_schedule="hold")
    trainer = ParTrainer(model=tiny_model(grad_window=2), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    for step in range(40):
        trainer.state.global_step = step
        for r in (3, 6, 12):
            reads, extra = trainer.readout_iterations(r, depth=5)
            assert reads == [r - 1, r]
            assert extra is None or 1 <= extra < min(r - 1, 5)  # c·k < d: a "No" label
    assert trainer.readout_iterations(2, depth=2)[1] is None  # the window already starts at 1


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


# ---------------------------------------------------------------------------------------------------- peft
def test_lora_on_core_save_load_round_trip(tmp_path):
    from peft import PeftModel

    model = apply_core_lora(tiny_model(), r=4, alpha=8)
    lora_names = [n for n, _ in model.named_parameters() if "lora_A" in n]
    assert lora_names and all(".layers.1." in n for n in lora_names)  # layer 1 is the core (1 + 1 + 1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("adapter" in n for n in trainable) and not any("embed_tokens" in n for n in trainable)
    args = tiny_args(tmp_path, max_steps=3, learning_rate=1e-2)
    ParTrainer(model=model, args=args, train_dataset=DATASET, data_collator=COLLATOR).train()
    model.save_pretrained(tmp_path / "lora")
    assert (tmp_path / "lora" / "adapter_model.safetensors").is_file()
    restored = PeftModel.from_pretrained(tiny_model(), tmp_path / "lora").eval()
    model.eval()
    batch = COLLATOR([DATASET[i] for i in range(4)])
    with torch.no_grad():
        kw = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"], num_iterations=3)
        expected = model(input_ids=batch["input_ids"], **kw).answer_logits
        got = restored(input_ids=batch["input_ids"], **kw).answer_logits
        base = tiny_model()(input_ids=batch["input_ids"], **kw).answer_logits
    torch.testing.assert_close(got, expected)
    assert (expected - base).abs().max() > 1e-4  # training changed something that the round trip kept


# ---------------------------------------------------------------------------------------------------- ddp
DDP_SCRIPT = r"""
import hashlib, json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
from tests.test_trainers import COLLATOR, DATASET, tiny_args, tiny_model
from pathlib import Path
from trainers import ParTrainer
out = Path(sys.argv[2])
args = tiny_args(out, max_steps=4, per_device_train_batch_size=4, curriculum_start_depth=2, curriculum_every_steps=1,
                 depth_schedule="hold", ddp_backend="gloo")
trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
depths = []
original = trainer.compute_loss
def spy(model, inputs, **kw):
    depths.append(inputs["depth"].tolist())
    return original(model, inputs, **kw)
trainer.compute_loss = spy
trainer.train()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in trainer.model.parameters())).hexdigest()
rank = int(os.environ["RANK"])
(out / f"rank{rank}.json").write_text(json.dumps({"digest": digest, "depths": depths,
                                                "world": trainer.args.world_size}))
"""


def test_two_process_gloo_ddp_same_depths_and_weights(tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
         str(script), str(REPO), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert len(ranks[0]["depths"]) == 4
    for mine, theirs in zip(*(r["depths"] for r in ranks)):
        assert len(mine) == len(theirs) == 4 and len(set(mine + theirs)) == 1  # one depth per step on both ranks


# ---------------------------------------------------------------------------------------------------- length levers
def test_additive_hold_tail_does_not_grow_with_depth():
    rng = np.random.default_rng(0)
    for depth in (2, 8, 32):
        drawn = {additive_hold_iterations(depth, 1, rng, 3, 1000) for _ in range(200)}
        assert drawn == {depth, depth + 1, depth + 2, depth + 3}
    assert additive_hold_iterations(9, 2, rng, 0, 1000) == 5
    assert additive_hold_iterations(30, 1, rng, 5, 31) <= 31


def test_random_positions_are_sorted_distinct_and_reach_the_model(tmp_path, monkeypatch):
    args = tiny_args(tmp_path, random_positions_max=64)
    trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    positions = trainer.position_ids(mask)
    real = positions[0, :5]
    assert (real.diff() > 0).all() and (positions[0, 5:] == 0).all() and (positions[1].diff() > 0).all()
    assert positions.max() < 64 and not torch.equal(positions[1], torch.arange(7))
    seen = []
    rotary = trainer.model.model.rotary_emb
    original = rotary.forward
    monkeypatch.setattr(rotary, "forward", lambda x, pos: seen.append(pos.clone()) or original(x, pos))
    trainer.train()
    assert seen and all((p.diff(dim=-1) > 0).all() for p in seen) and any(p.max() > p.shape[-1] for p in seen)
    with pytest.raises(ValueError, match="random_positions_max=4 is shorter"):
        ParTrainer(model=tiny_model(), args=tiny_args(tmp_path, random_positions_max=4), train_dataset=DATASET,
                   data_collator=COLLATOR).position_ids(mask)


def test_stretch_fraction_stretches_that_share_of_batches(tmp_path):
    args = tiny_args(tmp_path, max_steps=400, stretch_steps=400, stretch_fraction=0.25, stretch_max_scale=4.0)
    trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    stretched = 0
    for step in range(400):
        trainer.state.global_step = step
        scale = trainer.position_scale(8, "cpu")
        if scale is not None:
            stretched += 1
            assert ((scale >= 1) & (scale <= stretch_max_scale(step, 0, 400, 4.0))).all()
    assert 60 <= stretched <= 140  # 25% of 400, binomial sd ≈ 9


def test_local_view_training_reads_operation_ends(tmp_path):
    args = tiny_args(tmp_path, max_steps=3, depth_schedule="hold", hold_extra_iterations=2)
    model = tiny_model(loop_view="local", progress_positions=True, bidirectional_queries=True, grad_window=8)
    trainer = ParTrainer(model=model, args=args, train_dataset=DATASET, data_collator=COLLATOR)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert all(np.isfinite(e["loss"]) and e["depth"] <= e["iterations"] <= e["depth"] + 2 for e in logs)
