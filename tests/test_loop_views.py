"""Iteration-dependent views of the loop: `loop_view` (full / prefix / local), progress-coupled positions,
bidirectional queries, and the `operation_ends` input they read."""

import numpy as np
import pytest
import torch

from modeling_par import (
    LoopState,
    ParLoopedQwenForStateTracking,
    ReferenceLoop,
    loop_view_mask,
    operations_read,
    padded_causal_mask,
    progress_shift,
    token_segments,
)
from modeling_par.window_path import WindowLoop
from state_tracking import StateTrackingCollator, build_tokenizer, encode_batch, get_task, model_token_ids
from tests.conftest import make_model, tiny_par_config

SWAP = get_task("swap_s5")


def task_model(seed=0, rendering="symbolic", **overrides):
    tokenizer = build_tokenizer(SWAP, rendering)
    ids = model_token_ids(tokenizer, SWAP)
    overrides = dict(vocab_size=ids["vocab_size"], answer_token_ids=ids["answer_token_ids"],
                     halt_token_ids=ids["halt_token_ids"], **overrides)
    return make_model(seed, **overrides), tokenizer


def readouts(model, tokenizer, ops, rendering="symbolic", side="right", iterations=None, initial=None):
    batch = StateTrackingCollator(tokenizer.pad_token_id, padding_side=side)(
        encode_batch(SWAP, tokenizer, rendering, ops, initial))
    d = ops.shape[1]
    iterations = iterations or d
    with torch.no_grad():
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                    num_iterations=iterations, readout_iterations=list(range(1, iterations + 1)))
    return out.answer_logits  # (R, b, Q, C)


OPS = np.random.default_rng(0).integers(0, SWAP.num_ops, size=(3, 14))


# ------------------------------------------------------------------------------------------------ functions
def test_token_segments_and_operations_read():
    # <bos> op1 op2 op3 q1 q2 <pad> ; second sample: <bos> op1 q1 q2 <pad> <pad> <pad>
    ends = torch.tensor([[0, 1, 2, 3], [0, 1, -1, -1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]])
    segments, depth, query = token_segments(ends, mask)
    assert segments.tolist() == [[0, 1, 2, 3, 4, 4, 4], [0, 1, 2, 2, 2, 2, 2]]
    assert depth.tolist() == [3, 1]
    assert query.tolist() == [[0, 0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 0, 0]]
    low, high = operations_read(2, torch.tensor([3, 1]), step_size=1)
    assert low.tolist() == [1, 1] and high.tolist() == [2, 1]  # sample 2 has nothing left at k = 2
    low, high = operations_read(2, torch.tensor([7, 3]), step_size=2)
    assert low.tolist() == [2, 2] and high.tolist() == [4, 3]
    assert [t.tolist() for t in operations_read(0, torch.tensor([3]), 1)] == [[0], [0]]


def test_progress_shift_puts_queries_after_the_last_op_read():
    ends = torch.tensor([[0.0, 1, 2, 3, 4, 5]])  # d = 5, queries from position 6
    depth = torch.tensor([5])
    assert [progress_shift(ends, depth, k, 1).item() for k in range(7)] == [5, 4, 3, 2, 1, 0, 0]
    assert [progress_shift(ends, depth, k, 2).item() for k in range(4)] == [5, 3, 1, 0]


def test_local_mask_rows():
    ends = torch.tensor([[0, 1, 2, 3]])
    mask = torch.ones(1, 6, dtype=torch.long)  # <bos> op1 op2 op3 q1 q2
    segments, depth, query = token_segments(ends, mask)
    base = padded_causal_mask(mask, None)[:, 0]
    local = loop_view_mask(base, segments, depth, query, "local", 2, 1, bidirectional_queries=True)[0]
    assert local[4].tolist() == [False, False, True, False, True, True]  # q1 sees op 2 and both queries
    assert local[3].tolist() == [False, False, False, True, False, False]  # op 3 sees only itself
    prelude = loop_view_mask(base, segments, depth, query, "local", 0, 1, bidirectional_queries=False)[0]
    assert prelude[4].tolist() == [True, False, False, False, True, False]  # the preamble; causal queries
    prefix = loop_view_mask(base, segments, depth, query, "prefix", 2, 1, bidirectional_queries=False)[0]
    assert prefix[5].tolist() == [True, True, True, False, True, True]
    assert prefix[3].tolist() == [True, True, True, True, False, False]  # op rows stay causal
    full = loop_view_mask(base, segments, depth, query, "full", 2, 1, bidirectional_queries=False)[0]
    assert torch.equal(full, base[0])


