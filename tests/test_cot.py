"""The explicit chain-of-thought baseline: format, dataset, TRL training, evaluation and the script."""

import json
import math

import numpy as np
import pytest
import torch

from state_tracking import build_dataset, build_tokenizer, derive_seed, encode_batch, get_task, load_task
from state_tracking.cot import (
    EOS_TOKEN,
    build_cot_dataset,
    build_cot_tokenizer,
    cot_completion_ids,
    cot_completion_length,
    cot_completion_tokens,
    cot_token_ids,
    evaluate_cot,
    generate_cot,
    left_pad,
    parse_cot_answer,
    parse_cot_completion,
    render_cot,
)
from state_tracking.evaluation import draw_test_problems

from .conftest import load_example

torch.set_num_threads(1)

LAMP = {"name": "lamp", "states": ["off", "on", "broken"], "initial_state": "off",
        "operations": {"press": {"off": "on", "on": "off", "broken": "broken"},
                       "hit": {"off": "broken", "on": "broken", "broken": "broken"},
                       "wait": {"off": "off", "on": "on", "broken": "broken"}}}


def _tasks():
    return [get_task("swap_s5"), get_task("s5"), get_task("a5"), load_task(LAMP)]


# ---------------------------------------------------------------------------------------------
# Format
# ---------------------------------------------------------------------------------------------
def test_tokenizer_adds_only_eos_and_keeps_symbolic_ids():
    task = get_task("swap_s5")
    plain, cot = build_tokenizer(task, "symbolic"), build_cot_tokenizer(task)
    assert set(cot.get_vocab()) - set(plain.get_vocab()) == {EOS_TOKEN}
    assert all(cot.get_vocab()[t] == i for t, i in plain.get_vocab().items())
    assert cot.eos_token == EOS_TOKEN and len(cot) == len(plain) + 1


def test_render_cot_example():
    task = get_task("swap_s5")
    prompt, completion = render_cot(task, np.array([1, 0]))  # swap_1_2, identity
    assert prompt == "<bos> swap_1_2 identity <q1> <q2> <q3> <q4> <q5>"
    assert completion == ("banana apple cherry grape lemon No banana apple cherry grape lemon "
                          "Yes banana apple cherry grape lemon <eos>")
    assert len(completion.split()) == cot_completion_length(task, 2)


