"""Parents beyond Qwen2: a Llama-architecture causal LM converted exactly into Qwen2
(modeling_par.parent_conversion), the retrofit of one at R = 1, a truncated parent, the configs Qwen2 cannot express,
freezing the prelude, and the real SmolLM2 weights when a machine has them."""

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

from modeling_par import ParLoopedQwenForStateTracking
from modeling_par.parent_conversion import check_llama_config, first_layers, load_parent, qwen2_from_llama
from tests.conftest import ANSWER_IDS, HALT_IDS, VOCAB
from tests.test_modeling_par import candidate_logits, random_batch

REPO = Path(__file__).resolve().parents[1]


def tiny_llama_config(**overrides) -> LlamaConfig:
    kwargs = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True)
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config()).eval()
    with torch.no_grad():  # norms away from 1 so that a norm weight lost on the way would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def test_converted_llama_computes_the_parents_logits(tiny_llama):
    qwen2 = qwen2_from_llama(tiny_llama)
    assert isinstance(qwen2, Qwen2ForCausalLM) and not qwen2.training
    input_ids, _ = random_batch(seq=20)
    with torch.no_grad():
        torch.testing.assert_close(qwen2(input_ids).logits, tiny_llama(input_ids).logits, atol=1e-6, rtol=0)
    for i in range(6):  # the q/k/v biases Llama lacks are zero; the head stays tied
        attention = qwen2.model.layers[i].self_attn
        assert all(not getattr(attention, p).bias.any() for p in ("q_proj", "k_proj", "v_proj"))
    assert qwen2.lm_head.weight.data_ptr() == qwen2.model.embed_tokens.weight.data_ptr()
    assert qwen2.config.rope_parameters["rope_theta"] == 100000.0


def test_llama_parent_retrofits_with_r1_equal_to_it(tiny_llama, tmp_path):
    """From the model and from a saved folder: at R = 1 the answer logits are the parent's at the candidate rows."""
    tiny_llama.save_pretrained(tmp_path / "llama")
    input_ids, qpos = random_batch()
    with torch.no_grad():
        expected = candidate_logits(tiny_llama, input_ids, qpos)
        for source in (tiny_llama, tmp_path / "llama", str(tmp_path / "llama")):
            model = ParLoopedQwenForStateTracking.from_pretrained_parent(source, 2, 2, 2, answer_token_ids=ANSWER_IDS,
                                                                         halt_token_ids=HALT_IDS).eval()
            got = model(input_ids, query_positions=qpos, num_iterations=1).answer_logits[0]
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
            assert set(model.state_dict()) - {k for k in model.state_dict() if "_proj.bias" in k} \
                - set(tiny_llama.state_dict()) == {"adapter.weight"}


def test_truncated_parent_is_its_first_layers(tiny_llama):
    """truncate=True keeps the parent's first P + C + Q layers: R = 1 equals a Llama of those layers alone."""
    short = LlamaForCausalLM(tiny_llama_config(num_hidden_layers=3)).eval()
    missing, unexpected = short.load_state_dict(tiny_llama.state_dict(), strict=False)
    assert not missing and all(".layers." in k for k in unexpected)
    input_ids, qpos = random_batch()
    model = ParLoopedQwenForStateTracking.from_pretrained_parent(tiny_llama, 1, 1, 1, answer_token_ids=ANSWER_IDS,
                                                                 truncate=True).eval()
    assert model.config.num_hidden_layers == 3 and len(tiny_llama.model.layers) == 6  # the parent is not cut
    converted = qwen2_from_llama(tiny_llama)
    same = ParLoopedQwenForStateTracking.from_pretrained_parent(converted, 1, 1, 1, answer_token_ids=ANSWER_IDS,
                                                                truncate=True)
    assert len(converted.model.layers) == 6 and converted.config.num_hidden_layers == 6  # nor a Qwen2 one passed in
    torch.testing.assert_close(same.model.layers[2].mlp.up_proj.weight, converted.model.layers[2].mlp.up_proj.weight)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids, query_positions=qpos, num_iterations=1).answer_logits[0],
                                   candidate_logits(short, input_ids, qpos), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="truncate=True keeps only"):
        ParLoopedQwenForStateTracking.from_pretrained_parent(tiny_llama, 1, 1, 1, answer_token_ids=ANSWER_IDS)
    with pytest.raises(ValueError, match="= 9 exceeds the parent's num_hidden_layers = 6"):
        ParLoopedQwenForStateTracking.from_pretrained_parent(tiny_llama, 3, 3, 3, answer_token_ids=ANSWER_IDS,
                                                             truncate=True)
    with pytest.raises(ValueError, match=r"num_layers must be an integer in \[1, 6\]"):
        first_layers(qwen2_from_llama(tiny_llama), 0)


