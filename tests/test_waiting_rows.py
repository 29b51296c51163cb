"""The full view's row objectives (issue 68): the waiting-row stability loss (`trainers.objectives.waiting_row_change`)
and the read-so-far flag (`progress_flag_loss`): their formulas on hand-built states, which rows they read, and the
trainer adding them to the loss."""

from __future__ import annotations

import pytest
import torch

from modeling_par.loop_views import token_segments
from trainers import ParTrainer, progress_flag_loss, waiting_row_change

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


def trained_logs(folder, **arguments) -> list[dict]:
    """The training logs of a tiny full-view run with `arguments` (tests.test_trainers' tiny model and data)."""
    from tests.test_trainers import COLLATOR, DATASET, tiny_args, tiny_model

    torch.manual_seed(0)
    trainer = ParTrainer(model=tiny_model(loop_view="full"), args=tiny_args(folder, **arguments),
                         train_dataset=DATASET, data_collator=COLLATOR)
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e]


def test_the_trainer_adds_the_waiting_row_loss_and_refuses_a_negative_weight(tmp_path):
    from tests.test_trainers import tiny_args

    logs = trained_logs(tmp_path / "on", waiting_row_weight=0.5, max_steps=4)
    assert logs and all("loss_waiting_rows" in e for e in logs)
    assert all(e["loss"] == pytest.approx(e["loss_answer"] + 0.5 * e["loss_waiting_rows"], rel=1e-3) for e in logs)
    assert any(e["loss_waiting_rows"] > 0 for e in logs)
    with pytest.raises(ValueError, match="waiting_row_weight must be ≥ 0"):
        tiny_args(tmp_path, waiting_row_weight=-1.0)


def test_the_progress_flag_is_a_bce_on_one_channel_over_the_rows_rms_of_the_operation_tokens():
    generator = torch.Generator().manual_seed(2)
    states = [torch.randn(2, T, H, generator=generator) for _ in range(2)]
    # by hand at k = 2: operation tokens 2-7 (first prompt) and 2-9 (second); flag 1 for operations 1-2 (tokens 2-5)
    logits, targets = [], []
    for b, last in ((0, 7), (1, 9)):
        rows = states[1][b, 2 : last + 1]
        logits.append(rows[:, 0] / rows.pow(2).mean(-1).add(1e-6).sqrt())
        targets.append((torch.arange(2, last + 1) <= 5).float())
    expected = torch.nn.functional.binary_cross_entropy_with_logits(torch.cat(logits), torch.cat(targets))
    torch.testing.assert_close(progress_flag_loss(states, ENDS, MASK, torch.tensor([2])), expected)
    # a state whose channel 0 says the flag (large and of the right sign) has a loss near 0 (|f| <= sqrt(H): 8 here);
    # the other channels, the preamble and the question are free
    flagged = torch.randn(2, T, 64, generator=generator)
    flagged[..., 0] = torch.where(token_segments(ENDS, MASK).segments <= 2, 50.0, -50.0)
    assert progress_flag_loss([flagged, flagged], ENDS, MASK, torch.tensor([2])).item() < 1e-3
    assert progress_flag_loss([flagged, flagged], ENDS, MASK, torch.tensor([1])).item() > 1.0  # k = 1: only j = 1
    assert progress_flag_loss([flagged], ENDS, MASK, torch.tensor([1]), step_size=2).item() < 1e-3  # c = 2: j <= 2


def test_the_trainer_adds_the_progress_flag_loss_and_refuses_a_negative_weight(tmp_path):
    from tests.test_trainers import tiny_args

    logs = trained_logs(tmp_path / "on", progress_flag_weight=2.0, max_steps=3)
    assert logs and all(e["loss_progress_flag"] > 0 for e in logs)
    assert all(e["loss"] == pytest.approx(e["loss_answer"] + 2.0 * e["loss_progress_flag"], rel=1e-3) for e in logs)
    with pytest.raises(ValueError, match="progress_flag_weight must be ≥ 0"):
        tiny_args(tmp_path, progress_flag_weight=-0.5)