@pytest.mark.parametrize("task", _tasks(), ids=lambda t: t.name)
def test_round_trip_and_corruptions(task):
    tokenizer = build_cot_tokenizer(task)
    ids = cot_token_ids(tokenizer, task)
    rng = np.random.default_rng(0)
    ops = task.sample_ops(rng, 16, 5)
    states = task.prefix_states(ops, task.sample_initial(rng, 16))  # (16, 6, Q)
    completions = cot_completion_ids(states, ids)
    assert completions.shape == (16, cot_completion_length(task, 5))
    for i in range(16):  # the vectorised ids equal the token-level rendering
        assert tokenizer.convert_ids_to_tokens(completions[i].tolist()) == cot_completion_tokens(task, states[i])
        parsed = parse_cot_completion(completions[i], ids, task.num_queries)
        assert parsed.well_formed and parsed.num_tokens == completions.shape[1]
        np.testing.assert_array_equal(parsed.answer, states[i, -1])
        np.testing.assert_array_equal(parsed.states, states[i, 1:])
        np.testing.assert_array_equal(parse_cot_answer(torch.as_tensor(completions[i]), tokenizer, task), states[i, -1])
        # trailing padding after <eos> is ignored
        padded = np.concatenate([completions[i], [ids.pad] * 3])
        np.testing.assert_array_equal(parse_cot_completion(padded, ids, task.num_queries).answer, states[i, -1])

    row, q = completions[0], task.num_queries
    wrong_answer = row.copy()
    wrong_answer[-2] = ids.candidates[(states[0, -1, -1] + 1) % task.num_candidates]
    assert not np.array_equal(parse_cot_answer(wrong_answer, tokenizer, task), states[0, -1])
    malformed = {
        "no eos": row[:-1],
        "truncated": row[: len(row) // 2],
        "separator instead of candidate": np.where(np.arange(len(row)) == 0, ids.separator, row),
        "missing answer marker": np.where(np.arange(len(row)) == len(row) - q - 2, ids.separator, row),
        "short answer": np.delete(row, len(row) - 2),
        "eos first": np.concatenate([[ids.eos], row]),
        "empty": np.array([], dtype=np.int64),
    }
    for name, corrupted in malformed.items():
        assert parse_cot_answer(corrupted, tokenizer, task) is None, name
    # one extra state is well-formed but writes d + 1 states
    extra = np.concatenate([row[: q + 1], row])
    assert len(parse_cot_completion(extra, ids, q).states) == 6


# ---------------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("random_initial", [False, True])
def test_dataset_matches_par_problems_and_masks_completion(random_initial):
    task = get_task("swap_s5")
    tokenizer = build_cot_tokenizer(task)
    ids = cot_token_ids(tokenizer, task)
    data = build_cot_dataset(task, tokenizer, n=200, depths=(1, 8), seed=3, random_initial=random_initial)
    base = build_dataset(task, tokenizer, "symbolic", n=200, depths=(1, 8), seed=3, random_initial=random_initial)
    assert len(data) == 200 and data["depth"] == base["depth"] and data["ops"] == base["ops"]
    assert sorted(set(data["depth"])) == list(range(1, 9))
    for row in data:
        ops = np.array(row["ops"])[None]
        initial = np.array(row["step_labels"][0])[None] if random_initial else None
        np.testing.assert_array_equal(np.array(row["step_labels"]), task.prefix_states(ops, initial)[0])
        prompt = encode_batch(task, tokenizer, "symbolic", ops, initial)["input_ids"][0]
        mask = np.array(row["completion_mask"])
        assert row["prompt_length"] == len(prompt) and len(mask) == len(row["input_ids"])
        assert row["input_ids"][: len(prompt)] == prompt
        np.testing.assert_array_equal(mask, [0] * len(prompt) + [1] * cot_completion_length(task, row["depth"]))
        parsed = parse_cot_completion(np.array(row["input_ids"])[mask == 1], ids, task.num_queries)
        np.testing.assert_array_equal(parsed.states, np.array(row["step_labels"])[1:])
    # reproducible from the seed, different across seeds
    same = build_cot_dataset(task, tokenizer, n=200, depths=(1, 8), seed=3, random_initial=random_initial)
    other = build_cot_dataset(task, tokenizer, n=200, depths=(1, 8), seed=4, random_initial=random_initial)
    assert same["input_ids"] == data["input_ids"] and other["input_ids"] != data["input_ids"]


def test_bad_arguments_raise_value_error():
    task = get_task("swap_s5")
    tokenizer = build_cot_tokenizer(task)
    with pytest.raises(ValueError, match="n must be"):
        build_cot_dataset(task, tokenizer, n=0, depths=(1, 4))
    with pytest.raises(ValueError, match="depths"):
        build_cot_dataset(task, tokenizer, n=4, depths=0)
    with pytest.raises(ValueError, match="depths"):
        build_cot_dataset(task, tokenizer, n=4, depths=(0, 3))
    with pytest.raises(ValueError, match="seed"):
        build_cot_dataset(task, tokenizer, n=4, depths=(1, 3), seed=-1)
    with pytest.raises(ValueError, match="depth must be"):
        cot_completion_length(task, 0)
    with pytest.raises(ValueError, match="build_cot_tokenizer"):
        build_cot_dataset(task, build_tokenizer(task, "symbolic"), n=4, depths=(1, 3))
    model = _tiny_model(tokenizer, task)
    with pytest.raises(ValueError, match="depths"):
        evaluate_cot(model, tokenizer, task, [0, 4], n_per_depth=2)
    with pytest.raises(ValueError, match="depths"):
        evaluate_cot(model, tokenizer, task, [], n_per_depth=2)
    with pytest.raises(ValueError, match="depths must be distinct"):
        evaluate_cot(model, tokenizer, task, [2, 2], n_per_depth=2)
    with pytest.raises(ValueError, match="n_per_depth"):
        evaluate_cot(model, tokenizer, task, [2], n_per_depth=0)
    with pytest.raises(ValueError, match="batch_size"):
        evaluate_cot(model, tokenizer, task, [2], n_per_depth=2, batch_size=0)


# ---------------------------------------------------------------------------------------------
# Training with TRL and evaluation
# ---------------------------------------------------------------------------------------------
def _tiny_model(tokenizer, task, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    ids = cot_token_ids(tokenizer, task)
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=ids.pad, bos_token_id=ids.bos, eos_token_id=ids.eos)
    return Qwen2ForCausalLM(config)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from trl import SFTConfig, SFTTrainer

    task = get_task("swap_s5")
    tokenizer = build_cot_tokenizer(task)
    data = build_cot_dataset(task, tokenizer, n=16 * 12, depths=(1, 3), seed=0)
    model = _tiny_model(tokenizer, task)
    args = SFTConfig(output_dir=str(tmp_path_factory.mktemp("sft")), max_steps=12, per_device_train_batch_size=16,
                     learning_rate=1e-2, warmup_steps=0, logging_steps=1, seed=0, bf16=False,
                     activation_checkpointing=False, completion_only_loss=True, packing=False, max_length=64,
                     save_strategy="no", report_to="none", disable_tqdm=True, dataloader_pin_memory=False)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    return task, tokenizer, model, trainer


def test_sft_trainer_masks_prompt_and_loss_decreases(trained):
    task, tokenizer, model, trainer = trained
    prepared = trainer.train_dataset[0]
    prompt_length = prepared["prompt_length"]
    assert prepared["labels"][:prompt_length] == [-100] * prompt_length
    assert prepared["labels"][prompt_length:] == prepared["input_ids"][prompt_length:]
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-3:]) < losses[0] - 0.5  # from ~ln(27) = 3.3 at the start


