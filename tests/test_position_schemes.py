"""Position schemes of the full view (issue 68): NoPE (`position_encoding="nope"`), the core's causal depthwise
convolution (`core_conv_kernel`), PoSE positions (`pose_max_positions`), test-time position interpolation, dense
prefix targets (`prefix_state_queries`, `prefix_state_weight`); their formulas, R = 1 equivalence where it applies,
padding, save / load, refusals, and the study's rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking, causal_depthwise_mix
from modeling_par.loop_views import nope_positions
from modeling_par.prefix_state import prefix_state_logits
from par_studies import argv
from state_tracking import load_task
from state_tracking.prompts import text_prompt
from tests.conftest import ANSWER_IDS, HALT_IDS, load_example, make_model, tiny_par_config
from tests.test_modeling_par import candidate_logits, random_batch
from trainers import ParTrainer, pose_positions
from trainers.objectives import UNRECORDED, prefix_state_targets


def perturbed_conv(model, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for conv in model.core_conv:
            conv.weight.copy_(0.3 * torch.randn(conv.weight.shape, generator=g))
    return model


# ------------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("field,value,allowed", [
    ("position_encoding", "alibi", "one of"), ("core_conv_kernel", -1, "an integer ≥ 0"),
    ("core_conv_kernel", True, "an integer ≥ 0"),
])
def test_bad_position_fields_are_refused_by_name(field, value, allowed):
    with pytest.raises(ValueError, match=rf"ParLoopedQwenConfig\.{field} must be {allowed}"):
        tiny_par_config(**{field: value})


def test_the_convolution_is_refused_outside_the_full_view():
    with pytest.raises(ValueError, match=r"core_conv_kernel must be 0 with loop_view='local'"):
        tiny_par_config(core_conv_kernel=4, loop_view="local")


# ---------------------------------------------------------------------------------------------- the convolution
def test_causal_depthwise_mix_follows_its_formula():
    u = torch.randn(2, 7, 3)
    w = torch.randn(3, 1, 4)
    assert torch.equal(causal_depthwise_mix(u, torch.zeros(3, 1, 4)), u)  # w = 0: the identity
    out = causal_depthwise_mix(u, w)
    for t in range(7):  # u_t + Σ_j w_{K−1−j} ⊙ u_{t−j}, zeros before the first token
        expected = u[:, t] + sum(w[:, 0, 3 - j] * u[:, t - j] for j in range(4) if t - j >= 0)
        torch.testing.assert_close(out[:, t], expected)
    later = u.clone()
    later[:, 5:] += 1.0  # tokens 5, 6 changed: tokens 0..4 unchanged (causal)
    assert torch.equal(causal_depthwise_mix(later, w)[:, :5], out[:, :5])


def test_a_retrofit_with_the_convolution_computes_its_parent_at_r1(tiny_parent):
    input_ids, qpos = random_batch()
    model = ParLoopedQwenForStateTracking.from_pretrained_parent(
        tiny_parent, 2, 2, 2, answer_token_ids=ANSWER_IDS, halt_token_ids=HALT_IDS, core_conv_kernel=4).eval()
    assert len(model.core_conv) == 2 and all(bool((c.weight == 0).all()) for c in model.core_conv)
    with torch.no_grad():
        expected = candidate_logits(tiny_parent, input_ids, qpos)
        torch.testing.assert_close(model(input_ids, query_positions=qpos).answer_logits[0], expected, atol=1e-5,
                                   rtol=0)
        perturbed_conv(model)  # a trained convolution changes the answer
        assert (model(input_ids, query_positions=qpos).answer_logits[0] - expected).abs().max() > 1e-3


@pytest.mark.parametrize("encoding,kernel", [("rope", 4), ("nope", 4), ("nope", 0)])
def test_left_and_right_padding_change_nothing(encoding, kernel):
    model = make_model(position_encoding=encoding, core_conv_kernel=kernel)
    if kernel:
        perturbed_conv(model)
    input_ids, _ = random_batch(batch=2, seq=10, queries=1)
    padded = torch.zeros(2, 13, dtype=torch.long)
    mask = torch.zeros(2, 13, dtype=torch.long)
    padded[0, 3:], mask[0, 3:] = input_ids[0], 1  # left padding
    padded[1, :10], mask[1, :10] = input_ids[1], 1  # right padding
    with torch.no_grad():
        plain = model(input_ids, num_iterations=3, readout_iterations=[1, 2, 3]).answer_logits
        out = model(padded, attention_mask=mask, query_positions=torch.tensor([[12], [9]]), num_iterations=3,
                    readout_iterations=[1, 2, 3]).answer_logits
        predicted = model.predict(padded, attention_mask=mask, query_positions=torch.tensor([[12], [9]]),
                                  num_iterations=3)
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(predicted.answer_logits, plain[-1], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------------------ NoPE
def test_nope_is_rope_with_every_position_zero_and_ignores_positions():
    nope = make_model(position_encoding="nope")
    rope = make_model(position_encoding="rope")  # same seed: the same weights
    input_ids, qpos = random_batch()
    zeros = torch.zeros_like(input_ids)
    shifted = torch.arange(input_ids.shape[1]).expand_as(input_ids) * 3 + 100
    with torch.no_grad():
        out = nope(input_ids, query_positions=qpos, num_iterations=2).answer_logits
        torch.testing.assert_close(out, rope(input_ids, query_positions=qpos, num_iterations=2,
                                             position_ids=zeros).answer_logits)
        torch.testing.assert_close(out, nope(input_ids, query_positions=qpos, num_iterations=2,
                                             position_ids=shifted).answer_logits)
        assert (rope(input_ids, query_positions=qpos, num_iterations=2).answer_logits - out).abs().max() > 1e-4
    assert torch.equal(nope_positions(shifted), torch.zeros(shifted.shape))


def test_the_scheme_survives_save_and_load(tmp_path):
    model = perturbed_conv(make_model(position_encoding="nope", core_conv_kernel=3))
    model.save_pretrained(tmp_path)
    loaded = ParLoopedQwenForStateTracking.from_pretrained(tmp_path).eval()
    assert loaded.config.position_encoding == "nope" and loaded.config.core_conv_kernel == 3
    input_ids, qpos = random_batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids, query_positions=qpos, num_iterations=3).answer_logits,
                                   model(input_ids, query_positions=qpos, num_iterations=3).answer_logits)
    assert ParLoopedQwenConfig.from_pretrained(tmp_path).position_encoding == "nope"


# ---------------------------------------------------------------------------------------------- interpolation
def test_interpolation_scales_positions_and_refuses_a_scale_past_one():
    from state_tracking.evaluation import interpolated_position_ids

    mask = torch.ones(1, 6, dtype=torch.long)
    torch.testing.assert_close(interpolated_position_ids(mask, 0.5)["position_ids"], torch.arange(6)[None].float() / 2)
    assert interpolated_position_ids(mask, None) == {}
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        interpolated_position_ids(mask, 2.0)


def test_interpolated_evaluation_equals_the_plain_one_in_range_and_not_past_it():
    from state_tracking import build_tokenizer, get_task
    from state_tracking.evaluation import evaluate_length_generalization

    task = get_task("swap_s5")
    tokenizer = build_tokenizer(task, "symbolic")
    from tests.test_trainers import tiny_model

    model = tiny_model().eval()
    kwargs = dict(n_per_depth=16, seed=0, progress=False, train_max_depth=4)
    with pytest.raises(ValueError, match="interpolate_positions=True needs train_max_depth"):
        evaluate_length_generalization(model, tokenizer, task, [4], interpolate_positions=True, n_per_depth=4,
                                       progress=False)
    calls = []
    original = model.predict
    model.predict = lambda *a, **k: calls.append(k.get("position_ids")) or original(*a, **k)
    plain = evaluate_length_generalization(model, tokenizer, task, [2, 8], **kwargs)
    inter = evaluate_length_generalization(model, tokenizer, task, [2, 8], interpolate_positions=True, **kwargs)
    assert calls[:2] == [None, None]
    assert calls[2].max() == calls[2].shape[1] - 1  # d = 2 ≤ d_train: λ = 1
    assert abs(float(calls[3][0, 1] - calls[3][0, 0]) - 0.5) < 1e-6  # d = 8: λ = 4 / 8
    assert inter["per_depth"][0] == plain["per_depth"][0] and inter["interpolate_positions"]


# ----------------------------------------------------------------------------------------------------- trainer
def test_pose_positions_follow_their_formula():
    rng = np.random.default_rng(0)
    for n in (2, 5, 30):
        for _ in range(50):
            p = pose_positions(rng, n, 64)
            steps = np.diff(p)
            jumps = np.flatnonzero(steps != 1)
            assert p[0] == 0 and p[-1] < 64 and len(p) == n and (steps >= 1).all() and len(jumps) <= 1
    assert len({tuple(pose_positions(rng, 10, 64)) for _ in range(50)}) > 10  # cuts and skips vary
    assert pose_positions(rng, 1, 64).tolist() == [0]


def test_pose_reaches_the_model_and_bad_schemes_are_refused(tmp_path, monkeypatch):
    from tests.test_trainers import COLLATOR, DATASET, tiny_args, tiny_model

    trainer = ParTrainer(model=tiny_model(), args=tiny_args(tmp_path, pose_max_positions=128, max_steps=3),
                         train_dataset=DATASET, data_collator=COLLATOR)
    seen = []
    rotary = trainer.model.model.rotary_emb
    original = rotary.forward
    monkeypatch.setattr(rotary, "forward", lambda x, pos: seen.append(pos.clone()) or original(x, pos))
    trainer.train()
    assert seen and any(int((p.diff(dim=-1) > 1).sum()) > 0 for p in seen) and all(p.max() < 128 for p in seen)
    with pytest.raises(ValueError, match=r"pose_max_positions must be None when stretch_steps > 0"):
        tiny_args(tmp_path, pose_max_positions=128, stretch_steps=2)
    with pytest.raises(ValueError, match=r"pose_max_positions must be None or ≥ 2"):
        tiny_args(tmp_path, pose_max_positions=1)
    for scheme in (dict(stretch_steps=2), dict(pose_max_positions=128), dict(random_positions_max=128)):
        with pytest.raises(ValueError, match=r"must be unset with position_encoding='nope'"):
            ParTrainer(model=tiny_model(position_encoding="nope"), args=tiny_args(tmp_path, **scheme),
                       train_dataset=DATASET, data_collator=COLLATOR)


# ------------------------------------------------------------------------------------------ dense prefix targets
def test_prefix_state_targets_are_the_wavefront():
    step_labels = torch.arange(2 * 6 * 3).view(2, 6, 3)  # B = 2, D = 5, Q = 3: z_j of sample b is step_labels[b, j]
    depth = torch.tensor([5, 3])
    for c in (1, 2):
        targets = prefix_state_targets(step_labels, depth, [1, 2, 4], c)
        assert targets.shape == (3, 2, 5, 3)
        for i, k in enumerate([1, 2, 4]):
            for b in range(2):
                for j in range(1, 6):  # operation j's token reads z_j once reached (j ≤ c·k) and before d
                    expected = step_labels[b, j] if j <= min(c * k, int(depth[b])) else torch.full((3,), UNRECORDED)
                    assert torch.equal(targets[i, b, j - 1], expected), (c, k, b, j)
    with pytest.raises(ValueError, match="iterations must be"):
        prefix_state_targets(step_labels, depth, [0, 1], 1)
    with pytest.raises(ValueError, match="step_size must be"):
        prefix_state_targets(step_labels, depth, [1], 0)


def test_the_state_head_reads_its_formula_and_survives_save_and_load(tmp_path):
    model = make_model(prefix_state_queries=3)
    c = len(model.config.answer_token_ids)
    assert model.state_head.weight.shape == (3 * c, model.config.hidden_size)
    states = torch.randn(2, 7, model.config.hidden_size)
    positions = torch.tensor([[1, 4, -1], [0, 6, 2]])
    logits = model.state_logits(states, positions)
    assert logits.shape == (2, 3, 3, c)
    for b in range(2):
        for n in range(3):  # W_z s[b, t], one block of c candidates per query
            t = max(int(positions[b, n]), 0)
            torch.testing.assert_close(logits[b, n].flatten(), model.state_head.weight @ states[b, t])
    model.save_pretrained(tmp_path)
    loaded = ParLoopedQwenForStateTracking.from_pretrained(tmp_path)
    assert loaded.config.prefix_state_queries == 3
    torch.testing.assert_close(loaded.state_logits(states, positions), logits)
    with pytest.raises(ValueError, match="needs ParLoopedQwenConfig.prefix_state_queries > 0"):
        make_model().state_logits(states, positions)
    with pytest.raises(ValueError, match="not a multiple of num_queries=4"):
        prefix_state_logits(states, positions, model.state_head.weight, 4)


@pytest.mark.parametrize("value,view,allowed", [(-1, "full", "an integer ≥ 0"), (2, "local", "0 with loop_view")])
def test_bad_state_heads_are_refused_by_name(value, view, allowed):
    with pytest.raises(ValueError, match=rf"ParLoopedQwenConfig\.prefix_state_queries must be {allowed}"):
        tiny_par_config(prefix_state_queries=value, loop_view=view)


def test_dense_prefix_targets_train_the_state_head_and_add_their_loss(tmp_path):
    from tests.test_trainers import COLLATOR, DATASET, TASK, tiny_args, tiny_model

    def run(weight):
        model = tiny_model(prefix_state_queries=TASK.num_queries)
        trainer = ParTrainer(model=model, args=tiny_args(tmp_path / str(weight), prefix_state_weight=weight,
                                                         max_steps=4), train_dataset=DATASET, data_collator=COLLATOR)
        before = model.state_head.weight.detach().clone()
        trainer.train()
        logs = [e for e in trainer.state.log_history if "loss" in e]
        return model.state_head.weight.detach(), before, logs

    after, before, logs = run(1.0)
    assert not torch.equal(after, before)  # the head is trained
    assert all(e["loss"] == pytest.approx(e["loss_answer"] + e["loss_prefix_state"], rel=1e-3) for e in logs)
    assert all(e["loss_prefix_state"] > 0 for e in logs)
    after, before, logs = run(0.0)
    assert torch.equal(after, before) and all("loss_prefix_state" not in e for e in logs)  # off: not read
    with pytest.raises(ValueError, match="prefix_state_weight > 0 needs a model with a state head"):
        ParTrainer(model=tiny_model(), args=tiny_args(tmp_path, prefix_state_weight=1.0), train_dataset=DATASET,
                   data_collator=COLLATOR)
    with pytest.raises(ValueError, match="prefix_state_weight must be ≥ 0"):
        tiny_args(tmp_path, prefix_state_weight=-1.0)


def test_a_retrofit_may_add_a_state_head(tiny_parent):
    model = ParLoopedQwenForStateTracking.from_pretrained_parent(
        tiny_parent, 2, 2, 2, answer_token_ids=ANSWER_IDS, halt_token_ids=HALT_IDS, prefix_state_queries=2)
    assert model.state_head.weight.shape[0] == 2 * len(ANSWER_IDS)


# ------------------------------------------------------------------------------------------------------- study
def test_every_study_row_parses_with_the_scheme_and_init_its_name_says(tmp_path, monkeypatch):
    from par_studies.parents import Parent

    monkeypatch.setattr(Parent, "ensure", lambda self, quiet=False: tmp_path / "smollm2")
    study = load_example("examples/reproduce/full_view_positions.py")
    train_par = load_example("examples/train_par.py")
    for name in study.ROWS:
        model_args, task_args, train_args = train_par.parse_args(
            argv(study.row_flags(name)) + ["--output_dir", str(tmp_path / name)])
        scheme = study.scheme_of(name)
        assert model_args.loop_view == "full" and name.startswith(("smollm2_", "random_", scheme))
        assert model_args.position_encoding == ("nope" if scheme.startswith("nope") else "rope")
        assert model_args.core_conv_kernel == (4 if scheme.endswith("conv") else 0)
        assert train_args.stretch_steps == (train_args.max_steps if scheme == "stretch_all" else
                                            500 if scheme == "stretch_end" else 0)
        assert train_args.pose_max_positions == {"pose": 1024, "pose_conv": 1024, "pose_near_conv": 320}.get(scheme)
        assert (train_args.random_positions_max is not None) == scheme.startswith("randomized")
        assert (train_args.depth_schedule == "hold") == ("_hold" in name)
        assert train_args.progress_flag_weight == (1.0 if name.endswith(("_flag", "_flag_4k")) else 0.0)
        assert train_args.prefix_state_weight == (1.0 if name.endswith("_dense") else
                                                  0.1 if name.endswith("_dense_light") else 0.0)
        assert train_args.max_train_depth == task_args.probe_depth == (16 if name.endswith("_d16") else
                                                                       12 if name.endswith("_d12") else 8)
        init = study.init_of(name)
        if init == "scratch":
            assert model_args.init_from_parent is None
            assert train_args.per_device_train_batch_size == (32 if name.endswith("_d12") else 64)
        else:  # results/pretrained_swap_s5's smollm2_full_pace_3k setting, pretrained or its random twin
            assert model_args.init_from_parent == str(tmp_path / "smollm2") and model_args.truncate_parent
            assert model_args.parent_weights == ("pretrained" if init == "smollm2" else "random")
            assert train_args.per_device_train_batch_size == 8 and train_args.max_steps == 3000


def test_a_recorded_row_becomes_its_summary_entry_and_table_row():
    study = load_example("examples/reproduce/full_view_positions.py")
    evaluation = {"depths": [8, 16, 32], "accuracy": [0.99, 0.5, 0.01], "grid": [8, 16, 32, 64]}
    record = {"row": "nope_conv", "seed": 0, "steps": 900, "train_seconds": 1000.0, "in_range_reached": True,
              "positions": "nope + causal conv (4)", "hold": False, "stretch": None, "train_max_depth": 8,
              "evaluation": evaluation, "interpolated": None, "command": "c",
              "profile": {"depths": [16], "profile": [[1.0, 0.5]]}}
    second = dict(record, seed=1, evaluation=dict(evaluation, accuracy=[1.0, 0.7, 0.03]))
    (entry,) = study.summary_rows([record, second])
    assert entry["seeds"] == [0, 1] and entry["view"] == "full" and entry["init"] == "scratch"
    assert entry["accuracy"]["16"] == {"mean": pytest.approx(0.6), "per_seed": [0.5, 0.7]}
    assert entry["accuracy"]["64"]["per_seed"] == [0.0, 0.0]  # cut by the stop rule: counted 0
    table = study.rows_table([record])
    assert "| nope_conv | 0 | 900 | 1000 | yes | 8 | 99.00 | 50.00 | 1.00 | 0.00 | – |" in table
    assert "profile" not in table  # the profiles go to profiles.md
    assert "| nope_conv | 0 | profile | 16 | 100 50 |" in study.profiles_table([record])


def test_a_tiny_row_trains_tests_profiles_and_collects(tmp_path, monkeypatch, scripts_in_process):
    """The study end to end at tiny scale (train_par.py in this process): a rotary row gets its interpolated grid and
    profile, a NoPE row none; the record's command is the one that ran; --collect writes summary.json and the table."""
    study = load_example("examples/reproduce/full_view_positions.py")
    monkeypatch.setattr(study, "OUT", tmp_path / "results")
    monkeypatch.setattr(study, "RUN_DIR", tmp_path / "runs")
    monkeypatch.setattr(study, "N", 8)
    monkeypatch.setattr(study, "N_INTERPOLATED", 8)
    monkeypatch.setattr(study, "PROFILE_N", 8)
    monkeypatch.setattr(study, "POINTER_N", 4)
    original = study.row_flags
    tiny = {"--max_steps": "3", "--hidden_size": "16", "--intermediate_size": "32", "--num_attention_heads": "2",
            "--num_key_value_heads": "2", "--probe_n": "4", "--eval_n": "4", "--save_steps": "2",
            "--max_train_depth": "2", "--probe_depth": "2", "--eval_depths": "2"}
    monkeypatch.setattr(study, "row_flags", lambda row, seed=0: {**original(row, seed), **tiny})
    monkeypatch.setattr(study, "train_max_depth", lambda row: 2)
    for row in ("conv", "nope_conv"):
        record = study.run_row(row, 0)
        assert record["evaluation"]["grid"] == [2, 4, 8, 16] and record["steps"] == 3
        assert record["train_commands"] == ["python " + " ".join(scripts_in_process[-1])]
        assert "--core_conv_kernel 4" in record["train_commands"][0]
        assert record["profile"]["depths"] == [4, 8] and record["padding_control"]["padding_control_depth"] == 2
        assert (record["interpolated"] is None) == (row == "nope_conv")
        assert record["attention_pointer"]["depths"] == [2, 4, 8]  # d_train, 2x, 4x
        assert [len(layers) for layers in record["attention_pointer"]["on_target"]] == [2, 2, 2]  # the core's layers
        assert ("profile_interpolated" in record) == (row == "conv")
    paused = study.profile_checkpoint("conv", 0)  # a stopped row's newest checkpoint, profiled
    assert paused["step"] in (2, 3) and paused["profile"]["depths"] == [1, 2, 4, 8]
    assert (tmp_path / "results" / "checkpoints" / "conv_s0.json").is_file()
    (tmp_path / "results" / "README.md").write_text(f"x\n{study.TABLE_START}\n{study.TABLE_END}\ny\n")
    summary = study.collect()
    assert [r["row"] for r in summary["rows"]] == ["nope_conv", "conv"]  # the study's row order
    assert summary["rows"][1]["accuracy_interpolated"] is not None
    readme = (tmp_path / "results" / "README.md").read_text()
    profiles = (tmp_path / "results" / "profiles.md").read_text()
    assert "| conv | 0 | 3 |" in readme and "| conv | 0 | attention on operation k, core layer 2 | 4 |" in profiles
    before = json.loads(study.record_path("conv", 0).read_text())["attention_pointer"]
    assert study.add_pointer("conv", 0)["attention_pointer"]["on_target"] == before["on_target"]  # --pointer again
    assert (tmp_path / "results" / "profiles.png").is_file()
    # --export: the row as a Hub folder that serves raw text by remote code alone (checkpoints/par-swap-s5-full)
    from transformers import pipeline

    shipped = study.export("conv", 0, target=tmp_path / "par-swap-s5-full")
    card = (shipped / "README.md").read_text()
    assert "full view" in card and "d ≤ 2" in card and "iterations 1, 2, ... read z_k right" in card
    assert json.loads((shipped / "training_summary.json").read_text())["steps"] == 3
    tracker = pipeline("state-tracking", model=str(shipped), trust_remote_code=True)
    task = load_task("examples/tasks/swap_s5_short.json")
    prompt, _ = text_prompt(task, np.array([1, 2]))
    got = tracker(prompt)
    assert got["depth"] == 2 and got["iterations"] == 2 and set(got["answers"]) == set(task.query_names)
    with pytest.raises(SystemExit, match="from-scratch row"):
        study.export("smollm2_pose", 0, target=tmp_path / "x")


