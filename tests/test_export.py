import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import eval_results_to_model_index
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tests.conftest import VOCAB, load_example
from tests.test_modeling_par import load_remote, random_batch

REPO = Path(__file__).resolve().parents[1]
push_to_hub = load_example("examples/push_to_hub.py")


def word_tokenizer():
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", unk_token="w1")


def test_export_folder_is_hub_ready_and_loads_remotely(tiny_model, tmp_path):
    ckpt = tmp_path / "ckpt"
    tiny_model.save_pretrained(ckpt)
    word_tokenizer().save_pretrained(ckpt)
    (ckpt / "state_tracking_task.json").write_text(json.dumps({"name": "toy"}))
    results = tmp_path / "table.md"
    results.write_text("| depth | acc |\n|---|---|\n| 8 | 0.5 |")

    out = push_to_hub.export_for_hub(ckpt, tmp_path / "export", repo_id="me/par-tiny", results=results)
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "configuration_par.py", "modeling_par.py", "tokenizer.json",
            "tokenizer_config.json", "state_tracking_task.json", "README.md"} <= names
    card = (out / "README.md").read_text()
    assert "{{" not in card and "me/par-tiny" in card and "| 8 | 0.5 |" in card and "2 + 2 + 2" in card
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModel"].startswith("modeling_par.")
    assert AutoTokenizer.from_pretrained(out, trust_remote_code=True).convert_tokens_to_ids("w7") == 7

    input_ids, qpos = random_batch()
    with torch.no_grad():
        expected = tiny_model(input_ids, query_positions=qpos, num_iterations=4, readout_iterations=[2, 4])
    got = load_remote(out, {"input_ids": input_ids.tolist(), "query_positions": qpos.tolist()})
    torch.testing.assert_close(got, expected.answer_logits, atol=1e-6, rtol=0)


def test_export_rejects_bad_inputs(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="--checkpoint"):
        push_to_hub.export_for_hub(tmp_path / "nothing", tmp_path / "out")
    tiny_model.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="--dtype"):
        push_to_hub.export_for_hub(tmp_path / "ckpt", tmp_path / "out", dtype="fp8")
    push_to_hub.export_for_hub(tmp_path / "ckpt", tmp_path / "out", dtype="bfloat16")
    with pytest.raises(ValueError, match="--output_dir"):
        push_to_hub.export_for_hub(tmp_path / "ckpt", tmp_path / "out")


def front_matter(card: str) -> dict:
    assert card.startswith("---\n"), card[:80]
    return yaml.safe_load(card.split("---\n", 2)[1])


def measured_metrics(index: list[dict]) -> dict[tuple[int, str], float]:
    """(test depth, metric name) -> value over a model-index, checking each result names its depth once."""
    (entry,) = index
    out = {}
    for result in entry["results"]:
        depth = result["dataset"]["args"]["test_depth"]
        assert result["dataset"]["config"] == f"d{depth}"
        for metric in result["metrics"]:
            assert metric["type"] == "accuracy" and f"d = {depth} " in metric["name"] + " "
            out[depth, metric["name"]] = metric["value"]
    return out


def test_card_front_matter_carries_measured_results_as_model_index(tiny_model, tmp_path):
    ckpt = tmp_path / "ckpt"
    tiny_model.save_pretrained(ckpt)
    (ckpt / "state_tracking_task.json").write_text(json.dumps({"name": "toy"}))
    rng = np.random.default_rng(7)
    depths = [8, 16, 32, 64]
    forced, halting = rng.uniform(0, 1, 4).round(6).tolist(), rng.uniform(0, 1, 2).round(6).tolist()  # stop rule
    rows = {"forced depth (R = d)": forced, "learned halting (no R given)": halting}
    measured = {"depths": depths, "rows": rows, "train_max_depth": 8, "n_sequences": 96}
    results = tmp_path / "table.md"
    results.write_text(push_to_hub.results_section("intro", depths, rows))

    out = push_to_hub.export_for_hub(ckpt, tmp_path / "export", repo_id="me/par-tiny", results=results,
                                     measured=measured)
    card = (out / "README.md").read_text()
    meta = front_matter(card)
    assert meta["pipeline_tag"] == "state-tracking" and meta["library_name"] == "transformers"
    (entry,) = meta["model-index"]
    assert entry["name"] == "par-tiny" and len(entry["results"]) == len(depths)
    for result, depth in zip(entry["results"], depths):
        assert result["task"] == {"type": "state-tracking", "name": "State tracking"}
        assert result["dataset"] == {"type": "par-state-tracking/toy", "name": "toy", "config": f"d{depth}",
                                     "args": {"test_depth": depth, "train_max_depth": 8, "n_sequences": 96,
                                              "task_spec": "state_tracking_task.json"}}
    expected = {(d, f"overall state accuracy (%), {label}, d = {d} ({d // 8}x)"): round(100 * a, 2)
                for label, accuracy in rows.items() for d, a in zip(depths, accuracy)}
    assert measured_metrics(meta["model-index"]) == expected and len(expected) == 6  # no metric past the stop rule
    assert f"| forced depth (R = d) | {100 * forced[0]:.1f} |" in card  # the prose table is still there

    # The Hub's own reader sees every number, and its canonical form is what the card holds.
    data = ModelCard(card).data
    assert data.pipeline_tag == "state-tracking" and data.model_name == "par-tiny"
    assert sorted(r.metric_value for r in data.eval_results) == sorted(expected.values())
    assert eval_results_to_model_index(data.model_name, data.eval_results) == meta["model-index"]