def test_evaluate_cot_matches_direct_recomputation(trained):
    task, tokenizer, model, _ = trained
    ids = cot_token_ids(tokenizer, task)
    result = evaluate_cot(model, tokenizer, task, [4, 2], n_per_depth=12, seed=5, batch_size=5, train_max_depth=3)
    assert result["depths"] == [2, 4] and result["n"] == result["n_per_depth"] == 12
    assert len(result["accuracy"]) == len(result["per_depth"]) == 2
    json.dumps(result)  # JSON-ready
    for depth, row in zip(result["depths"], result["per_depth"]):
        ops, initial = draw_test_problems(task, depth, 12, 5)
        rng = np.random.default_rng(derive_seed("eval", 5, depth))  # the package evaluator's test problems
        np.testing.assert_array_equal(ops, task.sample_ops(rng, 12, depth))
        states = task.prefix_states(ops)
        prompts = encode_batch(task, tokenizer, "symbolic", ops)["input_ids"]
        input_ids, attention_mask = left_pad(prompts, ids.pad)
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False, use_cache=True,
                                 max_new_tokens=row["max_new_tokens"], eos_token_id=ids.eos, pad_token_id=ids.pad)
        generated = out[:, input_ids.shape[1]:]
        answers = [parse_cot_answer(g, tokenizer, task) for g in generated]
        expected = np.mean([a is not None and np.array_equal(a, s) for a, s in zip(answers, states[:, -1])])
        assert row["accuracy"] == pytest.approx(expected)
        chains = [parse_cot_completion(g, ids, task.num_queries).states for g in generated]
        expected_chain = np.mean([c is not None and c.shape == states[i, 1:].shape and (c == states[i, 1:]).all()
                                  for i, c in enumerate(chains)])
        assert row["intermediate_accuracy"] == pytest.approx(expected_chain)
        lengths = [(g == ids.eos).nonzero()[0].item() + 1 if (g == ids.eos).any() else len(g) for g in generated]
        assert row["mean_generated_tokens"] == pytest.approx(np.mean(lengths))
        assert row["max_new_tokens"] == cot_completion_length(task, depth) + task.num_queries + 1
        assert 0.0 <= row["intermediate_accuracy"] <= 1.0 and 0.0 <= row["fraction_malformed"] <= 1.0