def test_the_wavefront_profile_reads_the_state_head_at_each_operations_last_token():
    from state_tracking import StateTrackingCollator, encode_batch
    from state_tracking.data import derive_seed
    from state_tracking.diagnostics import wavefront_profile
    from tests.test_trainers import TASK, TOKENIZER, tiny_model

    model = tiny_model(prefix_state_queries=TASK.num_queries).eval()
    got = wavefront_profile(model, TOKENIZER, TASK, [3, 5], n_per_depth=12, seed=2, rendering="symbolic")
    assert got["depths"] == [3, 5] and [len(row) for row in got["wavefront"]] == [3, 5]
    for depth, row in zip([3, 5], got["wavefront"]):  # by hand: the head at each operation's end after R = d
        ops = TASK.sample_ops(np.random.default_rng(derive_seed("wavefront", 2, depth)), 12, depth)
        batch = StateTrackingCollator(TOKENIZER.pad_token_id, padding_side="right")(
            encode_batch(TASK, TOKENIZER, "symbolic", ops, None))
        with torch.no_grad():
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], num_iterations=depth, output_loop_states=True)
            read = model.state_head(out.loop_states[-1]).unflatten(-1, (TASK.num_queries, -1)).argmax(-1)
        ends = batch["operation_ends"][:, 1:]
        at_ends = read.gather(1, ends[..., None].expand(-1, -1, TASK.num_queries)).numpy()
        expected = (at_ends == TASK.prefix_states(ops, None)[:, 1:]).all(-1).mean(0)
        assert row == pytest.approx(expected.round(4).tolist())
    # a head right at the odd operations only: the profile says exactly that
    def half_right(states, positions):
        depth = positions.shape[1]
        truth = TASK.prefix_states(TASK.sample_ops(np.random.default_rng(derive_seed("wavefront", 2, depth)), 12,
                                                   depth), None)[:, 1:]
        truth[:, 1::2] = (truth[:, 1::2] + 1) % len(model.config.answer_token_ids)
        return torch.nn.functional.one_hot(torch.as_tensor(truth), len(model.config.answer_token_ids)).float()

    model.state_logits = half_right
    assert wavefront_profile(model, TOKENIZER, TASK, [5], n_per_depth=12, seed=2,
                             rendering="symbolic")["wavefront"] == [[1.0, 0.0, 1.0, 0.0, 1.0]]
    with pytest.raises(ValueError, match="needs a model with a state head"):
        wavefront_profile(tiny_model(), TOKENIZER, TASK, [3], n_per_depth=2, rendering="symbolic")


