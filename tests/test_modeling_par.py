import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import Qwen2ForCausalLM

from modeling_par import (
    ParLoopedQwenConfig,
    ParLoopedQwenForStateTracking,
    halt_confirmed,
    halt_iteration,
    padded_causal_mask,
    state_rms,
)
from tests.conftest import (
    ANSWER_IDS,
    HALT_IDS,
    VOCAB,
    fresh_process_job,
    fresh_process_result,
    make_model,
    tiny_par_config,
)

REPO = Path(__file__).resolve().parents[1]


def candidate_logits(parent, input_ids, query_positions):
    logits = parent(input_ids).logits  # (b, t, vocab)
    at_queries = logits.gather(1, query_positions[..., None].expand(-1, -1, logits.shape[-1]))
    return at_queries[..., ANSWER_IDS]  # (b, q, candidates)


def random_batch(batch=3, seq=12, queries=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (batch, seq), generator=g)
    query_positions = torch.arange(seq - queries, seq).expand(batch, -1)
    return input_ids, query_positions


# ---------------------------------------------------------------------------------------------------- retrofit
def test_r1_equals_parent_from_saved_checkpoint(tiny_parent, tmp_path):
    tiny_parent.save_pretrained(tmp_path / "parent")
    input_ids, qpos = random_batch()
    with torch.no_grad():
        expected = candidate_logits(tiny_parent, input_ids, qpos)
        for source in (tmp_path / "parent", str(tmp_path / "parent"), tiny_parent):
            model = ParLoopedQwenForStateTracking.from_pretrained_parent(
                source, prelude_layers=2, core_layers=2, coda_layers=2, answer_token_ids=ANSWER_IDS,
                halt_token_ids=HALT_IDS,
            ).eval()
            out = model(input_ids, query_positions=qpos, num_iterations=1)
            assert out.answer_logits.shape == (1, 3, 3, len(ANSWER_IDS))
            torch.testing.assert_close(out.answer_logits[0], expected, atol=1e-5, rtol=0)
            # Qwen2's parameter names are kept; only the adapter is new.
            assert set(model.state_dict()) - set(tiny_parent.state_dict()) == {"adapter.weight"}


def test_from_pretrained_parent_rejects_layer_split_and_bad_source(tiny_parent):
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ParLoopedQwenForStateTracking.from_pretrained_parent(tiny_parent, 2, 2, 3, answer_token_ids=ANSWER_IDS)
    with pytest.raises(ValueError, match="model_or_path"):
        ParLoopedQwenForStateTracking.from_pretrained_parent(123, 2, 2, 2, answer_token_ids=ANSWER_IDS)


def test_from_qwen2_is_an_alias_of_from_pretrained_parent(tiny_parent):
    """The old name builds the same model and says it is the alias."""
    torch.manual_seed(0)
    new = ParLoopedQwenForStateTracking.from_pretrained_parent(tiny_parent, 2, 2, 2, answer_token_ids=ANSWER_IDS)
    old = ParLoopedQwenForStateTracking.from_qwen2(tiny_parent, 2, 2, 2, answer_token_ids=ANSWER_IDS)
    assert "Alias of `from_pretrained_parent`" in ParLoopedQwenForStateTracking.from_qwen2.__doc__
    assert new.config.to_dict() == old.config.to_dict()
    assert all(torch.equal(a, b) for a, b in zip(new.state_dict().values(), old.state_dict().values()))


PARENTS_ON_FIRST_RETROFIT = """
    import sys
    import torch
    from modeling_par import ParLoopedQwenForStateTracking
    from tests.conftest import ANSWER_IDS, VOCAB, make_model, tiny_qwen2_config
    from transformers import Qwen2ForCausalLM

    seen = []
    model = make_model()
    model.predict(torch.randint(1, VOCAB, (2, 6)), num_iterations=3)
    seen.append(f"parents after inference: {'modeling_par.parent_conversion' in sys.modules}")
    ParLoopedQwenForStateTracking.from_pretrained_parent(Qwen2ForCausalLM(tiny_qwen2_config()), 2, 2, 2,
                                                         answer_token_ids=ANSWER_IDS)
    seen.append(f"parents after a retrofit: {'modeling_par.parent_conversion' in sys.modules}")
    print(json.dumps(seen))
"""


