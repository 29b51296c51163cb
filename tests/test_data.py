import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from state_tracking import (
    StateTrackingCollator,
    build_dataset,
    build_tokenizer,
    encode_batch,
    get_task,
    load_task,
    model_token_ids,
    parse_depths,
    symbolic_tokens,
    text_prompt,
    truncate_to_prefix,
)

SWAP = get_task("swap_s5")
LAMP = {
    "name": "lamp",
    "states": ["off", "on"],
    "operations": {"press": {"off": "on", "on": "off"}, "wait": {"off": "off", "on": "on"}},
    "text": {"initial": "The lamp is {state}.", "query": "The lamp is",
             "operations": {"press": "Press the switch.", "wait": "Wait a minute."}},
}


def bpe_tokenizer(task) -> PreTrainedTokenizerFast:
    """A small byte-level BPE (Qwen-style, no <bos>) trained on text prompts: stands in for a
    pretrained tokenizer whose words carry a leading space (" apple")."""
    ops = task.sample_ops(np.random.default_rng(0), 100, 6)
    corpus = [text_prompt(task, row)[0] for row in ops] + ["Answer: Yes. Answer: No."] * 20
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|endoftext|>")


# ---------------------------------------------------------------------------------------------
# Prompts and tokenizers
# ---------------------------------------------------------------------------------------------
def test_symbolic_prompt_and_tokenizer_round_trip(tmp_path):
    tokenizer = build_tokenizer(SWAP, "symbolic")
    ops = np.array([[1, 5, 0], [10, 10, 2]])
    assert symbolic_tokens(SWAP, ops[0]) == [
        "<bos>", "swap_1_2", "swap_2_3", "identity", "<q1>", "<q2>", "<q3>", "<q4>", "<q5>"]
    encoded = encode_batch(SWAP, tokenizer, "symbolic", ops)
    assert encoded["query_positions"] == [[4, 5, 6, 7, 8]] * 2
    # the numpy id mapping equals what the tokenizer makes of the same words (it adds <bos> itself)
    for row, ids in zip(ops, encoded["input_ids"]):
        assert tokenizer(" ".join(symbolic_tokens(SWAP, row)[1:]))["input_ids"] == ids
        assert tokenizer.convert_ids_to_tokens(ids) == symbolic_tokens(SWAP, row)

    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert encode_batch(SWAP, reloaded, "symbolic", ops) == encoded
    assert model_token_ids(reloaded, SWAP) == model_token_ids(tokenizer, SWAP)


def test_symbolic_prompt_with_random_initial():
    tokenizer = build_tokenizer(SWAP, "symbolic")
    initial = np.array([[4, 3, 2, 1, 0]])
    encoded = encode_batch(SWAP, tokenizer, "symbolic", np.array([[6]]), initial)
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"][0]) == [
        "<bos>", "lemon", "grape", "cherry", "banana", "apple", "swap_2_4", "<q1>", "<q2>", "<q3>", "<q4>", "<q5>"
    ]
    assert encoded["query_positions"] == [[7, 8, 9, 10, 11]]


def test_model_token_ids():
    tokenizer = build_tokenizer(SWAP, "symbolic")
    ids = model_token_ids(tokenizer, SWAP)
    assert tokenizer.convert_ids_to_tokens(ids["answer_token_ids"]) == SWAP.candidate_names
    assert tokenizer.convert_ids_to_tokens(list(ids["halt_token_ids"])) == ["Yes", "No"]
    assert ids["pad_token_id"] == tokenizer.pad_token_id and ids["vocab_size"] == len(tokenizer) == 26


@pytest.mark.parametrize("make_tokenizer", [lambda task: build_tokenizer(task, "text"), bpe_tokenizer],
                         ids=["word_level", "bpe"])
def test_text_prompt_queries_sit_before_question_marks(make_tokenizer):
    tokenizer = make_tokenizer(SWAP)
    ops = np.array([[1, 0], [6, 6]])
    prompt, ends = text_prompt(SWAP, ops[0])
    assert prompt == (
        "Box 1 contains the apple. Box 2 contains the banana. Box 3 contains the cherry. Box 4 contains the grape. "
        "Box 5 contains the lemon. Swap the contents of Box 1 and Box 2. Leave the boxes as they are. "
        "Box 1 contains the ? Box 2 contains the ? Box 3 contains the ? Box 4 contains the ? Box 5 contains the ?"
    )
    assert all(prompt[end - 3 : end + 2] == "the ?" for end in ends)
    encoded = encode_batch(SWAP, tokenizer, "text", ops)
    for ids, positions in zip(encoded["input_ids"], encoded["query_positions"]):
        tokens = tokenizer.convert_ids_to_tokens(ids)
        assert [tokens[p].lstrip("Ġ") for p in positions] == ["the"] * 5
        assert [tokens[p + 1].lstrip("Ġ") for p in positions] == ["?"] * 5
        assert tokens[positions[0] - 3].lstrip("Ġ") == "Box" and tokens[positions[4] - 2].lstrip("Ġ") == "5"
    answer_ids = model_token_ids(tokenizer, SWAP)["answer_token_ids"]
    assert answer_ids[0] in encoded["input_ids"][0]  # " apple" as it appears in the prompt


