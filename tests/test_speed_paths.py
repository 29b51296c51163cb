"""The faster paths compute what the reference path computes: the sdpa causal fast path (exactly), `compile_core()`
(to kernel rounding) and the evaluator's `workers` (the same answers). Speed itself is measured in
benchmarks/bench_speed.py, never here."""

import pytest
import torch

from modeling_par import ParLoopedQwenForStateTracking
from state_tracking import evaluate_length_generalization
from state_tracking.evaluation import worker_slices
from tests.conftest import make_model
from tests.test_evaluator import tiny_swap_s5_par_model
from tests.test_modeling_par import random_batch


def run_and_grads(model, input_ids, **kwargs):
    model.zero_grad()
    out = model(input_ids, num_iterations=4, readout_iterations=[2, 4], **kwargs)
    (out.answer_logits.square().sum() + out.halt_logits.square().sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.answer_logits.detach(), out.halt_logits.detach(), grads


def test_causal_fast_path_is_exactly_the_masked_computation():
    model = make_model()
    assert model.config._attn_implementation == "sdpa" and model.causal_fast_path
    input_ids, qpos = random_batch()
    ones = torch.ones_like(input_ids)
    assert model._full_view_mask(ones, model.model.embed_tokens(input_ids)) is None  # the fast path is taken
    fast = run_and_grads(model, input_ids, query_positions=qpos)
    model.causal_fast_path = False
    assert model._full_view_mask(ones, model.model.embed_tokens(input_ids)) is not None
    masked = run_and_grads(model, input_ids, query_positions=qpos)
    torch.testing.assert_close(fast[0], masked[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(fast[1], masked[1], atol=1e-6, rtol=0)
    assert fast[2].keys() == masked[2].keys() and len(fast[2]) > 5
    for name in fast[2]:
        torch.testing.assert_close(fast[2][name], masked[2][name], atol=1e-6, rtol=1e-5)


def test_causal_fast_path_is_not_taken_with_padding_or_eager_attention():
    model = make_model()
    input_ids, qpos = random_batch()
    padded = torch.ones_like(input_ids)
    padded[0, :2] = 0  # left padding in one sample
    hidden = model.model.embed_tokens(input_ids)
    assert model._full_view_mask(padded, hidden) is not None
    model.config._attn_implementation = "eager"  # eager attention needs the explicit (additive) mask
    mask = model._full_view_mask(torch.ones_like(input_ids), hidden)
    assert mask is not None and mask.dtype == hidden.dtype


def test_compile_core_matches_eager_forward_and_gradients():
    torch._dynamo.reset()
    model = make_model()
    input_ids, qpos = random_batch()
    eager = run_and_grads(model, input_ids, query_positions=qpos)
    model.compile_core(dynamic=False)
    assert model._compiled_core is not None
    compiled = run_and_grads(model, input_ids, query_positions=qpos)
    torch.testing.assert_close(compiled[0], eager[0], atol=1e-5, rtol=1e-5)
    for name in eager[2]:
        torch.testing.assert_close(compiled[2][name], eager[2][name], atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # predict runs the compiled block too (per-sample exit changes the batch size)
        pred = model.predict(input_ids, query_positions=qpos, num_iterations=torch.tensor([1, 2, 3]))
    assert model.compile_core(disable=True)._compiled_core is None
    with torch.no_grad():
        reference = model.predict(input_ids, query_positions=qpos, num_iterations=torch.tensor([1, 2, 3]))
    torch.testing.assert_close(pred.answer_logits, reference.answer_logits, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_worker_slices_cover_the_rows_once():
    assert worker_slices(0, 10, 3) == [slice(0, 3), slice(3, 7), slice(7, 10)]
    assert worker_slices(8, 10, 4) == [slice(8, 9), slice(9, 10)]  # never an empty part
    assert worker_slices(0, 5, 1) == [slice(0, 5)]


@pytest.mark.parametrize("loop_view", ["full", "local"])
def test_evaluator_workers_give_the_same_answers(loop_view):
    extra = {} if loop_view == "full" else dict(loop_view="local", progress_positions=True, bidirectional_queries=True)
    task, tokenizer, _, model = tiny_swap_s5_par_model(halt_confirm=1, halt_window=2, max_iterations=12, **extra)
    threads = torch.get_num_threads()
    for mode in ("forced", "halting"):
        common = dict(n_per_depth=21, batch_size=8, mode=mode, seed=3, progress=False)
        one = evaluate_length_generalization(model, tokenizer, task, [2, 5], **common)
        three = evaluate_length_generalization(model, tokenizer, task, [2, 5], workers=3, **common)
        assert three["workers"] == 3 and torch.get_num_threads() == threads  # restored after the threaded call
        for a, b in zip(one["per_depth"], three["per_depth"]):
            assert a == b


def test_evaluator_rejects_bad_workers():
    task, tokenizer, _, model = tiny_swap_s5_par_model()
    with pytest.raises(ValueError, match="workers"):
        evaluate_length_generalization(model, tokenizer, task, [2], n_per_depth=4, workers=0, progress=False)


def test_compile_core_is_not_saved(tmp_path):
    model = make_model().compile_core()
    model.save_pretrained(tmp_path)
    reloaded = ParLoopedQwenForStateTracking.from_pretrained(tmp_path)
    assert reloaded._compiled_core is None


def test_default_workers_follow_the_device():
    from state_tracking.evaluation import default_workers

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert default_workers("cpu") == 2
        torch.set_num_threads(1)
        assert default_workers(torch.device("cpu")) == 1
        assert default_workers("meta") == 1  # not a CPU: one part
    finally:
        torch.set_num_threads(threads)
