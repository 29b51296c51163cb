"""The GGUF path of a retrofit, in CI: a tiny Qwen2 and a tiny Llama written with `gguf.GGUFWriter` (F32 tensors, a
byte-level BPE tokenizer whose item names are one token each), read back by transformers with `gguf_file=`, through
`load_parent`, `from_pretrained_parent` and `train_par.py --init_from_qwen2 … --gguf_file …` — what the real parents
(par_studies.parents: SmolLM2-135M, a Llama; the Qwen2.5-shaped 0.5B, a Qwen2) go through.

`gguf` is in the dev extra (`pip install -e ".[dev]"`), so these run in CI; without it they skip, saying so.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from modeling_par import ParLoopedQwenForStateTracking
from modeling_par.parent_conversion import load_parent
from state_tracking import load_task, model_token_ids

gguf = pytest.importorskip("gguf", reason="the GGUF reader is the optional extra gguf (pip install -e '.[dev]')")

WORDS = ["Ġapple", "Ġbanana", "Ġcherry", "Ġgrape", "Ġlemon", "ĠBox", "Ġcontains", "Ġthe", "Ġswap", "Ġskip", "ĠYes",
         "ĠNo"]
SHORT_SWAP = {"group": "swap_s5", "text": "short"}


def bpe_vocabulary() -> tuple[list[str], list[str]]:
    """A byte-level BPE: the 256 byte symbols, then merges building each of WORDS (one token each) left to right."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens, merges = list(bytes_to_unicode().values()), []
    for word in WORDS:
        current = word[0]
        for ch in word[1:]:
            if current + ch not in tokens:
                merges.append(f"{current} {ch}")
                tokens.append(current + ch)
            current += ch
    return tokens + ["<|endoftext|>"], merges


