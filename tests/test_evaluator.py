import importlib.util
import json
import math
import os
from types import SimpleNamespace

import evaluate
import numpy as np
import pytest
import torch
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel

from state_tracking import (
    STATE_ACCURACY_METRIC_PATH,
    StateTrackingCollator,
    build_tokenizer,
    derive_seed,
    encode_batch,
    evaluate_length_generalization,
    extrapolation_factor,
    get_task,
    load_results,
    load_task,
    longest_accurate_depth,
    model_token_ids,
    overall_state_accuracy,
    per_query_accuracy,
    plot_accuracy_vs_depth,
    save_results,
    save_task,
)
from state_tracking.prompts import query_token

SWAP = get_task("swap_s5")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Fake models obeying the model.predict contract
# ---------------------------------------------------------------------------------------------
class OracleConfig(PretrainedConfig):
    model_type = "state_tracking_test_oracle"

    def __init__(self, task_spec=None, rendering="symbolic", vocabulary=None, answer_token_ids=None,
                 step_size=1, max_iterations=4096, halt_max_depth=None, **kwargs):
        self.task_spec = task_spec
        self.rendering = rendering
        self.vocabulary = vocabulary  # token string per id
        self.answer_token_ids = answer_token_ids
        self.step_size = step_size
        self.max_iterations = max_iterations
        self.halt_max_depth = halt_max_depth
        super().__init__(**kwargs)


class OracleModel(PreTrainedModel):
    """Reads the problem back from the prompt and applies its first min(c·R, d) operations, like a
    perfect PAR loop: forced R >= d / c gives z_d, fewer iterations an earlier prefix state.
    Halting: R = ceil(d / c), halted only when d <= halt_max_depth. Asserts that every query
    position points at the query's token."""

    config_class = OracleConfig

    def __init__(self, config):
        super().__init__(config)
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.seen_prompts = []
        self.post_init()

    def _init_weights(self, module):
        pass

    def predict(self, input_ids, attention_mask=None, query_positions=None, num_iterations=None, halting=False):
        task = load_task(self.config.task_spec)
        words, c = self.config.vocabulary, self.config.step_size
        answers, iterations, halted = [], [], []
        for b in range(len(input_ids)):
            tokens = [words[i] for i in input_ids[b][attention_mask[b].bool()].tolist()]
            self.seen_prompts.append(" ".join(tokens))
            at_queries = [words[i] for i in input_ids[b][query_positions[b]].tolist()]
            if self.config.rendering == "symbolic":
                assert at_queries == [query_token(q) for q in range(task.num_queries)]
                ops, initial = self._read_symbolic(task, tokens)
            else:
                assert at_queries == ["the"] * task.num_queries
                ops, initial = self._read_text(task, tokens)
            d = len(ops)
            if halting:
                rounds = math.ceil(d / c)
                halted.append(self.config.halt_max_depth is None or d <= self.config.halt_max_depth)
            else:
                rounds = int(num_iterations if isinstance(num_iterations, int) else num_iterations[b])
                halted.append(True)
            steps = min(c * rounds, d)
            answers.append(task.final_states(np.array(ops[:steps], dtype=np.int64).reshape(1, steps), initial)[0])
            iterations.append(rounds)
        return SimpleNamespace(
            answers=torch.tensor(np.stack(answers)), iterations=torch.tensor(iterations), halted=torch.tensor(halted)
        )

    @staticmethod
    def _read_symbolic(task, tokens):
        ops = [task.op_names.index(t) for t in tokens if t in task.op_names]
        shown = tokens[1 : 1 + task.num_queries]
        initial = (np.array([[task.candidate_names.index(t) for t in shown]]) if shown[0] in task.candidate_names
                   else None)
        return ops, initial

    @staticmethod
    def _read_text(task, tokens):
        """Group tasks: 'Box b contains the ITEM .' sentences, then one sentence per op."""
        sentences, current = [], []
        for token in tokens[1:]:  # skip <bos>
            current.append(token)
            if token == ".":
                sentences.append(tuple(current))
                current = []
        op_sentences = {tuple(w for w, _ in Whitespace().pre_tokenize_str(text)): o
                        for o, text in enumerate(task.op_texts)}
        initial = [task.candidate_names.index(s[4]) for s in sentences[: task.num_queries]]
        ops = [op_sentences[s] for s in sentences[task.num_queries :]]
        return ops, np.array([initial])


