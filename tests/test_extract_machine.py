"""examples/extract_machine.py: the BFS over a model's states on a perfect stub model of known machines (exact
tables, agreement 1.0, the start cases, the cap), and end to end on a tiny trained records checkpoint."""

import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from modeling_par.record_format import RecordFormat
from state_tracking.records import build_record_tokenizer
from state_tracking.tasks import load_task
from tests.conftest import load_example

torch.set_num_threads(1)
extract_machine = load_example("examples/extract_machine.py")

# machines: (query names, ops, start, step(state, op) -> state); a state is a tuple of labels, one per query
CYCLE = {"go on": {"a": "No", "No": "b-2", "b-2": "a"}, "reset all": {"a": "a", "No": "a", "b-2": "a"},
         "hold!": {"a": "a", "No": "No", "b-2": "b-2"}}  # names to sanitize ("No" is a reserved word)
UNREACHED_START = {"p": {"s0": "x", "x": "y", "y": "x"}, "q": {"s0": "x", "x": "x", "y": "y"}}  # s0 never re-entered


def scalar(table, start):
    return ("state",), list(table), (start,), lambda s, op: (table[op][s[0]],)


def two_bits():
    flip = {"true": "false", "false": "true"}
    steps = {"flip x0": lambda s: (flip[s[0]], s[1]), "flip x1": lambda s: (s[0], flip[s[1]]),
             "swap": lambda s: (s[1], s[0])}
    return ("x0", "x1"), list(steps), ("true", "false"), lambda s, op: steps[op](s)


class PerfectModel:
    """Answers like a perfect model of `machine`: the state after R·c operations of the prompt (forced R)."""

    def __init__(self, machine, labels, initial_state=False):
        self.queries, self.ops, self.start, self.step = machine
        self.fmt = RecordFormat(query_names=self.queries, candidates=tuple(labels), operations=tuple(self.ops),
                                initial_state=initial_state, task_name="toy")
        self.tokenizer = build_record_tokenizer(self.fmt)
        self.config = SimpleNamespace(prompt_format=self.fmt.to_dict(), step_size=1,
                                      pad_token_id=self.tokenizer.pad_token_id)
        self.op_of = {tuple(self.fmt.operation_tokens(self.tokenizer, i)): i for i in range(len(self.ops))}
        self.label_of = {t: i for i, t in enumerate(self.fmt.special_ids(self.tokenizer)["candidates"])}

    def predict(self, input_ids, attention_mask=None, query_positions=None, operation_ends=None, num_iterations=None):
        answers = []
        for ids, ends, reads in zip(input_ids.tolist(), operation_ends.tolist(), num_iterations.tolist()):
            ends = [e for e in ends if e >= 0]
            state = self.start
            if self.fmt.initial_state:
                state = tuple(self.fmt.candidates[self.label_of[t]] for t in ids[1:1 + len(self.queries)])
            for a, b in list(zip(ends, ends[1:]))[:reads]:
                state = self.step(state, self.ops[self.op_of[tuple(ids[a + 1:b + 1])]])
            answers.append([self.fmt.candidates.index(label) for label in state])
        return SimpleNamespace(answers=torch.tensor(answers))


def reachable(machine, initial=None):
    """The states after ≥ 1 op (and the start when it is given) and their transitions, by BFS."""
    _, ops, start, step = machine
    seen, frontier, table = ({start} if initial else set()), [start], {}
    while frontier:
        nxt = []
        for s in frontier:
            for op in ops:
                t = step(s, op)
                table.setdefault(s, {})[op] = t
                if t not in seen:
                    seen.add(t)
                    nxt.append(t)
        frontier = nxt
    return seen, {s: row for s, row in table.items() if s in seen}


def original_table(out):
    """The extracted task's transitions, in the original op and state names."""
    task = load_task(out["task"])
    name = out["state_names"]
    return {name[s]: {out["operation_names"][op]: name[task.candidate_names[task.transitions[o, i]]]
                      for o, op in enumerate(task.op_names)} for i, s in enumerate(task.candidate_names)}


def original_name(queries, state):
    return state[0] if len(queries) == 1 else ",".join(f"{q}={v}" for q, v in zip(queries, state))


