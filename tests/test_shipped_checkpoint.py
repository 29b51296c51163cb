"""The committed checkpoint (checkpoints/par-swap-s5-small) loads as remote code and answers correctly."""

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from state_tracking import StateTrackingCollator, encode_batch, load_task_from_dir

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "par-swap-s5-small"
# Measured on this checkpoint (32 sequences per depth, seeds below): 1.0 at d = 2, 4, 6, 8 (its training range).
MIN_ACCURACY = {2: 0.9, 4: 0.9, 6: 0.9, 8: 0.9}


@pytest.fixture(scope="module")
def shipped():
    model = AutoModel.from_pretrained(CHECKPOINT, trust_remote_code=True, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(CHECKPOINT, trust_remote_code=True), load_task_from_dir(CHECKPOINT)


@pytest.mark.parametrize("depth", [2, 4, 6, 8])
def test_shipped_checkpoint_answers_match_the_task_states(shipped, depth):
    model, tokenizer, task = shipped
    assert type(model).__name__ == "ParLoopedQwenForStateTracking" and task.name == "swap_s5"
    rng = np.random.default_rng(2026 + depth)
    ops = task.sample_ops(rng, 32, depth)
    expected = task.final_states(ops)  # (32, 5) item index per box, from the task's own transition rule
    batch = StateTrackingCollator(tokenizer.pad_token_id)(encode_batch(task, tokenizer, "symbolic", ops))
    pred = model.predict(batch["input_ids"], attention_mask=batch["attention_mask"],
                         query_positions=batch["query_positions"], num_iterations=depth)
    accuracy = (pred.answers.numpy() == expected).all(-1).mean()
    assert accuracy >= MIN_ACCURACY[depth], (depth, accuracy)


@pytest.mark.parametrize("name", ["modeling_par.py", "configuration_par.py"])
def test_shipped_remote_code_is_the_package_code(name):
    """The checkpoint carries a copy of the remote code; a model change must re-export it, not ship it stale."""
    package = Path(__file__).resolve().parents[1] / "modeling_par" / name
    assert (CHECKPOINT / name).read_text() == package.read_text(), f"re-export {CHECKPOINT.name}: {name} is stale"
