"""pretrained_smollm2.py on a trained row's folder: --heldout2 (the second held-out set, read once) and the per-phrasing
evaluation files that let two processes share a row's evaluation."""

from __future__ import annotations

import json

import pytest

from par_studies import save_record
from par_studies.pretrained_smollm2 import (
    curves,
    diagnostics,
    evaluation,
    export,
    heldout,
    rows,
    training,
)
from tests.conftest import load_example
from tests.test_heldout2_records import recipe_record

train_par = load_example("examples/train_par.py")
study = load_example("examples/reproduce/pretrained_smollm2.py")  # the script: its command line (main)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny retrofit trained 2 steps: a byte-level BPE reads any wording, as SmolLM2's does."""
    import torch
    from transformers import LlamaForCausalLM

    from par_studies.paper_scale.harness import EOS, qwen_like_tokenizer
    from state_tracking import load_task
    from tests.test_parents import tiny_llama_config

    tmp_path = tmp_path_factory.mktemp("tiny_retrofit")
    tokenizer = qwen_like_tokenizer(load_task("examples/tasks/batch_process_phrasings.json"))
    tokenizer.pad_token = tokenizer.eos_token = EOS
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_llama_config(vocab_size=len(tokenizer), num_hidden_layers=3, pad_token_id=None)
                     ).save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    run = tmp_path / "row_s0"
    from par_studies import argv

    train_par.main(argv({**tiny_flags(tmp_path / "llama"), "--output_dir": str(run)}))
    return run


def tiny_flags(parent) -> dict:
    """The tiny run's train_par.py flags (its parent folder `parent`)."""
    return {"--init_from_qwen2": str(parent), "--prelude_layers": "1", "--core_layers": "1", "--coda_layers": "1",
            "--task_file": "examples/tasks/batch_process_phrasings.json", "--rendering": "text",
            "--random_initial": "true", "--loop_view": "local", "--progress_positions": "true",
            "--bidirectional_queries": "true", "--max_steps": "2", "--per_device_train_batch_size": "4",
            "--max_train_depth": "2", "--eval_depths": "2", "--eval_n": "4", "--disable_tqdm": "true",
            "--use_cpu": "true", "--report_to": "none", "--learning_rate": "1e-2"}


def heldout2_on_the_tiny_run(run, tmp_path, monkeypatch) -> None:
    """--heldout2 pointed at the tiny run (every seed), a record with a first-set accuracy, d = 2 and 3, 6 prompts."""
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"evaluation": {"held_out": {"accuracy": [0.5, 0.25]}}}))
    monkeypatch.setattr(heldout, "run_path", lambda row, seed: run)
    monkeypatch.setattr(heldout, "record_path", lambda row, seed: record)
    monkeypatch.setattr(heldout, "HELDOUT2_OUT", tmp_path / "heldout2.json")
    monkeypatch.setattr(heldout, "DEPTHS", [2, 3])
    monkeypatch.setattr(heldout, "N", 6)


def test_heldout2_reads_the_rows_seeds_once(tiny_run, tmp_path, monkeypatch):
    """The second set's wordings, which the run's training never held; a second read is refused."""
    heldout2_on_the_tiny_run(tiny_run, tmp_path, monkeypatch)
    out = heldout.heldout2("retrofit_frozen_emb", [0])
    saved = json.loads((tmp_path / "heldout2.json").read_text())
    assert saved["row"] == "retrofit_frozen_emb" and saved["task_file"].endswith("batch_process_heldout2.json")
    assert saved["per_seed"]["0"]["depths"][0] == 2 and set(saved["mean"]) == {"2", "3"}
    assert all(0.0 <= a <= 1.0 for a in saved["per_seed"]["0"]["accuracy"])
    assert saved["first_held_out_set"] == {"0": [0.5, 0.25]} and out["n_per_depth"] == 6
    with pytest.raises(SystemExit, match="read once"):
        heldout.heldout2("retrofit_frozen_emb", [0])


