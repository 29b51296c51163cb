"""Answer feedback (`answer_feedback=True`: the state passed between iterations is the soft answer at the queries): the
state it writes, the local window against the masked computation with gradients, what passes between iterations, and
one coda call per iteration."""

import pytest
import torch

from tests.test_loop_views import OPS, readouts, task_model
from tests.test_speed_paths import RECIPE, window_batch, window_run_and_grads


def test_answer_feedback_state_writes_the_soft_answer_at_the_queries_only():
    from modeling_par.modeling_par import answer_feedback_state

    e = torch.randn(2, 5, 3)
    logits = torch.tensor([[[0.0, 50.0]], [[50.0, 0.0]]])  # (b, q=1, C=2): sample 0 answers 1, sample 1 answers 0
    embeddings = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    out = answer_feedback_state(e, logits, torch.tensor([[4], [2]]), embeddings)
    expected = e.clone()
    expected[0, 4] += embeddings[1]
    expected[1, 2] += embeddings[0]
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("rendering", ["symbolic", "text"])
def test_answer_feedback_window_equals_the_masked_computation_with_gradients(rendering):
    """With `answer_feedback` the local window (and its plans) computes what the masked whole-prompt loop computes,
    forward and backward; blocks are not used (the feedback reads out every iteration)."""
    model, tokenizer = task_model(rendering=rendering, answer_feedback=True, **RECIPE)
    batch = window_batch(tokenizer, OPS[:, :9], rendering)
    fast, fast_grads = window_run_and_grads(model, batch, iterations=11, reads=(3, 9, 11))
    with torch.no_grad():
        blocks = readouts(model, tokenizer, OPS[:, :9], rendering, iterations=11)
    model.runtime.local_window = False
    masked, masked_grads = window_run_and_grads(model, batch, iterations=11, reads=(3, 9, 11))
    torch.testing.assert_close(fast, masked, atol=2e-5, rtol=0)
    torch.testing.assert_close(blocks[[2, 8, 10]], masked, atol=2e-5, rtol=0)
    assert fast_grads.keys() == masked_grads.keys()
    for name in masked_grads:
        torch.testing.assert_close(fast_grads[name], masked_grads[name], atol=2e-5, rtol=1e-4)


def test_answer_feedback_passes_only_the_answer_between_iterations():
    """Under answer feedback the state handed to iteration k + 1 is e + softmax(y_k) E at the queries and e elsewhere:
    two iterations' states differ only at the query rows, by (softmax(y_j) − softmax(y_k)) E; without feedback the
    other rows of the query region carry state too."""
    def states_and_answers(feedback):
        model, tokenizer = task_model(answer_feedback=feedback, **RECIPE)
        model.runtime.local_window = False  # the states of the whole prompt, (b, t, h)
        batch = window_batch(tokenizer, OPS[:, :6])
        with torch.no_grad():
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                        num_iterations=6, readout_iterations=list(range(1, 7)), output_loop_states=True)
        embeddings = model.model.embed_tokens.weight[model.config.answer_token_ids]
        return out, batch["query_positions"], embeddings

    out, queries, embeddings = states_and_answers(True)
    b, q = queries.shape
    at_queries = torch.zeros(out.loop_states[0].shape[:2], dtype=torch.bool)
    at_queries[torch.arange(b)[:, None], queries] = True
    soft = out.answer_logits.softmax(-1) @ embeddings  # (R, b, q, h)
    for j, k in ((0, 3), (2, 5)):
        difference = out.loop_states[k] - out.loop_states[j]
        assert difference[~at_queries].abs().max() == 0
        torch.testing.assert_close(difference[torch.arange(b)[:, None], queries], soft[k] - soft[j],
                                   atol=1e-5, rtol=1e-4)
    off, _, _ = states_and_answers(False)
    assert not torch.allclose(off.loop_states[3], off.loop_states[0], atol=1e-4)


