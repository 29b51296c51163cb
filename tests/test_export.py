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

from tests.conftest import VOCAB, fresh_process_job, fresh_process_result, load_example, make_model
from tests.test_modeling_par import LOAD_IN_FRESH_PROCESS, random_batch

REPO = Path(__file__).resolve().parents[1]
push_to_hub = load_example("examples/push_to_hub.py")


def word_tokenizer():
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", unk_token="w1")


@fresh_process_job("exported_tiny_model")
def exported_tiny_model(folder):
    """`make_model()` saved with a word tokenizer, a task file and a results table, exported for the hub
    (`export_for_hub`): `fresh_process` (package blocked) loads the export and answers a batch."""
    model = make_model()
    ckpt = folder / "ckpt"
    model.save_pretrained(ckpt)
    word_tokenizer().save_pretrained(ckpt)
    (ckpt / "state_tracking_task.json").write_text(json.dumps({"name": "toy"}))
    results = folder / "table.md"
    results.write_text("| depth | acc |\n|---|---|\n| 8 | 0.5 |")
    out = push_to_hub.export_for_hub(ckpt, folder / "export", repo_id="me/par-tiny", results=results)
    input_ids, qpos = random_batch()
    batch = {"input_ids": input_ids.tolist(), "query_positions": qpos.tolist()}
    return dict(script=LOAD_IN_FRESH_PROCESS, folder=out, args=[json.dumps(batch), ""], model=model,
                input_ids=input_ids, query_positions=qpos)


def test_export_folder_is_hub_ready_and_loads_remotely(fresh_process):
    job = fresh_process_result(fresh_process, "exported_tiny_model")
    out, model = job["folder"], job["model"]
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "configuration_par.py", "modeling_par.py", "tokenizer.json",
            "tokenizer_config.json", "state_tracking_task.json", "README.md"} <= names
    card = (out / "README.md").read_text()
    assert "{{" not in card and "me/par-tiny" in card and "| 8 | 0.5 |" in card and "2 + 2 + 2" in card
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModel"].startswith("modeling_par.")
    assert AutoTokenizer.from_pretrained(out, trust_remote_code=True).convert_tokens_to_ids("w7") == 7

    with torch.no_grad():
        expected = model(job["input_ids"], query_positions=job["query_positions"], num_iterations=4,
                         readout_iterations=[2, 4])
    (got,) = (torch.tensor(logits) for logits in job["output"])
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


@pytest.fixture(scope="module")
def records_run(tmp_path_factory):
    """A tiny records run of train_par.py (an order log in the user's own column names, a held-out test file, both
    evaluation modes): the folder a user exports after training on their own files."""
    from tests.test_records_new_user import COLUMNS, TINY, orders, train_par, write_csv

    tmp = tmp_path_factory.mktemp("records")
    train = write_csv(tmp / "orders.csv", orders(120, 1, 4, 2))
    test = write_csv(tmp / "orders_test.csv", orders(24, 2, 8, 3))
    run = tmp / "run"
    summary = train_par.main(TINY + ["--train_file", train, *COLUMNS, "--test_file", test, "--max_steps", "3",
                                     "--output_dir", str(run), "--eval_halting", "true", "--halting_loss_weight",
                                     "0.5", "--depth_schedule", "hold", "--hold_extra_iterations", "8"])
    return run, summary


@pytest.fixture(scope="module")
def records_card(records_run, tmp_path_factory):
    """The records run exported once (`export_for_hub`): (the export folder, its card, the card's fields, its YAML
    front matter)."""
    run, _ = records_run
    out = push_to_hub.export_for_hub(run, tmp_path_factory.mktemp("records_export") / "export")
    card = (out / "README.md").read_text()
    fields = push_to_hub.card_fields(card)  # the card follows the template, so a re-export can carry it
    return out, card, fields, front_matter(card)


def test_records_run_card_is_titled_by_its_task(records_run, records_card):
    run, _ = records_run
    _, card, _, _ = records_card
    assert "\n# par-orders\n" in card  # titled by the task (the training file's name), not the folder ("run")
    assert "Not stated by the exporter" not in card and "No results were attached" not in card
    assert str(run.parent) not in card  # local folders are not published; file names are


def expected_model_index(run: Path, summary: dict) -> tuple[dict, dict]:
    """From the run's eval JSONs: {(split, d, metric name): accuracy (%)} and {(split, d): records}."""
    expected, splits = {}, {}
    for key in ("test", "test_halting", "validation", "validation_halting"):
        record = json.loads((run / f"eval_{key}.json").read_text())
        label = push_to_hub.MODE_LABELS[record["mode"]]
        for row in record["per_depth"]:
            d = row["depth"]
            name = f"overall state accuracy (%), {label}, d = {d} ({d / summary['max_train_depth']:g}x)"
            expected[record["split"], d, name] = round(100 * row["accuracy"], 2)
            splits[record["split"], d] = row["n"]
    return expected, splits