class RandomModel(torch.nn.Module):
    """Uniform random answers: overall accuracy ~ 1/5^5 on swap-S5, per box ~ 1/5."""

    def __init__(self, task, step_size=1):
        super().__init__()
        self.config = OracleConfig(task_spec=task.to_dict(), step_size=step_size)
        self.num_candidates, self.num_queries = task.num_candidates, task.num_queries
        self.generator = torch.Generator().manual_seed(0)

    @property
    def device(self):
        return torch.device("cpu")

    def predict(self, input_ids, attention_mask=None, query_positions=None, num_iterations=None, halting=False):
        batch = len(input_ids)
        answers = torch.randint(self.num_candidates, (batch, self.num_queries), generator=self.generator)
        return SimpleNamespace(answers=answers, iterations=torch.ones(batch, dtype=torch.long),
                               halted=torch.ones(batch, dtype=torch.bool))


AutoConfig.register(OracleConfig.model_type, OracleConfig, exist_ok=True)
AutoModel.register(OracleConfig, OracleModel, exist_ok=True)


def make_oracle(task, tokenizer, rendering="symbolic", **config):
    vocab = tokenizer.get_vocab()
    vocabulary = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    answer_ids = model_token_ids(tokenizer, task)["answer_token_ids"]
    return OracleModel(OracleConfig(task_spec=task.to_dict(), rendering=rendering, vocabulary=vocabulary,
                                    answer_token_ids=answer_ids, **config))


# ---------------------------------------------------------------------------------------------
# Extrapolation factor
# ---------------------------------------------------------------------------------------------
def test_extrapolation_factor_on_synthetic_curves():
    depths = [32, 64, 128, 256, 512]
    assert longest_accurate_depth(depths, [1.0, 1.0, 0.9, 0.6, 0.4]) == 256
    assert extrapolation_factor(depths, [1.0, 1.0, 0.9, 0.6, 0.4], 32) == 8.0
    assert extrapolation_factor(depths, [1.0, 0.5, 0.49, 0.2, 0.0], 32) == 2.0  # 0.5 itself counts
    assert extrapolation_factor(depths, [1.0, 0.4, 0.9, 0.9, 0.9], 32) == 1.0  # cut at the first failure
    assert extrapolation_factor(depths, [1.0] * 5, 32) == 16.0  # a lower bound: every depth passed
    assert extrapolation_factor(depths, [0.3, 0.2, 0.1, 0.0, 0.0], 32) == 0.0
    assert extrapolation_factor([512, 32, 128], [0.1, 1.0, 0.7], 16) == 8.0  # order of the lists does not matter
    with pytest.raises(ValueError, match="equal length"):
        extrapolation_factor([32, 64], [1.0], 32)
    with pytest.raises(ValueError, match="distinct"):
        extrapolation_factor([32, 32], [1.0, 1.0], 32)
    with pytest.raises(ValueError, match="train_max_depth must be a positive integer"):
        extrapolation_factor([32], [1.0], 0)


# ---------------------------------------------------------------------------------------------
# The evaluator end to end
# ---------------------------------------------------------------------------------------------
def test_forced_oracle_is_exact():
    tokenizer = build_tokenizer(SWAP)
    model = make_oracle(SWAP, tokenizer, step_size=2)
    results = evaluate_length_generalization(
        model, tokenizer, SWAP, [16, 1, 7], n_per_depth=96, seed=1, batch_size=40, train_max_depth=4, progress=False
    )
    assert results["depths"] == [1, 7, 16]
    assert results["accuracy"] == [1.0, 1.0, 1.0]
    for row, depth in zip(results["per_depth"], [1, 7, 16]):
        assert row["num_iterations"] == math.ceil(depth / 2) == row["mean_iterations"]
        assert row["fraction_not_halted"] == 0.0 and row["n"] == 96
        assert row["per_query_accuracy"] == {f"box_{b}": 1.0 for b in range(1, 6)}
    assert results["d50"] == 16 and results["extrapolation_factor"] == 4.0
    assert results["extrapolation_factor_is_lower_bound"]
    assert results["step_size"] == 2 and results["task_spec"] == SWAP.to_dict() and results["mode"] == "forced"
    assert results["model_config"]["step_size"] == 2
    assert {"date", "torch", "transformers", "numpy", "hostname", "platform"} <= set(results["environment"])
    json.dumps(results)  # JSON-ready


