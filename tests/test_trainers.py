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
    additive_hold_iterations,
    apply_core_lora,
    balanced_halt_loss,
    core_lora_config,
    curriculum_max_depth,
    final_targets,
    halt_labels,
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
    # 3 × No with different CEs, 1 × Yes: each class weighs 1/2, so a plain mean over the 4 terms is wrong
    logits = torch.tensor([[[2.0, 0.0]], [[1.0, 0.0]], [[0.0, 0.0]], [[0.0, 3.0]]])  # (K=4, B=1, 2)
    labels = torch.tensor([[1], [1], [1], [0]])
    ce = torch.nn.functional.cross_entropy(logits[:, 0], labels[:, 0], reduction="none")
    expected = 0.5 * ce[:3].mean() + 0.5 * ce[3]
    got = balanced_halt_loss(logits, labels)
    torch.testing.assert_close(got, expected)
    assert abs(got - ce.mean()) > 0.1  # the plain mean differs
    torch.testing.assert_close(balanced_halt_loss(logits[:3], labels[:3]), ce[:3].mean())  # one class: its mean


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
    ("objective", "final"), ("depth_schedule", "uniform"), ("min_train_depth", 0), ("max_train_depth", 0),
    ("curriculum_start_depth", 99), ("hold_tail_alpha", 0.0), ("halting_loss_weight", -1.0),
    ("stretch_max_scale", 0.5), ("adapter_learning_rate", 0.0), ("max_steps", -1), ("stretch_fraction", 0.0),
    ("hold_extra_iterations", -1), ("random_positions_max", 1),
])
def test_invalid_training_arguments(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"ParTrainingArguments\.{field} must be"):
        tiny_args(tmp_path, **{field: value})


@pytest.mark.parametrize("field,overrides", [
    ("halt_label_offset", dict(halt_label_offset=1)),  # no halting loss
    ("hold_extra_iterations", dict(hold_extra_iterations=3)),  # forced schedule runs no extra iterations
    ("hold_tail_alpha", dict(depth_schedule="hold", hold_tail_alpha=2.0)),  # additive tail
    ("hold_max_factor", dict(hold_max_factor=2.0)),
    ("stretch_max_scale", dict(stretch_max_scale=4.0)),  # no stretch phase
    ("stretch_fraction", dict(stretch_fraction=0.5)),
])
def test_training_options_without_effect_are_errors(tmp_path, field, overrides):
    with pytest.raises(ValueError, match=rf"ParTrainingArguments\.{field} must be"):
        tiny_args(tmp_path, **overrides)


# ---------------------------------------------------------------------------------------------------- training
def test_loss_falls_within_a_few_dozen_steps(tmp_path):
    args = tiny_args(tmp_path, max_steps=60, max_train_depth=2, learning_rate=5e-3, warmup_steps=0,
                     halting_loss_weight=0.5, adapter_learning_rate=1e-2, depth_schedule="hold",
                     hold_extra_iterations=1)
    trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    trainer.train()
    # the loss sums the window's iterations (R varies under hold): compare it per iteration read
    curve = [e["loss_answer"] / min(e["iterations"], 4) for e in trainer.state.log_history if "loss" in e]
    assert np.mean(curve[-8:]) < 0.8 * np.mean(curve[:8]), curve
    assert len(trainer.optimizer.param_groups) == 3  # decay, no decay, adapter
    adapter = {id(p) for n, p in trainer.model.named_parameters() if is_adapter_parameter(n)}
    for group in trainer.optimizer.param_groups:  # the scheduler keeps each group's starting lr
        is_adapter = all(id(p) in adapter for p in group["params"])
        assert is_adapter or not any(id(p) in adapter for p in group["params"])
        assert group["initial_lr"] == (1e-2 if is_adapter else 5e-3), group["initial_lr"]