def test_records_run_card_model_index_has_every_split_and_length(records_run, records_card):
    """model-index: one result per split and length, both modes, numbers and record counts from the eval JSONs."""
    run, summary = records_run
    _, card, _, meta = records_card
    (entry,) = meta["model-index"]
    assert entry["name"] == "par-orders"
    expected, splits = expected_model_index(run, summary)
    got = {}
    for result in entry["results"]:
        dataset = result["dataset"]
        depth = dataset["args"]["test_depth"]
        assert dataset["type"] == "par-state-tracking/orders" and dataset["config"] == f"d{depth}"
        assert dataset["args"]["n_sequences"] == splits[dataset["split"], depth]
        assert dataset["args"]["train_max_depth"] == summary["max_train_depth"]
        got.update({(dataset["split"], depth, m["name"]): m["value"] for m in result["metrics"]})
    assert got == expected and {s for s, _ in splits} == {"test", "validation"}
    assert [r["dataset"]["split"] for r in entry["results"]][0] == "test"  # the held-out test comes first
    data = ModelCard(card).data  # the Hub's reader sees every number, and the split
    assert sorted(r.metric_value for r in data.eval_results) == sorted(expected.values())
    assert {r.dataset_split for r in data.eval_results} == {"test", "validation"}
    assert eval_results_to_model_index(data.model_name, data.eval_results) == meta["model-index"]


def test_records_run_card_tells_its_results_and_data(records_run, records_card):
    run, summary = records_run
    _, _, fields, _ = records_card
    # the prose results: a row per test length with its record count and both modes' accuracy
    test, halting = (json.loads((run / f"eval_{k}.json").read_text()) for k in ("test", "test_halting"))
    for forced_row, halting_row in zip(test["per_depth"], halting["per_depth"]):
        d, train_depth = forced_row["depth"], summary["max_train_depth"]
        length = f"{d} ({d / train_depth:g}x)" if d > train_depth else str(d)
        assert (f"| {length} | {forced_row['n']} | {100 * forced_row['accuracy']:.1f} | "
                f"{100 * halting_row['accuracy']:.1f} |") in fields["results"]
    assert f"Trained {summary['steps']} of at most 3 steps" in fields["results"]

    # the data section: files, record counts, columns, vocabulary, training mode
    records = summary["records"]
    data_section = fields["training_data"]
    assert f"- training: {records['train_records']} records from `orders.csv`" in data_section
    assert f"- test: {test['n_records']} records from `orders_test.csv`" in data_section
    assert "operations `order_events` (split at ';'), state `status`" in data_section
    assert f"{records['operations']} operations (" in data_section and "1 query (`state`)" in data_section
    assert "4 labels (`cancelled`, `new`, `paid`, `shipped`)" in data_section
    assert "training mode: final-answer training over the lengths present" in data_section
    assert f"at most {summary['max_train_depth']} operations" in fields["limits"]


def test_records_run_card_is_carried_by_a_re_export(records_card, tmp_path):
    """A re-export of the export carries all of it; a repo name given on the command line names the model."""
    out, _, fields, meta = records_card
    push_to_hub.main(["--checkpoint", str(out), "--output_dir", str(tmp_path / "again"), "--repo_id", "me/orders"])
    again = (tmp_path / "again" / "README.md").read_text()
    assert front_matter(again)["model-index"][0]["name"] == "orders" and "\n# orders\n" in again
    assert measured_metrics_by_split(front_matter(again)) == measured_metrics_by_split(meta)
    assert push_to_hub.card_fields(again)["training_data"] == fields["training_data"]


def measured_metrics_by_split(meta: dict) -> dict:
    return {(r["dataset"]["split"], r["dataset"]["config"], m["name"]): m["value"]
            for r in meta["model-index"][0]["results"] for m in r["metrics"]}


def test_export_writes_the_remote_code_the_config_needs(tiny_model, tmp_path):
    """The export's remote code is the generator's (scripts/sync_remote_code.py): what config.json names and imports,
    byte for byte the package's, and nothing else."""
    from scripts.sync_remote_code import remote_code_files, write_remote_code

    tiny_model.save_pretrained(tmp_path / "ckpt")
    out = push_to_hub.export_for_hub(tmp_path / "ckpt", tmp_path / "export")
    assert sorted(p.name for p in out.glob("*.py")) == [p.name for p in remote_code_files(out)]
    assert write_remote_code(out, check=True) == []