def test_forced_mode_uses_ceil_depth_over_step_size():
    # the oracle advances 2 ops per iteration; evaluating as if c = 4 gives R = ceil(d / 4) rounds,
    # which cover only half of the ops -> a stale prefix state, rarely the right one
    tokenizer = build_tokenizer(SWAP)
    model = make_oracle(SWAP, tokenizer, step_size=2)
    results = evaluate_length_generalization(model, tokenizer, SWAP, [16], n_per_depth=128, step_size=4, progress=False)
    assert results["per_depth"][0]["num_iterations"] == 4
    assert results["accuracy"][0] < 0.3


def test_halting_mode_reports_iterations_and_not_halted():
    tokenizer = build_tokenizer(SWAP)
    model = make_oracle(SWAP, tokenizer, step_size=1, halt_max_depth=8)
    results = evaluate_length_generalization(model, tokenizer, SWAP, [4, 12], n_per_depth=64, mode="halting",
                                             progress=False)
    assert results["accuracy"] == [1.0, 1.0]
    assert [row["mean_iterations"] for row in results["per_depth"]] == [4.0, 12.0]
    assert [row["fraction_not_halted"] for row in results["per_depth"]] == [0.0, 1.0]
    assert [row["mean_iterations_halted"] for row in results["per_depth"]] == [4.0, None]
    assert [row["accuracy_halted"] for row in results["per_depth"]] == [1.0, None]
    assert [row["num_iterations"] for row in results["per_depth"]] == [None, None]
    assert results["extrapolation_factor"] is None


def test_random_model_is_at_chance():
    tokenizer = build_tokenizer(SWAP)
    results = evaluate_length_generalization(
        RandomModel(SWAP), tokenizer, SWAP, [8], n_per_depth=1024, batch_size=256, train_max_depth=8, progress=False
    )
    row = results["per_depth"][0]
    assert row["accuracy"] < 0.01  # chance 1 / 5^5
    assert all(abs(acc - 0.2) < 0.06 for acc in row["per_query_accuracy"].values())
    assert results["d50"] == 0 and results["extrapolation_factor"] == 0.0


class HorizonModel(torch.nn.Module):
    """Exact up to `horizon` iterations, uniform random answers beyond: a curve that dies past the horizon."""

    def __init__(self, task, tokenizer, horizon):
        super().__init__()
        self.oracle, self.random, self.horizon = make_oracle(task, tokenizer), RandomModel(task), horizon
        self.config = self.oracle.config

    @property
    def device(self):
        return torch.device("cpu")

    def predict(self, input_ids, num_iterations=None, **kwargs):
        exact = self.oracle.predict(input_ids, num_iterations=num_iterations, **kwargs)
        if int(num_iterations) > self.horizon:
            return self.random.predict(input_ids, num_iterations=num_iterations, **kwargs)
        return exact


