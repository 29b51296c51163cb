"""Raw text in, state out: the checkpoint's segmentation rule (modeling_par/prompt_format.py) and the
`state-tracking` pipeline (modeling_par/pipeline_par.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import pipeline

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking, PromptFormat, PromptFormatError
from modeling_par.token_boundaries import token_boundaries
from state_tracking import build_tokenizer, encode_batch, get_task, load_task, model_token_ids, prompt_format_of
from state_tracking.prompts import text_prompt
from tests.conftest import fresh_process_job, fresh_process_result

REPO = Path(__file__).resolve().parents[1]
MACHINE = load_task(REPO / "examples" / "tasks" / "batch_process.json")
SWAP = get_task("swap_s5")


def machine_prompt(ops: list[str]) -> str:
    text = MACHINE.text
    return " ".join([text["initial"].format(state="idle"), *(text["operations"][o] for o in ops), text["query"] + " ?"])


@pytest.mark.parametrize("task", [SWAP, get_task("s5"), MACHINE], ids=lambda t: t.name)
@pytest.mark.parametrize("rendering", ["text", "symbolic"])
def test_format_segments_every_rendered_prompt_back_into_its_operations(task, rendering):
    fmt = prompt_format_of(task, rendering)
    assert PromptFormat.from_dict(json.loads(json.dumps(fmt.to_dict()))) == fmt
    tokenizer = build_tokenizer(task, rendering)
    ops = np.random.default_rng(0).integers(0, task.num_ops, (4, 7))
    encoded = encode_batch(task, tokenizer, rendering, ops)
    for i in range(len(ops)):
        if rendering == "text":
            prompt = text_prompt(task, ops[i])[0]
        else:
            prompt = " ".join([task.op_names[o] for o in ops[i]] + [f"<q{j + 1}>" for j in range(task.num_queries)])
        segments = fmt.segment(prompt)
        assert list(segments.operations) == [task.op_names[o] for o in ops[i]]
        encoding = tokenizer([prompt])
        assert encoding["input_ids"][0] == encoded["input_ids"][i]
        ends, queries = token_boundaries(encoding, 0, prompt, segments)
        assert ends == encoded["operation_ends"][i] and queries == encoded["query_positions"][i]


@pytest.mark.parametrize("prompt, message", [
    ("", "the prompt is empty"),
    ("   \n ", "the prompt is empty"),
    (machine_prompt(["start", "level_ok"])[:-2], r"query is cut off or wrong: question 1 of 1 should be 'The reactor "
                                                 r"is now \?'"),
    (machine_prompt(["start"]).replace(" The reactor is now ?", ""), "query is cut off"),
    (machine_prompt(["start", "level_ok"]).replace("presses start", "presses stop"),
     r"operation 1 'The operator presses stop.' .* is not an operation sentence of task 'batch_process' .*nearest "
     r"known: 'The operator presses start.'"),
    (machine_prompt(["start", "level_ok"]).replace("start. ", "start. . "), r"operation 2 '\.' .* is empty"),
    ("The batch reactor is idle.", "has 1 unit"),
    (machine_prompt(["start"]).replace("is idle", "is asleep"), "start sentence 1 'The batch reactor is asleep.'"),
])
def test_a_prompt_the_task_cannot_produce_gets_one_clear_error(prompt, message):
    with pytest.raises(PromptFormatError, match=message):
        prompt_format_of(MACHINE, "text").segment(prompt)


def test_symbolic_format_errors():
    fmt = prompt_format_of(SWAP, "symbolic")
    queries = " ".join(f"<q{j + 1}>" for j in range(5))
    assert fmt.segment("swap_1_2 identity " + queries).operations == ("swap_1_2", "identity")
    start = fmt.segment("banana apple cherry grape lemon swap_1_2 " + queries)  # a random start: Q candidates first
    assert start.operations == ("swap_1_2",) and start.preamble_end == len("banana apple cherry grape lemon")
    with pytest.raises(PromptFormatError, match="query is cut off .* ends with '<q1> <q2> <q3> <q4> <q5>'"):
        fmt.segment("swap_1_2 identity <q1> <q2>")
    with pytest.raises(PromptFormatError, match="operation 2 'swap_1_9' .* nearest known: 'swap_1_5'"):
        fmt.segment("swap_1_2 swap_1_9 " + queries)


def test_a_delimiter_rule_reads_one_operation_per_line():
    lines = ["The batch reactor is idle.", "The operator presses start.", "The level sensor reports full.",
             "The reactor is now ?"]
    fmt = prompt_format_of(MACHINE, "text").with_delimiter(r"\n")
    segments = fmt.segment("\n".join(lines) + "\n")
    assert segments.operations == ("start", "level_ok")
    log = "\n".join(lines)
    assert [log[:e] for e in segments.operation_ends] == ["\n".join(lines[:2]), "\n".join(lines[:3])]
    with pytest.raises(PromptFormatError,
                       match=r"empty unit between two delimiters at character \d+ .*delimiter '\\\\n'"):
        fmt.segment("\n".join(lines[:2] + ["  "] + lines[2:]))
    spoken = fmt.with_delimiter(r";").segment("The batch reactor is idle; The operator presses start ;An alarm trips;"
                                              "The reactor is now ?")  # under a delimiter the closing '.' is optional
    assert spoken.operations == ("start", "alarm")


@pytest.mark.parametrize("change, message", [
    (lambda d: d["operations"].update(start=["The operator presses start"]),
     r"operations\['start'\] must be one sentence"),
    (lambda d: d["operations"].update(start=["The tank reports empty."]), "sentences no other operation uses"),
    (lambda d: d.update(delimiter="("),
     "delimiter must be None or a regex that can split units apart \\(this one is not a valid regular"),
    (lambda d: d.update(delimiter="x*"), "this one matches the empty string"),
    (lambda d: d.update(rendering="speech"), r"rendering must be one of \['text', 'symbolic'\]"),
    (lambda d: d.update(shape="round"), r"unknown key\(s\) \['shape'\]"),
])
def test_format_spec_errors_name_the_field(change, message):
    spec = prompt_format_of(MACHINE, "text").to_dict()
    change(spec)
    with pytest.raises(ValueError, match=message):
        PromptFormat.from_dict(spec)


def test_config_checks_its_prompt_format():
    from tests.conftest import tiny_par_config

    with pytest.raises(ValueError, match=r"ParLoopedQwenConfig.prompt_format must be a format with one candidate per "
                                         r"answer_token_ids entry \(5\); it lists 6"):
        tiny_par_config(prompt_format=prompt_format_of(MACHINE, "text").to_dict())
    with pytest.raises(ValueError, match="ParLoopedQwenConfig.prompt_format must be a valid PromptFormat"):
        tiny_par_config(prompt_format={"rendering": "text"})
    with pytest.raises(ValueError, match="ParLoopedQwenConfig.learned_halting must be False without halt_token_ids"):
        tiny_par_config(halt_token_ids=None, learned_halting=True)


# --------------------------------------------------------------------------------------------- the pipeline
def text_checkpoint(folder: Path, learned_halting: bool = False) -> tuple[ParLoopedQwenForStateTracking, object]:
    """A tiny random local-view model of the batch-process machine, saved with its tokenizer."""
    tokenizer = build_tokenizer(MACHINE, "text")
    ids = model_token_ids(tokenizer, MACHINE)
    config = ParLoopedQwenConfig(
        vocab_size=ids["vocab_size"], pad_token_id=ids["pad_token_id"], hidden_size=32, intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=2, prelude_layers=1, core_layers=1, coda_layers=1,
        answer_token_ids=ids["answer_token_ids"], halt_token_ids=ids["halt_token_ids"], loop_view="local",
        progress_positions=True, bidirectional_queries=True, max_position_embeddings=4096, halt_window=2,
        halt_confirm=1, prompt_format=prompt_format_of(MACHINE, "text").to_dict(), learned_halting=learned_halting)
    torch.manual_seed(0)
    model = ParLoopedQwenForStateTracking(config).eval()
    with torch.no_grad():
        model.adapter.weight.add_(0.3 * torch.randn_like(model.adapter.weight))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def machine_prompts(n: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    ops = [rng.integers(0, MACHINE.num_ops, int(d)) for d in rng.integers(1, 9, n)]
    return [text_prompt(MACHINE, o)[0] for o in ops], ops


def reference(model, tokenizer, ops, **predict):
    enc = encode_batch(MACHINE, tokenizer, "text", ops[None])
    out = model.predict(torch.tensor(enc["input_ids"]), query_positions=torch.tensor(enc["query_positions"]),
                        operation_ends=torch.tensor(enc["operation_ends"]), **predict)
    return MACHINE.candidate_names[int(out.answers[0, 0])], int(out.iterations[0])


def test_pipeline_answers_as_the_model_does_batched_and_padded_either_side(tmp_path):
    model, tokenizer = text_checkpoint(tmp_path)
    tracker = pipeline("state-tracking", model=str(tmp_path), trust_remote_code=True)
    prompts, ops = machine_prompts(7)
    single = [tracker(p) for p in prompts]
    want = [reference(model, tokenizer, o, num_iterations=len(o)) for o in ops]
    assert [(r["answers"]["state"], r["iterations"]) for r in single] == want
    assert all(r["mode"] == "forced depth" and r["halted"] and r["depth"] == len(o) for r, o in zip(single, ops))
    assert len({r["answers"]["state"] for r in single}) > 1  # the random model's answers vary: equality means something
    assert tracker(prompts, batch_size=3) == single
    tracker.tokenizer.padding_side = "left"
    assert tracker(prompts, batch_size=4) == single


def test_pipeline_trajectory_is_the_progress_readouts(tmp_path):
    model, tokenizer = text_checkpoint(tmp_path)
    tracker = pipeline("state-tracking", model=str(tmp_path), trust_remote_code=True)
    prompts, ops = machine_prompts(3, seed=1)
    results = tracker(prompts, batch_size=2, return_trajectory=True)
    for result, o in zip(results, ops):
        enc = encode_batch(MACHINE, tokenizer, "text", o[None])
        with torch.no_grad():
            logits = model(torch.tensor(enc["input_ids"]), query_positions=torch.tensor(enc["query_positions"]),
                           operation_ends=torch.tensor(enc["operation_ends"]), num_iterations=len(o),
                           readout_iterations=list(range(1, len(o) + 1))).answer_logits
        want = [MACHINE.candidate_names[int(c)] for c in logits.argmax(-1)[:, 0, 0]]
        assert [step["after_operations"] for step in result["trajectory"]] == list(range(1, len(o) + 1))
        assert [step["answers"]["state"] for step in result["trajectory"]] == want
        assert result["trajectory"][-1]["answers"] == result["answers"]


def test_pipeline_halts_when_the_checkpoint_learned_to(tmp_path):
    model, tokenizer = text_checkpoint(tmp_path, learned_halting=True)
    tracker = pipeline("state-tracking", model=str(tmp_path), trust_remote_code=True)
    prompts, ops = machine_prompts(4, seed=2)
    results = tracker(prompts, max_iterations=12)
    assert all(r["mode"] == "learned halting" for r in results)
    halted = [reference(model, tokenizer, o, halting=True, max_iterations=12) for o in ops]
    assert [(r["answers"]["state"], r["iterations"]) for r in results] == halted
    forced = tracker(prompts, halting=False)
    assert [r["iterations"] for r in forced] == [len(o) for o in ops] and forced[0]["mode"] == "forced depth"
    with pytest.raises(ValueError, match="unknown argument"):
        tracker(prompts[0], temperature=0.5)


def test_pipeline_refuses_a_malformed_prompt_and_a_checkpoint_without_format(tmp_path):
    text_checkpoint(tmp_path)
    tracker = pipeline("state-tracking", model=str(tmp_path), trust_remote_code=True)
    for bad, message in [("", "empty"), (machine_prompt(["start"])[:-1], "query is cut off"),
                         (machine_prompt(["start", "alarm"]).replace("An alarm trips.", "A bell rings."),
                          "operation 2 'A bell rings.'")]:
        with pytest.raises(ValueError, match=message) as error:  # the folder's own PromptFormatError (remote code)
            tracker(bad)
        assert type(error.value).__name__ == "PromptFormatError"
    config = json.loads((tmp_path / "config.json").read_text())
    config["prompt_format"] = None
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no prompt_format in its config"):
        pipeline("state-tracking", model=str(tmp_path), trust_remote_code=True)


PIPELINE_FROM_FOLDER = """
    from transformers import pipeline
    tracker = pipeline("state-tracking", model=sys.argv[1], trust_remote_code=True)
    assert type(tracker).__module__.startswith("transformers_modules"), type(tracker).__module__
    prompts = json.loads(sys.argv[3])
    results = tracker(prompts, batch_size=2, return_trajectory=True)
    try:
        tracker(prompts[0].replace(" ?", ""))
        error = None
    except ValueError as e:
        error = type(e).__name__ + ": " + str(e)
    print(json.dumps({"results": results, "error": error}))