def test_operation_attention_sums_the_queries_attention_over_each_operations_tokens():
    from state_tracking.diagnostics import operation_attention

    weights = torch.zeros(1, 2, 8, 8)  # tokens: preamble 0-1 | op 1: 2-3 | op 2: 4-6 | query 7
    weights[0, 0, 7] = torch.tensor([0.1, 0.1, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1])
    weights[0, 1, 7] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0])
    mass = operation_attention(weights, torch.tensor([[7]]), torch.tensor([[1, 3, 6]]))
    assert mass[0].tolist() == pytest.approx([0.2, 0.65])  # heads averaged: (0.4 + 0) / 2, (0.3 + 1.0) / 2


def test_the_attention_pointer_profile_follows_the_core_layers_at_every_iteration():
    from state_tracking.diagnostics import attention_pointer_profile, operation_attention
    from tests.test_trainers import TASK, TOKENIZER, tiny_model

    model = tiny_model(loop_view="full", progress_positions=False, bidirectional_queries=False, core_layers=2).eval()
    got = attention_pointer_profile(model, TOKENIZER, TASK, [3, 5], n_per_depth=10, seed=1, batch_size=4,
                                    rendering="symbolic")
    assert model.config._attn_implementation != "eager"  # restored
    assert got["depths"] == [3, 5]
    for depth, on_target, pointer, mass in zip([3, 5], got["on_target"], got["pointer"], got["mass"]):
        assert len(on_target) == len(pointer) == len(mass) == 2  # two core layers
        assert all(len(row) == depth for row in on_target + pointer + mass)  # one per iteration
        assert all(1 <= p <= depth for row in pointer for p in row)
        assert all(0 <= a <= 1 for row in on_target + mass for a in row)
    # by hand for depth 3, layer 1, iteration 2: the same problems, the second core layer's second call
    from state_tracking import StateTrackingCollator, encode_batch
    from state_tracking.data import derive_seed

    ops = TASK.sample_ops(np.random.default_rng(derive_seed("attention_pointer", 1, 3)), 10, 3)
    batch = StateTrackingCollator(TOKENIZER.pad_token_id, padding_side="right")(
        encode_batch(TASK, TOKENIZER, "symbolic", ops, None))
    caught = []
    hook = model.core[1].self_attn.register_forward_hook(lambda m, a, out: caught.append(out[1]))
    model.config._attn_implementation = "eager"
    try:
        with torch.inference_mode():
            model(batch["input_ids"], attention_mask=batch["attention_mask"],
                  query_positions=batch["query_positions"], num_iterations=3)
    finally:
        model.config._attn_implementation = "sdpa"
        hook.remove()
    mass = operation_attention(caught[1], batch["query_positions"], batch["operation_ends"])
    assert got["on_target"][0][1][1] == pytest.approx(float((mass.argmax(-1) + 1 == 2).float().mean()), abs=1e-4)
    assert got["mass"][0][1][1] == pytest.approx(float(mass[:, 1].mean()), abs=1e-4)
    with pytest.raises(ValueError, match="full view"):
        attention_pointer_profile(tiny_model(loop_view="local"), TOKENIZER, TASK, [3], n_per_depth=2,
                                  rendering="symbolic")


def test_a_fine_tuned_row_starts_from_its_source_row_of_the_same_seed(tmp_path, monkeypatch):
    """`<scheme>_hold_ft` fine-tunes the scheme's own run of the same seed (its folder filled in by row_flags), and
    refuses to start, naming the row to run first, while that run has not finished."""
    study = load_example("examples/reproduce/full_view_positions.py")
    monkeypatch.setattr(study, "RUN_DIR", tmp_path / "runs")
    flags = study.row_flags("pose_conv_hold_ft", 2)
    assert flags["--init_from_par"] == str(tmp_path / "runs" / "pose_conv_s2")
    assert flags["--depth_schedule"] == "hold" and flags["--max_steps"] == "500"
    assert "--probe_stop_accuracy" not in flags  # it starts in range: the stop rule would end it at its first probe
    with pytest.raises(SystemExit, match="pose_conv_s2, which has not finished training; run that row with --seed 2"):
        study.run_row("pose_conv_hold_ft", 2)