@fresh_process_job("parents_on_first_retrofit", blocked=False)
def parents_on_first_retrofit(folder):
    """The package imported for the first time in the fresh process (after its blocked checks), from the
    repository."""
    return dict(script=PARENTS_ON_FIRST_RETROFIT, folder=REPO, args=[])


def test_the_parent_conversion_is_imported_only_by_a_retrofit(fresh_process):
    """`modeling_par` builds and runs a model without importing `modeling_par.parent_conversion`;
    `from_pretrained_parent` imports it on first use (by importlib, which transformers' remote-code scanner does not
    follow). In the fresh process (`fresh_process`), where the package is imported for the first time."""
    from transformers.dynamic_module_utils import get_relative_import_files

    remote_code = get_relative_import_files(REPO / "modeling_par" / "modeling_par.py")
    assert "parent_conversion.py" not in {Path(f).name for f in remote_code}
    job = fresh_process_result(fresh_process, "parents_on_first_retrofit")
    assert job["output"] == ["parents after inference: False", "parents after a retrofit: True"]


def test_tied_embeddings_parent_keeps_tie():
    from tests.conftest import tiny_qwen2_config

    torch.manual_seed(0)
    parent = Qwen2ForCausalLM(tiny_qwen2_config(tie_word_embeddings=True)).eval()
    model = ParLoopedQwenForStateTracking.from_pretrained_parent(parent, 2, 2, 2, answer_token_ids=ANSWER_IDS).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    input_ids, qpos = random_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids, query_positions=qpos).answer_logits[0], candidate_logits(parent, input_ids, qpos),
            atol=1e-5, rtol=0,
        )


# ---------------------------------------------------------------------------------------------------- anchoring
def test_anchoring_keeps_every_iteration_at_iteration_one_rms(tiny_model):
    input_ids, qpos = random_batch()
    with torch.no_grad():
        out = tiny_model(input_ids, query_positions=qpos, num_iterations=6, output_loop_states=True)
    reference = state_rms(out.loop_states[0])
    for state in out.loop_states[1:]:
        torch.testing.assert_close(state_rms(state), reference, rtol=1e-4, atol=0)
    # The raw (pre-anchoring) RMS does drift, which is what anchoring removes.
    assert not torch.allclose(out.state_rms[-1], out.state_rms[0], rtol=1e-3)


def test_anchoring_off_changes_multi_iteration_outputs():
    input_ids, qpos = random_batch()
    on, off = make_model(norm_anchoring=True), make_model(norm_anchoring=False)
    with torch.no_grad():
        a1 = on(input_ids, query_positions=qpos, num_iterations=1).answer_logits
        b1 = off(input_ids, query_positions=qpos, num_iterations=1).answer_logits
        a4 = on(input_ids, query_positions=qpos, num_iterations=4).answer_logits
        b4 = off(input_ids, query_positions=qpos, num_iterations=4).answer_logits
    torch.testing.assert_close(a1, b1)  # iteration 1 is its own reference
    assert (a4 - b4).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------------- stretch
def test_position_scale_one_equals_integer_positions(tiny_model):
    input_ids, qpos = random_batch()
    with torch.no_grad():
        plain = tiny_model(input_ids, query_positions=qpos, num_iterations=3).answer_logits
        scaled = tiny_model(input_ids, query_positions=qpos, num_iterations=3, position_scale=1.0).answer_logits
        stretched = tiny_model(input_ids, query_positions=qpos, num_iterations=3, position_scale=2.0).answer_logits
    torch.testing.assert_close(plain, scaled, atol=1e-6, rtol=0)
    assert (plain - stretched).abs().max() > 1e-4