"""


@fresh_process_job("text_checkpoint_pipeline")
def saved_text_checkpoint(folder):
    """`text_checkpoint` in `folder`/text-ckpt and three prompts for the pipeline in `fresh_process` (blocked)."""
    text_checkpoint(folder / "text-ckpt")
    prompts, _ = machine_prompts(3, seed=3)
    return dict(script=PIPELINE_FROM_FOLDER, folder=folder / "text-ckpt", args=[json.dumps(prompts)], prompts=prompts)


def test_pipeline_loads_from_the_checkpoint_folder_alone(fresh_process):
    job = fresh_process_result(fresh_process, "text_checkpoint_pipeline")
    folder, prompts, out = job["folder"], job["prompts"], job["output"]
    assert {"pipeline_par.py", "prompt_format.py"} <= {p.name for p in folder.glob("*.py")}
    here = pipeline("state-tracking", model=str(folder), trust_remote_code=True)(prompts, return_trajectory=True)
    assert out["results"] == here
    assert out["error"].startswith("PromptFormatError: the query is cut off")


@pytest.mark.parametrize("task", [SWAP, MACHINE], ids=lambda t: t.name)
@pytest.mark.parametrize("rendering", ["text", "symbolic"])
def test_the_cards_example_prompt_is_one_the_format_reads(task, rendering):
    fmt = prompt_format_of(task, rendering)
    names = [task.op_names[-1], task.op_names[0], task.op_names[-1]]
    assert fmt.segment(fmt.example(names)).operations == tuple(names)
    assert fmt.segment(fmt.example()).depth == 2
    with pytest.raises(ValueError, match="unknown operation"):
        fmt.example(["fly"])


# --------------------------------------------------------------------------------------------- what training used
PHRASINGS = load_task(REPO / "examples" / "tasks" / "batch_process_phrasings.json")


def test_trained_phrasings_are_the_sentences_of_the_built_dataset(monkeypatch):
    """The record replays build_dataset exactly: the units of every prompt the dataset was rendered from (captured
    as it builds) are the record, slot by slot — no more (held-out phrasings, unused start states), no fewer."""
    import state_tracking.tokenization as tokenization
    from state_tracking.data import build_dataset, trained_phrasings

    rendered = []

    def capture(*args, **kwargs):
        rendered.append(text_prompt(*args, **kwargs)[0])
        return rendered[-1], None

    monkeypatch.setattr(tokenization, "text_prompt", capture)
    build_dataset(PHRASINGS, build_tokenizer(PHRASINGS, "text"), "text", n=40, depths=(1, 3), seed=3)
    fmt = prompt_format_of(PHRASINGS, "text")
    ops, starts, queries = set(), set(), set()
    for prompt in rendered:
        units = [prompt[a:b] for a, b in fmt.units(prompt)]
        starts.add(units[0])
        queries.add(units[-1][:-2])
        ops.update(zip(fmt.segment(prompt).operations, units[1:-1]))
    trained = trained_phrasings(PHRASINGS, "text", n=40, depths=(1, 3), seed=3)
    assert {(name, u) for name, units in trained["operations"].items() for u in units} == ops
    assert set(trained["preamble"][0]) == starts == {"The batch reactor is idle.", "At the start the reactor is idle."}
    assert set(trained["queries"][0]) == queries
    held_out = {options[-1] for options in PHRASINGS.op_phrasings}
    assert not held_out & {u for units in trained["operations"].values() for u in units}
    assert "n=40, depths=(1, 3), seed=3" in trained["source"]
    symbolic = trained_phrasings(SWAP, "symbolic", n=200, depths=(1, 4), seed=0, random_initial=True)
    assert list(symbolic["operations"]) == SWAP.op_names and symbolic["queries"] == []
    assert symbolic["preamble"] == [SWAP.candidate_names] * SWAP.num_queries
    assert trained_phrasings(SWAP, "symbolic", n=20, depths=2, seed=0)["preamble"] == []


def trained_format():
    from state_tracking.data import trained_phrasings

    return prompt_format_of(PHRASINGS, "text").with_trained(
        trained_phrasings(PHRASINGS, "text", n=400, depths=(1, 4), seed=0, random_initial=True))


def test_segment_lists_every_untrained_unit_with_its_nearest_trained_sentence():
    fmt = trained_format()
    assert PromptFormat.from_dict(json.loads(json.dumps(fmt.to_dict()))) == fmt
    seen = ("The batch reactor is filling. The tank is full. The batch is started by the operator. "
            "The reactor state is now ?")
    assert fmt.segment(seen).untrained == ()
    held = seen.replace("The batch reactor", "Initially the batch reactor").replace("The tank is full.",
                                                                                   "The level switch signals full.")
    segments = fmt.segment(held.replace("The reactor state is now", "At this point the reactor is"))
    assert segments.operations == ("level_ok", "start")
    assert segments.untrained == (
        {"unit": "start sentence 1", "sentence": "Initially the batch reactor is filling.",
         "nearest_trained": "The batch reactor is filling."},
        {"unit": "operation 1 (level_ok)", "sentence": "The level switch signals full.",
         "nearest_trained": "The level sensor reports full."},
        {"unit": "question 1", "sentence": "At this point the reactor is ?", "nearest_trained": "The reactor is now"})
    error = fmt.untrained_error(segments)
    assert isinstance(error, PromptFormatError)
    assert str(error).startswith("start sentence 1 'Initially the batch reactor is filling.' never occurs in this "
                                 "checkpoint's training data (nearest trained: 'The batch reactor is filling.'); 2 "
                                 "more untrained unit(s)")
    assert "allow_untrained=True" in str(error)
    assert fmt.with_delimiter(r"\n").segment(seen.replace(". ", "\n")).untrained == ()
    assert prompt_format_of(PHRASINGS, "text").segment(held).untrained is None  # no record: nothing known
    assert fmt.segment(fmt.example()).untrained == ()


def test_a_measured_untrained_accuracy_is_quoted_and_says_when_allow_untrained_is_the_way():
    fmt = trained_format()
    held = ("Initially the batch reactor is filling. The tank is full. The reactor state is now ?")
    spec = fmt.to_dict()
    for accuracy, advice in ((0.973, True), (0.41, False)):
        spec["trained"]["untrained_accuracy"] = {"accuracy": accuracy, "depth": 64, "n": 1024,
                                                 "source": "results/pretrained_cpu"}
        measured = PromptFormat.from_dict(json.loads(json.dumps(spec)))
        assert measured.to_dict()["trained"]["untrained_accuracy"]["accuracy"] == accuracy
        message = str(measured.untrained_error(measured.segment(held)))
        assert f"measured at {100 * accuracy:.1f}% on phrasings its training never used (1024 prompts of 64 " \
               "operations; results/pretrained_cpu)" in message
        assert ("allow_untrained=True is the way to use it on new wordings" in message) is advice
    for bad, field in (({"accuracy": 1.5, "depth": 64, "n": 1, "source": ""}, r"\['accuracy'\] must be a number"),
                       ({"accuracy": 0.5, "depth": 0, "n": 1, "source": ""}, r"\['depth'\] must be an integer"),
                       ({"accuracy": 0.5}, "untrained_accuracy must be None or a dict with keys")):
        spec["trained"]["untrained_accuracy"] = bad
        with pytest.raises(ValueError, match=field):
            PromptFormat.from_dict(spec)


def test_symbolic_untrained_start_and_operation():
    fmt = prompt_format_of(SWAP, "symbolic")
    queries = " ".join(f"<q{j + 1}>" for j in range(5))
    default_only = fmt.with_trained({"operations": {"swap_1_2": ["swap_1_2"], "identity": ["identity"]},
                                     "preamble": [], "queries": []})
    assert default_only.segment("swap_1_2 identity " + queries).untrained == ()
    segments = default_only.segment("banana apple cherry grape lemon swap_1_2 swap_2_3 " + queries)
    assert [u["unit"] for u in segments.untrained] == ["start", "operation 2"]
    assert segments.untrained[1]["nearest_trained"] == "swap_1_2"
    assert "training never wrote one (the default start only)" in str(default_only.untrained_error(segments))
    apple_first = fmt.with_trained({"operations": {"swap_1_2": ["swap_1_2"]},
                                    "preamble": [["apple"]] + [SWAP.candidate_names] * 4})
    assert [u["unit"] for u in apple_first.segment("banana apple cherry grape lemon swap_1_2 " + queries).untrained] \
        == ["start token 1"]


@pytest.mark.parametrize("change, message", [
    (lambda t: t["operations"].update(start=["The operator presses stop."]),
     r"trained.operations\['start'\] must be sentences of operation 'start' this format accepts there"),
    (lambda t: t["operations"].update(fly=["The operator presses start."]), "trained.operations must be keyed by"),
    (lambda t: t.update(preamble=[]), r"trained.preamble must be one list of start sentences per preamble unit \(1\)"),
    (lambda t: t["preamble"][0].append("The batch reactor is asleep."),
     r"trained.preamble\[0\] must be start sentences"),
    (lambda t: t.update(queries=[["The kettle is"]]), r"trained.queries\[0\] must be question words"),
    (lambda t: t.update(heard=True), r"prompt_format.trained must be a dict with keys"),
    (lambda t: t.update(source=3), "trained.source must be None or a string"),
])
def test_a_bad_trained_record_gets_one_error_naming_the_field(change, message):
    spec = trained_format().to_dict()
    change(spec["trained"])
    with pytest.raises(ValueError, match=message):
        PromptFormat.from_dict(spec)
    from tests.conftest import tiny_par_config  # the config checks it on load, with the same words

    with pytest.raises(ValueError, match="ParLoopedQwenConfig.prompt_format must be a valid PromptFormat"):
        tiny_par_config(prompt_format=spec, answer_token_ids=list(range(6)))


def test_pipeline_refuses_untrained_sentences_unless_asked(tmp_path):
    model, tokenizer = text_checkpoint(tmp_path)
    fmt = prompt_format_of(MACHINE, "text").with_trained({
        "operations": {"start": ["The operator presses start."], "level_ok": ["The level sensor reports full."]},
        "preamble": [["The batch reactor is idle."]], "queries": [["The reactor is now"]]})
    config = json.loads((tmp_path / "config.json").read_text())
    config["prompt_format"] = fmt.to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config))
    tracker = pipeline("state-tracking", model=str(tmp_path), trust_remote_code=True)
    trained = machine_prompt(["start", "level_ok"])
    assert tracker(trained) == pipeline("state-tracking", model=model, tokenizer=tokenizer)(trained)
    assert "untrained" not in tracker(trained)
    untrained = machine_prompt(["start", "alarm", "level_ok"])
    with pytest.raises(ValueError, match=r"operation 2 \(alarm\) 'An alarm trips.' never occurs in this checkpoint's "
                                         r"training data \(nearest trained: '.*'\)") as error:
        tracker(untrained)
    assert type(error.value).__name__ == "PromptFormatError"
    with pytest.raises(ValueError, match="never occurs"):
        tracker([trained, untrained], batch_size=2)
    both = tracker([trained, untrained], batch_size=2, allow_untrained=True)
    assert both[0]["untrained"] == [] and [u["sentence"] for u in both[1]["untrained"]] == ["An alarm trips."]
    alone = tracker(untrained, allow_untrained=True, return_trajectory=True)
    assert alone["untrained"] == both[1]["untrained"] and alone["answers"] == both[1]["answers"]
    assert alone["answers"]["state"] == reference(model, tokenizer, np.array([0, 6, 1]), num_iterations=3)[0]
    with pytest.raises(ValueError, match="allow_untrained must be a bool"):
        tracker(trained, allow_untrained="yes")
    old = pipeline("state-tracking", model=model, tokenizer=tokenizer)  # no record: answered, flagged as unknown
    assert "untrained" not in old(untrained) and old(untrained, allow_untrained=True)["untrained"] is None


def test_fine_tuning_adds_its_sentences_to_the_parents_record(tmp_path):
    from types import SimpleNamespace

    from tests.conftest import load_example

    train_par = load_example("examples/train_par.py")
    text_checkpoint(tmp_path)  # a parent that records nothing: the child records nothing either
    args = SimpleNamespace(rendering="text")
    problems = dict(n=30, depths=(1, 2), seed=1, random_initial=False)
    assert train_par.trained_prompt_format(MACHINE, args, problems, str(tmp_path)).trained is None
    config = json.loads((tmp_path / "config.json").read_text())
    parent = {"operations": {"start": ["The operator presses start."]}, "preamble": [["The batch reactor is filling."]],
              "queries": [["The reactor is now"]], "source": "parent"}
    config["prompt_format"] = prompt_format_of(MACHINE, "text").with_trained(parent).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config))
    child = train_par.trained_prompt_format(MACHINE, args, problems, str(tmp_path)).trained
    alone = train_par.trained_prompt_format(MACHINE, args, problems).trained
    assert set(child["operations"]) == set(alone["operations"]) and len(alone["operations"]) == MACHINE.num_ops
    assert child["preamble"] == (("The batch reactor is filling.", "The batch reactor is idle."),)
    assert child["source"].startswith("parent; state_tracking.data.trained_phrasings")
