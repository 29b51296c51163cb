"""The faster paths compute what the reference path computes: the sdpa causal fast path (exactly), `compile_core()`
(to kernel rounding) and the evaluator's `workers` (the same answers). Speed itself is measured in
benchmarks/bench_speed.py, never here."""

import pytest
import torch

from modeling_par import ParLoopedQwenForStateTracking, default_compile_options
from modeling_par.compile_support import eager_parts
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
    assert model.config._attn_implementation == "sdpa" and model.runtime.causal_fast_path
    input_ids, qpos = random_batch()
    ones = torch.ones_like(input_ids)
    assert model._full_view_mask(ones, model.model.embed_tokens(input_ids)) is None  # the fast path is taken
    fast = run_and_grads(model, input_ids, query_positions=qpos)
    model.runtime.causal_fast_path = False
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
    model.compile_core(dynamic=False, options={"cpp_wrapper": False})  # inductor's Python wrapper (the C++ one: below)
    assert model.compiled is not None
    compiled = run_and_grads(model, input_ids, query_positions=qpos)
    torch.testing.assert_close(compiled[0], eager[0], atol=1e-5, rtol=1e-5)
    for name in eager[2]:
        torch.testing.assert_close(compiled[2][name], eager[2][name], atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # predict runs the compiled block too (per-sample exit changes the batch size)
        pred = model.predict(input_ids, query_positions=qpos, num_iterations=torch.tensor([1, 2, 3]))
    assert model.compile_core(disable=True).compiled is None
    with torch.no_grad():
        reference = model.predict(input_ids, query_positions=qpos, num_iterations=torch.tensor([1, 2, 3]))
    torch.testing.assert_close(pred.answer_logits, reference.answer_logits, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_default_compile_options_add_the_cpp_wrapper_on_cpu_only():
    assert default_compile_options({}, torch.device("cpu")) == {"options": {"cpp_wrapper": True}}
    assert default_compile_options({"dynamic": False}, "cpu") == {"dynamic": False, "options": {"cpp_wrapper": True}}
    kept = {"options": {"cpp_wrapper": False, "max_autotune": True}}
    assert default_compile_options(kept, "cpu") == kept  # the caller's choice wins
    assert default_compile_options({"mode": "max-autotune"}, "cpu") == {"mode": "max-autotune"}  # mode excludes options
    assert default_compile_options({"backend": "eager"}, "cpu") == {"backend": "eager"}  # inductor's option only
    assert default_compile_options({}, "meta") == {}  # not a CPU


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
    assert reloaded.compiled is None


def test_default_workers_follow_the_device():
    from state_tracking.evaluation import default_workers

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert default_workers("cpu") == 2
        torch.set_num_threads(1)
        assert default_workers(torch.device("cpu")) == 1
        assert default_workers("meta") == 1  # not a CPU: one part
        torch.set_num_threads(2)
        assert default_workers("cpu", "eager") == 1  # eager attention: one part measured faster
        assert default_workers("cpu", "par_eager") == 1
        assert default_workers("cpu", "sdpa") == 2
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------- the local window's paths
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402

from state_tracking import StateTrackingCollator, encode_batch  # noqa: E402
from state_tracking.evaluation import check_attn_implementation, default_attn_implementation  # noqa: E402
from tests.conftest import load_example  # noqa: E402
from tests.test_loop_views import OPS, SWAP, readouts, task_model  # noqa: E402

RECIPE = dict(loop_view="local", progress_positions=True, bidirectional_queries=True)


def window_batch(tokenizer, ops, rendering="symbolic"):
    return StateTrackingCollator(tokenizer.pad_token_id)(encode_batch(SWAP, tokenizer, rendering, ops))


def window_run_and_grads(model, batch, iterations=6, reads=(2, 4, 6)):
    model.zero_grad()
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                operation_ends=batch["operation_ends"], num_iterations=iterations, readout_iterations=list(reads))
    (out.answer_logits.square().sum() + out.halt_logits.square().sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.answer_logits.detach(), grads


@pytest.mark.parametrize("plan_iterations, rendering", [(1, "symbolic"), (3, "text"), (5, "symbolic")])
def test_window_plans_of_any_block_size_equal_the_masked_computation(plan_iterations, rendering):
    """Windows built a block of iterations at a time (blocks straddling d = 9 and iterations past it, ops of
    varying token spans in the text rendering) compute what the masked full-prompt local view computes."""
    model, tokenizer = task_model(rendering=rendering, **RECIPE)
    model.runtime.window_plan_iterations = plan_iterations
    fast = readouts(model, tokenizer, OPS[:, :9], rendering, iterations=13)
    model.runtime.local_window = False
    masked = readouts(model, tokenizer, OPS[:, :9], rendering, iterations=13)
    torch.testing.assert_close(fast, masked, atol=2e-5, rtol=0)


def test_window_plans_follow_per_sample_early_exit():
    """predict drops finished samples mid-block: the plan is cut with them, and answers match one-iteration plans.
    Samples of different depths (so different windows and progress shifts) share the batch."""
    model, tokenizer = task_model(**RECIPE)
    ops = [OPS[:1, :3], OPS[1:2, :9], OPS[2:, :5]]
    rows = {k: sum((encode_batch(SWAP, tokenizer, "symbolic", o)[k] for o in ops), []) for k in
            ("input_ids", "query_positions", "operation_ends")}
    batch = StateTrackingCollator(tokenizer.pad_token_id)(rows)
    kwargs = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                  operation_ends=batch["operation_ends"], num_iterations=torch.tensor([3, 9, 5]))
    answers = {}
    for plan_iterations in (1, 4, 16):
        model.runtime.window_plan_iterations = plan_iterations
        with torch.no_grad():
            answers[plan_iterations] = model.predict(batch["input_ids"], **kwargs).answer_logits
    torch.testing.assert_close(answers[4], answers[1], atol=2e-5, rtol=0)
    torch.testing.assert_close(answers[16], answers[1], atol=2e-5, rtol=0)


def test_eager_attention_equals_sdpa_on_the_local_window():
    model, tokenizer = task_model(**RECIPE)
    batch = window_batch(tokenizer, OPS[:, :6])
    sdpa = window_run_and_grads(model, batch)
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    eager = window_run_and_grads(model, batch)
    torch.testing.assert_close(eager[0], sdpa[0], atol=1e-5, rtol=0)
    assert eager[1].keys() == sdpa[1].keys() and len(eager[1]) > 5
    for name in sdpa[1]:
        torch.testing.assert_close(eager[1][name], sdpa[1][name], atol=1e-5, rtol=1e-4)


def test_compile_core_on_the_local_window_matches_eager():
    """The default CPU training path: "par_eager" attention (its fused few-key blocks), the core update and the coda
    compiled, on the window, against the uncompiled model (where "par_eager" is "eager")."""
    torch._dynamo.reset()
    model, tokenizer = task_model(**RECIPE)
    model.set_attn_implementation("par_eager")
    batch = window_batch(tokenizer, OPS[:, :6])
    reference = window_run_and_grads(model, batch)
    model.compile_core(dynamic=False)
    assert model.compiled is not None and model.parts is model.compiled
    compiled = window_run_and_grads(model, batch)
    torch.testing.assert_close(compiled[0], reference[0], atol=1e-5, rtol=1e-5)
    for name in reference[1]:
        torch.testing.assert_close(compiled[1][name], reference[1][name], atol=1e-5, rtol=1e-4)
    torch._dynamo.reset()


def attention_inputs(keys, heads=4, kv_heads=2, queries=5, batch=3, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, queries, dim, generator=g)
    k, v = (torch.randn(batch, kv_heads, keys, dim, generator=g) for _ in range(2))
    allowed = torch.rand(batch, 1, queries, keys, generator=g) > 0.3
    allowed[..., 0] = True  # no empty softmax row
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)
    return module, q, k, v, mask


