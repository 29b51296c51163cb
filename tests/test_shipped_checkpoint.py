"""The committed checkpoint (checkpoints/par-swap-s5-small) loads as remote code and answers correctly."""

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from state_tracking import StateTrackingCollator, encode_batch, load_task_from_dir

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "par-swap-s5-small"
# Trained on d ≤ 8 (results/length_generalization_cpu/, run local_bidir_halting_offset). Measured with the
# sequences below (32 per depth): 1.0 at every depth here, including 4× and 8× its training depth.
MIN_ACCURACY = {2: 0.9, 8: 0.9, 32: 0.9, 64: 0.9}


@pytest.fixture(scope="module")
def shipped():
    model = AutoModel.from_pretrained(CHECKPOINT, trust_remote_code=True, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(CHECKPOINT, trust_remote_code=True), load_task_from_dir(CHECKPOINT)


def encode(task, tokenizer, ops):
    batch = StateTrackingCollator(tokenizer.pad_token_id)(encode_batch(task, tokenizer, "symbolic", ops))
    return batch["input_ids"], dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                                    operation_ends=batch["operation_ends"])


@pytest.mark.parametrize("depth", sorted(MIN_ACCURACY))
def test_shipped_checkpoint_answers_match_the_task_states(shipped, depth):
    model, tokenizer, task = shipped
    assert type(model).__name__ == "ParLoopedQwenForStateTracking" and task.name == "swap_s5"
    rng = np.random.default_rng(2026 + depth)
    ops = task.sample_ops(rng, 32, depth)
    expected = task.final_states(ops)  # (32, 5) item index per box, from the task's own transition rule
    input_ids, inputs = encode(task, tokenizer, ops)
    pred = model.predict(input_ids, num_iterations=depth, **inputs)
    accuracy = (pred.answers.numpy() == expected).all(-1).mean()
    assert accuracy >= MIN_ACCURACY[depth], (depth, accuracy)


def test_shipped_checkpoint_halts_when_no_operation_is_left(shipped):
    """Depth unknown: learned halting confirms at R = d + 1 (the first iteration that reads no operation) and reads
    the right state there."""
    model, tokenizer, task = shipped
    ops = task.sample_ops(np.random.default_rng(7), 32, 24)
    input_ids, inputs = encode(task, tokenizer, ops)
    pred = model.predict(input_ids, halting=True, **inputs)
    assert pred.halted.all() and (pred.iterations == 25).all()
    assert (pred.answers.numpy() == task.final_states(ops)).all(-1).mean() >= 0.9


@pytest.mark.parametrize("name", ["modeling_par.py", "configuration_par.py"])
def test_shipped_remote_code_is_the_package_code(name):
    """The checkpoint carries a copy of the remote code; a model change must re-export it, not ship it stale."""
    package = Path(__file__).resolve().parents[1] / "modeling_par" / name
    assert (CHECKPOINT / name).read_text() == package.read_text(), f"re-export {CHECKPOINT.name}: {name} is stale"
