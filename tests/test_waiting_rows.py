"""The waiting-row stability loss (issue 68, `trainers.objectives.waiting_row_change`): its formula on hand-built
states, which rows it reads, and the trainer adding it to the loss."""

from __future__ import annotations

import pytest
import torch

from modeling_par.loop_views import token_segments
from trainers import ParTrainer, waiting_row_change

# two prompts of 10 tokens: the preamble ends at 1, operations end at 3, 5, 7 (and 9 in the second), then the question
ENDS = torch.tensor([[1, 3, 5, 7, -1], [1, 3, 5, 7, 9]])
T, H = 12, 4
MASK = torch.ones(2, T)


def test_the_loss_reads_each_tokens_operation_from_the_loops_own_segments():
    """The preamble is 0, operation j's tokens j, the question d + 1 (`token_segments`, which the loss reads)."""
    assert token_segments(ENDS, MASK).segments.tolist() == [[0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4],
                                                            [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]]


def test_waiting_row_change_is_the_mean_squared_relative_change_of_the_rows_not_reached():
    generator = torch.Generator().manual_seed(0)
    states = [torch.randn(2, T, H, generator=generator) for _ in range(3)]  # s_1, s_2, s_3
    iterations = torch.tensor([1, 2, 3])
    # by hand: k = 2 reads operation 2, so operations j > 3 wait (first prompt: none; second: operation 4, tokens 8-9);
    # k = 3: j > 4 (none); k = 1 has no s_0 here and is skipped
    rows = torch.tensor([8, 9])
    expected = ((states[1][1, rows] - states[0][1, rows]).pow(2).sum(-1) / states[0][1, rows].pow(2).sum(-1)).mean()
    torch.testing.assert_close(waiting_row_change(states, ENDS, MASK, iterations), expected, rtol=1e-5, atol=1e-6)


def test_only_the_waiting_rows_count():
    base = torch.randn(2, T, H, generator=torch.Generator().manual_seed(1))
    moved = base.clone()
    moved[:, :8] += 5.0  # the preamble and operations 1-3 (reached or read at k = 2) and the question move freely
    moved[:, 10:] -= 3.0
    assert waiting_row_change([base, moved], ENDS, MASK, torch.tensor([2])).item() == 0.0
    moved[1, 8] += 1.0  # a token of operation 4, which k = 2 has not reached
    assert waiting_row_change([base, moved], ENDS, MASK, torch.tensor([2])).item() > 0.0
    # nothing waits at the last iterations, or with a step size that reads two operations per iteration
    assert waiting_row_change([base, moved, moved], ENDS, MASK, torch.tensor([3])).item() == 0.0
    assert waiting_row_change([base, moved], ENDS, MASK, torch.tensor([2]), step_size=2).item() == 0.0


def test_the_trainer_adds_the_waiting_row_loss_and_refuses_a_negative_weight(tmp_path):
    from tests.test_trainers import COLLATOR, DATASET, tiny_args, tiny_model

    torch.manual_seed(0)
    trainer = ParTrainer(model=tiny_model(loop_view="full"), args=tiny_args(tmp_path / "on", waiting_row_weight=0.5,
                                                                            max_steps=4),
                         train_dataset=DATASET, data_collator=COLLATOR)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert logs and all("loss_waiting_rows" in e for e in logs)
    assert all(e["loss"] == pytest.approx(e["loss_answer"] + 0.5 * e["loss_waiting_rows"], rel=1e-3) for e in logs)
    assert any(e["loss_waiting_rows"] > 0 for e in logs)
    with pytest.raises(ValueError, match="waiting_row_weight must be ≥ 0"):
        tiny_args(tmp_path, waiting_row_weight=-1.0)