def check_exact(out, machine, given_initial=False):
    queries = machine[0]
    states, table = reachable(machine, given_initial)
    got = original_table(out)
    expected = {original_name(queries, s): {op: original_name(queries, t) for op, t in row.items()}
                for s, row in table.items()}
    assert {k: got[k] for k in expected} == expected
    assert {s["original"] for s in out["states"]} == set(expected)
    assert out["num_states"] == len(states) and not out["truncated"] and out["unexplored"] == []
    assert out["agreement"]["fraction"] == 1.0 and out["agreement"]["agree"] == out["agreement"]["n"]
    for s in out["states"]:  # a representative is a shortest sequence reaching its state
        state = machine[2]
        for op in s["representative"]:
            state = machine[3](state, op)
        assert original_name(queries, state) == s["original"]
    return got


def test_a_perfect_model_gives_its_machine_with_sanitized_names():
    model = PerfectModel(scalar(CYCLE, "a"), ["a", "No", "b-2"])
    out = extract_machine.extract(model, model.tokenizer, agreement_depth=20, agreement_n=64, batch_size=7)
    check_exact(out, scalar(CYCLE, "a"))
    assert out["operation_names"] == {"go_on": "go on", "reset_all": "reset all", "hold": "hold!"}
    assert out["state_names"] == {"a": "a", "No_": "No", "b_2": "b-2"}
    # the start (the machine's "a") is equivalent to the state "a" reached by an op: no added state
    assert out["start"] == {"state": "a", "kind": "equivalent",
                            "transitions": {"go on": "No_", "reset all": "a", "hold!": "a"}}
    assert out["task"]["initial_state"] == "a" and out["task"]["text"]["operations"]["go_on"] == "go on"
    assert [s["representative"] for s in out["states"]] == [["go on"], ["reset all"], ["go on", "go on"]]
    task = load_task(out["task"])  # the task reproduces the machine's answers from its start
    ops = np.random.default_rng(1).integers(0, 3, size=(16, 12))
    truth = [[CYCLE[model.ops[o]] for o in row] for row in ops]
    states = task.prefix_states(ops)
    for row, steps in zip(states, truth):
        s = "a"
        for k, step in enumerate(steps):
            s = step[s]
            assert out["state_names"][task.candidate_names[row[k + 1, 0]]] == s


def test_an_unreached_start_becomes_a_pseudo_state():
    machine = scalar(UNREACHED_START, "s0")
    model = PerfectModel(machine, ["s0", "x", "y"])
    out = extract_machine.extract(model, model.tokenizer, agreement_depth=9, agreement_n=32)
    got = check_exact(out, machine)
    assert out["start"]["kind"] == "pseudo" and out["task"]["initial_state"] == "start"
    assert got["__start__"] == {"p": "x", "q": "x"} and "s0" not in got  # the model never answers s0
    assert out["task"]["states"] == ["x", "y", "start"]


def test_initial_state_and_multi_query_states():
    machine = two_bits()
    model = PerfectModel(machine, ["false", "true"], initial_state=True)
    with pytest.raises(ValueError, match="--initial_state"):
        extract_machine.extract(model, model.tokenizer)
    out = extract_machine.extract(model, model.tokenizer, initial={"x0": "true", "x1": "false"}, agreement_depth=7,
                                  agreement_n=32)
    check_exact(out, machine, given_initial=True)
    assert out["queries"] == ["x0", "x1"] and out["num_states"] == 4
    assert out["start"]["kind"] == "initial_state" and out["task"]["initial_state"] == "x0_true_x1_false"
    assert out["states"][0] == {"name": "x0_true_x1_false", "original": "x0=true,x1=false",
                                "answers": {"x0": "true", "x1": "false"}, "representative": []}


def test_max_states_caps_the_search_with_an_unexplored_sink():
    counter = {"inc": {str(i): str((i + 1) % 6) for i in range(6)}, "stay": {str(i): str(i) for i in range(6)}}
    model = PerfectModel(scalar(counter, "0"), [str(i) for i in range(6)])
    out = extract_machine.extract(model, model.tokenizer, max_states=3, agreement_depth=12, agreement_n=64)
    assert out["truncated"] and out["num_states"] == 3 and out["max_states"] == 3
    assert [s["original"] for s in out["states"]] == ["1", "0", "2"]
    assert out["unexplored"] == [{"state": "2", "operation": "inc"}]
    task = load_task(out["task"])
    assert task.candidate_names[-1] == "unexplored" and out["state_names"]["unexplored"] == "<unexplored>"
    assert 0 < out["agreement"]["fraction"] < 1  # sequences of > 2 net increments leave the table