@pytest.mark.parametrize("overrides, message", [
    ({"attention_bias": True}, "attention_bias = True"),
    ({"mlp_bias": True}, "mlp_bias = True"),
    ({"head_dim": 32}, "head_dim = 32"),
    ({"rope_parameters": {"rope_type": "made_up", "rope_theta": 1e4}}, "rope_type'] = 'made_up'"),
])
def test_configs_qwen2_cannot_express_are_refused(overrides, message):
    config = tiny_llama_config(**overrides)
    with pytest.raises(ValueError, match=message):
        check_llama_config(config)


def test_other_architectures_and_bad_sources_are_refused(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        load_parent(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="model_or_path"):
        ParLoopedQwenForStateTracking.from_pretrained_parent(object(), 2, 2, 2, answer_token_ids=ANSWER_IDS)
    with pytest.raises(ValueError, match="gguf_file names a file inside a folder"):
        load_parent(LlamaForCausalLM(tiny_llama_config(num_hidden_layers=1)), gguf_file="x.gguf")


def test_freeze_prelude_trains_only_core_coda_and_adapter(tiny_llama):
    model = ParLoopedQwenForStateTracking.from_pretrained_parent(tiny_llama, 2, 2, 2, answer_token_ids=ANSWER_IDS,
                                                                 halt_token_ids=HALT_IDS).freeze_prelude()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "adapter.weight" in trainable and "model.layers.2.mlp.up_proj.weight" in trainable
    assert "model.layers.5.self_attn.q_proj.weight" in trainable and "model.norm.weight" in trainable
    assert not trainable & {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                            "model.layers.1.mlp.down_proj.weight"}
    input_ids, qpos = random_batch()
    out = model(input_ids, query_positions=qpos, num_iterations=2)
    out.answer_logits.sum().backward()
    assert model.model.embed_tokens.weight.grad is None and model.model.layers[0].mlp.up_proj.weight.grad is None
    assert model.model.layers[2].mlp.up_proj.weight.grad.abs().sum() > 0


def test_real_smollm2_converts_and_retrofits_exactly(monkeypatch):
    """The real parent (python -m par_studies.smollm2 fetches it): conversion exact, R = 1 within 1e-4 (fp32).
    transformers reads the file three times (config, weights, tokenizer), each a fresh `GGUFReader` parsing every
    metadata field (the 49k-token vocabulary), and asks gguf for its tensor-name map once per submodule (~400 builds
    of the same map): here each is made once and handed out again (both are read-only: the reader maps the file
    read-only, the map is a lookup table), ~13 s of CPU less; what transformers does with them is unchanged."""
    gguf = pytest.importorskip("gguf", reason="the GGUF reader is the optional extra: pip install -e '.[pretrained]'")
    from par_studies.smollm2 import GGUF_FILE, local_gguf

    path = local_gguf()
    if path is None:
        pytest.skip("SmolLM2's GGUF is not in the cache: python -m par_studies.smollm2 downloads it (~100 MB)")
    from functools import cache

    from par_studies.smollm2 import parity

    reader, name_map = cache(gguf.GGUFReader), cache(gguf.get_tensor_name_map)  # transformers imports both per call
    monkeypatch.setattr(gguf, "GGUFReader", lambda path, mode="r": reader(str(path), mode))
    monkeypatch.setattr(gguf, "get_tensor_name_map", name_map)
    record = parity(str(path.parent), GGUF_FILE, layers=(3, 3, 3), truncate=True, seq=24)
    assert record["conversion_max_abs_diff"] == 0.0
    assert record["r1_max_abs_diff"] <= 1e-4
    assert reader.cache_info().hits == 2 and name_map.cache_info().misses == 1  # one read, one map


def test_train_par_retrofits_a_truncated_llama_folder_with_a_frozen_prelude(tmp_path):
    """train_par.py --init_from_qwen2 (the old name of --init_from_parent) on a Llama folder (with its tokenizer), cut
    to its first P + C + Q layers, the prelude frozen: the checkpoint holds those layers, embeddings and prelude as the
    parent's, a trained core."""
    from safetensors.torch import load_file

    from par_studies.paper_scale.harness import EOS, qwen_like_tokenizer
    from state_tracking import load_task
    from tests.conftest import load_example

    train_par = load_example("examples/train_par.py")
    task = load_task(REPO / "examples" / "tasks" / "batch_process_phrasings.json")
    tokenizer = qwen_like_tokenizer(task)
    tokenizer.pad_token = tokenizer.eos_token = EOS
    torch.manual_seed(0)
    parent = LlamaForCausalLM(tiny_llama_config(vocab_size=len(tokenizer), num_hidden_layers=5, pad_token_id=None))
    parent.save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    out = tmp_path / "run"
    summary = train_par.main([
        "--init_from_qwen2", str(tmp_path / "llama"), "--truncate_parent", "true", "--freeze_prelude", "true",
        "--prelude_layers", "1", "--core_layers", "1", "--coda_layers", "1", "--task_file",
        str(REPO / "examples" / "tasks" / "batch_process_phrasings.json"), "--rendering", "text",
        "--loop_view", "local", "--progress_positions", "true", "--bidirectional_queries", "true",
        "--max_train_depth", "3", "--max_steps", "3", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
        "--warmup_steps", "0", "--eval_depths", "3", "--eval_n", "4", "--output_dir", str(out), "--use_cpu", "true",
        "--disable_tqdm", "true"])
    assert summary["steps"] == 3
    saved = load_file(str(out / "model.safetensors"))
    before = parent.state_dict()
    assert not any(k.startswith("model.layers.3.") for k in saved)  # cut to 3 layers
    for key in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):
        torch.testing.assert_close(saved[key], before[key], atol=0, rtol=0)  # frozen
    assert not torch.equal(saved["model.layers.1.mlp.up_proj.weight"], before["model.layers.1.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match="--gguf_file and --truncate_parent describe the parent"):
        train_par.main(["--truncate_parent", "true", "--output_dir", str(tmp_path / "x")])


def test_pretrained_study_rows_parse_and_hold_out_one_slot_at_a_time(monkeypatch):
    """examples/reproduce/pretrained_smollm2.py: every row is a valid train_par.py command (the parent's folder
    filled in); the slot diagnosis's task writes held-out sentences in its one slot and trained ones elsewhere."""
    import numpy as np

    from par_studies import argv
    from par_studies.pretrained_smollm2 import diagnostics, rows, training
    from state_tracking import load_task
    from state_tracking.prompts import text_prompt
    from tests.conftest import load_example
    from trainers.model_setup import resolve_view

    train_par = load_example("examples/train_par.py")
    monkeypatch.setattr(training, "parent_folder", lambda name="smollm2-135m": f"some/{name}")  # nothing fetched
    for name in rows.ROWS:
        model_args, task_args, train_args = train_par.parse_args(argv(training.row_flags(name)) + ["--output_dir", "x"])
        retrofit = model_args.init_from_parent is not None
        two_stage = rows.ROWS[name].init_from is not None  # fine-tunes its stage-1 row's folder instead
        assert retrofit == (name != "scratch" and not two_stage) and task_args.rendering == "text"
        assert two_stage == (model_args.init_from_par is not None)
        assert not retrofit or (model_args.truncate_parent and model_args.gguf_file.endswith(".gguf"))
        assert resolve_view(model_args)["loop_view"] == "local"
    full = load_task(REPO / rows.TASK_FILE)
    _, held_ops, held_queries = full.phrasing_options("held_out")
    _, seen_ops, seen_queries = full.phrasing_options("seen")
    rng = np.random.default_rng(0)
    prompt = text_prompt(diagnostics.slot_task("operations"), np.arange(8), None, "held_out", rng)[0]
    assert all(options[0] in prompt for options in held_ops) and "At this point" not in prompt
    assert any(q in prompt for q in seen_queries[0]) and not prompt.startswith("Initially")
    prompt = text_prompt(diagnostics.slot_task("question"), np.arange(8), None, "held_out", rng)[0]
    assert prompt.endswith(held_queries[0][0] + " ?") and not any(options[0] in prompt for options in held_ops)


def _snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _unchanged(model, before: dict, layers: int) -> None:
    after = model.state_dict()
    assert len(model.model.layers) == layers and model.config.num_hidden_layers == layers
    assert set(after) == set(before)
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_load_parent_honours_dtype_names_and_never_changes_the_model_passed_in(architecture, tiny_llama):
    """dtype given by name casts a model passed in as a torch.dtype does; neither a cast nor num_layers changes the
    caller's model (its dtype, weights or layers): the parent that comes back is a new model."""
    source = qwen2_from_llama(tiny_llama) if architecture == "qwen2" else tiny_llama
    before = _snapshot(source)
    input_ids, _ = random_batch(seq=12)
    for dtype in ("bfloat16", torch.bfloat16, "torch.bfloat16"):
        parent = load_parent(source, dtype=dtype)
        assert isinstance(parent, Qwen2ForCausalLM) and parent is not source
        assert {p.dtype for p in parent.parameters()} == {torch.bfloat16}
        _unchanged(source, before, 6)
    cut = load_parent(source, num_layers=2)
    assert len(cut.model.layers) == 2 and cut.config.num_hidden_layers == 2 and cut is not source
    _unchanged(source, before, 6)
    torch.testing.assert_close(cut.model.layers[1].mlp.up_proj.weight, source.model.layers[1].mlp.up_proj.weight)
    short = LlamaForCausalLM(tiny_llama_config(num_hidden_layers=2)).eval()
    short.load_state_dict(tiny_llama.state_dict(), strict=False)
    with torch.no_grad():  # the cut copy computes what a 2-layer parent with those weights computes
        torch.testing.assert_close(cut(input_ids).logits, short(input_ids).logits, atol=1e-5, rtol=0)
    if architecture == "qwen2":  # nothing asked: the model itself, not a copy
        assert load_parent(source) is source and load_parent(source, dtype=torch.float32, num_layers=6) is source
    with pytest.raises(ValueError, match=r"dtype must be a floating torch.dtype, one of \['float32', 'bfloat16'"):
        load_parent(source, dtype="half-ish")
    with pytest.raises(ValueError, match=r"num_layers must be an integer in \[1, 6\]"):
        load_parent(source, num_layers=7)


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_from_pretrained_parent_casts_its_own_copy_never_the_model_passed_in(architecture, tiny_llama):
    """from_pretrained_parent(model, dtype="bfloat16") gives a bfloat16 PAR model (the name was ignored for a model
    passed in), and neither a torch.dtype nor truncate=True casts or cuts the caller's model."""
    source = qwen2_from_llama(tiny_llama) if architecture == "qwen2" else tiny_llama
    before = _snapshot(source)
    for dtype in ("bfloat16", torch.bfloat16):
        model = ParLoopedQwenForStateTracking.from_pretrained_parent(source, 1, 1, 1, answer_token_ids=ANSWER_IDS,
                                                                     dtype=dtype, truncate=True)
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert model.config.num_hidden_layers == 3
        torch.testing.assert_close(model.model.layers[2].mlp.up_proj.weight,
                                   before["model.layers.2.mlp.up_proj.weight"].to(torch.bfloat16), atol=0, rtol=0)
        _unchanged(source, before, 6)
    model = ParLoopedQwenForStateTracking.from_pretrained_parent(source, 2, 2, 2, answer_token_ids=ANSWER_IDS)
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # default: the parent's dtype
    _unchanged(source, before, 6)


def test_load_parent_names_a_missing_folder_or_gguf_file(tmp_path):
    """A parent path from_pretrained cannot read is one ValueError naming it (was: a traceback about a Hub repo id or
    a Hub URL for a local folder)."""
    with pytest.raises(ValueError, match="parent /nonexistent/parent: no such folder, and not a Hub id"):
        load_parent("/nonexistent/parent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="the folder has no config.json"):
        load_parent(tmp_path / "empty")
    (tmp_path / "empty" / "other.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"gguf_file 'missing.gguf': no such file in .*\['other.gguf'\]"):
        load_parent(tmp_path / "empty", gguf_file="missing.gguf")
    with pytest.raises(ValueError, match="gguf_file 'missing.gguf': no such file"):
        ParLoopedQwenForStateTracking.from_pretrained_parent(str(tmp_path / "empty"), 1, 1, 1,
                                                             answer_token_ids=ANSWER_IDS, gguf_file="missing.gguf")


def test_pretrained_study_docstring_names_its_rows_and_only_those():
    """examples/reproduce/pretrained_smollm2.py's docstring describes every row it has (ROWS) and no other (it named a
    `retrofit_frozen` row that does not exist)."""
    import re

    from par_studies.pretrained_smollm2.rows import ROWS
    from tests.conftest import load_example

    study = load_example("examples/reproduce/pretrained_smollm2.py")
    described = set(re.findall(r"`([a-z][a-z0-9_]*)`", study.__doc__.split("Rows:", 1)[1]))
    assert described == set(ROWS)
    assert set(re.findall(r"--row (\S+)", study.__doc__)) <= set(ROWS)


def test_freeze_prelude_from_step_keeps_the_prelude_of_step_n_and_trains_the_core_on(tmp_path):
    """--freeze_prelude_from_step 2: the prelude moves in steps 1-2 (it differs from the parent's at checkpoint-2),
    then stays exactly as at step 2 to the end of 4 steps, while the core trains on; bad values are refused by name."""
    from safetensors.torch import load_file

    from par_studies.paper_scale.harness import EOS, qwen_like_tokenizer
    from state_tracking import load_task
    from tests.conftest import load_example

    train_par = load_example("examples/train_par.py")
    task_file = str(REPO / "examples" / "tasks" / "batch_process_phrasings.json")
    tokenizer = qwen_like_tokenizer(load_task(task_file))
    tokenizer.pad_token = tokenizer.eos_token = EOS
    torch.manual_seed(0)
    parent = LlamaForCausalLM(tiny_llama_config(vocab_size=len(tokenizer), num_hidden_layers=3, pad_token_id=None))
    parent.save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    common = ["--init_from_qwen2", str(tmp_path / "llama"), "--prelude_layers", "1", "--core_layers", "1",
              "--coda_layers", "1", "--task_file", task_file, "--rendering", "text", "--loop_view", "local",
              "--progress_positions", "true", "--bidirectional_queries", "true", "--max_train_depth", "3",
              "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--warmup_steps", "0",
              "--eval_depths", "3", "--eval_n", "4", "--use_cpu", "true", "--disable_tqdm", "true",
              "--report_to", "none"]
    out = tmp_path / "run"
    train_par.main([*common, "--freeze_prelude_from_step", "2", "--max_steps", "4", "--save_strategy", "steps",
                    "--save_steps", "2", "--save_total_limit", "2", "--output_dir", str(out)])
    at_2 = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    final = load_file(str(out / "model.safetensors"))
    before = parent.state_dict()
    prelude, core = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"
    assert not torch.equal(at_2[prelude], before[prelude])  # trained in steps 1-2
    torch.testing.assert_close(final[prelude], at_2[prelude], atol=0, rtol=0)  # frozen from step 2 on
    assert not torch.equal(final[core], at_2[core])  # the core trained on
    for value, message in (("0", "must be an integer >= 1"), ("-3", "must be an integer >= 1")):
        with pytest.raises(ValueError, match=message):
            train_par.main([*common, "--freeze_prelude_from_step", value, "--max_steps", "1",
                            "--output_dir", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="give one"):
        train_par.main([*common, "--freeze_prelude_from_step", "2", "--freeze_prelude", "true", "--max_steps", "1",
                        "--output_dir", str(tmp_path / "y")])
