"""The records step's cost cuts compute what they replace (issue 71): the local window with answer feedback, whose
per-batch pieces (the adapter's halves, e at every plan's op rows, the readout's and the feedback's weight rows, rms
computed once per iteration) are built once, against the whole-prompt reference loop, forward and backward over a few
optimizer steps; and "par_eager"'s uncompiled attention (`bmm_attention`) against transformers' eager attention, bit
for bit. The cost itself is measured in benchmarks/bench_records_step.py and benchmarks/ab_records_step.py."""

from types import SimpleNamespace

import pytest
import torch

from tests.test_loop_views import OPS, task_model
from tests.test_speed_paths import RECIPE, window_batch


def step_loss_and_grads(model, batch, iterations: int):
    """The recipe's records step on `batch`: R iterations, readouts over the gradient window, the final answer's cross
    entropy (plus the halt logits, so the halting rows carry gradient too). -> (loss, {name: grad})."""
    model.zero_grad()
    reads = list(range(max(1, iterations - model.config.grad_window + 1), iterations + 1))
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                operation_ends=batch["operation_ends"], num_iterations=iterations, readout_iterations=reads)
    targets = torch.arange(out.answer_logits[-1].numel() // out.answer_logits.shape[-1]) % out.answer_logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(out.answer_logits[-1].flatten(0, -2), targets)
    (loss + 0.1 * out.halt_logits.square().mean()).backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("rendering, plan_iterations", [("symbolic", 16), ("text", 3)])
def test_feedback_window_step_equals_the_reference_loop_over_optimizer_steps(rendering, plan_iterations):
    """Answer feedback on the local window, a gradient window (3) shorter than the loop (9 iterations: the first plan is
    built in a no-grad iteration and still carries e's gradient into the window), operations of several tokens (text)
    and plans rebuilt inside the window (3 iterations each): the loss and every parameter's gradient equal the
    whole-prompt reference loop's (`local_window=False`), at each of three AdamW steps (the weights move off their
    initialisation, so W_e e and the feedback rows all matter)."""
    model, tokenizer = task_model(rendering=rendering, answer_feedback=True, grad_window=3, **RECIPE)
    model.train().set_attn_implementation("par_eager")
    model.runtime.window_plan_iterations = plan_iterations
    batch = window_batch(tokenizer, OPS[:, :8], rendering)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model.runtime.local_window = False
        reference_loss, reference = step_loss_and_grads(model, batch, iterations=9)
        model.runtime.local_window = True
        loss, grads = step_loss_and_grads(model, batch, iterations=9)
        torch.testing.assert_close(loss, reference_loss, atol=2e-6, rtol=0)
        assert grads.keys() == reference.keys()
        assert {"adapter.weight", "model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight"} <= set(grads)
        for name in reference:
            torch.testing.assert_close(grads[name], reference[name], atol=2e-5, rtol=1e-4, msg=name)
        optimizer.step()


def test_feedback_window_predict_equals_the_reference_loop():
    """predict (forced, per-sample depths: samples leave the batch and the plans are cut with them) on the window with
    its per-batch pieces gives the reference loop's answers."""
    model, tokenizer = task_model(answer_feedback=True, **RECIPE)
    batch = window_batch(tokenizer, OPS[:, :7])
    kwargs = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                  operation_ends=batch["operation_ends"], num_iterations=torch.tensor([3, 7, 5]))
    answers = {}
    for window in (True, False):
        model.runtime.local_window = window
        answers[window] = model.predict(batch["input_ids"], **kwargs).answer_logits
    torch.testing.assert_close(answers[True], answers[False], atol=2e-5, rtol=0)


@pytest.mark.parametrize("heads, kv_heads, queries, keys", [(4, 4, 2, 2), (4, 2, 5, 7), (2, 1, 1, 1)])
def test_bmm_attention_is_transformers_eager_attention_bit_for_bit(heads, kv_heads, queries, keys):
    """`par_eager_attention` uncompiled (`bmm_attention`: the two products as bmm, without matmul's broadcasting)
    gives exactly transformers' `eager_attention_forward`: output, weights and the gradients of q, k, v, on inputs laid
    out as the Qwen2 layer hands them over (head-transposed views), GQA included."""
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

    from modeling_par.par_attention import par_eager_attention

    g = torch.Generator().manual_seed(0)
    batch, dim = 3, 8
    q_rows = torch.randn(batch, queries, heads, dim, generator=g, requires_grad=True)
    k_rows, v_rows = (torch.randn(batch, keys, kv_heads, dim, generator=g, requires_grad=True) for _ in range(2))
    allowed = torch.rand(batch, 1, queries, keys, generator=g) > 0.3
    allowed[..., 0] = True
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, training=True)
    weights_out = torch.randn(batch, queries, heads, dim, generator=g)
    results = []
    for attention in (eager_attention_forward, par_eager_attention):
        out, weights = attention(module, q_rows.transpose(1, 2) * 1.0, k_rows.transpose(1, 2) * 1.0,
                                 v_rows.transpose(1, 2) * 1.0, mask, 0.35)
        grads = torch.autograd.grad((out * weights_out).sum() + weights.square().sum(), (q_rows, k_rows, v_rows))
        results.append((out, weights, *grads))
    for got, want in zip(*results[::-1]):
        assert got.shape == want.shape and got.stride() == want.stride() and torch.equal(got, want)