def test_small_block_attention_equals_transformers_eager_attention():
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward, repeat_kv

    from modeling_par.modeling_par import small_block_attention
    module, q, k, v, mask = attention_inputs(keys=7)
    want_out, want_weights = eager_attention_forward(module, q, k, v, mask, 0.35)
    out, weights = small_block_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), mask, 0.35)
    assert out.shape == want_out.shape == (3, 5, 4, 8) and weights.shape == want_weights.shape == (3, 4, 5, 7)
    torch.testing.assert_close(out, want_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    assert weights.masked_select(~(mask == 0).expand_as(weights)).abs().max() == 0  # masked keys get no weight
    no_mask, _ = small_block_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), None, 0.35)
    torch.testing.assert_close(no_mask, eager_attention_forward(module, q, k, v, None, 0.35)[0], atol=1e-6, rtol=1e-5)


def test_par_eager_attention_fuses_only_small_blocks_while_compiling(monkeypatch):
    """Uncompiled, "par_eager" is transformers' eager attention; while torch.compile traces it, blocks of at most
    SMALL_BLOCK_KEYS keys (and no dropout in training) go to `small_block_attention`; compiled, it gives the same
    values."""
    from modeling_par import par_attention as mp

    calls = []
    real = mp.small_block_attention
    monkeypatch.setattr(mp, "small_block_attention", lambda *a: calls.append(a[1].shape[-2]) or real(*a))
    module, q, k, v, mask = attention_inputs(keys=7)
    reference = mp.eager_attention_forward(module, q, k, v, mask, 0.35)[0]
    assert torch.equal(mp.par_eager_attention(module, q, k, v, mask, 0.35)[0], reference) and calls == []
    monkeypatch.setattr(mp.torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(mp.par_eager_attention(module, q, k, v, mask, 0.35)[0], reference, atol=1e-6, rtol=1e-5)
    assert calls == [7]
    big = attention_inputs(keys=mp.SMALL_BLOCK_KEYS + 1)
    mp.par_eager_attention(*big, 0.35)
    mp.par_eager_attention(SimpleNamespace(num_key_value_groups=2, training=True), q, k, v, mask, 0.35, dropout=0.1)
    assert calls == [7]  # a long block and training dropout stay on transformers' eager attention
    monkeypatch.undo()
    torch._dynamo.reset()
    compiled = torch.compile(mp.par_eager_attention, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(module, q, k, v, mask, 0.35)[0], reference, atol=1e-6, rtol=1e-5)
    torch._dynamo.reset()


def test_default_attn_implementation_follows_the_view_and_device():
    assert default_attn_implementation("local", "cpu") == "par_eager"
    assert default_attn_implementation("local", "cpu", local_window=False) == "sdpa"
    assert default_attn_implementation("full", "cpu") == "sdpa"
    assert default_attn_implementation("local", "cuda") == "sdpa"
    # a loaded model keeps what it runs unless the window path on a CPU switches it to par_eager
    assert default_attn_implementation("full", "cpu", current="eager") == "eager"
    assert default_attn_implementation("local", "cuda", current="sdpa") == "sdpa"
    assert default_attn_implementation("local", "cpu", current="sdpa") == "par_eager"
    assert check_attn_implementation("par_eager") == "par_eager"
    assert check_attn_implementation("auto") == "auto"
    with pytest.raises(ValueError, match="attn_implementation must be one of"):
        check_attn_implementation("flash_attention_2")


def test_train_par_speed_options_resolve_auto_and_reject_bad_values(monkeypatch):
    from trainers import model_setup

    train_par = load_example("examples/train_par.py")
    speed_options = model_setup.speed_options
    monkeypatch.setattr(model_setup, "inductor_can_compile_for_cpu", lambda: True)
    cpu = lambda steps, budget=None: SimpleNamespace(device=torch.device("cpu"), max_steps=steps,  # noqa: E731
                                                      max_train_seconds=budget)
    model_args, _, _ = train_par.parse_args([])
    assert (model_args.attn_implementation, model_args.compile_core) == ("auto", "auto")
    long_run = cpu(model_setup.AUTO_COMPILE_MIN_STEPS)
    assert speed_options(model_args, long_run, "local") == ("par_eager", True)
    assert speed_options(model_args, cpu(10), "local") == ("par_eager", False)  # compiling would not pay back
    assert speed_options(model_args, cpu(5000, budget=3), "local") == ("par_eager", False)  # nor in 3 s
    assert speed_options(model_args, long_run, "full") == ("sdpa", False)
    gpu = SimpleNamespace(device=torch.device("cuda"), max_steps=10_000)
    assert speed_options(model_args, gpu, "local") == ("sdpa", False)
    monkeypatch.setattr(model_setup, "inductor_can_compile_for_cpu", lambda: False)  # no C++ compiler: auto stays eager
    assert speed_options(model_args, long_run, "local") == ("par_eager", False)
    given, _, _ = train_par.parse_args(["--attn_implementation", "sdpa", "--compile_core", "false"])
    assert speed_options(given, long_run, "local") == ("sdpa", False)
    assert model_args.block_iterations == 4
    for flag, value, message in (("--attn_implementation", "flash", "--attn_implementation must be one of"),
                                 ("--compile_core", "yes", "--compile_core must be auto, true or false"),
                                 ("--block_iterations", "0", "--block_iterations must be an integer >= 1")):
        bad, _, _ = train_par.parse_args([flag, value])
        with pytest.raises(ValueError, match=message):
            speed_options(bad, long_run, "local")


def test_evaluate_par_picks_par_eager_attention_for_the_shipped_recipe_on_cpu():
    evaluate_par = load_example("examples/evaluate_par.py")
    from pathlib import Path
    shipped = Path(__file__).resolve().parents[1] / "checkpoints" / "par-swap-s5-small"
    model, _ = evaluate_par.load_model_and_tokenizer(str(shipped), "cpu")
    assert model.config.loop_view == "local" and model.config._attn_implementation == "par_eager"
    model, _ = evaluate_par.load_model_and_tokenizer(str(shipped), "cpu", attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("view", [RECIPE, {}])
def test_batched_readouts_equal_one_coda_call_per_iteration(view):
    """forward stacks the readouts of up to `readout_batch_iterations` iterations into one coda call: the same
    logits and gradients as one call per iteration (the window's span changes between plans on the way)."""
    model, tokenizer = task_model(**view)
    model.runtime.window_plan_iterations = 4
    batch = window_batch(tokenizer, OPS[:, :7])
    runs = []
    for batched in (1, 8):
        model.runtime.readout_batch_iterations = batched
        model.zero_grad()
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                    num_iterations=10, readout_iterations=[1, 2, 3, 5, 6, 7, 8, 9, 10])
        (out.answer_logits.square().sum() + out.halt_logits.square().sum()).backward()
        runs.append((out.answer_logits.detach(), out.halt_logits.detach(),
                     {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(runs[1][0], runs[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(runs[1][1], runs[0][1], atol=1e-5, rtol=0)
    for name in runs[0][2]:
        torch.testing.assert_close(runs[1][2][name], runs[0][2][name], atol=1e-5, rtol=1e-4)


class _WrappedAdapter(torch.nn.Module):
    """Stands in for a wrapper such as PEFT's modules_to_save: not a plain nn.Linear, so it is called whole."""

    def __init__(self, linear):
        super().__init__()
        self.inner = linear

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("view, local_window", [(RECIPE, True), (RECIPE, False), ({}, True)])
def test_split_adapter_equals_the_whole_adapter(view, local_window):
    """W [e ; s] as W_e e (once per batch) + W_s s (each iteration): the same logits and gradients as the adapter
    run on [e ; s] every iteration, on the window, the masked local view and the full view; a wrapped adapter is
    called whole."""
    model, tokenizer = task_model(**view)
    model.runtime.local_window = local_window
    with torch.no_grad():  # W_e and W_s both matter (the identity-style init leaves W_e e small)
        model.adapter.weight.add_(0.1 * torch.randn_like(model.adapter.weight))
    batch = window_batch(tokenizer, OPS[:, :7])
    runs = {}
    for split in (True, False):
        model.runtime.split_adapter = split
        assert (model._adapter_halves() is None) is (not split)
        runs[split] = window_run_and_grads(model, batch, iterations=8, reads=(1, 3, 8))
    torch.testing.assert_close(runs[True][0], runs[False][0], atol=1e-5, rtol=0)
    assert "adapter.weight" in runs[False][1] and runs[False][1]["adapter.weight"].abs().sum() > 0
    for name in runs[False][1]:
        torch.testing.assert_close(runs[True][1][name], runs[False][1][name], atol=1e-5, rtol=1e-4)
    model.runtime.split_adapter = True
    handle = model.adapter.register_forward_pre_hook(lambda module, args: None)  # hooks run only when it is called
    assert model._adapter_halves() is None
    handle.remove()
    assert model._adapter_halves() is not None
    model.adapter = _WrappedAdapter(model.adapter)
    assert model._adapter_halves() is None
    wrapped = window_run_and_grads(model, batch, iterations=8, reads=(1, 3, 8))
    torch.testing.assert_close(wrapped[0], runs[False][0], atol=1e-5, rtol=0)


def count_units(model) -> list:
    """A list that grows by one each time a no-grad unit of window iterations (`window_path.window_block`) runs: the
    model's parts stay eager, with the unit counted."""
    calls, parts = [], eager_parts(model)
    model.compiled = parts._replace(window_block=lambda *args: calls.append(1) or parts.window_block(*args))
    return calls


def block_runs(model, batch, block_iterations, calls):
    """forward (training, gradient window 3 of 13 iterations, readouts cutting no-grad runs short) and predict (mixed
    forced depths, past d) with `block_iterations`; `calls` counts the `window_block` units run."""
    model.runtime.block_iterations = block_iterations
    model.zero_grad()
    common = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                  operation_ends=batch["operation_ends"])
    out = model(batch["input_ids"], num_iterations=13, readout_iterations=[5, 11, 12, 13], output_loop_states=True,
                **common)
    (out.answer_logits.square().sum() + out.halt_logits.square().sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad():
        predicted = model.predict(batch["input_ids"], num_iterations=torch.tensor([3, 9, 13]), **common)
    return dict(answers=out.answer_logits.detach(), rms=out.state_rms.detach(), grads=grads,
                states=torch.stack(out.loop_states).detach(), predicted=predicted.answer_logits, calls=len(calls))


@pytest.mark.parametrize("rendering", ["symbolic", "text"])
def test_block_iterations_equal_one_iteration_at_a_time(rendering):
    """No-grad runs of `block_iterations` iterations (`window_block`, one unit) compute what single window steps
    compute one iteration at a time: readouts, loop states, state rms and gradients of a training forward whose first
    iterations run without grad, and predict's answers at per-sample forced depths; blocks straddle window plans."""
    model, tokenizer = task_model(rendering=rendering, grad_window=3, **RECIPE)
    model.runtime.window_plan_iterations = 4
    batch = window_batch(tokenizer, OPS[:, :9], rendering)
    calls = count_units(model)
    single = block_runs(model, batch, 1, calls)
    assert single["calls"] == 0
    blocks = block_runs(model, batch, 3, calls)
    # forward: 2-4, 6-8 (1 sets the anchoring reference, 5 is read, 11-13 carry grad); predict: 4-6, 7-9, 10-12
    # (depth 3 is read at 3, depth 9 at 9)
    assert blocks["calls"] == 2 + 3
    for key in ("answers", "rms", "states", "predicted"):
        torch.testing.assert_close(blocks[key], single[key], atol=1e-6, rtol=0)
    assert blocks["grads"].keys() == single["grads"].keys() and len(single["grads"]) > 5
    for name in single["grads"]:
        torch.testing.assert_close(blocks["grads"][name], single["grads"][name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rendering, seed, some_unconfirmed", [("symbolic", 2, True), ("symbolic", 4, False),
                                                              ("text", 3, True)])
def test_halting_in_blocks_equals_one_iteration_at_a_time(rendering, seed, some_unconfirmed):
    """predict(halting=True) on the local window runs `block_iterations` iterations as one unit and reads them in one
    coda call, in order; a sample that halts inside a block leaves the batch at its end. The same halting
    iterations, flags and answers as one iteration at a time: samples halting at different iterations, inside
    blocks, and (`some_unconfirmed`) never confirmed by max_iterations."""
    model, tokenizer = task_model(seed=seed, rendering=rendering, halt_confirm=2, halt_window=3, **RECIPE)
    with torch.no_grad():  # spread P(Yes) across samples
        model.lm_head.weight[model.config.halt_token_ids[0]] += 0.5 * torch.randn(
            model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    batch = window_batch(tokenizer, np.random.default_rng(seed).integers(0, SWAP.num_ops, size=(6, 9)), rendering)
    calls = count_units(model)
    runs = {}
    for block_iterations in (1, 3):
        model.runtime.block_iterations = block_iterations
        with torch.no_grad():
            runs[block_iterations] = model.predict(
                batch["input_ids"], attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                operation_ends=batch["operation_ends"], halting=True, max_iterations=16)
        runs[block_iterations, "calls"], calls[:] = len(calls), []
    single, blocks = runs[1], runs[3]
    assert runs[1, "calls"] == 0 and runs[3, "calls"] >= 1
    assert blocks.iterations.tolist() == single.iterations.tolist()
    assert blocks.halted.tolist() == single.halted.tolist()
    torch.testing.assert_close(blocks.answer_logits, single.answer_logits, atol=1e-5, rtol=0)
    assert len(set(single.iterations.tolist())) > 1  # samples halt at different iterations
    assert single.halted.any() and (not single.halted.all()) == some_unconfirmed


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, None])
def test_bad_runtime_options_are_rejected(bad):
    """Runtime options are checked when set, and only `model.runtime` holds them: the old attribute on the model
    (which would silently do nothing) and an unknown option are errors."""
    model, _ = task_model(**RECIPE)
    for name in ("block_iterations", "window_plan_iterations", "readout_batch_iterations"):
        with pytest.raises(ValueError, match=f"ParRuntimeOptions.{name} must be an int >= 1"):
            setattr(model.runtime, name, bad)
    with pytest.raises(ValueError, match="ParRuntimeOptions.local_window must be a bool"):
        model.runtime.local_window = 1
    with pytest.raises(AttributeError, match="set model.runtime.block_iterations"):
        model.block_iterations = 2
    with pytest.raises(AttributeError, match="has no option 'block_iteration'"):
        model.runtime.block_iteration = 2
    assert model.runtime.block_iterations == 4 and model.runtime.local_window is True


def test_compiled_block_iterations_match_eager():
    """`compile_core` compiles the no-grad block as one graph; here that graph alone is captured whole
    (`fullgraph=True`: no graph break) through AOT autograd without inductor's code generation (to keep the test
    short; inductor's kernels are tested on the single-iteration graph above) and checked against the eager unit."""
    model, tokenizer = task_model(**RECIPE)
    model.set_attn_implementation("eager")
    assert model.compile_core().compiled.window_block is not None and model.compile_core(disable=True).compiled is None
    batch = window_batch(tokenizer, OPS[:, :6])
    common = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                  operation_ends=batch["operation_ends"], num_iterations=5)
    model.runtime.block_iterations = 2
    with torch.no_grad():
        reference = model.predict(batch["input_ids"], **common).answer_logits
        torch._dynamo.reset()
        parts, calls = eager_parts(model), []
        unit = torch.compile(parts.window_block, backend="aot_eager", fullgraph=True, dynamic=False)
        model.compiled = parts._replace(window_block=lambda *args: calls.append(1) or unit(*args))  # only the unit
        compiled = model.predict(batch["input_ids"], **common).answer_logits
    assert len(calls) == 2  # iterations 2-3 and 4-5 (1 sets the anchoring reference)
    torch.testing.assert_close(compiled, reference, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