def test_stop_rule_ends_a_dead_curve_after_two_depths_and_matches_one_call():
    from state_tracking import evaluate_until_failed

    tokenizer = build_tokenizer(SWAP)
    grid = [4, 8, 16, 32, 64, 128]
    result = evaluate_until_failed(HorizonModel(SWAP, tokenizer, 8), tokenizer, SWAP, grid, n_per_depth=64,
                                   train_max_depth=4, progress=False)
    assert result["depths"] == [4, 8, 16, 32] and result["stopped_early"] and result["grid"] == grid
    assert result["accuracy"][:2] == [1.0, 1.0] and max(result["accuracy"][2:]) < 0.02
    assert result["d50"] == 8 and result["extrapolation_factor"] == 2.0
    # the same problems as one call over those depths (test sets depend on (seed, depth) only)
    whole = evaluate_length_generalization(HorizonModel(SWAP, tokenizer, 8), tokenizer, SWAP, [4, 8], n_per_depth=64,
                                           progress=False)
    assert whole["accuracy"] == result["accuracy"][:2]
    alive = evaluate_until_failed(make_oracle(SWAP, tokenizer), tokenizer, SWAP, grid[:3], n_per_depth=16,
                                  progress=False)
    assert alive["depths"] == grid[:3] and not alive["stopped_early"]
    with pytest.raises(ValueError, match="stop_below must be in"):
        evaluate_until_failed(make_oracle(SWAP, tokenizer), tokenizer, SWAP, grid, stop_below=1.5)


@pytest.mark.parametrize("rendering", ["symbolic", "text"])
def test_oracle_with_random_initial(rendering):
    tokenizer = build_tokenizer(SWAP, rendering)
    model = make_oracle(SWAP, tokenizer, rendering, step_size=1)
    results = evaluate_length_generalization(
        model, tokenizer, SWAP, [2, 5], n_per_depth=32, batch_size=16, rendering=rendering, random_initial=True,
        progress=False,
    )
    assert results["accuracy"] == [1.0, 1.0] and results["random_initial"] and results["rendering"] == rendering
    assert len({" ".join(prompt.split()[:6]) for prompt in model.seen_prompts}) > 1  # <bos> + the shown start differ


def test_test_sets_depend_only_on_seed_and_depth():
    tokenizer = build_tokenizer(SWAP)

    def prompts(depths, seed, depth=5):
        model = make_oracle(SWAP, tokenizer)
        evaluate_length_generalization(model, tokenizer, SWAP, depths, n_per_depth=16, seed=seed, progress=False)
        return [p for p in model.seen_prompts if len(p.split()) == 1 + depth + 5]

    assert prompts([3, 5], seed=1) == prompts([5], seed=1)
    assert prompts([5], seed=1) != prompts([5], seed=2)
    # not the stream a training set with the same seed starts from
    training_ops = SWAP.sample_ops(np.random.default_rng(1), 16, 5)
    training = [" ".join(["<bos>", *(SWAP.op_names[o] for o in row), "<q1> <q2> <q3> <q4> <q5>"])
                for row in training_ops]
    assert prompts([5], seed=1) != training


def test_evaluator_rejects_bad_input():
    tokenizer = build_tokenizer(SWAP)
    model = make_oracle(SWAP, tokenizer)
    with pytest.raises(ValueError, match="mode must be one of \\['forced', 'halting'\\]"):
        evaluate_length_generalization(model, tokenizer, SWAP, [4], mode="greedy", progress=False)
    with pytest.raises(ValueError, match="distinct integers >= 1"):
        evaluate_length_generalization(model, tokenizer, SWAP, [0, 4], progress=False)
    with pytest.raises(ValueError, match="n_per_depth must be a positive integer"):
        evaluate_length_generalization(model, tokenizer, SWAP, [4], n_per_depth=0, progress=False)
    reordered = get_task("swap_s5", items=["lemon", "grape", "cherry", "banana", "apple"])  # same words, other order
    with pytest.raises(ValueError, match="answer_token_ids .* differ"):
        evaluate_length_generalization(model, tokenizer, reordered, [4], progress=False)


