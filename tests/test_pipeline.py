"""Raw text in, state out: the checkpoint's segmentation rule (modeling_par/prompt_format.py) and the
`state-tracking` pipeline (modeling_par/pipeline_par.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import pipeline

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking, PromptFormat, PromptFormatError
from modeling_par.prompt_format import token_boundaries
from state_tracking import build_tokenizer, encode_batch, get_task, load_task, model_token_ids, prompt_format_of
from state_tracking.prompts import text_prompt
from tests.test_modeling_par import run_blocked

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
    with pytest.raises(PromptFormatError, match=r"empty unit between two delimiters at character \d+ .*delimiter '\\\\n'"):
        fmt.segment("\n".join(lines[:2] + ["  "] + lines[2:]))
    spoken = fmt.with_delimiter(r";").segment("The batch reactor is idle; The operator presses start ;An alarm trips;"
                                              "The reactor is now ?")  # under a delimiter the closing '.' is optional
    assert spoken.operations == ("start", "alarm")


@pytest.mark.parametrize("change, message", [
    (lambda d: d["operations"].update(start=["The operator presses start"]), r"operations\['start'\] must be one sentence"),
    (lambda d: d["operations"].update(start=["The tank reports empty."]), "sentences no other operation uses"),
    (lambda d: d.update(delimiter="("), "delimiter must be a valid regex"),
    (lambda d: d.update(delimiter="x*"), "matches no empty string"),
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
    assert len({r["answers"]["state"] for r in single}) > 1  # the random model's answers vary, so equality means something
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


def test_pipeline_loads_from_the_checkpoint_folder_alone(tmp_path):
    text_checkpoint(tmp_path)
    assert {"pipeline_par.py", "prompt_format.py"} <= {p.name for p in tmp_path.glob("*.py")}
    prompts, _ = machine_prompts(3, seed=3)
    out = json.loads(run_blocked(PIPELINE_FROM_FOLDER, tmp_path, json.dumps(prompts)))
    here = pipeline("state-tracking", model=str(tmp_path), trust_remote_code=True)(prompts, return_trajectory=True)
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
