"""The auxiliary phrasing-alignment loss (issue 49's lever): its value, the encodings it reads, and a training run."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import load_example
from tests.test_trainers import COLLATOR, DATASET, tiny_args, tiny_model
from trainers import (
    ParTrainingArguments,
    operation_encodings,
    phrasing_alignment_loss,
    within_operation_variance_ratio,
)

train_par = load_example("examples/train_par.py")


def test_the_loss_is_the_within_operation_spread_of_unit_encodings():
    e1, e2 = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 0.5])
    # operation 7 in two orthogonal wordings: centroid (0.5, 0.5), each at squared distance 0.5; operation 2 once
    # (no partner, not counted)
    z, ids = torch.stack([e1, e2, torch.tensor([1.0, 1.0])]), torch.tensor([7, 7, 2])
    assert phrasing_alignment_loss(z, ids).item() == pytest.approx(0.5)
    # scale does not matter, and wordings encoded alike cost nothing
    assert phrasing_alignment_loss(torch.stack([e1, 5 * e1, e2, 2 * e2]), torch.tensor([1, 1, 4, 4])).item() \
        == pytest.approx(0.0, abs=1e-7)
    # opposite encodings of one operation: the largest spread, 1 each
    assert phrasing_alignment_loss(torch.stack([e1, -e1]), torch.tensor([0, 0])).item() == pytest.approx(1.0)
    zero = phrasing_alignment_loss(torch.stack([e1, e2]).requires_grad_(), torch.tensor([0, 1]))
    assert zero.item() == 0.0 and zero.requires_grad  # no repeated operation: 0, still part of the graph


def test_operation_encodings_read_each_operations_last_token():
    states = torch.arange(2 * 6 * 1, dtype=torch.float32).view(2, 6, 1)
    ends = torch.tensor([[0, 2, 4, -1], [1, 3, -1, -1]])  # preamble end, then operations (−1 past d)
    ops = torch.tensor([[5, 6, -100], [5, -100, -100]])
    z, ids = operation_encodings(states, ends, ops)
    assert z.squeeze(-1).tolist() == [2.0, 4.0, 9.0] and ids.tolist() == [5, 6, 5]


def test_prelude_states_are_the_same_on_the_local_window_and_the_whole_prompt():
    model = tiny_model(loop_view="local", progress_positions=True, bidirectional_queries=True).eval()
    batch = COLLATOR([DATASET[i] for i in range(8)])
    kw = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
              query_positions=batch["query_positions"], operation_ends=batch["operation_ends"], num_iterations=2,
              output_prelude_states=True)
    with torch.no_grad():
        window = model(**kw).prelude_states
        model.runtime.local_window = False
        whole = model(**kw).prelude_states
        assert model(**{**kw, "output_prelude_states": False}).prelude_states is None
    z_window, ids = operation_encodings(window, batch["operation_ends"], batch["ops"])
    z_whole, _ = operation_encodings(whole, batch["operation_ends"], batch["ops"])
    assert len(ids) == int(batch["depth"].sum())
    torch.testing.assert_close(z_window, z_whole)


def test_a_negative_weight_is_refused(tmp_path):
    with pytest.raises(ValueError, match="phrasing_alignment_weight"):
        tiny_args(tmp_path, cls=ParTrainingArguments, phrasing_alignment_weight=-0.1)


def test_train_par_trains_with_it_on_a_text_task(tmp_path):
    flags = ["--task_file", "examples/tasks/batch_process_phrasings.json", "--rendering", "text",
             "--hidden_size", "32", "--intermediate_size", "64", "--num_attention_heads", "2",
             "--num_key_value_heads", "2", "--max_steps", "4", "--per_device_train_batch_size", "16",
             "--max_train_depth", "3", "--eval_depths", "3", "--eval_n", "8", "--logging_steps", "2",
             "--disable_tqdm", "true", "--use_cpu", "true", "--report_to", "none"]
    for form, most in (("unit", 2.0), ("variance_ratio", 1.0)):
        train_par.main(flags + ["--output_dir", str(tmp_path / form), "--phrasing_alignment_weight", "1.0",
                                "--phrasing_alignment_form", form])
        curve = json.loads((tmp_path / form / "summary.json").read_text())["curve"]
        values = [point["loss_align"] for point in curve if "loss_align" in point]
        assert len(values) == 2 and all(0.0 < v < most for v in values)  # wordings differ: a spread to shrink
    train_par.main(flags + ["--output_dir", str(tmp_path / "off")])
    curve = json.loads((tmp_path / "off" / "summary.json").read_text())["curve"]
    assert not any("loss_align" in point for point in curve)


def test_the_variance_ratio_is_the_share_of_the_spread_within_operations():
    # two operations, two wordings each; 1-d encodings 0, 2 (op 1) and 10, 12 (op 2): within 4 × 1, total 104
    z, ids = torch.tensor([[0.0], [2.0], [10.0], [12.0]]), torch.tensor([1, 1, 2, 2])
    within = 4 * 1.0
    total = sum((v - 6.0) ** 2 for v in (0.0, 2.0, 10.0, 12.0))
    assert within_operation_variance_ratio(z, ids).item() == pytest.approx(within / total)
    # a direction every encoding shares does not lower it (the unit form is blind to the same spread behind it)
    shared = torch.tensor([[100.0, 0.0]])
    wide = torch.cat([torch.zeros(4, 1), z], dim=1) + shared
    assert within_operation_variance_ratio(wide, ids).item() == pytest.approx(within / total)
    assert phrasing_alignment_loss(wide, ids).item() < 1e-3
    # scaling every encoding changes nothing; the operation explaining none of the spread gives 1
    assert within_operation_variance_ratio(3 * z, ids).item() == pytest.approx(within / total)
    assert within_operation_variance_ratio(z, torch.tensor([1, 2, 1, 2])).item() == pytest.approx(
        sum((v - m) ** 2 for v, m in ((0, 5), (10, 5), (2, 7), (12, 7))) / total)
    zero = within_operation_variance_ratio(z.clone().requires_grad_(), torch.tensor([1, 2, 3, 4]))
    assert zero.item() == 0.0 and zero.requires_grad  # no repeated operation


def test_an_unknown_form_is_refused(tmp_path):
    with pytest.raises(ValueError, match="phrasing_alignment_form"):
        tiny_args(tmp_path, cls=ParTrainingArguments, phrasing_alignment_form="cosine")