def test_card_without_measured_results_has_no_model_index(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "ckpt")
    table = tmp_path / "table.md"
    table.write_text("| depth | acc |\n|---|---|\n| 8 | 0.5 |")
    for i, results in enumerate((None, table)):
        card = (push_to_hub.export_for_hub(tmp_path / "ckpt", tmp_path / f"out{i}", results=results)
                / "README.md").read_text()
        meta = front_matter(card)
        assert "model-index" not in meta and meta["pipeline_tag"] == "state-tracking"
        assert ModelCard(card).data.eval_results is None
    empty = {"task": "toy", "depths": [8, 16], "rows": {"forced depth (R = d)": []}}
    assert "model-index" not in front_matter(push_to_hub.render_card(tiny_model, "me/x", measured=empty))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):  # percentages where fractions belong
        push_to_hub.render_card(tiny_model, "me/x", measured={**empty, "rows": {"forced": [50.0]}})
    with pytest.raises(ValueError, match="task name"):  # no task given and no task spec in the checkpoint
        push_to_hub.export_for_hub(tmp_path / "ckpt", tmp_path / "out2",
                                   measured={"depths": [8], "rows": {"forced": [0.5]}})


def test_evaluator_json_results_give_the_model_index(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "ckpt")
    record = {"task": "swap_s5", "mode": "halting", "train_max_depth": 4, "n_per_depth": 32, "depths": [4, 12],
              "accuracy": [0.96875, 0.40625], "d50": 4}
    (tmp_path / "eval.json").write_text(json.dumps(record))
    push_to_hub.main(["--checkpoint", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "out"),
                      "--repo-id", "me/par-eval", "--results", str(tmp_path / "eval.json")])
    meta = front_matter((tmp_path / "out" / "README.md").read_text())
    assert [r["dataset"]["args"] for r in meta["model-index"][0]["results"]] == [
        {"test_depth": d, "train_max_depth": 4, "n_sequences": 32} for d in record["depths"]]
    assert measured_metrics(meta["model-index"]) == {
        (d, f"overall state accuracy (%), learned halting (no R given), d = {d} ({d // 4}x)"): round(100 * a, 2)
        for d, a in zip(record["depths"], record["accuracy"])}


def test_shipped_card_model_index_matches_its_training_summary():
    card = (REPO / "checkpoints" / "par-swap-s5-small" / "README.md").read_text()
    summary = json.loads((REPO / "checkpoints" / "par-swap-s5-small" / "training_summary.json").read_text())
    meta = front_matter(card)
    assert meta["pipeline_tag"] == "state-tracking"
    train = summary["max_train_depth"]
    rows = {"forced depth (R = d)": (summary["depths"], summary["accuracy"])}
    if summary["halting"]:
        rows["learned halting (no R given)"] = (summary["halting"]["depths"], summary["halting"]["accuracy"])
    expected = {(d, f"overall state accuracy (%), {label}, d = {d} ({d / train:g}x)"): round(100 * a, 2)
                for label, (depths, accuracy) in rows.items() for d, a in zip(depths, accuracy)}
    assert measured_metrics(meta["model-index"]) == expected
    assert {r["dataset"]["name"] for r in meta["model-index"][0]["results"]} == {"swap_s5"}
    assert {r["dataset"]["args"]["n_sequences"] for r in meta["model-index"][0]["results"]} == {summary["n_per_depth"]}


def test_reexport_keeps_the_source_cards_results_unless_new_ones_are_given(tiny_model, tmp_path, capsys):
    source = REPO / "checkpoints" / "par-swap-s5-small"
    source_card = (source / "README.md").read_text()
    out = push_to_hub.export_for_hub(source, tmp_path / "again", repo_id="me/par-again")
    card = (out / "README.md").read_text()
    (entry,) = front_matter(card)["model-index"]
    assert entry["name"] == "par-again"
    assert measured_metrics([entry]) == measured_metrics(front_matter(source_card)["model-index"])
    kept = push_to_hub.card_fields(card)
    for field in ("results", "training_data", "limits"):
        assert kept[field] == push_to_hub.card_fields(source_card)[field] and kept[field].strip()

    table = tmp_path / "table.md"  # new results replace the carried ones (and their model-index)
    table.write_text("| depth | acc |\n|---|---|\n| 8 | 0.5 |")
    card = (push_to_hub.export_for_hub(source, tmp_path / "new", results=table) / "README.md").read_text()
    assert "model-index" not in front_matter(card) and push_to_hub.card_fields(card)["results"].strip() == (
        table.read_text())

    ckpt = tmp_path / "ckpt"  # a hand-written card is not the template's: reported, nothing carried
    tiny_model.save_pretrained(ckpt)
    (ckpt / "README.md").write_text("# my model\n\n| d | acc |\n|---|---|\n| 8 | 99 |\n")
    card = (push_to_hub.export_for_hub(ckpt, tmp_path / "hand") / "README.md").read_text()
    assert "model-index" not in front_matter(card) and "| 8 | 99 |" not in card
    assert "does not follow hub_card.md" in capsys.readouterr().err