def llama_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf's `permute`), which transformers undoes reading a llama GGUF."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_tiny_gguf(folder, arch: str, layers: int = 3):
    """A tiny `arch` ("qwen2" or "llama") causal LM as folder/tiny.gguf; returns (the model, file name)."""
    tokens, merges = bpe_vocabulary()
    sizes = dict(vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=256)
    torch.manual_seed(0)
    model = (Qwen2ForCausalLM(Qwen2Config(**sizes)) if arch == "qwen2" else LlamaForCausalLM(LlamaConfig(**sizes)))
    model.eval()
    if arch == "qwen2":  # nonzero q/k/v biases, so the test sees them read
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.1)
    writer = gguf.GGUFWriter(str(folder / "tiny.gguf"), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(256)
    writer.add_block_count(layers)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(model.config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(model.config.rms_norm_eps)
    if arch == "llama":
        writer.add_rope_dimension_count(8)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_pad_token_id(len(tokens) - 1)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2 if arch == "qwen2" else gguf.MODEL_ARCH.LLAMA, layers)
    for key, value in model.state_dict().items():
        if key == "lm_head.weight":  # tied
            continue
        array = value.float().numpy()
        if arch == "llama" and key.endswith(("q_proj.weight", "k_proj.weight")):
            array = llama_permute(array, 4 if "q_proj" in key else 2)
        writer.add_tensor(names.get_name(key, try_suffixes=(".weight", ".bias")), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, "tiny.gguf"


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny_gguf(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"gguf_{request.param}")
    model, name = write_tiny_gguf(folder, request.param)
    return request.param, folder, name, model


def test_transformers_reads_the_tiny_gguf_as_written(tiny_gguf):
    arch, folder, name, model = tiny_gguf
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    assert loaded.config.model_type == arch
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=1e-5)


def test_load_parent_and_from_pretrained_parent_on_a_gguf_file_equal_the_parent_at_r1(tiny_gguf):
    arch, folder, name, model = tiny_gguf
    parent = load_parent(folder, gguf_file=name)
    assert isinstance(parent, Qwen2ForCausalLM)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    answer_ids = model_token_ids(tokenizer, load_task(SHORT_SWAP))["answer_token_ids"]
    assert len(set(answer_ids)) == 5  # " apple" … " lemon": one token each
    queries = torch.arange(7, 12).expand(2, -1)
    with torch.no_grad():
        expected = model(ids).logits[:, 7:12][..., answer_ids]
        torch.testing.assert_close(parent(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
        whole = ParLoopedQwenForStateTracking.from_pretrained_parent(folder, 1, 1, 1, answer_token_ids=answer_ids,
                                                                     gguf_file=name).eval()
        torch.testing.assert_close(whole(ids, query_positions=queries, num_iterations=1).answer_logits[0], expected,
                                   rtol=0, atol=1e-5)


def test_a_truncated_gguf_retrofit_equals_the_parent_cut_to_its_first_layers(tmp_path):
    model, name = write_tiny_gguf(tmp_path, "qwen2", layers=4)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=name)
    answer_ids = model_token_ids(tokenizer, load_task(SHORT_SWAP))["answer_token_ids"]
    config = model.config.to_dict()
    config.update(num_hidden_layers=3, layer_types=config["layer_types"][:3])
    cut = Qwen2ForCausalLM(Qwen2Config(**config)).eval()
    cut.load_state_dict({k: v for k, v in model.state_dict().items() if ".layers.3." not in k})
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(3))
    queries = torch.arange(5, 10).expand(2, -1)
    retrofit = ParLoopedQwenForStateTracking.from_pretrained_parent(tmp_path, 1, 1, 1, answer_token_ids=answer_ids,
                                                                    gguf_file=name, truncate=True).eval()
    with torch.no_grad():
        got = retrofit(ids, query_positions=queries, num_iterations=1).answer_logits[0]
        torch.testing.assert_close(got, cut(ids).logits[:, 5:10][..., answer_ids], rtol=0, atol=1e-5)


@pytest.mark.parametrize("weights", ["pretrained", "random"])
def test_train_par_retrofits_a_gguf_parent_and_saves_a_loadable_checkpoint(tmp_path, weights):
    import json

    from tests.conftest import load_example

    model, name = write_tiny_gguf(tmp_path, "qwen2")
    train_par = load_example("examples/train_par.py")
    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps(SHORT_SWAP))
    out = tmp_path / "run"
    train_par.main(["--output_dir", str(out), "--rendering", "text", "--task_file", str(task_file),
                    "--init_from_qwen2", str(tmp_path), "--gguf_file", name, "--truncate_parent", "true",
                    "--prelude_layers", "1", "--core_layers", "1", "--coda_layers", "1", "--parent_weights", weights,
                    "--freeze_embeddings", "true", "--max_train_depth", "3", "--per_device_train_batch_size", "4",
                    "--max_steps", "2", "--eval_depths", "3", "--eval_n", "4", "--report_to", "none",
                    "--disable_tqdm", "true", "--save_strategy", "no", "--logging_steps", "1", "--seed", "3"])
    trained = ParLoopedQwenForStateTracking.from_pretrained(out)
    embeddings = model.model.embed_tokens.weight
    # frozen embeddings: the parent's own (pretrained) or the fresh draw's (random), unchanged by the two steps
    assert torch.equal(trained.model.embed_tokens.weight, embeddings) == (weights == "pretrained")
    up = trained.model.layers[0].mlp.up_proj.weight
    parent_up = model.model.layers[0].mlp.up_proj.weight
    assert ((up - parent_up).abs().max() < 0.05) == (weights == "pretrained")  # lr steps move it little; a redraw a lot
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def test_a_gguf_cut_to_its_first_layers_reads_as_the_whole_file_truncated(tmp_path):
    """par_studies.parents.truncate_gguf: the first N blocks' tensors copied byte for byte, block_count N, the tokenizer
    kept; the retrofit read from the cut file equals the one read from the whole file with truncate=True."""
    from par_studies.parents import truncate_gguf

    write_tiny_gguf(tmp_path, "llama", layers=4)
    cut = tmp_path / "cut" / "first3.gguf"
    info = truncate_gguf(tmp_path / "tiny.gguf", cut, 3)
    assert info["layers"] == 3 and info["of"] == 4 and info["bytes"] == cut.stat().st_size
    reader = gguf.GGUFReader(str(cut))
    assert reader.get_field("llama.block_count").contents() == 3
    assert not [t.name for t in reader.tensors if t.name.startswith("blk.3.")]
    assert any(t.name.startswith("blk.2.") for t in reader.tensors)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    answer_ids = model_token_ids(tokenizer, load_task(SHORT_SWAP))["answer_token_ids"]
    whole, short = (ParLoopedQwenForStateTracking.from_pretrained_parent(
        folder, 1, 1, 1, answer_token_ids=answer_ids, gguf_file=name, truncate=True).state_dict()
        for folder, name in ((tmp_path, "tiny.gguf"), (cut.parent, cut.name)))
    assert whole.keys() == short.keys() and all(torch.equal(whole[k], short[k]) for k in whole)
    text = " Box apple swap skip lemon"
    assert AutoTokenizer.from_pretrained(cut.parent, gguf_file=cut.name)(text).input_ids == tokenizer(text).input_ids
    for bad in (0, 5):
        with pytest.raises(ValueError, match=r"num_layers must be an integer in 1 \.\. 4 \(tiny.gguf has 4 blocks\)"):
            truncate_gguf(tmp_path / "tiny.gguf", tmp_path / "bad.gguf", bad)
    assert not (tmp_path / "bad.gguf").exists()