def test_heldout2_seeds_tested_apart_write_no_record_and_are_read_back(tiny_run, tmp_path, monkeypatch):
    """--cache_only: a seed's test is kept in its run folder and no record is written; the call over every seed then
    reads that test back instead of running it again."""
    (tiny_run / "eval_heldout2.json").unlink(missing_ok=True)
    heldout2_on_the_tiny_run(tiny_run, tmp_path, monkeypatch)
    assert heldout.heldout2("retrofit_frozen_emb", [0], write_record=False) is None
    assert not (tmp_path / "heldout2.json").exists()
    cached = json.loads((tiny_run / "eval_heldout2.json").read_text())
    assert cached["grid"] == [2, 3] and cached["n_per_depth"] == 6

    def no_second_test(*args, **kwargs):
        raise AssertionError("the kept test was evaluated again")

    monkeypatch.setattr(heldout, "evaluate_phrasing", no_second_test)
    out = heldout.heldout2("retrofit_frozen_emb", [0])
    assert out["per_seed"]["0"] == cached["evaluation"]
    assert json.loads((tmp_path / "heldout2.json").read_text())["per_seed"]["0"] == cached["evaluation"]
    monkeypatch.setattr(heldout, "N", 7)  # another grid or prompt count is not the kept test
    (tmp_path / "heldout2.json").unlink()
    with pytest.raises(AssertionError, match="evaluated again"):
        heldout.heldout2("retrofit_frozen_emb", [0])


def test_a_phrasing_evaluated_apart_is_read_back_not_evaluated_again(tiny_run, monkeypatch):
    for cache in tiny_run.glob("eval_*.json"):
        cache.unlink()
    monkeypatch.setattr(evaluation, "run_path", lambda row, seed: tiny_run)
    import state_tracking

    calls = []
    real = state_tracking.evaluate_until_failed

    def counted(*args, **kwargs):
        calls.append(kwargs["phrasing"])
        return real(*args, **kwargs)

    monkeypatch.setattr(state_tracking, "evaluate_until_failed", counted)
    segments = [{"command": "python examples/train_par.py", "wall_seconds": 1.0, "status": "finished"}]
    apart = evaluation.evaluate("retrofit_frozen_emb", 0, segments, [2, 3], 4, ["held_out"])
    assert calls == ["held_out"] and (tiny_run / "eval_held_out.json").is_file()
    whole = evaluation.evaluate("retrofit_frozen_emb", 0, segments, [2, 3], 4, ["seen", "held_out"])
    assert calls == ["held_out", "seen"]  # held_out read from its file
    assert whole["evaluation"]["held_out"] == apart["evaluation"]["held_out"]
    evaluation.evaluate("retrofit_frozen_emb", 0, segments, [2], 4, ["held_out"])  # another grid: evaluated again
    assert calls == ["held_out", "seen", "held_out"]


def test_an_export_names_the_parent_its_row_was_cut_from():
    assert export.parent_of("qwen_frozen_emb") == ("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, "
                                                  "its first layers as 3 + 3 + 3, embeddings frozen)")
    assert export.parent_of("retrofit_full") == ("smollm2", "SmolLM2-135M-Instruct (Q4_1 GGUF, its first layers as "
                                                "3 + 3 + 3)")
    # a two-stage row was cut from its first stage's parent
    assert export.parent_of("qwen_stage2_frozen_prelude") == (
        "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, its first layers as 3 + 3 + 3, embeddings "
        "frozen); then a second stage with the prelude and embeddings frozen")
    assert export.steps_text({"steps": 200, "stage1": {"steps": 300}}) == "300 + 200 steps (two stages)"
    assert export.steps_text({"steps": 700}) == "700 steps"