# ------------------------------------------------------------------------------------------------ invariance
@pytest.mark.parametrize("view", ["local", "prefix"])
@pytest.mark.parametrize("rendering, side", [("symbolic", "right"), ("symbolic", "left"), ("text", "right")])
def test_iterations_up_to_d_do_not_depend_on_prompt_length(view, rendering, side):
    """With a restricted view and progress positions, iteration k of a d = 14 prompt computes exactly what it
    computes on the prompt's first k operations (k ≤ 5), padding and rendering whatever they are."""
    model, tokenizer = task_model(rendering=rendering, loop_view=view, progress_positions=True,
                                  bidirectional_queries=True)
    long = readouts(model, tokenizer, OPS, rendering, side)
    short = readouts(model, tokenizer, OPS[:, :5], rendering, side)
    torch.testing.assert_close(long[:5], short, atol=2e-5, rtol=0)
    full_model, _ = task_model(rendering=rendering, progress_positions=True)
    drift = (readouts(full_model, tokenizer, OPS, rendering, side)[:5]
             - readouts(full_model, tokenizer, OPS[:, :5], rendering, side)).abs().max()
    assert drift > 1e-3  # the full view does see the longer prompt


def core_step_at(model, tokenizer, ops, iteration, query_state):
    """The query rows of one core step at `iteration`, from a given query state (other rows: e), computed on the
    whole prompt (the masked reference computation)."""
    model.runtime.local_window = False
    batch = StateTrackingCollator(tokenizer.pad_token_id)(encode_batch(SWAP, tokenizer, "symbolic", ops))
    with torch.no_grad():
        backend = model._backend(batch["input_ids"], batch["attention_mask"], batch["query_positions"], None,
                                 batch["operation_ends"])
        assert isinstance(backend, ReferenceLoop)
        state = backend.initial_state().clone()
        state[:, -SWAP.num_queries:] = query_state
        (step,) = backend.advance(LoopState(iteration - 1, state, None), iteration)
    assert step.iteration == iteration
    return step.state[:, -SWAP.num_queries:]