@pytest.mark.parametrize("objective", ["par", "final_every_iteration", "final_only"])
def test_every_objective_supervises_its_targets_and_stretch_reaches_the_rotary(tmp_path, objective, monkeypatch):
    import trainers.par_trainer as par_trainer

    args = tiny_args(tmp_path, max_steps=3, objective=objective, depth_schedule="hold", stretch_steps=3,
                     stretch_max_scale=4.0)
    trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    seen, positions = [], []
    real_loss = par_trainer.answer_loss
    monkeypatch.setattr(par_trainer, "answer_loss",
                        lambda logits, targets: seen.append(targets) or real_loss(logits, targets))
    batches = []
    real_compute = trainer.compute_loss
    monkeypatch.setattr(trainer, "compute_loss",
                        lambda model, inputs, **kw: batches.append(inputs) or real_compute(model, inputs, **kw))
    rotary = trainer.model.model.rotary_emb
    real_rotary = rotary.forward
    monkeypatch.setattr(rotary, "forward", lambda x, pos: positions.append(pos.clone()) or real_rotary(x, pos))
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    for inputs, targets, log in zip(batches, seen, logs):
        labels, depth = inputs["step_labels"], inputs["depth"]
        d = int(depth[0])
        final = labels[torch.arange(len(depth)), depth]  # z_d, (B, Q)
        if objective == "final_only":
            assert targets.shape[0] == 1 and torch.equal(targets[0], final)
        elif objective == "final_every_iteration":
            assert all(torch.equal(t, final) for t in targets)
        else:  # iteration k of the window reads z_min(k, d)
            r = targets.shape[0]
            iterations = list(range(int(log["iterations"]) - r + 1, int(log["iterations"]) + 1))
            for t, k in zip(targets, iterations):
                assert torch.equal(t, labels[:, min(k, d)])
    stretched = [p for p in positions if not torch.equal(p, p.round())]
    assert stretched, "no stretched (non-integer) position reached the rotary embedding"