def test_profile_reads_every_iteration_of_a_trained_row_in_each_phrasing(tiny_run, tmp_path, monkeypatch):
    """--profile: the accuracy of every iteration k = 1 … d against the state after k operations, per phrasing, kept
    in the row's record; its held-out profile is progress_profile's on held-out sentences."""
    import numpy as np

    from state_tracking import progress_profile
    from state_tracking.tokenization import encode_batch

    record = tmp_path / "record.json"
    record.write_text(json.dumps({"row": "retrofit_frozen_emb"}))
    monkeypatch.setattr(diagnostics, "run_path", lambda row, seed: tiny_run)
    monkeypatch.setattr(diagnostics, "record_path", lambda row, seed: record)
    monkeypatch.setattr(diagnostics, "PROFILE_DEPTH", 3)
    monkeypatch.setattr(diagnostics, "PROFILE_N", 5)
    out = diagnostics.profile_row("retrofit_frozen_emb", 0)
    saved = json.loads(record.read_text())
    assert saved["profile_command"] == ("python examples/reproduce/pretrained_smollm2.py --profile retrofit_frozen_emb "
                                        "--seed 0")
    saved = saved["profile"]
    assert saved == out and saved["depth"] == 3 and saved["n"] == 5
    for phrasing in ("seen", "held_out"):
        profile = saved[phrasing]["profile"]
        assert len(profile) == 3 and all(a in {i / 5 for i in range(6)} for a in profile)
    # the held-out profile is read from held-out sentences: every prompt it scores contains them
    from par_studies import load_run

    model, tokenizer, task = load_run(tiny_run, 3)
    held = encode_batch(task, tokenizer, "text", np.zeros((1, 3), dtype=np.int64), None, "held_out",
                        np.random.default_rng(0))
    seen = encode_batch(task, tokenizer, "text", np.zeros((1, 3), dtype=np.int64), None, "canonical")
    assert held["input_ids"] != seen["input_ids"]
    direct = progress_profile(model, tokenizer, task, [3], n_per_depth=5, seed=0, rendering="text",
                              phrasing="held_out")
    assert direct["phrasing"] == "held_out" and [round(a, 4) for a in direct["profile"][0]] == \
        saved["held_out"]["profile"]


def test_the_profile_of_an_augmented_row_reads_the_studys_own_wordings(tiny_run, tmp_path, monkeypatch):
    """A row trained on an augmented copy of the wordings (its run folder holds that file) is profiled on the study's
    task file, as it is tested: its "seen" prompts are not drawn among the variants."""
    import par_studies
    import state_tracking
    from par_studies import load_run
    from state_tracking import load_task

    augmented = load_task("examples/tasks/batch_process_determiners.json")
    monkeypatch.setattr(par_studies, "load_run", lambda folder, depth: (*load_run(tiny_run, depth)[:2], augmented))
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"row": "qwen_stage2_determiners"}))
    monkeypatch.setattr(diagnostics, "run_path", lambda row, seed: tiny_run)
    monkeypatch.setattr(diagnostics, "record_path", lambda row, seed: record)
    monkeypatch.setattr(diagnostics, "PROFILE_DEPTH", 2)
    monkeypatch.setattr(diagnostics, "PROFILE_N", 2)
    seen_tasks = []

    def spy(model, tokenizer, task, *args, **kwargs):
        seen_tasks.append(task)
        return {"profile": [[1.0, 1.0]], "first_failure": [None]}

    monkeypatch.setattr(state_tracking, "progress_profile", spy)
    diagnostics.profile_row("qwen_stage2_determiners", 0)
    original = load_task(rows.REPO / rows.TASK_FILE)
    assert len(seen_tasks) == 2 and all(t.text == original.text for t in seen_tasks)
    assert augmented.text != original.text


def test_a_probe_on_the_held_out_wordings_scores_what_the_evaluator_scores_on_them(tiny_run, tmp_path):
    """--probe_phrasing held_out: the probe's prompts are the evaluator's held-out prompts for that depth, n and seed
    (not the canonical ones), and its accuracy is the evaluator's; a phrasing without the text rendering, or a name the
    task does not know, is refused by the callback and by train_par.py before anything loads."""
    from par_studies import load_run
    from state_tracking import evaluate_length_generalization
    from trainers import StateAccuracyProbeCallback

    model, tokenizer, task = load_run(tiny_run, 3)
    kwargs = dict(n=6, seed=5, rendering="text", random_initial=True)
    held = StateAccuracyProbeCallback(tokenizer, task, 3, phrasing="held_out", **kwargs)
    canonical = StateAccuracyProbeCallback(tokenizer, task, 3, **kwargs)
    assert held.describe() == {"probe_depth": 3, "probe_n": 6, "probe_phrasing": "held_out"}
    assert held.encoded["input_ids"] != canonical.encoded["input_ids"]
    evaluated = evaluate_length_generalization(model, tokenizer, task, [3], n_per_depth=6, seed=5, rendering="text",
                                               random_initial=True, phrasing="held_out", progress=False)
    assert held.evaluate(model) == evaluated["accuracy"][0]
    with pytest.raises(ValueError, match="needs the text rendering"):
        StateAccuracyProbeCallback(tokenizer, task, 3, phrasing="held_out", rendering="symbolic")
    with pytest.raises(ValueError, match="phrasing must be one of"):
        StateAccuracyProbeCallback(tokenizer, task, 3, phrasing="unseen", rendering="text")
    base = ["--task_file", "examples/tasks/batch_process_phrasings.json", "--probe_depth", "3", "--max_steps", "1",
            "--output_dir", str(tmp_path / "refused")]
    with pytest.raises(ValueError, match="--probe_phrasing held_out needs --rendering text"):
        train_par.main(base + ["--probe_phrasing", "held_out"])
    with pytest.raises(ValueError, match="--probe_phrasing must be one of canonical, seen, held_out"):
        train_par.main(base + ["--rendering", "text", "--probe_phrasing", "unseen"])


