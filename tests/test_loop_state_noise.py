"""Loop-state noise (`config.loop_state_noise`, `perturb_loop_state`): formula, training only, refusals, the flag."""

from __future__ import annotations

import pytest
import torch

from modeling_par import ParLoopedQwenForStateTracking
from modeling_par.modeling_par import perturb_loop_state, state_rms
from tests.conftest import load_example, make_model, tiny_par_config
from tests.test_modeling_par import random_batch


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), True, "0.1"])
def test_bad_noise_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"ParLoopedQwenConfig\.loop_state_noise must be a finite number ≥ 0"):
        tiny_par_config(loop_state_noise=value)


def test_noise_is_refused_outside_the_full_view():
    with pytest.raises(ValueError, match=r"loop_state_noise must be 0 with loop_view='local'"):
        tiny_par_config(loop_state_noise=0.1, loop_view="local")


def test_perturb_loop_state_follows_its_formula():
    g = torch.Generator().manual_seed(0)
    state, rms = torch.randn(4, 50, 64, generator=g), torch.rand(4, 50, 1, generator=g) + 0.5
    torch.manual_seed(7)
    out = perturb_loop_state(state, rms, 0.3)
    torch.manual_seed(7)
    torch.testing.assert_close(out, state + torch.randn_like(state) * 0.3 * rms)
    z = (out - state) / (0.3 * rms)  # ε ~ N(0, I) per element (12,800 draws: the mean's sd is 0.009)
    assert abs(float(z.mean())) < 0.03 and abs(float(z.std()) - 1.0) < 0.03


def _logits(model, train: bool, seed: int = 0):
    input_ids, qpos = random_batch()
    model.train(train)
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(input_ids, query_positions=qpos, num_iterations=4).answer_logits


def test_noise_acts_in_training_only_and_survives_save_and_load(tmp_path):
    model = make_model(loop_state_noise=0.5)
    clean = make_model(loop_state_noise=0.0)
    clean.load_state_dict(model.state_dict())
    assert torch.equal(_logits(model, train=False), _logits(clean, train=False))  # evaluation: no noise
    assert torch.equal(_logits(clean, train=True), _logits(clean, train=False))  # σ = 0: training computes the same
    noisy = _logits(model, train=True)
    assert not torch.allclose(noisy, _logits(clean, train=False), atol=1e-3)  # σ > 0: training is perturbed ...
    assert torch.equal(noisy, _logits(model, train=True))  # ... by torch's global generator (same seed, same draw)
    assert not torch.equal(noisy, _logits(model, train=True, seed=1))
    model.save_pretrained(tmp_path)
    assert ParLoopedQwenForStateTracking.from_pretrained(tmp_path).config.loop_state_noise == 0.5


def test_every_iterations_state_gets_noise_of_its_reference_scale(monkeypatch):
    """In training, the core's anchored output s_k gets σ · rms(s_1) · ε: the perturbation's per-token rms over the
    hidden size is σ · rms(s_1) (the anchoring makes rms(s_k) = rms(s_1) before it)."""
    import modeling_par.modeling_par as modeling

    model = make_model(loop_state_noise=0.2)
    deltas = []

    def spy(state, reference_rms, std):
        out = perturb_loop_state(state, reference_rms, std)
        deltas.append(((out - state), reference_rms, state_rms(state)))
        return out

    monkeypatch.setattr(modeling, "perturb_loop_state", spy)
    _logits(model, train=True)
    assert len(deltas) == 4  # one per iteration
    for k, (delta, reference, rms) in enumerate(deltas, start=1):
        ratio = state_rms(delta) / (0.2 * reference)
        assert abs(float(ratio.mean()) - 1.0) < 0.1, k
        if k > 1:  # anchored: the state's rms is its reference
            torch.testing.assert_close(rms, reference.float(), rtol=1e-4, atol=1e-5)


def test_the_flag_reaches_a_new_model_and_a_fine_tuned_checkpoint(tmp_path):
    from trainers.model_setup import initial_model, par_fields

    parse_args = load_example("examples/train_par.py").parse_args
    base = ["--output_dir", str(tmp_path / "out"), "--max_steps", "1"]
    model_args, _, train_args = parse_args([*base, "--loop_state_noise", "0.25"])
    assert par_fields(model_args, train_args)["loop_state_noise"] == 0.25
    saved = make_model()
    saved.save_pretrained(tmp_path / "par")
    ids = {"answer_token_ids": list(saved.config.answer_token_ids)}
    model_args, _, _ = parse_args([*base, "--init_from_par", str(tmp_path / "par"), "--loop_state_noise", "0.25"])
    assert initial_model(model_args, ids, {}).config.loop_state_noise == 0.25
    model_args, _, _ = parse_args([*base, "--init_from_par", str(tmp_path / "par")])
    assert initial_model(model_args, ids, {}).config.loop_state_noise == 0.0  # not given: the checkpoint's own


def test_the_break_depth_study_reads_noise_in_training_mode_and_restores_the_model(monkeypatch):
    """full_view_break_depth: σ = 0 gives the plain profile, σ > 0 lowers it, and the model comes back in eval mode
    with σ = 0 and its own eval()."""
    from modeling_par import ParLoopedQwenForStateTracking
    from state_tracking import build_tokenizer, load_task
    from state_tracking.diagnostics import progress_profile

    study = load_example("examples/studies/full_view_break_depth.py")
    assert study.first_below([1.0, 0.95, 0.6, 0.4], 0.9) == 3 and study.first_below([1.0, 0.95], 0.5) is None
    monkeypatch.setattr(study, "NOISE_DEPTHS", (6,))
    model = ParLoopedQwenForStateTracking.from_pretrained(study.REPO / "checkpoints" / "par-swap-s5-full").eval()
    task = load_task(study.REPO / study.TASK_FILE)
    tokenizer = build_tokenizer(task, "text")
    plain = progress_profile(model, tokenizer, task, (6,), n_per_depth=16, seed=1, batch_size=16, rendering="text")
    assert study.noisy_profile(model, tokenizer, task, 0.0, 16, 1) == plain["profile"]
    noisy = study.noisy_profile(model, tokenizer, task, 3.0, 16, 1)[0]
    assert sum(noisy) < sum(plain["profile"][0]) - 1.0
    assert not model.training and model.config.loop_state_noise == 0.0 and "eval" not in vars(model)