def test_pretrained_tokenizer_checks():
    tokenizer = bpe_tokenizer(SWAP)
    assert tokenizer.convert_ids_to_tokens(model_token_ids(tokenizer, SWAP)["answer_token_ids"])[0] == "Ġapple"
    unseen = get_task("swap_s5", items=["apple", "banana", "cherry", "grape", "watermelon"])
    with pytest.raises(ValueError, match="'watermelon' must be one known token"):
        model_token_ids(tokenizer, unseen)
    with pytest.raises(ValueError, match="use build_tokenizer\\(task, 'symbolic'\\)"):
        encode_batch(SWAP, tokenizer, "symbolic", np.zeros((1, 2), dtype=int))
    word_level = build_tokenizer(SWAP, "text")
    with pytest.raises(ValueError, match="'watermelon' of the text prompt is unknown"):
        encode_batch(unseen, word_level, "text", np.zeros((1, 1), dtype=int), np.array([[4, 0, 1, 2, 3]]))
    with pytest.raises(ValueError, match="unknown rendering 'latex'"):
        build_tokenizer(SWAP, "latex")


def test_state_machine_renderings():
    lamp = load_task(LAMP)
    symbolic = build_tokenizer(lamp, "symbolic")
    encoded = encode_batch(lamp, symbolic, "symbolic", np.array([[0, 1]]))
    assert symbolic.convert_ids_to_tokens(encoded["input_ids"][0]) == ["<bos>", "press", "wait", "<q1>"]
    assert symbolic.convert_ids_to_tokens(model_token_ids(symbolic, lamp)["answer_token_ids"]) == ["off", "on"]
    text = build_tokenizer(lamp, "text")
    prompt, _ = text_prompt(lamp, np.array([0, 1]))
    assert prompt == "The lamp is off. Press the switch. Wait a minute. The lamp is ?"
    encoded = encode_batch(lamp, text, "text", np.array([[0, 1]]))
    assert text.convert_ids_to_tokens(encoded["input_ids"][0])[encoded["query_positions"][0][0]] == "is"


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------
def test_build_dataset_columns_and_labels():
    tokenizer = build_tokenizer(SWAP)
    dataset = build_dataset(SWAP, tokenizer, n=200, depths=(1, 8), seed=3)
    assert dataset.column_names == ["input_ids", "query_positions", "operation_ends", "step_labels", "depth", "ops"]
    assert len(dataset) == 200
    depths = np.array(dataset["depth"])
    assert depths.min() == 1 and depths.max() == 8
    for example in dataset.select(range(20)):
        d = example["depth"]
        assert len(example["ops"]) == d and len(example["input_ids"]) == 1 + d + 5
        assert example["query_positions"] == list(range(1 + d, 1 + d + 5))
        labels = np.array(example["step_labels"])
        assert labels.shape == (d + 1, 5)
        np.testing.assert_array_equal(labels, SWAP.prefix_states(np.array([example["ops"]]))[0])
        encoded = encode_batch(SWAP, tokenizer, "symbolic", np.array([example["ops"]]))
        assert example["input_ids"] == encoded["input_ids"][0]


def test_build_dataset_is_reproducible():
    tokenizer = build_tokenizer(SWAP)
    a = build_dataset(SWAP, tokenizer, n=100, depths=(1, 8), seed=5)
    b = build_dataset(SWAP, tokenizer, n=100, depths=(1, 8), seed=5)
    c = build_dataset(SWAP, tokenizer, n=100, depths=(1, 8), seed=6)
    assert a[:] == b[:] and a._fingerprint == b._fingerprint
    assert a["ops"] != c["ops"] and a._fingerprint != c._fingerprint


