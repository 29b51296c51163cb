"""The training probes (StateAccuracyProbeCallback, RecordsProbeCallback): probing on fixed problems and across a
resume, restoring the best probe's weights, the eager fallback when the compiler fails on the probe's shapes, the early
stop. Moved whole from test_trainers.py; its shared helpers are imported from there."""

import functools
import json

import numpy as np
import pytest
import torch
import transformers

from tests.test_trainers import COLLATOR, DATASET, IDS, TASK, TOKENIZER, losses, tiny_args, tiny_model
from trainers import ParTrainer


def test_state_accuracy_probe_logs_every_n_steps_on_fixed_problems_and_survives_resume(tmp_path):
    """StateAccuracyProbeCallback: a probe at step 0 and every N steps, each scoring the same problems (the
    evaluator's draw for that depth, n and seed) in eval mode, the model back in train mode after; its accuracy is the
    evaluator's on those problems, in one batch or several; training is unchanged by it; a run resumed from a
    checkpoint keeps the checkpoint's probes and adds the later ones, equal to the uninterrupted run's."""
    from state_tracking import evaluate_length_generalization
    from state_tracking.evaluation import draw_test_problems
    from trainers import StateAccuracyProbeCallback

    depth, n, every = 4, 12, 2
    local = dict(loop_view="local", progress_positions=True, bidirectional_queries=True)

    def train(folder, probe=True, resume=None):
        model = tiny_model(**local)
        calls = []  # (rows, input_ids, training mode) of each predict call
        predict = model.predict

        @functools.wraps(predict)  # the same signature: the evaluator passes operation_ends
        def spy(input_ids, **kwargs):
            calls.append((input_ids.shape[0], input_ids.clone(), model.training))
            return predict(input_ids, **kwargs)

        model.predict = spy
        args = tiny_args(folder, max_steps=6, save_strategy="steps", save_steps=2, curriculum_start_depth=2,
                         curriculum_every_steps=2)
        trainer = ParTrainer(model=model, args=args, train_dataset=DATASET, data_collator=COLLATOR)
        if probe:
            trainer.add_callback(StateAccuracyProbeCallback(TOKENIZER, TASK, depth, n=n, every_steps=every, seed=3))
        trainer.train(resume_from_checkpoint=resume)
        probes = [e for e in trainer.state.log_history if "probe_accuracy" in e]
        return trainer, probes, calls

    full, probes, calls = train(tmp_path / "a")
    assert [p["step"] for p in probes] == [0, 2, 4, 6]
    assert all(0.0 <= p["probe_accuracy"] <= 1.0 and (p["probe_depth"], p["probe_n"]) == (depth, n) for p in probes)
    scored = [ids for rows, ids, _ in calls if rows == n]
    assert len(scored) == 4 and all(torch.equal(ids, scored[0]) for ids in scored)  # the same problems every time
    assert not any(training for *_, training in calls) and full.model.training
    final = evaluate_length_generalization(full.model, TOKENIZER, TASK, [depth], n_per_depth=n, seed=3,
                                           progress=False)
    assert probes[-1]["probe_accuracy"] == final["accuracy"][0]
    batched = StateAccuracyProbeCallback(TOKENIZER, TASK, depth, n=n, seed=3, batch_size=5)  # 5 + 5 + 2 rows
    assert batched.evaluate(full.model.train()) == final["accuracy"][0] and full.model.training
    assert np.array_equal(batched.ops, draw_test_problems(TASK, depth, n, 3)[0])
    state = json.loads((tmp_path / "a" / "out" / "checkpoint-4" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "probe_accuracy" in e] == [0, 2, 4]  # saved with the step

    unprobed, _, _ = train(tmp_path / "b", probe=False)
    assert losses(unprobed) == pytest.approx(losses(full), rel=1e-6)  # the probe leaves training as it was

    _, resumed_probes, resumed_calls = train(tmp_path / "c", resume=str(tmp_path / "a" / "out" / "checkpoint-4"))
    assert [p["step"] for p in resumed_probes] == [0, 2, 4, 6]
    assert resumed_probes[-1]["probe_accuracy"] == pytest.approx(probes[-1]["probe_accuracy"])
    assert torch.equal([ids for rows, ids, _ in resumed_calls if rows == n][0], scored[0])  # drawn again, the same
    with pytest.raises(ValueError, match="every_steps must be an integer >= 1"):
        StateAccuracyProbeCallback(TOKENIZER, TASK, depth, every_steps=0)


def test_records_probe_restores_the_weights_of_its_best_probe_when_the_final_ones_score_lower(tmp_path):
    """The Trainer's best-model machinery following the probe (metric_for_best_model="probe_accuracy",
    load_best_model_at_end): probes every 2 steps score 0.2, 0.9, 0.4 (steps 2, 4, 6) and the final weights (step 7,
    probed as the last step) 0.3: the run ends with exactly the weights it had at step 4, which its checkpoint-4 on
    disk holds, and says so in the log. Without the best-model arguments, or when the final probe is the best, the
    final weights stay."""
    from safetensors.torch import load_file

    from trainers import RecordsProbeCallback

    class Scripted(RecordsProbeCallback):
        script = {2: 0.2, 4: 0.9, 6: 0.4, 7: 0.3}

        def evaluate(self, model):
            return self.script[self.step]

        def _probe(self, state, model):
            self.step = state.global_step
            return super()._probe(state, model)

    class Snapshots(transformers.TrainerCallback):  # the weights after every step
        def __init__(self):
            self.at = {}

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.at[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def train(folder, best=True, script=None):
        best_model = dict(metric_for_best_model="probe_accuracy", load_best_model_at_end=True) if best else {}
        trainer = ParTrainer(model=tiny_model(), args=tiny_args(folder, max_steps=7, **best_model),
                             train_dataset=DATASET, data_collator=COLLATOR)
        probe = Scripted(DATASET.select(range(8)), IDS["pad_token_id"], every_steps=2)
        if script:
            probe.script = script
        snapshots = Snapshots()
        trainer.add_callback(snapshots)
        trainer.add_callback(probe)
        trainer.train()
        return trainer, snapshots.at

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)

    trainer, at = train(tmp_path / "a")
    final = trainer.model.state_dict()
    assert same(final, at[4]) and not same(final, at[7])
    assert same(load_file(tmp_path / "a" / "out" / "checkpoint-4" / "model.safetensors"), at[4])
    assert trainer.state.best_model_checkpoint == str(tmp_path / "a" / "out" / "checkpoint-4")
    assert [row for row in trainer.state.log_history if "probe_restored_step" in row] == [
        {"step": 7, "probe_restored_step": 4, "probe_restored_accuracy": 0.9}]
    assert [row["step"] for row in trainer.state.log_history if "probe_accuracy" in row] == [2, 4, 6, 7]
    trainer, at = train(tmp_path / "b", best=False)
    assert same(trainer.model.state_dict(), at[7]) and not list((tmp_path / "b" / "out").glob("checkpoint-*"))
    assert [row["step"] for row in trainer.state.log_history if "probe_accuracy" in row] == [2, 4, 6]
    trainer, at = train(tmp_path / "c", script={2: 0.2, 4: 0.9, 6: 0.4, 7: 0.9})  # as good as the best: it stays
    assert same(trainer.model.state_dict(), at[7]) and trainer.state.best_global_step == 7
    assert not any("probe_restored_step" in row for row in trainer.state.log_history)


def test_a_probe_whose_compiled_shapes_fail_runs_eagerly_and_training_stays_compiled(tmp_path):
    """A probe on shapes torch.compile cannot compile (measured: an InductorError at the first probe after a resume
    ended a 70-minute run) is probed eagerly, the same accuracies as an eager run's, with one warning; the model's
    compiled parts are kept for training; an error that is not the compiler's is raised."""
    from torch._inductor.exc import InductorError

    from modeling_par.compile_support import eager_parts
    from trainers import StateAccuracyProbeCallback

    local = dict(loop_view="local", progress_positions=True, bidirectional_queries=True)

    class FailsInEval:
        """Stands for compiled parts: the eager functions in training, a compiler error (or `error`) in eval mode."""

        def __init__(self, model, error):
            self.parts, self.model, self.error, self.failures = eager_parts(model), model, error, 0

        def __getattr__(self, name):
            function = getattr(self.parts, name)

            def call(*args, **kwargs):
                if not self.model.training:
                    self.failures += 1
                    raise self.error
                return function(*args, **kwargs)
            return call

    def train(folder, error=None):
        model = tiny_model(**local)
        fake = FailsInEval(model, error) if error is not None else None
        model.compiled = fake
        args = tiny_args(folder, max_steps=4)
        trainer = ParTrainer(model=model, args=args, train_dataset=DATASET, data_collator=COLLATOR)
        trainer.add_callback(StateAccuracyProbeCallback(TOKENIZER, TASK, 4, n=8, every_steps=2, seed=3))
        trainer.train()
        return [e["probe_accuracy"] for e in trainer.state.log_history if "probe_accuracy" in e], model, fake

    eager, _, _ = train(tmp_path / "eager")
    with pytest.warns(UserWarning, match="torch.compile failed on the probe's shapes .*probing eagerly"):
        probed, model, fake = train(tmp_path / "fails", InductorError(ValueError("Exponent must be non-negative."),
                                                                      None))
    assert len(probed) == 3 and probed == eager
    assert fake.failures == 1 and model.compiled is fake  # tried compiled once; training kept its compiled parts
    with pytest.raises(RuntimeError, match="not the compiler"):
        train(tmp_path / "other", RuntimeError("not the compiler"))


def test_state_accuracy_probe_early_stop_after_patience_probes_and_across_a_resume(tmp_path):
    """stop_accuracy: training stops at the probe step where the last `stop_patience` probes all reached it (not at
    the first such probe), the stop is logged and that step's checkpoint saved; resumed from a checkpoint whose
    history already holds one such probe, it stops at the next one (the count comes from the log history)."""
    from trainers import StateAccuracyProbeCallback

    class Scripted(StateAccuracyProbeCallback):  # the accuracy a probe at step s reports
        script = {0: 0.0, 2: 0.5, 4: 0.995, 6: 0.2, 8: 0.999, 10: 1.0, 12: 1.0}

        def evaluate(self, model):
            return self.script[self.step]

        def _probe(self, state, model):
            self.step = state.global_step
            super()._probe(state, model)

    def train(folder, resume=None, gated=False):
        # gated: d_max 2, 4, 6 from steps 0, 5, 10 (0-based), the probe's stop waiting for the curriculum
        pace = dict(curriculum_start_depth=2, curriculum_every_steps=5, curriculum_increment=2) if gated else {}
        args = tiny_args(folder, max_steps=14, save_strategy="steps", save_steps=2, **pace)
        trainer = ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
        trainer.add_callback(Scripted(TOKENIZER, TASK, 2, n=4, every_steps=2, seed=0, stop_accuracy=0.99,
                                      stop_patience=2, curriculum_cap=trainer.curriculum_cap if gated else None))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    trainer = train(tmp_path / "a")  # 0.995 at step 4 alone does not stop it (6 falls back); 8 and 10 do
    assert trainer.state.global_step == 10
    assert [e["step"] for e in trainer.state.log_history if "probe_stop" in e] == [10]
    assert (tmp_path / "a" / "out" / "checkpoint-10").is_dir()
    resumed = train(tmp_path / "b", resume=str(tmp_path / "a" / "out" / "checkpoint-8"))  # holds 0.999 at step 8
    assert resumed.state.global_step == 10
    # the records rule, through ParTrainer.curriculum_cap: the exact probes at 8 and 10 wait, since the last of the
    # 10 steps trained (0-based 9) had d_max 4 (6 is the cap of the step after it); the probe at 12 stops the run
    gated = train(tmp_path / "c", gated=True)
    assert gated.state.global_step == 12
    assert [e["step"] for e in gated.state.log_history if "probe_stop" in e] == [12]
    for bad, field in ((dict(stop_accuracy=0.0), "stop_accuracy"), (dict(stop_accuracy=1.5), "stop_accuracy"),
                       (dict(stop_accuracy=0.9, stop_patience=0), "stop_patience")):
        with pytest.raises(ValueError, match=f"{field} must be"):
            StateAccuracyProbeCallback(TOKENIZER, TASK, 2, n=4, **bad)