# ---------------------------------------------------------------------------------------------
# Saving, plotting, metrics
# ---------------------------------------------------------------------------------------------
def test_save_results_and_plot(tmp_path):
    tokenizer = build_tokenizer(SWAP)
    runs = {}
    for label, step_size in (("oracle", 1), ("random", 1)):
        runs[label] = []
        for seed in (0, 1):
            model = make_oracle(SWAP, tokenizer) if label == "oracle" else RandomModel(SWAP, step_size)
            results = evaluate_length_generalization(model, tokenizer, SWAP, [2, 4, 8], n_per_depth=32, seed=seed,
                                                     train_max_depth=4, progress=False)
            path = tmp_path / label / f"seed{seed}.json"
            save_results(results, path)
            assert load_results(path) == json.loads(json.dumps(results))
            runs[label].append(load_results(path))
    png = tmp_path / "plots" / "accuracy.png"
    plot_accuracy_vs_depth(runs, png, title="swap-S5")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    runs["random"][1]["depths"] = [2, 4, 16]
    with pytest.raises(ValueError, match="same depths"):
        plot_accuracy_vs_depth(runs, tmp_path / "bad.png")
    with pytest.raises(ValueError, match="at least one label"):
        plot_accuracy_vs_depth({}, tmp_path / "empty.png")


def test_accuracy_functions_and_evaluate_metric():
    predictions = [[0, 1, 2], [0, 1, 1], [2, 1, 0], [0, 0, 0]]
    references = [[0, 1, 2], [0, 1, 2], [2, 1, 0], [1, 1, 1]]
    assert overall_state_accuracy(predictions, references) == 0.5
    np.testing.assert_allclose(per_query_accuracy(predictions, references), [0.75, 0.75, 0.5])
    with pytest.raises(ValueError, match="same shape"):
        overall_state_accuracy([[0, 1]], [[0, 1, 2]])
    metric = evaluate.load(STATE_ACCURACY_METRIC_PATH)
    result = metric.compute(predictions=predictions, references=references)
    assert result == {"state_accuracy": 0.5, "per_query_accuracy": [0.75, 0.75, 0.5]}