def test_stretched_last_token_still_sees_first_token(tiny_model):
    """Under the packed-mask trap every stretched token would see only itself: token 0 could not matter."""
    input_ids, qpos = random_batch(batch=1)
    changed = input_ids.clone()
    changed[0, 0] = (changed[0, 0] % (VOCAB - 1)) + 1
    with torch.no_grad():
        a = tiny_model(input_ids, query_positions=qpos[:, -1:], num_iterations=2, position_scale=2.0).answer_logits
        b = tiny_model(changed, query_positions=qpos[:, -1:], num_iterations=2, position_scale=2.0).answer_logits
    assert (a - b).abs().max() > 1e-5
    mask = padded_causal_mask(torch.ones(1, 6), None)
    assert mask[0, 0, -1].all() and not mask[0, 0, 0, 1:].any()


def test_position_scale_out_of_range_is_rejected(tiny_model):
    input_ids, qpos = random_batch()
    with pytest.raises(ValueError, match="position_scale"):
        tiny_model(input_ids, query_positions=qpos, position_scale=9.0)
    with pytest.raises(ValueError, match="position_scale"):
        tiny_model(input_ids, query_positions=qpos, position_scale=0.5)


# ---------------------------------------------------------------------------------------------------- padding
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_one_prompt_at_a_time(tiny_model, side):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g) for n in (7, 11, 9)]
    width = max(len(p) for p in prompts)
    input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    qpos = torch.zeros(len(prompts), 2, dtype=torch.long)
    for i, p in enumerate(prompts):
        start = width - len(p) if side == "left" else 0
        input_ids[i, start : start + len(p)] = p
        mask[i, start : start + len(p)] = 1
        qpos[i] = torch.tensor([start + len(p) - 2, start + len(p) - 1])
    with torch.no_grad():
        batched = tiny_model(input_ids, attention_mask=mask, query_positions=qpos, num_iterations=3)
        for i, p in enumerate(prompts):
            single = tiny_model(p[None], query_positions=torch.tensor([[len(p) - 2, len(p) - 1]]), num_iterations=3)
            torch.testing.assert_close(batched.answer_logits[:, i], single.answer_logits[:, 0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batched.halt_logits[:, i], single.halt_logits[:, 0], atol=1e-5, rtol=0)
        # default query = last real token, whichever the padding side
        default = tiny_model(input_ids, attention_mask=mask, num_iterations=2).answer_logits[0, :, 0]
        explicit = tiny_model(input_ids, attention_mask=mask, query_positions=qpos[:, 1:], num_iterations=2)
    torch.testing.assert_close(default, explicit.answer_logits[0, :, 0], atol=1e-6, rtol=0)


def test_query_on_padding_is_rejected(tiny_model):
    input_ids, qpos = random_batch()
    mask = torch.ones_like(input_ids)
    mask[:, -1] = 0
    with pytest.raises(ValueError, match="query_positions must point at real tokens"):
        tiny_model(input_ids, attention_mask=mask, query_positions=qpos)


# ---------------------------------------------------------------------------------------------------- gradient window
@pytest.mark.parametrize("checkpoint_core", [False, True])
def test_gradient_reaches_only_the_window(checkpoint_core):
    model = make_model(grad_window=3, checkpoint_core=checkpoint_core).train()
    calls = []
    hook = model.core[0].register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    input_ids, qpos = random_batch()
    out = model(input_ids, query_positions=qpos, num_iterations=7, readout_iterations=[5, 6, 7])
    expected = [False] * 4 + [True] * 3
    # activation checkpointing re-runs the windowed core calls in backward; count the forward pass only
    assert calls[:7] == expected
    out.answer_logits.sum().backward()
    hook.remove()
    assert model.adapter.weight.grad is not None and model.adapter.weight.grad.abs().sum() > 0
    assert model.prelude[0].mlp.up_proj.weight.grad.abs().sum() > 0
    if checkpoint_core:
        assert calls[7:] == [True] * 3


def test_readouts_outside_the_window_train_only_the_coda():
    model = make_model(grad_window=2).train()
    input_ids, qpos = random_batch()
    out = model(input_ids, query_positions=qpos, num_iterations=5, readout_iterations=[2])
    assert out.readout_iterations.tolist() == [2]
    out.answer_logits.sum().backward()
    assert model.coda[0].mlp.up_proj.weight.grad.abs().sum() > 0
    assert model.core[0].mlp.up_proj.weight.grad is None and model.adapter.weight.grad is None
    assert model.prelude[0].mlp.up_proj.weight.grad is None


def test_iteration_arguments_are_validated(tiny_model):
    input_ids, qpos = random_batch()
    with pytest.raises(ValueError, match="num_iterations"):
        tiny_model(input_ids, query_positions=qpos, num_iterations=0)
    with pytest.raises(ValueError, match="num_iterations"):
        tiny_model(input_ids, query_positions=qpos, num_iterations=tiny_model.config.max_iterations + 1)
    with pytest.raises(ValueError, match="readout_iterations"):
        tiny_model(input_ids, query_positions=qpos, num_iterations=3, readout_iterations=[4])
    with pytest.raises(ValueError, match="input_ids"):
        tiny_model(input_ids + VOCAB, query_positions=qpos)


def test_unknown_or_ineffective_arguments_are_errors(tiny_model):
    """No keyword is accepted and ignored: a misspelt one is a TypeError naming it, and predict's halting bound on a
    forced-depth call (which runs exactly num_iterations) is an error."""
    input_ids, qpos = random_batch()
    for bad in ("operation_endz", "labels"):
        with pytest.raises(TypeError, match=bad):
            tiny_model(input_ids, query_positions=qpos, **{bad: qpos})
    with pytest.raises(TypeError, match="operation_endz"):
        tiny_model.predict(input_ids, query_positions=qpos, num_iterations=2, operation_endz=qpos)
    with pytest.raises(ValueError, match="max_iterations bounds learned halting"):
        tiny_model.predict(input_ids, query_positions=qpos, num_iterations=2, max_iterations=4)
    with pytest.raises(ValueError, match="halting must be a bool"):
        tiny_model.predict(input_ids, query_positions=qpos, halting=1)
    output = tiny_model(input_ids, query_positions=qpos, num_iterations=2, operation_ends=None)
    assert output.answer_logits.shape[0] == 1


# ---------------------------------------------------------------------------------------------------- halting
def test_halt_iteration_on_hand_made_sequences():
    p = torch.tensor
    # window m=4, k=3: R=1 is below τ; R=2 is above τ and 3 of 2..5 are above τ.
    assert halt_iteration(p([0.1, 0.9, 0.8, 0.2, 0.9, 0.7, 0.9]), 0.5, 3, 4) == 2
    # R=2 is above τ but its window 2..5 has only 2 confirmations; R=3 is below τ; R=4 confirms (4..7: 3).
    assert halt_iteration(p([0.1, 0.9, 0.2, 0.6, 0.2, 0.6, 0.6, 0.1]), 0.5, 3, 4) == 4
    # never confirmed (and a trailing window too short to confirm) → None
    assert halt_iteration(p([0.9, 0.1, 0.1, 0.9, 0.1, 0.1, 0.9]), 0.5, 3, 4) is None
    assert halt_iteration(p([0.1, 0.1, 0.9, 0.9]), 0.5, 2, 4) is None
    # exactly τ is not above τ
    assert halt_iteration(p([0.5, 0.5, 0.5]), 0.5, 1, 1) is None
    assert halt_confirmed(p([[0.6, 0.4], [0.6, 0.9]]), 0.5, 2).tolist() == [True, False]


def test_early_exit_batch_equals_per_sample():
    model = make_model(seed=2, halt_confirm=2, halt_window=3)
    with torch.no_grad():  # spread P(Yes) across samples: bias the Yes row along the mean state direction
        model.lm_head.weight[HALT_IDS[0]] += 0.5 * torch.randn(64)
    input_ids, qpos = random_batch(batch=6, seed=5)
    batch = model.predict(input_ids, query_positions=qpos, halting=True, max_iterations=25)
    singles = [model.predict(input_ids[i : i + 1], query_positions=qpos[i : i + 1], halting=True, max_iterations=25)
               for i in range(6)]
    assert batch.iterations.tolist() == [s.iterations.item() for s in singles]
    assert batch.halted.tolist() == [s.halted.item() for s in singles]
    assert batch.answers.tolist() == [s.answers[0].tolist() for s in singles]
    assert len(set(batch.iterations.tolist())) > 1  # samples really exit at different iterations
    # forced depth with per-sample R equals per-sample runs and the forward pass
    depths = torch.tensor([1, 4, 2, 4, 3, 1])
    forced = model.predict(input_ids, query_positions=qpos, num_iterations=depths)
    assert forced.iterations.tolist() == depths.tolist() and forced.halted.all()
    for i, r in enumerate(depths.tolist()):
        with torch.no_grad():
            ref = model(input_ids[i : i + 1], query_positions=qpos[i : i + 1], num_iterations=r).answer_logits[-1, 0]
        torch.testing.assert_close(forced.answer_logits[i], ref, atol=1e-5, rtol=0)


def test_never_halting_samples_are_flagged():
    model = make_model(halt_threshold=0.5)
    with torch.no_grad():  # zero rows: P(Yes) = 0.5 exactly, never strictly above τ = 0.5
        model.lm_head.weight[list(HALT_IDS)] = 0.0
    input_ids, qpos = random_batch()
    pred = model.predict(input_ids, query_positions=qpos, halting=True, max_iterations=12)
    assert not pred.halted.any() and pred.iterations.tolist() == [12, 12, 12]


# ---------------------------------------------------------------------------------------------------- precision
def test_eager_equals_sdpa_and_bf16_runs():
    input_ids, qpos = random_batch()
    sdpa = make_model()
    eager = make_model()
    eager.config._attn_implementation = "eager"
    with torch.no_grad():
        a = sdpa(input_ids, query_positions=qpos, num_iterations=3).answer_logits
        b = eager(input_ids, query_positions=qpos, num_iterations=3).answer_logits
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        c = sdpa.to(torch.bfloat16)(input_ids, query_positions=qpos, num_iterations=3).answer_logits
    assert c.dtype == torch.bfloat16 and torch.isfinite(c).all()
    assert (c.float() - a).abs().max() < 0.1


# ---------------------------------------------------------------------------------------------------- config errors
BAD_FIELDS = [
    ("prelude_layers", dict(prelude_layers=0)),
    ("core_layers", dict(core_layers=1.5)),
    ("coda_layers", dict(coda_layers=-1)),
    ("num_hidden_layers", dict(num_hidden_layers=7)),
    ("step_size", dict(step_size=0)),
    ("grad_window", dict(grad_window=0)),
    ("max_iterations", dict(max_iterations=0)),
    ("halt_window", dict(halt_window=0)),
    ("halt_confirm", dict(halt_confirm=9, halt_window=8)),
    ("halt_threshold", dict(halt_threshold=1.0)),
    ("max_position_scale", dict(max_position_scale=0.5)),
    ("norm_anchoring", dict(norm_anchoring="yes")),
    ("checkpoint_core", dict(checkpoint_core=1)),
    ("answer_feedback", dict(answer_feedback="true")),
    ("answer_token_ids", dict(answer_token_ids=[1, VOCAB])),
    ("answer_token_ids", dict(answer_token_ids=[3, 3])),
    ("halt_token_ids", dict(halt_token_ids=(5, 5))),
    ("halt_token_ids", dict(halt_token_ids=(1, 2, 3))),
    # a combination with no effect: the full view with ordinary positions reads no query region
    ("bidirectional_queries", dict(bidirectional_queries=True)),
]


@pytest.mark.parametrize("field,override", BAD_FIELDS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_FIELDS)])
def test_invalid_config_field_names_the_field(field, override):
    with pytest.raises(ValueError, match=rf"ParLoopedQwenConfig\.{field} must be"):
        tiny_par_config(**override)