def test_plot_draws_small_machines_only(tmp_path, capsys):
    bits = PerfectModel(two_bits(), ["false", "true"], initial_state=True)
    out = extract_machine.extract(bits, bits.tokenizer, initial={"x0": "true", "x1": "false"}, agreement_n=4)
    assert extract_machine.plot_machine(out, tmp_path / "bits.png") and (tmp_path / "bits.png").stat().st_size > 1000
    counter = {"inc": {str(i): str((i + 1) % 13) for i in range(13)}}
    model = PerfectModel(scalar(counter, "0"), [str(i) for i in range(13)])
    out = extract_machine.extract(model, model.tokenizer, agreement_depth=30, agreement_n=8)
    assert out["num_states"] == 13 and out["agreement"]["fraction"] == 1.0
    assert not extract_machine.plot_machine(out, tmp_path / "big.png") and not (tmp_path / "big.png").exists()
    assert "--plot skipped: 13 states" in capsys.readouterr().out


def test_a_checkpoint_without_a_records_format_is_refused():
    for spec in (None, {"rendering": "symbolic", "task": "swap_s5"}):
        with pytest.raises(ValueError, match=r"config\.prompt_format must be a records format"):
            extract_machine.record_format_of(SimpleNamespace(prompt_format=spec))


def test_end_to_end_on_a_trained_checkpoint(tmp_path):
    """Train a tiny model on a 3-state machine's records until it has learned them (a few hundred steps), extract:
    the table is the machine's own, the extracted machine agrees with the model on sequences of the longest length
    trained (four table lookups composed, not one), and every representative leads to its state through the true
    table."""
    train_par = load_example("examples/train_par.py")
    table = {"go": {"a": "b", "b": "c", "c": "a"}, "reset": dict.fromkeys("abc", "a"), "hold": {s: s for s in "abc"}}
    rng = np.random.default_rng(0)
    with open(tmp_path / "train.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["ops", "states"])
        for _ in range(512):
            ops = [list(table)[o] for o in rng.integers(0, 3, int(rng.integers(1, 5)))]
            states = ["a"]
            for op in ops:
                states.append(table[op][states[-1]])
            writer.writerow([" ".join(ops), " ".join(states[1:])])
    run = tmp_path / "run"
    train_par.main(["--train_file", str(tmp_path / "train.csv"), "--operations_column", "ops",
                    "--step_states_column", "states", "--max_steps", "300", "--output_dir", str(run),
                    "--hidden_size", "32", "--intermediate_size", "64", "--num_attention_heads", "2",
                    "--num_key_value_heads", "2", "--per_device_train_batch_size", "16", "--max_iterations", "32",
                    "--disable_tqdm", "true", "--use_cpu", "true", "--logging_steps", "100", "--eval_n", "8",
                    "--learning_rate", "3e-3", "--compile_core", "false", "--seed", "0",
                    "--validation_split_percentage", "0"])
    out = extract_machine.main(["--model", str(run), "--out", str(tmp_path / "m.json"), "--plot",
                                str(tmp_path / "m.png"), "--agreement_depth", "4", "--agreement_n", "64",
                                "--device", "cpu"])
    by_state = {state: {op: table[op][state] for op in table} for state in "abc"}
    assert out["num_states"] == 3 and original_table(out) == by_state, out["states"]
    assert out["agreement"]["depth"] == 4 and out["agreement"]["fraction"] >= 0.95, out["agreement"]
    assert json.loads((tmp_path / "m.json").read_text()) == out and (tmp_path / "m.png").is_file()
    task = load_task(out["task"])
    assert out["command"].startswith("python examples/extract_machine.py --model") and out["date"]
    names = {v: k for k, v in out["operation_names"].items()}
    for s in out["states"]:  # the table from the start follows each representative to its state
        ops = np.array([[task.op_names.index(names[op]) for op in s["representative"]]])
        assert task.candidate_names[task.prefix_states(ops)[0, -1, 0]] == s["name"]