def test_interpolation_toward_the_parent_moves_every_pretrained_weight_and_keeps_the_adapter(tiny_run, tmp_path,
                                                                                            monkeypatch):
    """WiSE-FT (--interpolate): θ_0 is the run's own start (the parent's converted weights), each parent weight goes to
    θ_0 + α (θ_ft − θ_0), the adapter stays fine-tuned; α = 1 scores what the trained row scores; a bad α or initial
    state is refused by name."""
    import torch
    from safetensors.torch import load_file

    from par_studies import load_run
    from par_studies.interpolation import initial_weights, interpolate_from_init
    from state_tracking import evaluate_until_failed

    flags = tiny_flags(tiny_run.parent / "llama")
    initial = initial_weights(flags, 0, tmp_path / "scratch")
    parent = load_file(str(tiny_run.parent / "llama" / "model.safetensors"))
    torch.testing.assert_close(initial["model.layers.0.self_attn.q_proj.weight"],
                               parent["model.layers.0.self_attn.q_proj.weight"])
    torch.testing.assert_close(initial["model.embed_tokens.weight"], parent["model.embed_tokens.weight"])
    model, tokenizer, task = load_run(tiny_run, 3)
    tuned = {k: v.clone() for k, v in model.state_dict().items()}
    name = "model.layers.1.mlp.up_proj.weight"
    assert not torch.equal(tuned[name], initial[name])  # training moved it
    done = interpolate_from_init(model, initial, 0.25)
    assert name in done and "adapter.weight" not in done
    torch.testing.assert_close(model.state_dict()[name], initial[name] + 0.25 * (tuned[name] - initial[name]))
    torch.testing.assert_close(model.state_dict()["adapter.weight"], tuned["adapter.weight"])
    model.load_state_dict(tuned)
    interpolate_from_init(model, initial, 0.0)
    torch.testing.assert_close(model.state_dict()[name], initial[name])
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]; got 1.5"):
        interpolate_from_init(model, initial, 1.5)
    with pytest.raises(ValueError, match=f"the initial weights lack {name}"):
        interpolate_from_init(model, {k: v for k, v in initial.items() if k != name}, 0.5)

    monkeypatch.setattr(curves, "run_path", lambda row, seed: tiny_run)
    monkeypatch.setattr(curves, "row_flags", lambda row: flags)
    monkeypatch.setattr(curves, "INTERPOLATION_OUT", tmp_path / "interpolation")
    monkeypatch.setattr(curves, "DEPTHS", [2, 3])
    record = curves.interpolate("retrofit_frozen_emb", 0, [1.0, 0.5], n=6)
    saved = json.loads((tmp_path / "interpolation" / "retrofit_frozen_emb_s0.json").read_text())
    assert saved["points"] == record["points"] and [p["alpha"] for p in saved["points"]] == [1.0, 0.5]
    model.load_state_dict(tuned)
    direct = evaluate_until_failed(model, tokenizer, task, [2, 3], mode="forced", n_per_depth=6, seed=0,
                                   rendering="text", phrasing="held_out", train_max_depth=8, progress=False)
    assert saved["points"][0]["held_out"]["accuracy"] == direct["accuracy"]
    assert saved["commands"][0].endswith("--alphas 1.0,0.5 --interpolation_n 6")
    more = curves.interpolate("retrofit_frozen_emb", 0, [0.25, 0.5], n=6)  # a second screen adds its alphas
    assert [p["alpha"] for p in more["points"]] == [1.0, 0.5, 0.25] and len(more["commands"]) == 2
    assert more["points"][0] == saved["points"][0]
    with pytest.raises(SystemExit):
        study.main(["--interpolate", "retrofit_frozen_emb", "--alphas", "0.5,2"])