# ---------------------------------------------------------------------------------------------
# The command line, with a checkpoint loaded through AutoModel / AutoTokenizer
# ---------------------------------------------------------------------------------------------
def load_cli():
    spec = importlib.util.spec_from_file_location("evaluate_par",
                                                  os.path.join(REPO_ROOT, "examples", "evaluate_par.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_end_to_end(tmp_path):
    task = get_task("a5")
    tokenizer = build_tokenizer(task)
    checkpoint = tmp_path / "checkpoint"
    make_oracle(task, tokenizer, step_size=1).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    save_task(task, checkpoint)
    cli = load_cli()
    out, png = tmp_path / "results" / "a5.json", tmp_path / "results" / "a5.png"
    results = cli.main([
        "--model", str(checkpoint), "--depths", "2,4", "--n", "24", "--batch-size", "16", "--mode", "forced",
        "--out", str(out), "--plot", str(png), "--train-max-depth", "2", "--seed", "3", "--device", "cpu",
        "--no-progress",
    ])
    saved = load_results(out)
    assert saved["task"] == "a5" and saved["accuracy"] == [1.0, 1.0] and saved["extrapolation_factor"] == 2.0
    assert saved["seed"] == 3 and saved["n_per_depth"] == 24 and saved["model_dir"] == str(checkpoint)
    assert results["accuracy"] == saved["accuracy"] and png.exists()

    with pytest.raises(ValueError, match="disagrees"):
        cli.main(["--model", str(checkpoint), "--task", "s5", "--out", str(out), "--no-progress"])
    os.remove(checkpoint / "state_tracking_task.json")
    with pytest.raises(ValueError, match="pass --task"):
        cli.main(["--model", str(checkpoint), "--out", str(out), "--no-progress"])
    results = cli.main(["--model", str(checkpoint), "--task", "a5", "--depths", "3", "--n", "8", "--out", str(out),
                        "--no-progress"])
    assert results["accuracy"] == [1.0]


def tiny_swap_s5_par_model(**overrides):
    """A random tiny PAR model for swap-S5 with the symbolic tokenizer: (task, tokenizer, ids, model)."""
    from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking

    task = get_task("swap_s5")
    tokenizer = build_tokenizer(task, "symbolic")
    ids = model_token_ids(tokenizer, task)
    torch.manual_seed(0)
    model = ParLoopedQwenForStateTracking(ParLoopedQwenConfig(
        vocab_size=ids["vocab_size"], pad_token_id=ids["pad_token_id"], hidden_size=32, intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=2, prelude_layers=1, core_layers=1, coda_layers=1,
        answer_token_ids=ids["answer_token_ids"], halt_token_ids=ids["halt_token_ids"], **overrides,
    ))
    return task, tokenizer, ids, model


def test_evaluator_on_a_real_tiny_par_model():
    task, tokenizer, ids, model = tiny_swap_s5_par_model(step_size=2, halt_confirm=1, halt_window=2, max_iterations=12)
    forced = evaluate_length_generalization(model, tokenizer, task, [1, 3, 5], n_per_depth=20, batch_size=8,
                                            mode="forced", seed=1, train_max_depth=3, progress=False)
    assert [row["num_iterations"] for row in forced["per_depth"]] == [1, 2, 3]  # ⌈d / c⌉ with c = 2
    assert [row["mean_iterations"] for row in forced["per_depth"]] == [1.0, 2.0, 3.0]
    assert forced["model_config"]["step_size"] == 2
    halting = evaluate_length_generalization(model, tokenizer, task, [2, 4], n_per_depth=20, batch_size=8,
                                             mode="halting", seed=1, progress=False)
    # the same numbers, computed directly from model.predict on the evaluator's test sequences
    collate = StateTrackingCollator(ids["pad_token_id"])
    for result, mode in ((forced, "forced"), (halting, "halting")):
        for row in result["per_depth"]:
            d = row["depth"]
            ops = task.sample_ops(np.random.default_rng(derive_seed("eval", 1, d)), 20, d)
            batch = collate(encode_batch(task, tokenizer, "symbolic", ops))
            kwargs = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"])
            if mode == "forced":
                pred = model.predict(batch["input_ids"], num_iterations=math.ceil(d / 2), **kwargs)
            else:
                pred = model.predict(batch["input_ids"], halting=True, **kwargs)
            right = (pred.answers.numpy() == task.final_states(ops)).all(-1)
            halted = pred.halted.numpy()
            assert row["accuracy"] == right.mean()
            assert row["mean_iterations"] == pytest.approx(pred.iterations.double().mean().item())
            assert row["fraction_not_halted"] == 1.0 - halted.mean()
            if halted.any():
                halted_mean = pred.iterations[pred.halted].double().mean().item()
                assert row["mean_iterations_halted"] == pytest.approx(halted_mean)
                assert row["accuracy_halted"] == right[halted].mean()
            else:
                assert row["mean_iterations_halted"] is None and row["accuracy_halted"] is None


def test_cli_profile_and_padding_control_on_a_local_view_checkpoint(tmp_path):
    """--profile / --padding-control / --profile-plot on a saved local-view PAR model (bf16 weights upcast by
    --dtype float32): one readout per iteration per depth, the padding control at the depths ≥ D0, a heatmap."""
    task, tokenizer, _, model = tiny_swap_s5_par_model(loop_view="local", progress_positions=True,
                                                       bidirectional_queries=True)
    checkpoint = tmp_path / "ckpt"
    model.to(torch.bfloat16).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    save_task(task, checkpoint)
    out, profile, png = tmp_path / "r.json", tmp_path / "p.json", tmp_path / "p.png"
    cli = load_cli()
    results = cli.main(["--model", str(checkpoint), "--depths", "3,6", "--n", "16", "--out", str(out), "--seed", "5",
                        "--profile", str(profile), "--profile-plot", str(png), "--padding-control", "3",
                        "--device", "cpu", "--no-progress", "--dtype", "float32"])
    assert results["model_config"]["loop_view"] == "local"
    saved = load_results(profile)["profiles"]
    main, control = saved["progress profile"], saved["padding control (3 ops + identity)"]
    assert [len(row) for row in main["profile"]] == [3, 6] and control["depths"] == [3, 6]
    assert png.stat().st_size > 1000
    with pytest.raises(ValueError, match="need --profile"):
        cli.main(["--model", str(checkpoint), "--depths", "3", "--n", "4", "--out", str(out), "--no-progress",
                  "--padding-control", "3"])