def test_depth_specs():
    assert parse_depths(4)[0].tolist() == [4]
    values, probs = parse_depths((2, 5))
    assert values.tolist() == [2, 3, 4, 5] and np.allclose(probs, 0.25)
    assert parse_depths(range(2, 5))[0].tolist() == [2, 3, 4]
    assert parse_depths([8, 2])[0].tolist() == [8, 2]
    values, probs = parse_depths({1: 0.25, 7: 0.75})
    assert values.tolist() == [1, 7] and probs.tolist() == [0.25, 0.75]
    tokenizer = build_tokenizer(SWAP)
    dataset = build_dataset(SWAP, tokenizer, n=400, depths={2: 0.25, 6: 0.75}, seed=0)
    counts = np.bincount(dataset["depth"], minlength=7)
    assert counts[2] + counts[6] == 400 and 60 < counts[2] < 140
    assert set(build_dataset(SWAP, tokenizer, n=50, depths=[3, 9], seed=0)["depth"]) == {3, 9}
    for bad, message in [
        ((5, 2), "lo <= hi"),
        ((1, 2, 3), "\\(lo, hi\\)"),
        ([0, 2], ">= 1"),
        ([2, 2], "distinct"),
        ({1: 0.5, 2: 0.6}, "sum to 1"),
        ({1: -0.5, 2: 1.5}, ">= 0"),
        ("1-32", "depths must be"),
        (True, "depths must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_depths(bad)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        build_dataset(SWAP, tokenizer, n=0)


def test_build_dataset_random_initial_and_text():
    tokenizer = build_tokenizer(SWAP)
    dataset = build_dataset(SWAP, tokenizer, n=50, depths=(1, 4), seed=0, random_initial=True)
    starts = np.array([example[0] for example in dataset["step_labels"]])
    assert (np.sort(starts, axis=1) == np.arange(5)).all() and not (starts == np.arange(5)).all()
    example = dataset[0]
    assert len(example["input_ids"]) == 1 + 5 + example["depth"] + 5
    assert tokenizer.convert_ids_to_tokens(example["input_ids"][1:6]) == [
        SWAP.candidate_names[i] for i in example["step_labels"][0]]

    text_tokenizer = build_tokenizer(SWAP, "text")
    text = build_dataset(SWAP, text_tokenizer, "text", n=30, depths=(1, 4), seed=0, random_initial=True)
    for example in text.select(range(5)):
        tokens = text_tokenizer.convert_ids_to_tokens(example["input_ids"])
        assert [tokens[p] for p in example["query_positions"]] == ["the"] * 5
        np.testing.assert_array_equal(
            example["step_labels"],
            SWAP.prefix_states(np.array([example["ops"]]), np.array([example["step_labels"][0]]))[0],
        )


# ---------------------------------------------------------------------------------------------
# Collator and targets
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_collator_padding(padding_side):
    tokenizer = build_tokenizer(SWAP)
    dataset = build_dataset(SWAP, tokenizer, n=6, depths=[1, 4], seed=1)
    features = [dataset[i] for i in range(6)]
    depth = [f["depth"] for f in features]
    assert set(depth) == {1, 4}
    batch = StateTrackingCollator(tokenizer.pad_token_id, padding_side)(features)
    assert batch["input_ids"].shape == (6, 10) and batch["attention_mask"].shape == (6, 10)
    assert batch["step_labels"].shape == (6, 5, 5) and batch["ops"].shape == (6, 4)
    assert batch["depth"].tolist() == depth
    query_ids = tokenizer.convert_tokens_to_ids(["<q1>", "<q2>", "<q3>", "<q4>", "<q5>"])
    for b, f in enumerate(features):
        length = len(f["input_ids"])
        assert batch["attention_mask"][b].sum() == length
        real = batch["input_ids"][b][batch["attention_mask"][b].bool()]
        assert real.tolist() == f["input_ids"]
        assert batch["input_ids"][b].gather(0, batch["query_positions"][b]).tolist() == query_ids
        pads = batch["attention_mask"][b] == 0
        assert (batch["input_ids"][b][pads] == tokenizer.pad_token_id).all()
        if length < 10:
            assert pads[0 if padding_side == "left" else -1]
        assert batch["step_labels"][b, : f["depth"] + 1].tolist() == f["step_labels"]
        assert (batch["step_labels"][b, f["depth"] + 1 :] == -100).all()
        assert (batch["ops"][b, f["depth"] :] == -100).all()
    columns = StateTrackingCollator(tokenizer.pad_token_id, padding_side)(dataset[:6])
    assert all(torch.equal(columns[k], batch[k]) for k in batch)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_collator_keeps_the_shape_of_query_positions(padding_side):
    """One query per example given as a scalar stays (B,), shifted by each row's left padding."""
    features = [{"input_ids": [1, 2, 3], "query_positions": 2}, {"input_ids": [1, 2], "query_positions": 1}]
    batch = StateTrackingCollator(0, padding_side)(features)
    assert batch["query_positions"].tolist() == ([2, 2] if padding_side == "left" else [2, 1])


def test_collator_errors():
    with pytest.raises(ValueError, match="padding_side must be 'right' or 'left'"):
        StateTrackingCollator(0, "middle")
    collate = StateTrackingCollator(0)
    with pytest.raises(ValueError, match="needs 'query_positions'"):
        collate([{"input_ids": [1, 2]}])
    with pytest.raises(ValueError, match="unknown example keys \\['labels'\\]"):
        collate([{"input_ids": [1], "query_positions": [0], "labels": [1]}])
    with pytest.raises(ValueError, match="depth \\+ 1 rows"):
        collate([{"input_ids": [1], "query_positions": [0], "depth": 2, "step_labels": [[0], [1]]}])
    with pytest.raises(ValueError, match="also need 'depth'"):
        collate([{"input_ids": [1], "query_positions": [0], "step_labels": [[0]]}])


# ---------------------------------------------------------------------------------------------
# Prefix truncation
# ---------------------------------------------------------------------------------------------
def expected_prefix(task, tokenizer, rendering, example, j, random_initial):
    ops = np.array([example["ops"][:j]], dtype=np.int64).reshape(1, j)
    initial = np.array([example["step_labels"][0]]) if random_initial else None
    encoded = encode_batch(task, tokenizer, rendering, ops, initial)
    return {
        "input_ids": encoded["input_ids"][0],
        "query_positions": encoded["query_positions"][0],
        "operation_ends": encoded["operation_ends"][0],
        "step_labels": task.prefix_states(ops, initial)[0].tolist(),
        "depth": j,
        "ops": ops[0].tolist(),
    }


@pytest.mark.parametrize("rendering, random_initial", [("symbolic", False), ("symbolic", True), ("text", True)])
def test_truncate_to_prefix_equals_building_with_first_j_ops(rendering, random_initial):
    tokenizer = build_tokenizer(SWAP, rendering)
    dataset = build_dataset(SWAP, tokenizer, rendering, n=8, depths=(3, 6), seed=2, random_initial=random_initial)
    example = dataset[0]
    for j in (0, 2, example["depth"]):
        got = truncate_to_prefix(example, j, SWAP, tokenizer, rendering, random_initial=random_initial)
        assert got == expected_prefix(SWAP, tokenizer, rendering, example, j, random_initial)

    batch = dataset[:8]
    keep = np.minimum(3, np.array(batch["depth"])) - np.arange(8) % 2  # mixed prefix lengths
    got = truncate_to_prefix(batch, keep, SWAP, tokenizer, rendering, random_initial=random_initial)
    for i in range(8):
        want = expected_prefix(SWAP, tokenizer, rendering, dataset[i], int(keep[i]), random_initial)
        assert {k: got[k][i] for k in got} == want

    collated = StateTrackingCollator(tokenizer.pad_token_id, "left")([dataset[i] for i in range(8)])
    from_tensors = truncate_to_prefix(collated, torch.as_tensor(keep), SWAP, tokenizer, rendering,
                                      random_initial=random_initial)
    assert from_tensors == got


def test_truncate_to_prefix_errors():
    tokenizer = build_tokenizer(SWAP)
    plain = build_dataset(SWAP, tokenizer, n=4, depths=2, seed=0)
    shuffled = build_dataset(SWAP, tokenizer, n=4, depths=2, seed=0, random_initial=True)
    with pytest.raises(ValueError, match="0 <= j <= depth"):
        truncate_to_prefix(plain[0], 3, SWAP, tokenizer)
    with pytest.raises(ValueError, match="pass random_initial=True"):
        truncate_to_prefix(shuffled[:4], 1, SWAP, tokenizer)
    with pytest.raises(ValueError, match="random_initial=True"):
        truncate_to_prefix(plain[:4], 1, SWAP, tokenizer, random_initial=True)
    with pytest.raises(ValueError, match="needs columns \\['ops'\\]"):
        truncate_to_prefix({"step_labels": [[0] * 5], "depth": 0}, 0, SWAP, tokenizer)


class _NoOffsetsEncoding:
    """A BatchEncoding whose offsets map some characters to no token (what char_to_token does for a character the
    tokenizer dropped or never aligned)."""

    def __init__(self, encoding):
        self._encoding = encoding

    def __getitem__(self, key):
        return self._encoding[key]

    def char_to_token(self, i, char):
        return None if char % 2 else self._encoding.char_to_token(i, char)


def test_text_rendering_needs_usable_offsets(monkeypatch):
    """A tokenizer without character offsets (a slow one) or whose offsets miss a boundary character gets one clear
    error naming the problem and what to use instead, not a numpy error."""
    tokenizer = build_tokenizer(SWAP, "text")
    ops = np.array([[1, 0]])
    monkeypatch.setattr(type(tokenizer), "is_fast", property(lambda self: False))
    with pytest.raises(ValueError, match="needs a tokenizer with character offsets .*use_fast=True"):
        encode_batch(SWAP, tokenizer, "text", ops)
    monkeypatch.undo()
    call = type(tokenizer).__call__
    monkeypatch.setattr(type(tokenizer), "__call__", lambda self, *a, **k: _NoOffsetsEncoding(call(self, *a, **k)))
    with pytest.raises(ValueError, match=r"offsets map no token to character \d+ .* char_to_token returned None"):
        encode_batch(SWAP, tokenizer, "text", ops)
