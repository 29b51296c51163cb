"""The window path's prelude, run per segment (`window_path.segmented_prelude`), against the masked whole-prompt prelude
(`loop_views.loop_view_mask`, local, k = 0: the reference), and the window path's memory, linear in the prompt."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modeling_par import ReferenceLoop, token_segments
from modeling_par.window_path import WindowLoop, segment_rows
from state_tracking import StateTrackingCollator, encode_batch
from tests.conftest import VOCAB, make_model
from tests.test_loop_views import SWAP, task_model

RECIPE = dict(loop_view="local", progress_positions=True, bidirectional_queries=True)


def ragged_prompts(seed: int, depths: list[int], side: str, max_op_tokens: int = 9, queries: int = 2) -> dict:
    """Text-like random prompts: a preamble of 1–6 tokens, d_b operations of 1–`max_op_tokens` tokens each, a query
    region of `queries`–6 tokens, padded on `side` to the longest. query_positions: the first and last query token
    (`queries` = 2) or the last (1)."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in depths:
        lengths = [int(rng.integers(1, 7))] + [int(n) for n in rng.integers(1, max_op_tokens + 1, d)]
        ends = (np.cumsum(lengths) - 1).tolist()
        query_length = int(rng.integers(queries, 7))
        t = ends[-1] + 1 + query_length
        picks = [ends[-1] + 1, t - 1][-queries:]
        rows.append((rng.integers(1, VOCAB, t).tolist(), ends, picks))
    width, depth = max(len(r[0]) for r in rows), max(depths)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    ends = torch.full((len(rows), depth + 1), -1, dtype=torch.long)
    picks = torch.zeros(len(rows), queries, dtype=torch.long)
    for i, (tokens, row_ends, row_picks) in enumerate(rows):
        shift = width - len(tokens) if side == "left" else 0
        ids[i, shift:shift + len(tokens)] = torch.tensor(tokens)
        mask[i, shift:shift + len(tokens)] = 1
        ends[i, :len(row_ends)] = torch.tensor(row_ends) + shift
        picks[i] = torch.tensor(row_picks) + shift
    return dict(input_ids=ids, attention_mask=mask, operation_ends=ends, query_positions=picks)


def text_batch(tokenizer, depths: list[int], side: str, seed: int = 0) -> dict:
    """swap-S5 text prompts of several depths in one batch (ragged: padding on `side`)."""
    rng = np.random.default_rng(seed)
    parts = [encode_batch(SWAP, tokenizer, "text", SWAP.sample_ops(rng, 1, d)) for d in depths]
    rows = {k: sum((p[k] for p in parts), []) for k in ("input_ids", "query_positions", "operation_ends")}
    batch = StateTrackingCollator(tokenizer.pad_token_id, padding_side=side)(rows)
    return {k: batch[k] for k in ("input_ids", "attention_mask", "query_positions", "operation_ends")}


def prepared(model, batch, window: bool, position_scale=None):
    """The loop backend the model chooses for `batch` (after its prelude), with `runtime.local_window = window`."""
    model.runtime.local_window = window
    with torch.no_grad():
        return model._backend(batch["input_ids"], batch["attention_mask"], batch["query_positions"], position_scale,
                              batch["operation_ends"])


