"""The records package's contracts: pure maps (datasets' cache and num_proc give the same records), column roles
resolved once, the validation split made from the training file, and one delimiter rule everywhere."""

import csv
import json

import datasets
import numpy as np
import pytest

from modeling_par.record_format import RecordFormat
from state_tracking.records import (
    Normalizer,
    ReadOptions,
    RecordColumns,
    RecordError,
    load_record_files,
    read_record_splits,
)
from tests.counter_records import write_csv


def register_rows(n, seed, lo=1, hi=12):
    """A 3-bit register no code of this package wrote: set / clear / flip a bit; the state is the bits."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        bits, ops, states = [0, 0, 0], [], []
        for _ in range(int(rng.integers(lo, hi + 1))):
            verb, bit = ["set", "clear", "flip"][int(rng.integers(3))], int(rng.integers(3))
            bits[bit] = 1 if verb == "set" else 0 if verb == "clear" else 1 - bits[bit]
            ops.append(f"{verb} {bit}")
            states.append("b" + "".join(map(str, bits)))
        rows.append((ops, states))
    return rows


def write(path, rows):
    return write_csv(path, rows, ("events", "observed"), ";")


COLUMNS = RecordColumns(operations="events", step_states="observed", delimiter=";")


def table_of(dataset):
    return {k: dataset[k] for k in dataset.column_names}


def test_a_second_read_comes_from_datasets_cache_and_overwrite_cache_reads_again(tmp_path, monkeypatch):
    path = write(tmp_path / "log.csv", register_rows(300, 0))
    datasets.enable_caching()
    options = ReadOptions(cache_dir=str(tmp_path / "cache"))
    first = load_record_files(path, COLUMNS, options=options)

    def never(self, *args):
        raise AssertionError("the map ran again although its cache holds the result")

    monkeypatch.setattr(Normalizer, "__call__", never)
    again = load_record_files(path, COLUMNS, options=options)
    assert table_of(again.dataset) == table_of(first.dataset)
    assert again.dataset.cache_files and again.dataset.cache_files[0]["filename"].startswith(str(tmp_path / "cache"))
    with pytest.raises(AssertionError, match="the map ran again"):
        load_record_files(path, COLUMNS, options=ReadOptions(cache_dir=str(tmp_path / "cache"), overwrite_cache=True))


def test_preprocessing_workers_give_the_same_records_and_the_same_skips(tmp_path):
    rows = register_rows(4100, 1)
    rows[5] = (["set 0", "flip 9"], ["b100", "b100"])  # an operation only this record has (kept: it is training data)
    rows[4003] = (["set 0", "set 1"], ["b100"])  # 1 step state for 2 operations: skipped
    path = write(tmp_path / "log.csv", rows)
    one = read_record_splits(COLUMNS, path, skip_bad_records=True, validation_split_percentage=0)
    two = read_record_splits(COLUMNS, path, skip_bad_records=True, validation_split_percentage=0,
                             options=ReadOptions(num_proc=2))
    assert len(one.encoded) == 4099 and table_of(two.encoded) == table_of(one.encoded)
    assert one.skipped == two.skipped and len(one.skipped["train"]) == 1 and "record 4003 (0-based)" in \
        one.skipped["train"][0]


def test_a_validation_split_is_cut_from_the_training_file_when_none_is_given(tmp_path):
    path = write(tmp_path / "log.csv", register_rows(400, 2))
    records = read_record_splits(COLUMNS, path, validation_split_percentage=10, seed=3)
    train, (validation, encoded) = records.train, records.splits["validation"]
    assert len(train.dataset) == 360 and len(validation.dataset) == 40 == len(encoded)
    assert not set(train.dataset["record"]) & set(validation.dataset["record"])  # never trained on
    assert set(train.dataset["record"]) | set(validation.dataset["record"]) == set(range(400))
    assert "40 records (10%) of the training file" in records.notes[0]
    # the same seed cuts the same split; --max_train_samples counts training records after the cut (as
    # transformers' scripts); --max_eval_samples the validation records
    again = read_record_splits(COLUMNS, path, validation_split_percentage=10, seed=3, max_train_samples=100,
                               max_eval_samples=7)
    assert sorted(again.splits["validation"][0].dataset["record"]) == sorted(validation.dataset["record"][:7])
    assert len(again.encoded) == 100 and len(again.splits["validation"][1]) == 7
    given = read_record_splits(COLUMNS, path, validation_file=path, validation_split_percentage=10)
    assert len(given.encoded) == 400 and not given.notes  # a validation file given: nothing is cut
    for bad in (100, -1, "5"):
        with pytest.raises(RecordError, match="--validation_split_percentage must be a number in \\[0, 100\\)"):
            read_record_splits(COLUMNS, path, validation_split_percentage=bad)
    with pytest.raises(RecordError, match="--max_eval_samples must be an integer >= 1"):
        read_record_splits(COLUMNS, path, max_eval_samples=0)


def test_a_validation_split_too_small_to_mean_anything_cannot_stop_training(tmp_path):
    """5% of a 40-record file is 2 records: the split keeps the size asked for (probed and evaluated), and
    `stop_rule_off` says, in the notes a run logs, that --stop_when_validation_exact will not stop on it and why; from
    `MIN_VALIDATION_RECORDS` (32) records on the stop rule stands. A small --validation_file is named the same way."""
    from state_tracking.records import MIN_VALIDATION_RECORDS

    assert MIN_VALIDATION_RECORDS == 32
    path = write(tmp_path / "log.csv", register_rows(40, 2))
    small = read_record_splits(COLUMNS, path, validation_split_percentage=5)
    assert len(small.splits["validation"][1]) == 2 and len(small.encoded) == 38
    assert small.stop_rule_off.startswith("the validation split (--validation_split_percentage 5 of 40 training "
                                          "records) holds 2 records, fewer than 32: too few for "
                                          "--stop_when_validation_exact")
    assert small.stop_rule_off in small.notes
    enough = read_record_splits(COLUMNS, path, validation_split_percentage=80)  # 32 of 40
    assert len(enough.splits["validation"][1]) == 32 and enough.stop_rule_off is None
    assert not any("fewer than" in note for note in enough.notes)
    assert read_record_splits(COLUMNS, path, validation_split_percentage=0).stop_rule_off is None  # no split
    given = read_record_splits(COLUMNS, path, validation_file=write(tmp_path / "v.csv", register_rows(5, 3)))
    assert given.stop_rule_off.startswith("the validation split (--validation_file) holds 5 records")


def test_a_column_takes_one_role(tmp_path):
    """The word-problem layout `seed,input,target`: `target` named as the step states is also the final state (its
    last element); the conventional name `target` of a final-state column never selects it a second time."""
    rng = np.random.default_rng(0)
    with open(tmp_path / "words.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seed", "input", "target"])
        for seed in range(50):
            ops = rng.integers(0, 5, int(rng.integers(1, 8)))
            writer.writerow([seed, " ".join(map(str, ops)), " ".join(str(int(v)) for v in np.cumsum(ops) % 5)])
    columns = RecordColumns(operations="input", step_states="target")
    loaded = load_record_files(str(tmp_path / "words.csv"), columns)
    assert loaded.columns.state is None and loaded.columns.step_states == "target"
    assert len(loaded.dataset) == 50
    with pytest.raises(RecordError, match="--state_column and --step_states_column both name the column 'target'"):
        load_record_files(str(tmp_path / "words.csv"), RecordColumns(operations="input", state="target",
                                                                       step_states="target"))


@pytest.mark.parametrize("delimiter, message", [
    ("(;|,)", "has a capturing group"), ("x*", "matches the empty string"), ("(", "is not a valid regular expression")])
def test_one_delimiter_rule_for_the_reader_and_the_checkpoint_format(delimiter, message):
    with pytest.raises(RecordError, match=message):
        RecordColumns(operations="ops", state="s", delimiter=delimiter)
    with pytest.raises(ValueError, match=f"prompt_format.delimiter must be None.*{message}"):
        RecordFormat(query_names=("state",), candidates=("a",), operations=("x",), delimiter=delimiter)
    spec = {"rendering": "records", "query_names": ["state"], "candidates": ["a"], "operations": ["x"],
            "delimiter": delimiter}
    with pytest.raises(ValueError, match=message):  # a checkpoint's config is read by the same rule
        RecordFormat.from_dict(json.loads(json.dumps(spec)))


def test_a_records_run_stops_once_its_validation_split_is_exact(tmp_path):
    """The last operation sets the state (a machine learned in a few dozen steps): probes of the held-out validation
    split (10%, 40 records) every 10 steps; two exact probes in a row stop training long before --max_steps."""
    from tests.conftest import load_example

    train_par = load_example("examples/train_par.py")
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(400):
        ops = [["go", "stop"][int(i)] for i in rng.integers(0, 2, int(rng.integers(1, 4)))]
        rows.append((ops, ["moving" if op == "go" else "still" for op in ops]))
    path = write(tmp_path / "log.csv", rows)
    tiny = ["--hidden_size", "32", "--intermediate_size", "64", "--num_attention_heads", "2",
            "--num_key_value_heads", "2", "--per_device_train_batch_size", "16", "--disable_tqdm", "true",
            "--use_cpu", "true", "--max_iterations", "8", "--compile_core", "false", "--learning_rate", "3e-3",
            "--train_file", path, "--operations_column", "events", "--step_states_column", "observed",
            "--operation_delimiter", ";", "--max_steps", "400", "--probe_every_steps", "10", "--logging_steps", "10",
            "--validation_split_percentage", "10"]  # 40 records: enough to stop on (MIN_VALIDATION_RECORDS)
    summary = train_par.main(tiny + ["--output_dir", str(tmp_path / "stop")])
    probes = [p["accuracy"] for p in summary["probe"]]
    assert summary["probe_stopped_at"] is not None and summary["steps"] == summary["probe_stopped_at"] < 400
    assert probes[-2:] == [1.0, 1.0] and min(probes) < 1.0  # it stopped because it learned, not from the start
    full = train_par.main(tiny + ["--output_dir", str(tmp_path / "full"), "--stop_when_validation_exact", "false",
                                  "--max_steps", "60"])
    assert full["steps"] == 60 and full["probe_stopped_at"] is None and len(full["probe"]) == 6


def test_the_word_problem_layout_trains_and_its_machine_is_extracted(tmp_path):
    """A CSV `seed,input,target` as word-problem generators write it: `input` space-separated S5 element ids,
    `target` the running product after each step (one of 120 labels). `--step_states_column target` trains (no
    second selection of `target` as the final state), and extract_machine.py reads a machine from the checkpoint."""
    import itertools

    from tests.conftest import load_example

    train_par = load_example("examples/train_par.py")
    extract_machine = load_example("examples/extract_machine.py")
    elements = list(itertools.permutations(range(5)))
    index = {p: i for i, p in enumerate(elements)}
    rng = np.random.default_rng(0)
    inputs, targets = [], []
    with open(tmp_path / "s5.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seed", "input", "target"])
        for seed in range(200):
            ids = [int(i) for i in rng.integers(0, 120, int(rng.integers(1, 5)))]
            state, states = tuple(range(5)), []
            for i in ids:
                state = tuple(state[j] for j in elements[i])
                states.append(index[state])
            writer.writerow([seed, " ".join(map(str, ids)), " ".join(map(str, states))])
            inputs += [str(i) for i in ids]
            targets += [str(s) for s in states]
    run = tmp_path / "run"
    summary = train_par.main([
        "--train_file", str(tmp_path / "s5.csv"), "--operations_column", "input", "--step_states_column", "target",
        "--max_steps", "4", "--output_dir", str(run), "--hidden_size", "32", "--intermediate_size", "64",
        "--num_attention_heads", "2", "--num_key_value_heads", "2", "--per_device_train_batch_size", "8",
        "--max_iterations", "8", "--disable_tqdm", "true", "--use_cpu", "true", "--compile_core", "false",
        "--validation_split_percentage", "0"])
    assert summary["records"]["training_mode"].startswith("progress-aligned targets")
    # the vocabulary is the file's ids as written: each element id an operation (first appearance order), each
    # running-product id a label (numeric order); `seed` is no role
    spec = json.loads((run / "config.json").read_text())["prompt_format"]
    assert spec["operations"] == list(dict.fromkeys(inputs)) and spec["candidates"] == sorted(set(targets), key=int)
    assert (summary["records"]["operations"], summary["records"]["labels"]) == (len(set(inputs)), len(set(targets)))
    assert dict(spec["columns"]) == {"operations": "input", "state": None, "step_states": "target",
                                     "initial_state": None}
    out = extract_machine.main(["--model", str(run), "--out", str(tmp_path / "m.json"), "--max_states", "4",
                                "--agreement_depth", "4", "--agreement_n", "8", "--device", "cpu"])
    assert json.loads((tmp_path / "m.json").read_text()) == out
    # the machine is read over the checkpoint's operations, and its states are answers from the file's labels, each
    # reached by its representative in the extracted table
    from state_tracking.tasks import load_task

    assert sorted(out["operation_names"].values()) == sorted(spec["operations"])
    assert out["num_states"] == len(out["states"]) >= 1 and {s["original"] for s in out["states"]} <= set(targets)
    table = out["task"]["operations"]
    ops = {original: safe for safe, original in out["operation_names"].items()}
    for state in out["states"]:
        at = out["start"]["transitions"][state["representative"][0]]  # keyed by the operation as written
        for op in state["representative"][1:]:
            at = table[ops[op]][at]
        assert at == state["name"]
    load_task(out["task"])


def test_assignment_then_swap_logs_read_as_boolean_mappings_from_json_lines_and_parquet(tmp_path):
    """The variable-tracking layout: `history` (assignments, then tuple swaps), `state` a mapping of booleans."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import load_example

    records = load_example("examples/studies/own_data.py").variable_swap_records(30, (2, 4), seed=0)
    with open(tmp_path / "vars.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "vars.parquet")
    columns = RecordColumns(operations="history", state="state")
    for name in ("vars.jsonl", "vars.parquet"):
        loaded = load_record_files(str(tmp_path / name), columns)
        assert loaded.query_names == ["x0", "x1", "x2", "x3", "x4"]
        assert loaded.dataset["operations"] == [r["history"] for r in records]
        assert [row[-1] for row in loaded.dataset["labels"]] == [
            [str(r["state"][q]).lower() for q in loaded.query_names] for r in records]


def test_operation_tokens_whole_reads_each_statement_as_one_token_and_the_checkpoint_keeps_it(tmp_path):
    """`--operation_tokens whole`: one token per distinct operation (a statement `x2, x4 = x4, x2` is one token, not
    seven words); the checkpoint's tokenizer keeps it, so the pipeline reads a record the same way, and a statement
    training never held is refused."""
    from transformers import pipeline

    from state_tracking.records import build_record_tokenizer, discover_format
    from tests.conftest import load_example

    records = load_example("examples/studies/own_data.py").variable_swap_records(60, (1, 3), seed=0)
    path = tmp_path / "vars.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    loaded = load_record_files(str(path), RecordColumns(operations="history", state="state"))
    fmt = discover_format(loaded)
    words, whole = build_record_tokenizer(fmt), build_record_tokenizer(fmt, "whole")
    swap = next(op for op in fmt.operations if "," in op)
    assert len(fmt.operation_tokens(words, fmt.operations.index(swap))) == 7
    ids = [fmt.operation_tokens(whole, i) for i in range(len(fmt.operations))]
    assert all(len(t) == 1 for t in ids) and len({t[0] for t in ids}) == len(fmt.operations)
    assert whole.convert_ids_to_tokens(fmt.operation_tokens(whole, fmt.operations.index(swap))) == [swap]
    with pytest.raises(RecordError, match=r"--operation_tokens must be one of \['words', 'whole'\]"):
        build_record_tokenizer(fmt, "chars")
    train_par = load_example("examples/train_par.py")
    run = tmp_path / "run"
    summary = train_par.main([
        "--train_file", str(path), "--operations_column", "history", "--state_column", "state",
        "--operation_tokens", "whole", "--max_steps", "3", "--output_dir", str(run), "--hidden_size", "32",
        "--intermediate_size", "64", "--num_attention_heads", "2", "--num_key_value_heads", "2",
        "--per_device_train_batch_size", "8", "--disable_tqdm", "true", "--use_cpu", "true", "--compile_core", "false"])
    assert "--operation_tokens whole" in summary["command"]
    assert summary["records"]["operations"] == len(fmt.operations)
    tracker = pipeline("state-tracking", model=str(run), trust_remote_code=True)
    record = records[0]["history"]
    assert set(tracker({"history": record})["answers"]) == {f"x{i}" for i in range(5)}
    with pytest.raises(ValueError, match="'x9 = True' never occurs in the training data"):  # the remote code's
        tracker({"history": record + ["x9 = True"]})  # PromptFormatError


def test_the_validation_probe_scores_the_longest_records():
    """`longest_records`: the n longest of a split, the earlier of equal lengths first, in file order — the records the
    probe (train_par.py and rnn.py's stop rule) scores; RecordsProbeCallback holds exactly those."""
    from datasets import Dataset

    from state_tracking.records import longest_records
    from trainers import RecordsProbeCallback

    depths = [3, 9, 1, 9, 4, 7, 9, 2]
    split = Dataset.from_dict({"depth": depths, "tag": list(range(len(depths))),
                               "input_ids": [[1] * (d + 2) for d in depths],
                               "query_positions": [[d + 1] for d in depths],
                               "operation_ends": [list(range(d + 1)) for d in depths],
                               "step_labels": [[[0]] * (d + 1) for d in depths]})
    assert longest_records(split, 4)["tag"] == [1, 3, 5, 6]  # the three 9s and the 7, in file order
    assert longest_records(split, 4).data.table.num_rows == 4  # a flat table: readers of .data see only these rows
    assert longest_records(split, 2)["tag"] == [1, 3]  # of equal lengths, the earlier
    assert longest_records(split, 100)["tag"] == list(range(len(depths)))
    probe = RecordsProbeCallback(split, pad_token_id=0, n=4)
    assert probe.n == 4 and [int(d) for d, _, _ in probe.groups] == [7, 9]


def test_own_data_time_table_divides_the_mean_time_of_seeds_at_the_goal_by_the_lstms(tmp_path):
    """own_data.py --collect's time-to-result table: per row, the seeds reaching 99% at 16× and their mean training
    seconds over the LSTM row's (a seed under the goal is listed but not timed; no ratio where the LSTM misses)."""
    from tests.conftest import load_example

    own = load_example("examples/studies/own_data.py")

    def run(machine, row, seed, seconds, acc_16x, train_n=own.TRAIN_N):
        lengths = own.MACHINES[machine].get("test_lengths", (16, 64, 256))  # var_swap5: 21, 69, 261 statements
        per_depth = [{"depth": d, "n": 8, "accuracy": 1.0} for d in lengths[:2]] + [
            {"depth": lengths[2], "n": 8, "accuracy": acc_16x}]
        record = dict(machine=machine, row=row, seed=seed, train_n=train_n, steps=100 * seed + 100,
                      train_seconds=seconds, per_depth=per_depth, date="2026-12-04T12:00:00+00:00")
        (tmp_path / f"{machine}_{row}_{seed}_{train_n}.json").write_text(json.dumps(record))

    run("register3", "lstm_final", 0, 50.0, 1.0)
    run("register3", "lstm_final", 1, 70.0, 1.0)
    run("register3", "par_final_fast", 0, 100.0, 0.995)
    run("register3", "par_final_fast", 1, 140.0, 1.0)
    run("register3", "par_final_fast", 2, 999.0, 0.97)  # under the goal: not in the mean
    run("register3", "par_final_fast", 0, 5.0, 1.0, train_n=1000)  # another training size: not in this table
    run("batch_process", "par_final_fast", 0, 80.0, 1.0)  # no LSTM row at the goal: no ratio
    run("batch_process", "lstm_final", 0, 10.0, 0.5)
    run("var_swap5", "par_final_fast", 0, 300.0, 1.0)  # the faster LSTM row is the baseline
    run("var_swap5", "lstm_final", 0, 200.0, 1.0)
    run("var_swap5", "lstm_final_whole", 0, 100.0, 1.0)
    lines = {line.split(" | ")[0][2:] + "/" + line.split(" | ")[1]: line.split(" | ")
             for line in own.time_table(tmp_path).splitlines()[2:]}
    par = lines["register3/" + own.ROWS["par_final_fast"].label]
    assert par[2:] == ["0,1,2", "2026-12-04", "100/200/300", "100 / 140 / 999", "99.50 / 100.00 / 97.00", "2 of 3",
                       "120", "2.0× |"]
    assert lines["register3/" + own.ROWS["lstm_final"].label][-2:] == ["60", "– |"]
    assert lines["batch_process/" + own.ROWS["par_final_fast"].label][-2:] == ["80", "– |"]
    assert lines["var_swap5/" + own.ROWS["par_final_fast"].label][-1] == "3.0× |"