def test_probe_curve_keeps_the_probes_and_a_probe_changes_no_weight(tiny_run, tmp_path, monkeypatch):
    """--probe_curve: every probe of a trained row with its curriculum d_max, as JSON; the same flags and seed trained
    with the probe end on the very weights of the run without it (--compare_to: max |Δ| 0), so the row's evaluation
    carries over; a run without a probe is refused by name."""
    from par_studies import argv

    probed = tmp_path / "probed_s0"
    train_par.main(argv({**tiny_flags(tiny_run.parent / "llama"), "--output_dir": str(probed), "--probe_depth": "3",
                         "--probe_n": "4", "--probe_every_steps": "1", "--probe_phrasing": "held_out"}))
    folders = {"qwen_probe_500": probed, "qwen_frozen_emb_500": tiny_run}
    monkeypatch.setattr(curves, "run_path", lambda row, seed: folders[row])
    monkeypatch.setattr(curves, "PROBE_CURVES_OUT", tmp_path / "curves")
    record = curves.probe_curve("qwen_probe_500", 0, compare_to="qwen_frozen_emb_500")
    saved = json.loads((tmp_path / "curves" / "qwen_probe_500_s0.json").read_text())
    summary = json.loads((probed / "summary.json").read_text())
    assert saved["probe"] == record["probe"] and [p["step"] for p in saved["probe"]] == [0, 1, 2]
    assert [p["accuracy"] for p in saved["probe"]] == [p["accuracy"] for p in summary["probe"]]
    assert [p["curriculum_max_depth"] for p in saved["probe"]] == [None] * 3  # no curriculum in this run
    assert saved["probe_flags"]["--probe_phrasing"] == "held_out"  # the row's own flags
    assert saved["compare_to"] == {"row": "qwen_frozen_emb_500", "max_abs_weight_diff": 0.0}
    assert saved["command"].endswith("--probe_curve qwen_probe_500 --seed 0 --compare_to qwen_frozen_emb_500")
    summary["curve"] = [{"step": 1, "curriculum_max_depth": 2.0}, {"step": 2, "curriculum_max_depth": 3.0}]
    (probed / "summary.json").write_text(json.dumps(summary))  # a mastery curriculum's log: d_max at each probe
    assert [p["curriculum_max_depth"] for p in curves.probe_curve("qwen_probe_500", 0)["probe"]] == [None, 2, 3]
    with pytest.raises(SystemExit, match="logged no probe"):
        curves.probe_curve("qwen_frozen_emb_500", 0)


def test_sentences_reads_each_wording_alone_and_names_what_it_was_read_as(tiny_run, tmp_path, monkeypatch):
    """--sentences: every wording of every operation, one-operation prompts from every start state; the accuracy is
    the share of start states answered as the operation's transition, and `read_as` names the operations whose
    transitions the answers match (checked here against the answers recomputed through the evaluator's own path)."""
    import numpy as np

    from state_tracking import load_task

    record = tmp_path / "record.json"
    record.write_text(json.dumps({"row": "x"}))
    monkeypatch.setattr(diagnostics, "run_path", lambda row, seed: tiny_run)
    monkeypatch.setattr(diagnostics, "record_path", lambda row, seed: record)
    out = diagnostics.diagnose_sentences("retrofit_frozen_emb", 0)["sentences"]
    task = load_task("examples/tasks/batch_process_phrasings.json")
    spec = json.loads(open("examples/tasks/batch_process_phrasings.json").read())
    assert len(out) == sum(len(v) for v in spec["text"]["operations"].values())
    assert [s["wording"] for s in out if s["held_out"]] == [v[-1] for v in spec["text"]["operations"].values()]
    names = task.candidate_names
    for s in out:
        o = task.op_names.index(s["operation"])
        answers = [names.index(a) for a in s["answers"]]
        truth = [int(task.transitions[o][state]) for state in range(len(names))]
        assert s["accuracy"] == np.mean([a == t for a, t in zip(answers, truth)])
        assert s["read_as"] == diagnostics.read_as(answers, task.transitions, task.op_names)
    assert json.loads(record.read_text())["sentences"] == out