@pytest.mark.parametrize("local_window", [True, False])
def test_answer_feedback_runs_the_coda_once_per_iteration(local_window):
    """The feedback's readout is the iteration's readout: forward (every iteration read, with gradient) and predict
    (forced depth and learned halting) run the coda once per iteration run, not twice, and give what they gave."""
    model, tokenizer = task_model(answer_feedback=True, **RECIPE)
    model.runtime.local_window = local_window
    batch = window_batch(tokenizer, OPS[:, :6])
    inputs = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                  operation_ends=batch["operation_ends"])
    calls = {"core": 0, "coda": 0}

    def counted(name, function):
        def call(*args):
            calls[name] += 1
            return function(*args)
        return call

    model._core_layers = counted("core", model._core_layers)  # the core layers, on either path
    model._coda_block = counted("coda", model._coda_block)
    out = model(batch["input_ids"], num_iterations=6, readout_iterations=list(range(1, 7)), **inputs)
    assert calls == {"core": 6, "coda": 6}
    with torch.no_grad():
        blocks = readouts(model, tokenizer, OPS[:, :6], iterations=6)
    torch.testing.assert_close(out.answer_logits.detach(), blocks)
    calls.update(core=0, coda=0)
    forced = model.predict(batch["input_ids"], num_iterations=6, **inputs)
    assert calls == {"core": 6, "coda": 6}
    torch.testing.assert_close(forced.answer_logits, out.answer_logits[-1].detach())
    calls.update(core=0, coda=0)
    model.predict(batch["input_ids"], halting=True, max_iterations=10, **inputs)
    assert calls["coda"] == calls["core"] > 0


# ------------------------------------------------------------------------ answer_feedback_rows="queries" (full view)
def test_feedback_base_restarts_only_the_query_rows():
    from modeling_par.modeling_par import feedback_base

    e, state = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    columns = torch.tensor([[1, 4], [0, 2]])
    out = feedback_base(e, state, columns)
    expected = state.clone()
    for b, row in enumerate(columns.tolist()):
        expected[b, row] = e[b, row]
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def full_view_states(rows: str, feedback: bool = True, iterations: int = 5):
    model, tokenizer = task_model(loop_view="full", answer_feedback=feedback, answer_feedback_rows=rows)
    batch = window_batch(tokenizer, OPS[:, :5])
    with torch.no_grad():
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    query_positions=batch["query_positions"], num_iterations=iterations,
                    readout_iterations=list(range(1, iterations + 1)), output_loop_states=True,
                    output_prelude_states=True)
    embeddings = model.model.embed_tokens.weight[model.config.answer_token_ids]
    return out, batch, embeddings


def test_query_row_feedback_writes_the_answer_at_the_queries_and_keeps_the_rest_of_the_state():
    """Full view, `answer_feedback_rows="queries"`: at every iteration the query rows hold e_q + softmax(y_{k,q}) E
    (the bottleneck) and the rows before the first query hold exactly the plain loop's state (they cannot see the
    queries under causal attention), which differs from e: the state there is kept, not restarted."""
    out, batch, embeddings = full_view_states("queries")
    plain, _, _ = full_view_states("all", feedback=False)
    queries = batch["query_positions"]
    b = queries.shape[0]
    soft = out.answer_logits.softmax(-1) @ embeddings  # (R, b, q, h)
    e = out.prelude_states
    first_query = int(queries.min())
    for k in range(5):
        state = out.loop_states[k]
        torch.testing.assert_close(state[torch.arange(b)[:, None], queries],
                                   e[torch.arange(b)[:, None], queries] + soft[k], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(state[:, :first_query], plain.loop_states[k][:, :first_query], atol=1e-5,
                                   rtol=1e-4)
    assert not torch.allclose(out.loop_states[3][:, :first_query], e[:, :first_query], atol=1e-3)
    every_row, _, _ = full_view_states("all")  # the original feedback restarts those rows from e
    torch.testing.assert_close(every_row.loop_states[3][:, :first_query], e[:, :first_query], atol=0, rtol=0)


@pytest.mark.parametrize("fields, message", [
    (dict(answer_feedback_rows="some"), "one of ('all', 'queries')"),
    (dict(answer_feedback_rows="queries", answer_feedback=False, loop_view="full"), "answer_feedback=True"),
    (dict(answer_feedback_rows="queries", answer_feedback=True, loop_view="local", progress_positions=True,
          bidirectional_queries=True), "loop_view='full'"),
])
def test_answer_feedback_rows_refuses_what_it_cannot_do(fields, message):
    with pytest.raises(ValueError, match="answer_feedback_rows") as error:
        task_model(**fields)
    assert message in str(error.value)


def test_answer_feedback_rows_survives_save_and_load(tmp_path):
    from modeling_par import ParLoopedQwenForStateTracking

    model, _ = task_model(loop_view="full", answer_feedback=True, answer_feedback_rows="queries")
    model.save_pretrained(tmp_path)
    loaded = ParLoopedQwenForStateTracking.from_pretrained(tmp_path)
    assert loaded.config.answer_feedback_rows == "queries"
    out, batch, _ = full_view_states("queries")
    with torch.no_grad():
        again = loaded(batch["input_ids"], attention_mask=batch["attention_mask"],
                       query_positions=batch["query_positions"], num_iterations=5, readout_iterations=[5])
    torch.testing.assert_close(again.answer_logits[0], out.answer_logits[-1], atol=0, rtol=0)