@pytest.mark.parametrize("view, stationary", [("local", True), ("prefix", False)])
def test_local_view_step_is_the_same_map_at_every_k(view, stationary):
    """Local view: the update of iteration k is a function of (query states, op k) only — the same op read at
    iteration 7 of a 9-op prompt and at iteration 2 of a 3-op prompt gives the same new query states. The prefix
    view also reads ops 1..k−1, so it does not."""
    model, tokenizer = task_model(loop_view=view, progress_positions=True, bidirectional_queries=True)
    rng = np.random.default_rng(3)
    long_ops, short_ops = rng.integers(0, SWAP.num_ops, (3, 9)), rng.integers(0, SWAP.num_ops, (3, 3))
    short_ops[:, 1] = long_ops[:, 6]
    query_state = torch.randn(3, SWAP.num_queries, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    late = core_step_at(model, tokenizer, long_ops, 7, query_state)
    early = core_step_at(model, tokenizer, short_ops, 2, query_state)
    if stationary:
        torch.testing.assert_close(late, early, atol=2e-5, rtol=0)
    else:
        assert (late - early).abs().max() > 1e-3


def test_options_off_ignore_operation_ends_and_match_plain_forward():
    model, tokenizer = task_model()
    batch = StateTrackingCollator(tokenizer.pad_token_id)(encode_batch(SWAP, tokenizer, "symbolic", OPS))
    kwargs = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"], num_iterations=4)
    with torch.no_grad():
        plain = model(batch["input_ids"], **kwargs).answer_logits
        given = model(batch["input_ids"], operation_ends=batch["operation_ends"], **kwargs).answer_logits
    assert torch.equal(plain, given)


def test_predict_with_local_view_equals_forward_and_exits_early():
    model, tokenizer = task_model(loop_view="local", progress_positions=True, bidirectional_queries=True)
    ops = [OPS[:1, :3], OPS[1:2, :7], OPS[2:, :5]]
    rows = {k: sum((encode_batch(SWAP, tokenizer, "symbolic", o)[k] for o in ops), []) for k in
            ("input_ids", "query_positions", "operation_ends")}
    batch = StateTrackingCollator(tokenizer.pad_token_id)(rows)
    depths = torch.tensor([3, 7, 5])
    with torch.no_grad():
        pred = model.predict(batch["input_ids"], attention_mask=batch["attention_mask"],
                             query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                             num_iterations=depths)
    for b, o in enumerate(ops):
        alone = readouts(model, tokenizer, o)[-1, 0]
        torch.testing.assert_close(pred.answer_logits[b], alone, atol=2e-5, rtol=0)


def test_operation_ends_are_validated():
    model, tokenizer = task_model(loop_view="local", progress_positions=True)
    batch = StateTrackingCollator(tokenizer.pad_token_id)(encode_batch(SWAP, tokenizer, "symbolic", OPS[:, :4]))
    kwargs = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"], num_iterations=2)
    with pytest.raises(ValueError, match="operation_ends is required"):
        model(batch["input_ids"], **kwargs)
    bad = batch["operation_ends"].clone()
    bad[0, 2] = bad[0, 1]  # not increasing
    with pytest.raises(ValueError, match="strictly increasing"):
        model(batch["input_ids"], operation_ends=bad, **kwargs)
    with pytest.raises(ValueError, match="shape"):
        model(batch["input_ids"], operation_ends=batch["operation_ends"][:1], **kwargs)
    late = batch["operation_ends"].clone()
    late[:, -1] = batch["query_positions"][:, 0]  # the last op would end on a query
    with pytest.raises(ValueError, match="after the last operation"):
        model(batch["input_ids"], operation_ends=late, **kwargs)


@pytest.mark.parametrize("field, value", [("loop_view", "window"), ("progress_positions", 1),
                                          ("bidirectional_queries", "yes")])
def test_view_config_fields_are_validated(field, value):
    with pytest.raises(ValueError, match=f"ParLoopedQwenConfig.{field}"):
        tiny_par_config(**{field: value})


def test_view_options_round_trip_through_save_pretrained(tmp_path):
    model, tokenizer = task_model(loop_view="local", progress_positions=True, bidirectional_queries=True)
    model.save_pretrained(tmp_path)
    loaded = ParLoopedQwenForStateTracking.from_pretrained(tmp_path).eval()
    assert (loaded.config.loop_view, loaded.config.progress_positions, loaded.config.bidirectional_queries) == (
        "local", True, True)
    torch.testing.assert_close(readouts(loaded, tokenizer, OPS[:, :6]), readouts(model, tokenizer, OPS[:, :6]))


@pytest.mark.parametrize("rendering, side, step_size, bidirectional", [
    ("symbolic", "right", 1, True), ("symbolic", "left", 2, False), ("text", "right", 1, True),
    ("text", "left", 2, True)])
def test_local_window_equals_the_masked_local_computation(rendering, side, step_size, bidirectional):
    """The fast path (core and coda on iteration k's op tokens + the query region) computes what the masked
    full-prompt local view computes, including iterations past d (no operation left) and varying op spans."""
    model, tokenizer = task_model(rendering=rendering, loop_view="local", progress_positions=True,
                                  bidirectional_queries=bidirectional, step_size=step_size)
    assert model.runtime.local_window
    fast = readouts(model, tokenizer, OPS[:, :9], rendering, side, iterations=12)
    model.runtime.local_window = False
    masked = readouts(model, tokenizer, OPS[:, :9], rendering, side, iterations=12)
    torch.testing.assert_close(fast, masked, atol=2e-5, rtol=0)


def test_local_window_gradients_equal_the_masked_ones():
    model, tokenizer = task_model(loop_view="local", progress_positions=True, bidirectional_queries=True)
    batch = StateTrackingCollator(tokenizer.pad_token_id)(encode_batch(SWAP, tokenizer, "symbolic", OPS[:, :6]))
    grads = []
    for window in (True, False):
        model.runtime.local_window = window
        model.zero_grad()
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                    num_iterations=6, readout_iterations=[2, 4, 6])
        out.answer_logits.square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("rendering, side, seed", [("symbolic", "right", 0), ("text", "left", 3)])