def test_extra_halting_negative_is_a_no_example(tmp_path):
    args = tiny_args(tmp_path, halting_loss_weight=0.5, depth_schedule="hold", hold_tail="pareto")
    trainer = ParTrainer(model=tiny_model(grad_window=2), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    drawn = set()
    for step in range(40):
        trainer.state.global_step = step
        for r in (3, 6, 12):
            reads, extra = trainer.readout_iterations(r, depth=5)
            assert reads == [r - 1, r]
            assert extra is not None and 1 <= extra < min(r - 1, 5)  # before the window, c·k < d: a "No" label
            drawn.add(extra)
    assert drawn == {1, 2, 3, 4}  # every iteration below min(window, d) is drawn
    assert trainer.readout_iterations(2, depth=2)[1] is None  # the window already starts at 1


# ---------------------------------------------------------------------------------------------------- peft
def test_lora_on_every_layer_targets_prelude_core_and_coda_and_refuses_a_bad_choice():
    model = apply_core_lora(tiny_model(), r=4, alpha=8, layers="all")
    lora_layers = {n.split(".layers.")[1].split(".")[0] for n, _ in model.named_parameters() if "lora_A" in n}
    assert lora_layers == {"0", "1", "2"}  # prelude, core and coda of a 1 + 1 + 1 model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any("embed_tokens" in n or "lm_head" in n for n in trainable)
    assert all("lora_" in n or "adapter" in n for n in trainable)
    with pytest.raises(ValueError, match="--lora_layers must be one of core, all; got 'coda'"):
        core_lora_config(tiny_model().config, layers="coda")


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
import atexit, gc, hashlib, json, os, sys, weakref
sys.path.insert(0, sys.argv[1])
import torch
out, world = sys.argv[2], None
def at_exit():  # registered before the trainer's teardown, so it runs after it (atexit is last in, first out)
    gc.collect()
    with open(os.path.join(out, f"exit{os.environ['RANK']}.json"), "w") as f:
        json.dump({"initialized": torch.distributed.is_initialized(), "group_alive": world() is not None}, f)
atexit.register(at_exit)
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
world = weakref.ref(torch.distributed.group.WORLD)
trainer.train()  # and nothing after it tears torch.distributed down: ParTrainer's exit hook must
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
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
         str(script), str(REPO), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    for r in (0, 1):  # ParTrainer's exit hook destroyed the process group (its destructor joins gloo's threads)
        assert json.loads((tmp_path / f"exit{r}.json").read_text()) == {"initialized": False, "group_alive": False}
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


# ---------------------------------------------------------------------------------------------------- review fixes
def test_halting_needs_iterations_past_d(tmp_path):
    with pytest.raises(ValueError, match=r"halting_loss_weight must be 0 under depth_schedule='forced'"):
        tiny_args(tmp_path, halting_loss_weight=0.5)
    with pytest.raises(ValueError, match=r"hold_extra_iterations must be None with hold_tail='pareto'"):
        tiny_args(tmp_path, depth_schedule="hold", hold_tail="pareto", hold_extra_iterations=3)
    with pytest.raises(ValueError, match=r"ParTrainingArguments\.hold_tail must be"):
        tiny_args(tmp_path, depth_schedule="hold", hold_tail="uniform")


def test_default_hold_window_always_overlaps_the_progress_region(tmp_path):
    """Additive tail X ≤ grad_window − 1: the gradient window [R − w + 1, R] always contains iteration d; the Pareto
    tail puts most windows entirely past d at d = 32."""
    window = 8
    assert tiny_args(tmp_path, depth_schedule="hold").hold_tail == "additive"
    fractions = {}
    for tail in ("additive", "pareto"):
        trainer = ParTrainer(model=tiny_model(grad_window=window, max_iterations=512),
                             args=tiny_args(tmp_path, depth_schedule="hold", hold_tail=tail),
                             train_dataset=DATASET, data_collator=COLLATOR)
        past, draws = 0, []
        for step in range(300):
            trainer.state.global_step = step
            r = trainer.num_iterations(32)
            draws.append(r)
            past += r - window + 1 > 32
        fractions[tail] = past / 300
        if tail == "additive":
            assert set(draws) == set(range(32, 32 + window))  # X ~ U{0..7}: the halting window d..d+7 is trained
    assert fractions["additive"] == 0.0 and fractions["pareto"] > 0.5


def test_stretch_scales_are_drawn_for_the_global_batch_and_sliced_per_rank(tmp_path, monkeypatch):
    args = tiny_args(tmp_path, stretch_steps=6, stretch_max_scale=4.0)
    trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    trainer.state.global_step = 5
    whole = trainer.position_scale(8, "cpu")  # one process, global batch 8
    monkeypatch.setattr(ParTrainingArguments, "world_size", property(lambda self: 2))
    ranks = []
    for rank in (0, 1):
        monkeypatch.setattr(ParTrainingArguments, "process_index", property(lambda self, r=rank: r))
        ranks.append(trainer.position_scale(4, "cpu"))
    assert not torch.equal(ranks[0], ranks[1])  # ranks no longer draw the same vector
    torch.testing.assert_close(torch.cat(ranks), whole)


def test_stretch_phase_under_a_time_budget_warns(tmp_path):
    with pytest.warns(UserWarning, match="training may stop before it"):
        ParTrainer(model=tiny_model(), args=tiny_args(tmp_path, max_steps=100, stretch_steps=20, max_train_seconds=5),
                   train_dataset=DATASET, data_collator=COLLATOR)


def test_sampler_walks_each_depth_without_replacement():
    depths = np.repeat(np.arange(1, 4), [10, 13, 7])  # pools of 10, 13 and 7 examples
    sampler = DepthBatchSampler(depths, batch_size=4, num_batches=60, seed=0, min_depth=1, max_depth=3)
    batches = list(sampler)
    assert batches == list(sampler)
    for depth, size in ((1, 10), (2, 13), (3, 7)):
        stream = [i for b in batches if depths[b[0]] == depth for i in b]
        assert len(stream) >= 2 * size
        for start in range(0, len(stream) - size + 1, size):  # every pass covers the pool exactly once
            assert sorted(stream[start : start + size]) == sorted(np.flatnonzero(depths == depth).tolist())


# ------------------------------------------------------------------------------------------------ ablation schedules
def test_fixed_and_random_depth_schedules(tmp_path):
    """fixed: R = fixed_iterations whatever d; random: R ~ U{1..random_max_iterations} whatever d (both ablations)."""
    fixed = ParTrainer(model=tiny_model(), args=tiny_args(tmp_path, depth_schedule="fixed", fixed_iterations=3),
                       train_dataset=DATASET, data_collator=COLLATOR)
    assert {fixed.num_iterations(d) for d in (1, 5, 9)} == {3}
    random = ParTrainer(model=tiny_model(), args=tiny_args(tmp_path, depth_schedule="random", random_max_iterations=4),
                        train_dataset=DATASET, data_collator=COLLATOR)
    draws = set()
    for step in range(60):
        random.state.global_step = step
        draws.add(random.num_iterations(7))
    assert draws == {1, 2, 3, 4}
    # a final-answer run with R = 1 (the plain Transformer) trains and logs R = 1 at every depth
    args = tiny_args(tmp_path, max_steps=3, depth_schedule="fixed", fixed_iterations=1, objective="final_only")
    trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert logs and all(e["iterations"] == 1 and np.isfinite(e["loss"]) for e in logs)


@pytest.mark.parametrize("overrides, field", [
    (dict(depth_schedule="fixed"), "fixed_iterations"),
    (dict(fixed_iterations=2), "fixed_iterations"),
    (dict(depth_schedule="fixed", fixed_iterations=0), "fixed_iterations"),
    (dict(depth_schedule="random"), "random_max_iterations"),
    (dict(depth_schedule="random", random_max_iterations=0), "random_max_iterations"),
    (dict(depth_schedule="fixed", fixed_iterations=2, halting_loss_weight=0.5), "halting_loss_weight"),
])
def test_ablation_schedule_arguments_are_validated(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=rf"ParTrainingArguments\.{field} must be"):
        tiny_args(tmp_path, **overrides)


# ------------------------------------------------------------------------------------------------ mastery curriculum
def test_mastery_curriculum_grows_on_mastery_only_after_its_window_and_dwell():
    """MasteryCurriculum: d_max grows once the mean of the last `window` steps at d_max reaches the threshold, no sooner
    than `min_steps` after the previous growth, from step + lookahead; steps whose batch was below d_max (or during
    a pending growth) do not count; it stops at max_depth."""
    from trainers import MasteryCurriculum, mastery_max_depth

    m = MasteryCurriculum(start_depth=2, increment=1, max_depth=4, threshold=0.9, window=2, min_steps=3, lookahead=2)
    assert m.max_depth_at(0) == 2
    assert not m.end_step(0, 1.0)  # window not full
    assert not m.end_step(1, None)  # no batch at d_max this step
    assert m.end_step(2, 0.95) and m.advances == [4]  # mean(1.0, 0.95) ≥ 0.9, 3 steps since the start
    assert (m.max_depth_at(3), m.max_depth_at(4)) == (2, 3)
    assert not m.end_step(3, 1.0)  # the growth is pending: not counted at the new d_max
    assert not m.end_step(4, 1.0) and not m.end_step(5, 0.5)  # mean 0.75 < 0.9
    assert not m.end_step(6, 1.0) and m.recent == [0.5, 1.0]  # still 0.75
    assert m.end_step(7, 1.0) and m.advances == [4, 9]  # d_max 4 from step 9
    assert not any(m.end_step(t, 1.0) for t in range(9, 20))  # at max_depth
    assert mastery_max_depth(100, 2, 1, 4, m.advances) == 4
    again = MasteryCurriculum(2, 1, 4, 0.9, 2, 3, 2)
    again.load_state_dict(json.loads(json.dumps(m.state_dict())))
    assert again.advances == m.advances and again.recent == m.recent
    for bad, name in ((dict(threshold=0), "threshold"), (dict(window=0), "window"), (dict(min_steps=0), "min_steps")):
        kwargs = dict(start_depth=2, increment=1, max_depth=4, threshold=0.9, window=2, min_steps=3) | bad
        with pytest.raises(ValueError, match=f"MasteryCurriculum.{name} must be"):
            MasteryCurriculum(**kwargs)


def test_mastery_curriculum_in_training_draws_under_its_cap_and_resumes_the_same_batches(tmp_path):
    """ParTrainer with curriculum_advance_accuracy: every batch's depth is under the mastery cap of its step; with
    every batch at d_max 'mastered' the cap grows (from 2 up to max_train_depth, each growth ≥ curriculum_every_steps
    apart); a run resumed from a checkpoint (curriculum_state.json) draws the same depths and makes the same growths
    as the uninterrupted run; a run whose accuracy stays under the threshold never grows; arguments are validated."""

    class Scripted(ParTrainer):
        accuracy = 1.0

        def observe_final_accuracy(self, depth, accuracy):
            super().observe_final_accuracy(depth, self.accuracy)

    def train(folder, resume=None, accuracy=1.0, max_steps=40):
        Scripted.accuracy = accuracy
        args = tiny_args(folder, max_steps=max_steps, save_strategy="steps", save_steps=8, curriculum_start_depth=2,
                         curriculum_every_steps=3, curriculum_advance_accuracy=0.9, curriculum_window=2)
        trainer = Scripted(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
        trainer.train(resume_from_checkpoint=resume)
        depths = {e["step"]: e["depth"] for e in trainer.state.log_history if "depth" in e}
        caps = {e["step"]: e["curriculum_max_depth"] for e in trainer.state.log_history if "depth" in e}
        return trainer, depths, caps

    full, depths, caps = train(tmp_path / "a")
    advances = full.mastery.advances
    assert len(advances) >= 3 and all(b - a >= 3 for a, b in zip(advances, advances[1:]))  # 2 → 5 or more
    assert all(depths[step] <= caps[step] == full.mastery.max_depth_at(step - 1) for step in depths)
    assert caps[1] == 2 and max(caps.values()) == full.mastery.max_depth_at(39) >= 5 and max(depths.values()) >= 5
    saved = json.loads((tmp_path / "a" / "out" / "checkpoint-8" / "curriculum_state.json").read_text())
    assert saved["advances"] == [a for a in advances if a <= 8 + full.mastery.lookahead] and saved["advances"]
    resumed, resumed_depths, _ = train(tmp_path / "b", resume=str(tmp_path / "a" / "out" / "checkpoint-8"))
    assert resumed.mastery.advances == advances
    assert {s: d for s, d in resumed_depths.items() if s > 8} == {s: d for s, d in depths.items() if s > 8}
    stuck, stuck_depths, _ = train(tmp_path / "c", accuracy=0.5, max_steps=8)
    assert stuck.mastery.advances == [] and max(stuck_depths.values()) <= 2
    with pytest.raises(ValueError, match="curriculum_advance_accuracy must be"):
        tiny_args(tmp_path, curriculum_advance_accuracy=0.9)  # no curriculum to advance
    with pytest.raises(ValueError, match="curriculum_window must be"):
        tiny_args(tmp_path, curriculum_start_depth=2, curriculum_window=5)  # the fixed pace reads no accuracy
    with pytest.raises(ValueError, match="resume_from_checkpoint: .* has no curriculum_state.json"):
        plain = ParTrainer(model=tiny_model(), args=tiny_args(tmp_path / "d", max_steps=4, save_strategy="steps",
                                                              save_steps=2), train_dataset=DATASET,
                           data_collator=COLLATOR)
        plain.train()
        train(tmp_path / "e", resume=str(tmp_path / "d" / "out" / "checkpoint-2"))


def test_mastery_curriculum_visits_every_gapped_length(tmp_path):
    """Training lengths {2, 4, 6} (records of a few lengths): the cap moves from one length present to the next
    (mastery measured at the longest length under the cap) instead of stalling one past the first, where no batch
    ever has that depth; unit level and in training."""
    from trainers import MasteryCurriculum, mastery_levels

    assert mastery_levels(8, 1, 32, [8, 16, 32]) == [8, 16, 32] and mastery_levels(2, 1, 4) == [2, 3, 4]
    assert mastery_levels(8, 10, 40, [8, 9, 12, 30]) == [8, 30, 40]
    m = MasteryCurriculum(8, 1, 32, threshold=0.9, window=2, min_steps=1, lookahead=1, lengths=[8, 16, 32])
    for step in range(12):
        depth = m.measured_depth_at(step)
        m.observe(step, depth, 1.0)
        m.end_step(step, 1.0)
    assert [m.max_depth_at(a) for a in m.advances] == [16, 32]

    class Scripted(ParTrainer):
        def observe_final_accuracy(self, depth, accuracy):
            super().observe_final_accuracy(depth, 1.0)

    gapped = DATASET.filter(lambda row: row["depth"] in (2, 4, 6))
    args = tiny_args(tmp_path, max_steps=24, curriculum_start_depth=2,
                     curriculum_every_steps=3, curriculum_advance_accuracy=0.9, curriculum_window=2)
    trainer = Scripted(model=tiny_model(), args=args, train_dataset=gapped, data_collator=COLLATOR)
    trainer.train()
    drawn = {e["depth"] for e in trainer.state.log_history if "depth" in e}
    assert drawn == {2, 4, 6} and trainer.mastery.levels == [2, 4, 6], (drawn, trainer.mastery.levels)