def test_model_requires_answer_ids():
    config = tiny_par_config()
    config.answer_token_ids = []
    with pytest.raises(ValueError, match=r"ParLoopedQwenConfig\.answer_token_ids must be a non-empty list"):
        ParLoopedQwenForStateTracking(config)
    ParLoopedQwenConfig()  # a bare config (what transformers diffs against) still builds


# ---------------------------------------------------------------------------------------------------- remote code
BLOCK_THIS_REPOSITORY = textwrap.dedent(
    """
    import importlib.abc, json, sys
    sys.path[:] = [p for p in sys.path if p not in ("", ".", sys.argv[2])]

    class Block(importlib.abc.MetaPathFinder):  # the installed package must not be what loads: only the folder's code
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("modeling_par", "state_tracking", "trainers"):
                raise ImportError("blocked: " + name)

    sys.meta_path.insert(0, Block())
    """
)


def run_blocked(script: str, folder, *args: str, timeout: float | None = 240) -> str:
    """Run `script` (after `BLOCK_THIS_REPOSITORY`) in a fresh offline process in `folder`, with sys.argv
    [folder, repository, *args]; returns its last line of output."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run([sys.executable, "-c", BLOCK_THIS_REPOSITORY + textwrap.dedent(script), str(folder),
                           str(REPO), *args], capture_output=True, text=True, cwd=folder, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


LOAD_IN_FRESH_PROCESS = """
    import torch
    from transformers import AutoModel
    batch = json.loads(sys.argv[3])
    outputs = []
    for implementation in sys.argv[4].split(","):  # in this order, the first load in a fresh process ("": the default)
        attn = {"attn_implementation": implementation} if implementation else {}
        model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True, **attn).eval()
        assert not implementation or model.config._attn_implementation == implementation
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            out = model(torch.tensor(batch["input_ids"]), query_positions=torch.tensor(batch["query_positions"]),
                        num_iterations=4, readout_iterations=[2, 4])
        outputs.append(out.answer_logits.tolist())
    print(json.dumps(outputs))