def test_window_backend_equals_the_reference_backend(rendering, side, seed):
    """The two loop backends, chosen once per batch (`runtime.local_window`), compute the same on a batch of several
    depths: a training forward (readouts before and inside the gradient window, past d; gradients), forced depth per
    sample, and learned halting (halting iterations, flags and answers; some samples never confirmed)."""
    model, tokenizer = task_model(seed=seed, rendering=rendering, grad_window=3, halt_confirm=2, halt_window=3,
                                  loop_view="local", progress_positions=True, bidirectional_queries=True)
    with torch.no_grad():  # spread P(Yes) across samples
        model.lm_head.weight[model.config.halt_token_ids[0]] += 0.5 * torch.randn(
            model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    rng = np.random.default_rng(seed)
    parts = [encode_batch(SWAP, tokenizer, rendering, rng.integers(0, SWAP.num_ops, (2, d))) for d in (3, 9, 5, 7)]
    rows = {k: sum((p[k] for p in parts), []) for k in ("input_ids", "query_positions", "operation_ends")}
    batch = StateTrackingCollator(tokenizer.pad_token_id, padding_side=side)(rows)
    common = {k: batch[k] for k in ("attention_mask", "query_positions", "operation_ends")}
    runs = {}
    for window in (True, False):
        model.runtime.local_window = window
        with torch.no_grad():
            backend = model._backend(batch["input_ids"], *(common[k] for k in ("attention_mask", "query_positions")),
                                     None, common["operation_ends"])
        assert isinstance(backend, WindowLoop if window else ReferenceLoop)
        model.train()
        model.zero_grad()
        out = model(batch["input_ids"], num_iterations=11, readout_iterations=[2, 6, 9, 10, 11], **common)
        (out.answer_logits.square().sum() + out.halt_logits.square().sum()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.eval()
        forced = model.predict(batch["input_ids"], num_iterations=torch.tensor([3, 1, 9, 12, 5, 6, 7, 8]), **common)
        halting = model.predict(batch["input_ids"], halting=True, max_iterations=10, **common)
        runs[window] = (out.answer_logits.detach(), out.halt_logits.detach(), grads, forced, halting)
    (answers, halts, grads, forced, halting), reference = runs[True], runs[False]
    torch.testing.assert_close(answers, reference[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(halts, reference[1], atol=2e-5, rtol=0)
    assert grads.keys() == reference[2].keys() and len(grads) > 5
    for name in grads:  # fp32 sums in another order over 11 iterations: compared at each tensor's scale
        scale = reference[2][name].abs().max().item()
        torch.testing.assert_close(grads[name], reference[2][name], atol=1e-5 * scale, rtol=0)
    torch.testing.assert_close(forced.answer_logits, reference[3].answer_logits, atol=2e-5, rtol=0)
    assert forced.iterations.tolist() == [3, 1, 9, 12, 5, 6, 7, 8] and forced.halted.all()
    assert halting.iterations.tolist() == reference[4].iterations.tolist()
    assert halting.halted.tolist() == reference[4].halted.tolist()
    torch.testing.assert_close(halting.answer_logits, reference[4].answer_logits, atol=2e-5, rtol=0)
    assert len(set(halting.iterations.tolist())) > 1 and halting.halted.any() and not halting.halted.all()