def test_random_start_tests_both_phrasings_from_random_start_states(tiny_run, tmp_path, monkeypatch):
    import state_tracking

    record = tmp_path / "record.json"
    record.write_text(json.dumps({"row": "x"}))
    monkeypatch.setattr(diagnostics, "run_path", lambda row, seed: tiny_run)
    monkeypatch.setattr(diagnostics, "record_path", lambda row, seed: record)
    monkeypatch.setattr(diagnostics, "DEPTHS", [2, 3])
    calls = []
    real = state_tracking.evaluate_until_failed

    def spy(*args, **kwargs):
        calls.append((kwargs["phrasing"], kwargs["random_initial"], kwargs["n_per_depth"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(state_tracking, "evaluate_until_failed", spy)
    out = diagnostics.random_start("retrofit_frozen_emb", 0, n=5)
    assert calls == [("seen", True, 5), ("held_out", True, 5)]
    saved = json.loads(record.read_text())
    assert saved["random_start"] == out and out["depths"] == [2, 3]
    assert all(len(out[p]["accuracy"]) == 2 and all(0 <= a <= 1 for a in out[p]["accuracy"]) for p in rows.PHRASINGS)
    assert saved["random_start_command"].endswith("--random_start retrofit_frozen_emb --seed 0")


def test_trainable_count_reads_the_prelude_and_the_head_tying_from_the_checkpoint(tmp_path):
    """The prelude's depth comes from config.json (a two-stage row's flags do not give it) and an untied LM head
    trains with the embeddings frozen (the Qwen2.5-shaped parent's GGUF is untied)."""
    import torch
    from safetensors.torch import save_file

    weights = {"model.embed_tokens.weight": torch.zeros(10, 2), "lm_head.weight": torch.zeros(10, 2),
               **{f"model.layers.{i}.mlp.weight": torch.zeros(3) for i in range(4)}, "adapter.weight": torch.zeros(5)}
    save_file(weights, str(tmp_path / "model.safetensors"))
    for tied, expected_emb, expected_prelude in ((False, 20 + 12 + 5, 20 + 6 + 5), (True, 12 + 5, 6 + 5)):
        (tmp_path / "config.json").write_text(json.dumps({"prelude_layers": 2, "tie_word_embeddings": tied}))
        assert evaluation.trainable_count(tmp_path, "pilot_qwen_frozen_emb") == expected_emb
        assert evaluation.trainable_count(tmp_path, "qwen_stage2_frozen_prelude") == expected_prelude


def test_the_chosen_recipe_exports_with_its_measured_accuracy_and_answers_from_its_folder(tiny_run, tmp_path,
                                                                                            monkeypatch):
    """--export of a two-stage row: the card and the config quote the record's own test (its prompt count, both
    stages' steps); the folder alone answers raw strings through the pipeline (fresh process, package blocked),
    refusing held-out wordings by default."""
    record = recipe_record(0, [1.0, 0.5], [0.96, 0.5], n=256)
    record.update(steps=2, samples_seen=8, curve=None, stage1={"steps": 3, "train_seconds": 1.0})
    monkeypatch.setattr(training, "OUT", tmp_path / "out")
    monkeypatch.setattr(export, "run_path", lambda row, seed: tiny_run)
    save_record(record, training.record_path(rows.CHOSEN, 0))
    # the record has no d = 2: nothing is quoted that was not measured, and nothing is written
    with pytest.raises(SystemExit, match="no held-out accuracy at d = 2"):
        export.export(rows.CHOSEN, 0, target=tmp_path / "ckpt", depth=2, n=4)
    assert not (tmp_path / "ckpt").exists()
    for phrasing in ("seen", "held_out"):
        record["evaluation"][phrasing]["depths"] = [2, 64]
    save_record(record, training.record_path(rows.CHOSEN, 0))
    target = export.export(rows.CHOSEN, 0, target=tmp_path / "ckpt", depth=2, n=4)
    config = json.loads((target / "config.json").read_text())
    quoted = config["prompt_format"]["trained"]["untrained_accuracy"]
    assert quoted == {"accuracy": 0.96, "depth": 2, "n": 256,
                      "source": f"results/pretrained_cpu/runs/{rows.CHOSEN}_s0.json"}
    card = (target / "README.md").read_text()
    assert "256 fresh prompts per depth" in card and "3 + 2 steps (two stages)" in card
    check = json.loads(training.record_path(rows.CHOSEN, 0).read_text())["pipeline_check"]
    for phrasing in ("seen", "held_out"):
        assert check["by_phrasing"][phrasing]["n"] == 4
    assert check["by_phrasing"]["held_out"]["refused_by_default"] is True