def assert_prelude_equal(model, batch, position_scale=None):
    fast, masked = prepared(model, batch, True, position_scale), prepared(model, batch, False, position_scale)
    assert isinstance(fast, WindowLoop) and isinstance(masked, ReferenceLoop)
    real = batch["attention_mask"].bool()
    assert fast.loop.base_allowed is None and masked.loop.base_allowed is not None  # no (b, t, t) mask on the window
    torch.testing.assert_close(fast.prelude_out[real], masked.prelude_out[real], atol=1e-5, rtol=0)
    assert (fast.prelude_out[~real] == 0).all()  # padding: never read on the window path
    torch.testing.assert_close(fast.loop.positions, masked.loop.positions, atol=0, rtol=0)
    torch.testing.assert_close(fast.initial_state(), masked.prelude_out.gather(
        1, fast.window.query_index[..., None].expand(-1, -1, model.config.hidden_size)), atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.e_half, model.adapter_e_half(fast.window.query_e), atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------ token_segments
@pytest.mark.parametrize("side", ["left", "right"])
def test_token_segments_equal_the_definition(side):
    """segment(t) = #{i ≤ d : end_i < t}, here from a running count of markers: the (b, t, D+1) comparison it
    replaces, on ragged batches (depth 0 included)."""
    batch = ragged_prompts(1, [0, 3, 11, 1, 7], side)
    ends, mask = batch["operation_ends"], batch["attention_mask"]
    segments, depth, query = token_segments(ends, mask)
    t = torch.arange(mask.shape[1])
    big = ends.masked_fill(ends < 0, torch.iinfo(torch.long).max)
    reference = (big[:, None, :] < t[None, :, None]).sum(-1)
    assert torch.equal(segments, reference)
    assert depth.tolist() == [0, 3, 11, 1, 7]
    assert torch.equal(query, (reference == depth[:, None] + 1) & mask.bool())


def test_segment_rows_hold_every_real_token_once():
    batch = ragged_prompts(2, [4, 0, 9], "left")
    model = make_model(**RECIPE)
    backend = prepared(model, batch, True)
    blocks = segment_rows(backend.loop, batch["attention_mask"], True)
    held = torch.cat([rows.index[rows.inside] for rows in blocks]).sort().values
    real = batch["attention_mask"].reshape(-1).nonzero()[:, 0]
    assert torch.equal(held, real)
    assert blocks[0].index.shape[0] == 4 + 9 and blocks[1].index.shape[0] == 3  # a row per operation, per sample


# ------------------------------------------------------------------------------------------------ the prelude
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("bidirectional, progress", [(True, True), (False, True), (True, False)])
def test_segmented_prelude_equals_the_masked_prelude(side, attn, bidirectional, progress):
    """Random ragged text-like prompts (several tokens per operation, depth 0 among them), 2 prelude layers: e at every
    real token equals the masked whole-prompt prelude's (fp32, 1e-5), with and without stretch."""
    model = make_model(loop_view="local", progress_positions=progress, bidirectional_queries=bidirectional)
    model.set_attn_implementation(attn)
    assert model.config.prelude_layers == 2
    batch = ragged_prompts(3, [5, 0, 12, 2], side)
    assert_prelude_equal(model, batch)
    assert_prelude_equal(model, batch, position_scale=torch.tensor([1.0, 2.0, 1.5, 3.0]))


def test_segmented_prelude_of_a_batch_without_operations():
    model = make_model(**RECIPE)
    assert_prelude_equal(model, ragged_prompts(4, [0, 0], "right", queries=1))


@pytest.mark.parametrize("side", ["left", "right"])
def test_segmented_prelude_on_swap_s5_text_prompts(side):
    model, tokenizer = task_model(rendering="text", **RECIPE)
    assert_prelude_equal(model, text_batch(tokenizer, [2, 9, 5], side))


# ------------------------------------------------------------------------------------------------ the whole loop
@pytest.mark.parametrize("side", ["left", "right"])
def test_window_path_with_segmented_prelude_equals_the_masked_loop(side):
    """forward (readouts, gradients through the prelude) and predict at per-sample forced depths on a ragged batch of
    random text-like prompts: the window path equals the masked local computation."""
    model = make_model(grad_window=4, **RECIPE)
    batch = ragged_prompts(5, [6, 2, 9], side)
    common = {k: batch[k] for k in ("attention_mask", "query_positions", "operation_ends")}
    runs = {}
    for window in (True, False):
        model.runtime.local_window = window
        model.zero_grad()
        out = model(batch["input_ids"], num_iterations=10, readout_iterations=[1, 4, 10], **common)
        (out.answer_logits.square().sum() + out.halt_logits.square().sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        predicted = model.predict(batch["input_ids"], num_iterations=torch.tensor([6, 2, 9]), **common)
        runs[window] = (out.answer_logits.detach(), grads, predicted.answer_logits)
    torch.testing.assert_close(runs[True][0], runs[False][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(runs[True][2], runs[False][2], atol=1e-5, rtol=0)
    assert runs[True][1].keys() == runs[False][1].keys()
    assert any(n.startswith("model.layers.0.") for n in runs[True][1])  # the prelude is trained through e
    for name in runs[False][1]:
        torch.testing.assert_close(runs[True][1][name], runs[False][1][name], atol=1e-5, rtol=1e-4)


class _LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operation returns while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel())
        return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_window_path_holds_no_tensor_quadratic_in_the_prompt(attn):
    """The largest tensor a forced-depth predict creates grows like the prompt on the window path (text prompts,
    d = 16 -> 64: t × 3.2) — no (b, t, t) mask or scores, no (b, t, D+1) segment comparison — while the masked path
    grows like its square (× 10)."""
    model, tokenizer = task_model(rendering="text", **RECIPE)
    model.set_attn_implementation(attn)
    largest = {}
    for window in (True, False):
        model.runtime.local_window = window
        for depth in (16, 64):
            batch = text_batch(tokenizer, [depth, depth], "right")
            with _LargestTensor() as probe:
                model.predict(batch["input_ids"], num_iterations=depth, attention_mask=batch["attention_mask"],
                              query_positions=batch["query_positions"], operation_ends=batch["operation_ends"])
            largest[window, depth] = probe.largest
    assert largest[True, 64] / largest[True, 16] < 4.5, largest
    assert largest[False, 64] / largest[False, 16] > 8, largest  # the probe does see a quadratic tensor