def test_generation_with_left_padding_matches_unpadded(trained):
    task, tokenizer, model, _ = trained
    ids = cot_token_ids(tokenizer, task)
    prompts = [encode_batch(task, tokenizer, "symbolic", np.array([[1, 2, 3, 4]]))["input_ids"][0],
               encode_batch(task, tokenizer, "symbolic", np.array([[5]]))["input_ids"][0]]
    together = generate_cot(model, prompts, ids, max_new_tokens=12)
    alone = generate_cot(model, prompts[1:], ids, max_new_tokens=12)
    np.testing.assert_array_equal(together[1], alone[0])


# ---------------------------------------------------------------------------------------------
# The script
# ---------------------------------------------------------------------------------------------
def test_script_main_writes_results(tmp_path):
    script = load_example("examples/baselines/cot_trl.py")
    path = tmp_path / "out" / "cot.json"
    argv = ["--seed", "1", "--max_steps", "3", "--per_device_train_batch_size", "8", "--hidden_size", "32",
            "--intermediate_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "2",
            "--num_key_value_heads", "2", "--max_train_depth", "3", "--eval_depths", "2,6", "--eval_n", "4",
            "--logging_steps", "1", "--output_dir", str(tmp_path / "run"), "--results_json", str(path)]
    returned = script.main(argv)
    results = json.loads(path.read_text())
    assert results == json.loads(json.dumps(returned))
    assert results["method"] == "cot_trl" and results["seed"] == 1 and results["steps"] == 3
    assert results["command"] == "python examples/baselines/cot_trl.py " + " ".join(argv)
    assert set(results["wall_time_seconds"]) == {"data", "train", "eval"}
    assert results["machine"]["torch_num_threads"] == 1 and results["machine"]["platform"]
    assert results["date"] and results["versions"]["trl"] and results["versions"]["transformers"]
    assert [row["step"] for row in results["loss_curve"]] == [1, 2, 3]
    assert all(math.isfinite(row["loss"]) for row in results["loss_curve"])
    assert results["eval"]["depths"] == [2, 6] and results["eval"]["n"] == 4
    for depth in ("2", "6"):
        row = results["eval"]["per_depth"][depth]
        assert {"accuracy", "intermediate_accuracy", "mean_generated_tokens"} <= set(row)
    assert results["model"]["num_hidden_layers"] == 2 and results["model"]["vocab_size"] == 27
    assert results["training"]["completion_only_loss"] is True and results["train_examples"] == 24


def test_script_defaults_match_par_model_size():
    script = load_example("examples/baselines/cot_trl.py")
    args = script.parse_args([])
    assert (args.hidden_size, args.intermediate_size, args.num_attention_heads, args.num_key_value_heads,
            args.num_hidden_layers) == (128, 256, 4, 4, 4)
    assert (args.max_steps, args.per_device_train_batch_size, args.learning_rate) == (2000, 64, 1e-3)
    assert (args.min_train_depth, args.max_train_depth, args.eval_depths, args.eval_n) == (1, 8, [8, 16, 32, 64], 256)
    with pytest.raises(SystemExit):
        script.parse_args(["--max_steps", "0"])
