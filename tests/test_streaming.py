"""The live monitor (`modeling_par.streaming.StateStream`, `model.stream`): events one at a time, each answered equal to
`predict` on the whole prompt of the events so far, O(1) per event, stopped and resumed with the same answers, and the
configurations it cannot stream exactly refused."""

import math

import pytest
import torch

from modeling_par import StateStream
from tests.conftest import VOCAB, make_model

LOCAL = dict(loop_view="local", progress_positions=True)
PAD = 0


def random_events(seed: int, count: int, longest: int = 3) -> list[list[int]]:
    """`count` operations of 1..`longest` random tokens each (ids 2..VOCAB−1: never the pad id)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (int(torch.randint(1, longest + 1, (1,), generator=g)),), generator=g).tolist()
            for _ in range(count)]


# three monitors: (preamble, query region, readout columns in it)
PROMPTS = [([1], [30, 31, 32], [0, 2]), ([1, 7, 8], [33, 34], [0, 1]), ([1, 5], [35, 36, 37, 38], [1, 3])]


def whole_prompts(prompts, events, side: str) -> dict:
    """The batch of whole prompts [preamble | operations | query region], padded on `side`: input_ids,
    attention_mask, query_positions and operation_ends (−1 past each sample's depth)."""
    rows = []
    for (preamble, queries, columns), ops in zip(prompts, events):
        ids, ends = list(preamble), [len(preamble) - 1]
        for op in ops:
            ids += op
            ends.append(len(ids) - 1)
        rows.append((ids + queries, ends, [len(ids) + c for c in columns]))
    width, depth = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    batch = {k: [] for k in ("input_ids", "attention_mask", "query_positions", "operation_ends")}
    for ids, ends, queries in rows:
        pad = width - len(ids)
        shift = pad if side == "left" else 0
        pads = [PAD] * pad
        batch["input_ids"].append(pads + ids if side == "left" else ids + pads)
        batch["attention_mask"].append([0] * pad + [1] * len(ids) if side == "left" else [1] * len(ids) + [0] * pad)
        batch["query_positions"].append([q + shift for q in queries])
        batch["operation_ends"].append([e + shift for e in ends] + [-1] * (depth - len(ends)))
    return {k: torch.tensor(v) for k, v in batch.items()}


def predict_whole(model, prompts, events, side, position_scale=None):
    """`predict` on the whole prompts at the pipeline's forced depth max(1, ⌈d / c⌉)."""
    c = model.config.step_size
    depth = torch.tensor([max(1, math.ceil(len(ops) / c)) for ops in events])
    batch = whole_prompts(prompts, events, side)
    return model.predict(batch.pop("input_ids"), num_iterations=depth, position_scale=position_scale, **batch)


CONFIGS = {
    "c1-bidirectional": dict(LOCAL, bidirectional_queries=True),
    "c2-causal-queries": dict(LOCAL, step_size=2),
    "c3-answer-feedback": dict(LOCAL, step_size=3, answer_feedback=True, bidirectional_queries=True),
    "nope-ordinary-positions": dict(loop_view="local", position_encoding="nope", bidirectional_queries=True),
    "no-anchoring": dict(LOCAL, norm_anchoring=False),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stream_answers_equal_predict_on_the_whole_prompt(name):
    """After every event (and before any), each of three monitors with operations of 1-3 tokens answers what
    `predict` answers on the whole prompt of its events so far, left or right padded in one batch, on the local
    window and on the masked reference loop."""
    model = make_model(seed=1, **CONFIGS[name])
    events = [random_events(seed, 8) for seed in range(len(PROMPTS))]
    streams = [model.stream(pre, queries, query_positions=columns) for pre, queries, columns in PROMPTS]
    for d in range(9):
        got = [s.update(ops[d - 1]) if d else s.answer() for s, ops in zip(streams, events)]
        assert all(g.events == d and g.iteration == max(1, math.ceil(d / model.config.step_size)) for g in got)
        so_far = [ops[:d] for ops in events]
        for window, side in ((True, "left" if d % 2 else "right"), (False, "right")):
            model.runtime.local_window = window
            expected = predict_whole(model, PROMPTS, so_far, side)
            for b, g in enumerate(got):
                torch.testing.assert_close(g.answer_logits, expected.answer_logits[b], atol=1e-5, rtol=0)
                assert torch.equal(g.answers, expected.answers[b])
        model.runtime.local_window = True


def test_stream_with_a_positional_stretch_and_its_halt_logits_equal_forward():
    """`position_scale` stretches every position as `predict`'s does; the halt logits are those of forward's readout
    at iteration ⌈d/c⌉."""
    model = make_model(seed=2, **LOCAL, step_size=2)
    (pre, queries, columns), ops = PROMPTS[1], random_events(7, 5)
    stream = model.stream(pre, queries, query_positions=columns, position_scale=1.5)
    for d in range(1, 6):
        got = stream.update(ops[d - 1])
        expected = predict_whole(model, [PROMPTS[1]], [ops[:d]], "right", position_scale=1.5)
        torch.testing.assert_close(got.answer_logits, expected.answer_logits[0], atol=1e-5, rtol=0)
        batch = whole_prompts([PROMPTS[1]], [ops[:d]], "left")
        with torch.no_grad():
            out = model(batch.pop("input_ids"), num_iterations=got.iteration, position_scale=1.5, **batch)
        torch.testing.assert_close(got.halt_logits, out.halt_logits[-1, 0], atol=1e-5, rtol=0)
    plain = make_model(seed=2, **LOCAL, step_size=2).stream(pre, queries, query_positions=columns)
    assert (plain.update(ops[0]).answer_logits - model.stream(pre, queries, query_positions=columns,
                                                              position_scale=1.5).update(ops[0]).answer_logits
            ).abs().max() > 1e-4  # the stretch is read


def test_default_readout_is_the_last_query_token_as_predict():
    model = make_model(seed=3, **LOCAL)
    ops = random_events(3, 3)
    stream = model.stream([1], [30, 31])
    for op in ops:
        got = stream.update(op)
    assert got.answer_logits.shape == (1, len(model.config.answer_token_ids))
    expected = predict_whole(model, [([1], [30, 31], [1])], [ops], "right")
    torch.testing.assert_close(got.answer_logits, expected.answer_logits[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("step_size, stop_after, dtype", [(1, 4, torch.float32), (2, 3, torch.float32),
                                                          (2, 4, torch.float32), (3, 5, torch.bfloat16)])
def test_save_and_resume_mid_stream_gives_the_uninterrupted_answers(tmp_path, step_size, stop_after, dtype):
    """Stopped after `stop_after` events (inside a group of c or at its end), saved to a file and resumed on a fresh
    model of the same weights: every later answer is bit-identical to the uninterrupted stream's (fp32 and bf16)."""
    kwargs = dict(LOCAL, step_size=step_size, bidirectional_queries=True)
    pre, queries, columns = PROMPTS[2]
    ops = random_events(11, 10)

    def fresh():
        return make_model(seed=4, **kwargs).to(dtype)

    whole = fresh().stream(pre, queries, query_positions=columns)
    expected = [whole.update(op) for op in ops]
    first = fresh().stream(pre, queries, query_positions=columns)
    for op in ops[:stop_after]:
        first.update(op)
    first.save(tmp_path / "monitor.pt")
    del first
    resumed = StateStream.load(fresh(), tmp_path / "monitor.pt")
    assert torch.equal(resumed.answer().answer_logits, expected[stop_after - 1].answer_logits)
    for op, want in zip(ops[stop_after:], expected[stop_after:]):
        got = resumed.update(op)
        assert torch.equal(got.answer_logits, want.answer_logits) and torch.equal(got.halt_logits, want.halt_logits)
        assert (got.events, got.iteration) == (want.events, want.iteration)
    # load_state_dict on a running stream replaces its prompt and state
    other = fresh().stream([1], [30])
    other.load_state_dict(whole.state_dict())
    assert torch.equal(other.update(ops[0]).answer_logits, whole.update(ops[0]).answer_logits)


def test_the_state_and_the_work_per_event_do_not_grow_with_the_history(monkeypatch):
    """O(1) per event: the prelude reads only the new operation's tokens, the core and the coda only [the group's
    operations | the query region], whatever the number of events; the saved state holds the same tensors after 3
    events and after 59."""
    model = make_model(seed=5, **LOCAL, step_size=2)
    rows = {"prelude": [], "coda": []}
    prelude, coda = model._prelude_block, model._coda_block

    def recording(name, block):
        def run(hidden, *args):
            rows[name].append(hidden.shape[1])
            return block(hidden, *args)
        return run

    monkeypatch.setattr(model, "_prelude_block", recording("prelude", prelude))
    monkeypatch.setattr(model, "_coda_block", recording("coda", coda))
    stream = model.stream([1, 2], [30, 31, 32], query_positions=[0, 1, 2])  # prelude on [preamble | query region]
    assert rows["prelude"] == [5]
    shapes = {}
    for d in range(1, 61):
        rows["prelude"].clear(), rows["coda"].clear()
        stream.update([3 + d % 7, 4])  # two tokens each
        assert rows["prelude"] == [2]  # the new operation alone
        assert rows["coda"] == [2 * (2 - d % 2) + 3]  # its group's operations (1 or 2 of them) and the queries
        if d in (3, 59):  # one operation of an unfinished group each
            state = stream.state_dict()
            shapes[d] = [tuple(state[k].shape) for k in ("query_e", "state", "reference_rms")] + [
                tuple(p["e"].shape) for p in state["pending"]]
    assert shapes[3] == shapes[59] == [(1, 3, 64), (1, 3, 64), (1, 3, 1), (2, 64)]


def test_ordinary_positions_under_rope_cannot_stream_which_is_why_they_are_refused():
    """Without progress positions (rope) the query region sits after the whole prompt: the loop state after 3
    operations changes when 3 more arrive. With them it does not: what the stream keeps."""
    events = random_events(13, 6)
    drift = {}
    for progress in (True, False):
        model = make_model(seed=6, loop_view="local", progress_positions=progress)
        states = []
        for d in (3, 6):
            batch = whole_prompts([PROMPTS[0]], [events[:d]], "right")
            with torch.no_grad():
                out = model(batch.pop("input_ids"), num_iterations=3, output_loop_states=True, **batch)
            states.append(out.loop_states[-1])  # s_3 of the query region
        drift[progress] = (states[0] - states[1]).abs().max().item()
    assert drift[True] < 1e-5 and drift[False] > 1e-3


@pytest.mark.parametrize("overrides, message", [
    (dict(loop_view="full"), "ParLoopedQwenConfig.loop_view='local'; got 'full'"),
    (dict(loop_view="prefix", progress_positions=True), "ParLoopedQwenConfig.loop_view='local'; got 'prefix'"),
    (dict(loop_view="local"), r"ParLoopedQwenConfig.progress_positions=True \(or position_encoding='nope'\)"),
])
def test_configurations_that_cannot_stream_exactly_are_refused(overrides, message):
    model = make_model(seed=0, **overrides)
    with pytest.raises(ValueError, match=message):
        model.stream([1], [30])
    with pytest.raises(ValueError, match=message):
        StateStream.from_state_dict(model, {})


def test_bad_inputs_and_foreign_states_are_refused():
    model = make_model(seed=0, **LOCAL)
    with pytest.raises(ValueError, match="preamble_ids must be a non-empty 1-D"):
        model.stream([], [30])
    with pytest.raises(ValueError, match=r"query_ids must lie in \[0, vocab_size=40\)"):
        model.stream([1], [30, 40])
    with pytest.raises(ValueError, match=r"query_positions must be a non-empty list of indices into query_ids, in "
                                         r"\[0, 2\)"):
        model.stream([1], [30, 31], query_positions=[2])
    with pytest.raises(ValueError, match="position_scale must be None or a number in"):
        model.stream([1], [30], position_scale=0.5)
    stream = model.stream([1], [30, 31])
    for bad in ([], [[3, 4]], [3.0], [-1]):
        with pytest.raises(ValueError, match="operation_ids must"):
            stream.update(bad)
    assert stream.events == 0  # a refused event is not read
    stream.update([3])
    other = make_model(seed=0, **LOCAL, step_size=2)
    with pytest.raises(ValueError, match=r"ParLoopedQwenConfig.step_size=1; this model has 2"):
        StateStream.from_state_dict(other, stream.state_dict())
    with pytest.raises(ValueError, match="state must be a StateStream.state_dict"):
        stream.load_state_dict({"format": 0})


def test_the_shipped_checkpoint_streams_the_true_state_event_by_event():
    """The trained swap-S5 checkpoint (local view, progress positions) as a live monitor: 120 swaps one at a time,
    every state after each the true one, the last equal to `predict` on the whole prompt."""
    from pathlib import Path

    import numpy as np
    from transformers import AutoTokenizer

    from modeling_par import ParLoopedQwenForStateTracking
    from state_tracking import load_task_from_dir

    folder = Path(__file__).resolve().parents[1] / "checkpoints" / "par-swap-s5-small"
    model = ParLoopedQwenForStateTracking.from_pretrained(folder, dtype=torch.float32).eval()
    vocab, task = AutoTokenizer.from_pretrained(folder).get_vocab(), load_task_from_dir(folder)
    ops = task.sample_ops(np.random.default_rng(0), 1, 120)
    truth = torch.as_tensor(task.prefix_states(ops)[0])  # (d + 1, queries): the state after 0..d swaps
    queries = [vocab[f"<q{q + 1}>"] for q in range(task.num_queries)]
    stream = model.stream([vocab["<bos>"]], queries, query_positions=list(range(task.num_queries)))
    events = [[vocab[task.op_names[op]]] for op in ops[0]]
    answers = torch.stack([stream.update(event).answers for event in events])
    assert torch.equal(answers, truth[1:])
    expected = predict_whole(model, [([vocab["<bos>"]], queries, list(range(task.num_queries)))], [events], "right")
    torch.testing.assert_close(stream.answer().answer_logits, expected.answer_logits[0], atol=1e-5, rtol=0)
