"""The progress profile and padding control, checked exactly against models whose readouts are constructed."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from state_tracking import (
    build_tokenizer,
    format_profile,
    get_task,
    identity_operation,
    padded_operations,
    plot_progress_profile,
    progress_profile,
)

SWAP = get_task("swap_s5")
TOKENIZER = build_tokenizer(SWAP)
OP_IDS = {TOKENIZER.convert_tokens_to_ids(name): i for i, name in enumerate(SWAP.op_names)}


class OracleLoop(torch.nn.Module):
    """Reads the ops from the prompt and answers z_min(c·k, d) at iteration k while c·k ≤ `correct_until`, then
    a wrong state (every box shifted by one item); optionally wrong at every iteration when d > `max_prompt`
    (a positional failure)."""

    def __init__(self, step_size=1, correct_until=10**9, max_prompt=10**9, lag=0):
        super().__init__()
        self.config = SimpleNamespace(step_size=step_size)
        self.correct_until, self.max_prompt, self.lag = correct_until, max_prompt, lag
        self.calls = []

    def forward(self, input_ids, attention_mask, query_positions, num_iterations, readout_iterations,
                operation_ends=None):
        self.calls.append(num_iterations)
        c, logits = self.config.step_size, []
        for b in range(input_ids.shape[0]):
            ops = [OP_IDS[t] for t in input_ids[b].tolist() if t in OP_IDS]
            states = SWAP.prefix_states(np.array([ops]).reshape(1, len(ops)))[0]
            rows = []
            for k in readout_iterations:
                state = states[max(0, min(c * k, len(ops)) - self.lag)]  # lag: z_{c·k - lag}, a loop behind
                if c * k > self.correct_until or len(ops) > self.max_prompt:
                    state = (state + 1) % SWAP.num_candidates
                rows.append(torch.nn.functional.one_hot(torch.as_tensor(state), SWAP.num_candidates).float())
            logits.append(torch.stack(rows))
        return SimpleNamespace(answer_logits=torch.stack(logits, 1))  # (K, b, Q, C)


def test_profile_of_a_perfect_loop_is_all_ones_and_reads_every_iteration():
    model = OracleLoop()
    result = progress_profile(model, TOKENIZER, SWAP, [3, 7], n_per_depth=10, batch_size=4)
    assert result["profile"] == [[1.0] * 3, [1.0] * 7]
    assert result["final_accuracy"] == [1.0, 1.0] and result["first_failure"] == [None, None]
    assert model.calls == [3, 3, 3, 7, 7, 7]  # R = d per batch of 4 (10 sequences: 3 batches)


def test_profile_separates_iteration_count_from_positional_failures():
    counting = progress_profile(OracleLoop(correct_until=4), TOKENIZER, SWAP, [6], n_per_depth=8)
    assert counting["profile"] == [[1, 1, 1, 1, 0, 0]] and counting["first_failure"] == [5]
    positional = progress_profile(OracleLoop(max_prompt=5), TOKENIZER, SWAP, [4, 6], n_per_depth=8)
    assert positional["profile"] == [[1, 1, 1, 1], [0] * 6] and positional["first_failure"] == [None, 1]


def test_profile_with_step_size_two_and_extra_iterations():
    result = progress_profile(OracleLoop(step_size=2, correct_until=4), TOKENIZER, SWAP, [5], n_per_depth=6,
                              extra_iterations=2)
    # R = ⌈5/2⌉ + 2 = 5 readouts of z_2, z_4, z_5, z_5, z_5; the oracle fails once c·k > 4
    assert result["profile"] == [[1, 1, 0, 0, 0]] and result["final_accuracy"] == [0]


def test_padding_control_targets_stay_at_the_real_depth():
    result = progress_profile(OracleLoop(), TOKENIZER, SWAP, [4, 9], n_per_depth=6, padding_control_depth=4)
    assert result["kind"] == "padding_control" and result["profile"] == [[1.0] * 4, [1.0] * 9]
    rng = np.random.default_rng(0)
    ops = padded_operations(SWAP, rng, 5, 3, 8)
    assert ops.shape == (5, 8) and (ops[:, 3:] == identity_operation(SWAP)).all()
    states = SWAP.prefix_states(ops)
    assert (states[:, 3:] == states[:, 3:4]).all()  # the answer is z_3 at every length


def test_padding_control_and_profile_arguments_are_checked():
    with pytest.raises(ValueError, match="no identity operation"):
        identity_operation(get_task("a5"))
    assert identity_operation(get_task("s5")) == 0
    with pytest.raises(ValueError, match="padding_control_depth"):
        progress_profile(OracleLoop(), TOKENIZER, SWAP, [4], n_per_depth=2, padding_control_depth=5)
    with pytest.raises(ValueError, match="depths"):
        progress_profile(OracleLoop(), TOKENIZER, SWAP, [4, 4], n_per_depth=2)


def test_format_and_plot(tmp_path):
    result = progress_profile(OracleLoop(correct_until=2), TOKENIZER, SWAP, [3], n_per_depth=4)
    assert format_profile(result).splitlines()[-1] == "| 3 | 100 100 0 |"
    plot_progress_profile({"profile": result}, tmp_path / "p.png", train_max_depth=2)
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_the_profile_says_which_prefix_state_each_iteration_reads():
    on_track = progress_profile(OracleLoop(), TOKENIZER, SWAP, [5], n_per_depth=8)
    assert on_track["read_state"] == [[1, 2, 3, 4, 5]] and on_track["read_fraction"] == [[1.0] * 5]
    assert on_track["no_prefix_state"] == [[0.0] * 5]
    behind = progress_profile(OracleLoop(lag=2), TOKENIZER, SWAP, [5], n_per_depth=8)
    assert max(behind["profile"][0][2:]) < 0.5  # wrong against z_k from k = 3 (z_{k-2} == z_k only by chance) …
    assert behind["read_state"] == [[0, 0, 1, 2, 3]] and behind["read_fraction"] == [[1.0] * 5]  # … reading z_{k-2}


def test_prefix_state_alignment_counts_matches_ties_and_strangers():
    from state_tracking.diagnostics import prefix_state_alignment

    states = np.array([[[0, 1], [1, 0], [1, 0]], [[0, 1], [0, 1], [1, 0]]])  # (n=2, d+1=3, Q=2); z_1 == z_2 in row 0
    answers = np.array([[[1, 0], [0, 0]], [[0, 1], [1, 0]]])  # (n=2, R=2, Q=2); [0, 0] is no state of the problem
    result = prefix_state_alignment(answers, states)
    # k=1: row 0 reads z_1 and z_2, row 1 reads z_0 and z_1 -> z_1 on both; k=2: row 0 none, row 1 z_2
    assert result == {"read_state": [1, 2], "read_fraction": [1.0, 0.5], "no_prefix_state": [0.0, 0.5]}
    with pytest.raises(ValueError, match=r"answers must be \(n, R, Q\) and states \(n, d \+ 1, Q\)"):
        prefix_state_alignment(answers[0], states)


def test_readout_margins_agree_with_the_readouts_and_the_norm_trace():
    """`readout_margins`: a margin > 0 exactly where every query's argmax is z_k (checked against
    `iteration_readouts` on the same problems), the 10th percentile under the median, and the drift trace = 1 at
    k = 1."""
    import numpy as np

    from state_tracking.data import derive_seed
    from state_tracking.diagnostics import iteration_readouts, readout_margins
    from tests.test_loop_views import SWAP, task_model

    model, tokenizer = task_model(loop_view="full")
    result = readout_margins(model, tokenizer, SWAP, depth=5, n=24, seed=3, rendering="symbolic", batch_size=10)
    ops = SWAP.sample_ops(np.random.default_rng(derive_seed("margins", 3, 5)), 24, 5)
    answers = iteration_readouts(model, tokenizer, SWAP, ops, None, 5, rendering="symbolic")
    expected = (answers == SWAP.prefix_states(ops, None)[:, 1:]).all(-1).mean(0)
    np.testing.assert_allclose(result["accuracy"], expected)
    assert all(p10 <= median for p10, median in zip(result["margin_p10"], result["margin_median"]))
    assert result["state_rms_ratio"][0] == 1.0 and len(result["state_rms_ratio"]) == 5

    class OwnAnswers:  # the task, with the model's own readouts as the prefix states: every margin must be > 0
        def __getattr__(self, name):
            return getattr(SWAP, name)

        def prefix_states(self, ops, initial):
            return np.concatenate([SWAP.prefix_states(ops, initial)[:, :1], answers], axis=1)

    own = readout_margins(model, tokenizer, OwnAnswers(), depth=5, n=24, seed=3, rendering="symbolic", batch_size=10)
    assert own["accuracy"] == [1.0] * 5 and min(own["margin_p10"]) > 0
