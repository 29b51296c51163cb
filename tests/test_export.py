import json
from pathlib import Path

import pytest
import torch
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
    with pytest.raises(ValueError, match="--output-dir"):
        push_to_hub.export_for_hub(tmp_path / "ckpt", tmp_path / "out")