"""


@fresh_process_job("saved_tiny_model", order=0)  # the process's first load: nothing has registered "par_eager" yet
def saved_tiny_model(folder):
    """`make_model()` saved to `folder`/ckpt, and a batch: `fresh_process` (package blocked) loads it first with the
    attention implementation the remote code registers, "par_eager" (eager attention when uncompiled; asked for by
    the process's first load), then with the default, and answers the batch each time."""
    model = make_model()
    model.save_pretrained(folder / "ckpt")
    input_ids, qpos = random_batch()
    batch = {"input_ids": input_ids.tolist(), "query_positions": qpos.tolist()}
    return dict(script=LOAD_IN_FRESH_PROCESS, folder=folder / "ckpt", args=[json.dumps(batch), "par_eager,"],
                model=model, input_ids=input_ids, query_positions=qpos)


def test_save_pretrained_loads_with_trust_remote_code_in_fresh_process(fresh_process):
    job = fresh_process_result(fresh_process, "saved_tiny_model")
    folder, model = job["folder"], job["model"]
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_par.ParLoopedQwenConfig",
        "AutoModel": "modeling_par.ParLoopedQwenForStateTracking",
    }
    assert (folder / "modeling_par.py").exists() and (folder / "configuration_par.py").exists()
    with torch.no_grad():
        expected = model(job["input_ids"], query_positions=job["query_positions"], num_iterations=4,
                         readout_iterations=[2, 4])
    par_eager, default = (torch.tensor(logits) for logits in job["output"])
    torch.testing.assert_close(default, expected.answer_logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(par_eager, expected.answer_logits, atol=1e-5, rtol=0)


def test_a_model_first_called_under_inference_mode_still_trains(tiny_model):
    """The readout's cached index tensors are built outside inference_mode, so an evaluation before training (an
    in-training probe, a pre-training baseline) does not make every later backward fail."""
    ids = torch.randint(30, 40, (2, 6))
    with torch.inference_mode():
        tiny_model.predict(ids, num_iterations=2)
    tiny_model.train()
    out = tiny_model(ids, num_iterations=2)
    out.answer_logits.sum().backward()
    assert tiny_model.lm_head.weight.grad is not None and tiny_model.lm_head.weight.grad.abs().sum() > 0
