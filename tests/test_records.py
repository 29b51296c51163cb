"""Recorded data: files a user wrote by hand, the generator round trip, bad records (training and serving from them:
tests/test_records_training.py)."""

import csv
import hashlib
import json

import numpy as np
import pytest

from modeling_par import PromptFormatError
from modeling_par.record_format import RecordFormat, load_prompt_format
from state_tracking import build_dataset, build_tokenizer, get_task
from state_tracking.records import (
    RecordColumns,
    RecordError,
    build_record_tokenizer,
    discover_format,
    encode_records,
    has_step_states,
    load_record_files,
)
from tests.conftest import load_example
from tests.counter_records import write_csv as write_records_csv

make_dataset = load_example("examples/make_dataset.py")

# A machine no code of this package wrote: a turnstile (coin unlocks, push locks; a kick jams it until a coin).
TURNSTILE = {"coin": {"locked": "unlocked", "unlocked": "unlocked", "jammed": "locked"},
             "push": {"locked": "locked", "unlocked": "locked", "jammed": "jammed"},
             "kick": {"locked": "jammed", "unlocked": "unlocked", "jammed": "jammed"}}


def turnstile_rows(n, lo, hi, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        state, ops, states = "locked", [], []
        for _ in range(int(rng.integers(lo, hi + 1))):
            op = ["coin", "push", "kick"][int(rng.integers(3))]
            state = TURNSTILE[op][state]
            ops.append(op)
            states.append(state)
        rows.append((ops, states))
    return rows


def write_csv(path, rows):
    return write_records_csv(path, rows, ("events", "observed"), ";")


def test_generator_datasets_are_unchanged():
    """build_dataset is byte-for-byte what it was before records existed (its table hashed at that commit)."""
    task = get_task("swap_s5")
    data = build_dataset(task, build_tokenizer(task), n=64, depths=(1, 8), seed=3)
    digest = hashlib.sha256()
    for column in data.data.table.columns:
        digest.update(str(column.to_pylist()).encode())
    assert digest.hexdigest()[:16] == "8539a116a390307e"


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
def test_a_generator_file_reads_back_as_the_generators_problems(tmp_path, ext):
    task = get_task("swap_s5")
    path = tmp_path / f"swap.{ext}"
    make_dataset.main(["--task", "swap_s5", "--depths", "1-6", "--n", "40", "--seed", "5", "--out", str(path)])
    loaded = load_record_files(str(path))
    assert loaded.query_names == task.query_names and has_step_states(loaded)
    record_format = discover_format(loaded)
    tokenizer = build_record_tokenizer(record_format)
    encoded, skipped = encode_records(loaded, record_format, tokenizer)
    generated = build_dataset(task, build_tokenizer(task), n=40, depths=(1, 6), seed=5)
    assert not skipped and encoded["depth"] == generated["depth"]
    gen_vocab = {i: t for t, i in build_tokenizer(task).get_vocab().items()}
    rec_vocab = {i: t for t, i in tokenizer.get_vocab().items()}
    candidate = {c: record_format.candidates.index(name) for c, name in enumerate(task.candidate_names)}
    for mine, theirs in zip(encoded, generated):
        assert [rec_vocab[t] for t in mine["input_ids"]] == [gen_vocab[t] for t in theirs["input_ids"]]
        assert mine["operation_ends"] == theirs["operation_ends"]
        assert mine["query_positions"] == theirs["query_positions"]
        assert [record_format.operations[o] for o in mine["ops"]] == [task.op_names[o] for o in theirs["ops"]]
        assert mine["step_labels"][0] == [-100] * 5  # no initial state recorded
        assert mine["step_labels"][1:] == [[candidate[c] for c in row] for row in theirs["step_labels"][1:]]


def test_the_pipelines_encoding_equals_the_training_encoding(tmp_path):
    write_csv(tmp_path / "t.csv", turnstile_rows(30, 1, 7, 0))
    loaded = load_record_files(str(tmp_path / "t.csv"), RecordColumns(delimiter=";", operations="events",
                                                                     step_states="observed"))
    record_format = discover_format(loaded, "turnstile")
    tokenizer = build_record_tokenizer(record_format)
    encoded, _ = encode_records(loaded, record_format, tokenizer)
    for i, row in enumerate(loaded.dataset):
        ids, ends, queries = record_format.encode(tokenizer, row["operations"])
        assert (ids, ends, queries) == (encoded[i]["input_ids"], encoded[i]["operation_ends"],
                                        encoded[i]["query_positions"])
    assert RecordFormat.from_dict(json.loads(json.dumps(record_format.to_dict()))) == record_format
    assert isinstance(load_prompt_format(record_format.to_dict()), RecordFormat)


def test_unnamed_columns_are_found_or_refused_by_name(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"operations": ["a", "b"], "state": "x"}\n')
    cols = load_record_files(str(tmp_path / "a.jsonl")).columns
    assert (cols.operations, cols.state, cols.step_states) == ("operations", "state", None)
    (tmp_path / "b.jsonl").write_text('{"seq": ["a", "b"], "label": "x", "answer": "y"}\n')
    with pytest.raises(RecordError, match=r"no operations column.*columns found are \['seq', 'label', 'answer'\]"):
        load_record_files(str(tmp_path / "b.jsonl"), RecordColumns(state="label"))
    with pytest.raises(RecordError, match=r"several columns could hold the state \(\['label', 'answer'\]\)"):
        load_record_files(str(tmp_path / "b.jsonl"), RecordColumns(operations="seq"))
    with pytest.raises(RecordError, match="--state_column 'missing' is not a column"):
        load_record_files(str(tmp_path / "b.jsonl"), RecordColumns(operations="seq", state="missing"))


@pytest.mark.parametrize("content, message", [
    ('{"operations": ["a", "b"], "step_states": ["x"]}\n',
     r"record 0 \(0-based\), column 'step_states' \(--step_states_column\): 1 step states for 2 operations"),
    ('{"operations": [], "state": "x"}\n',
     r"record 0 \(0-based\), column 'operations' \(--operations_column\): the sequence of operations is empty"),
    ('{"operations": "", "state": "x"}\n',
     r"record 0 \(0-based\), column 'operations' \(--operations_column\): the sequence of operations is empty"),
    ('{"operations": ["a"], "state": null}\n',
     r"record 0 \(0-based\), column 'state' \(--state_column\): the state is missing"),
    ('{"operations": ["a"], "state": "x"}\n{"operations": ["a"], "state": {"q": "x"}}\n',
     r"record 1 \(0-based\), column 'state' \(--state_column\): the state names the queries \['q'\]"),
    ('{"operations": ["a", "b"], "step_states": ["x", "y"], "state": "z"}\n',
     r"record 0 \(0-based\): the last step state \['y'\] \(column 'step_states' \(--step_states_column\)\) "
         r"differs from the final state \['z'\]"),
    ('{"operations": ["a"], "state": "x"\n', r"does not parse as json"),
])
def test_every_bad_record_gets_one_error_naming_file_record_field(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(RecordError, match=message) as error:
        load_record_files(str(path))
    assert str(path) in str(error.value)


def test_unseen_labels_and_operations_at_test_time_are_errors_or_counted_skips(tmp_path):
    write_csv(tmp_path / "train.csv", turnstile_rows(20, 1, 4, 0))
    columns = RecordColumns(operations="events", step_states="observed", delimiter=";")
    train = load_record_files(str(tmp_path / "train.csv"), columns)
    record_format = discover_format(train)
    tokenizer = build_record_tokenizer(record_format)
    test = tmp_path / "test.csv"
    test.write_text("events,observed\ncoin;push,unlocked;locked\ncoin;dance,unlocked;unlocked\ncoin,broken\n")
    loaded = load_record_files(str(test), columns, query_names=train.query_names)
    with pytest.raises(RecordError, match=r"test.csv, record 1 \(0-based\), column 'events' "
                                          r"\(--operations_column\): operation 'dance' never occurs"):
        encode_records(loaded, record_format, tokenizer)
    encoded, skipped = encode_records(loaded, record_format, tokenizer, skip_bad_records=True)
    assert len(encoded) == 1 and len(skipped) == 2 and "'broken' never occurs" in skipped[1]
    assert "column 'observed' (--step_states_column): label 'broken'" in skipped[1]  # the user's column, not "labels"
    bad = tmp_path / "bad.csv"
    bad.write_text("events,observed\ncoin;push,unlocked\n;;,\ncoin,unlocked\n")
    kept = load_record_files(str(bad), columns, skip_bad_records=True)
    assert len(kept.dataset) == 1 and len(kept.skipped) == 2


def test_initial_states_encode_as_the_pipeline_reads_them(tmp_path):
    path = tmp_path / "swap_init.jsonl"
    records = make_dataset.main(["--task", "swap_s5", "--depths", "1-5", "--n", "30", "--random_initial", "--out",
                                 str(path)])
    loaded = load_record_files(str(path))
    record_format = discover_format(loaded)
    assert record_format.initial_state
    tokenizer = build_record_tokenizer(record_format)
    encoded, _ = encode_records(loaded, record_format, tokenizer)
    for record, row in zip(records, encoded):
        initial = record["initial_state"]
        ids, ends, queries = record_format.encode(tokenizer, record["operations"], initial)
        assert (ids, ends, queries) == (row["input_ids"], row["operation_ends"], row["query_positions"])
        assert row["step_labels"][0] == record_format.candidate_indices(initial)
        assert ends[0] == 5  # <bos> and one candidate token per box


@pytest.mark.parametrize("flags, ext", [([], "csv"), (["--final_only"], "jsonl"), (["--final_only"], "parquet"),
                                        (["--random_initial"], "jsonl")])
def test_the_arrow_path_reads_plain_files_as_the_record_by_record_path(tmp_path, monkeypatch, flags, ext):
    """Plain batches (scalar labels, whitespace or list operations) are read with Arrow compute; the result is the
    record-by-record path's, which reads every other batch (and names bad records)."""
    from state_tracking import records as records_module

    path = tmp_path / f"m.{ext}"
    make_dataset.main(["--task", "examples/tasks/register3.json", "--depths", "1-7", "--n", "50", "--out", str(path),
                       *flags])
    calls = []
    plain = records_module.Normalizer.plain_batch
    monkeypatch.setattr(records_module.Normalizer, "plain_batch",
                        lambda self, *a: calls.append(plain(self, *a)) or calls[-1])
    fast = load_record_files(str(path))
    assert calls and all(table is not None for table in calls) and fast.query_names == ["state"]
    monkeypatch.setattr(records_module.Normalizer, "plain_batch", lambda self, *a: None)
    slow = load_record_files(str(path))
    assert fast.dataset[:] == slow.dataset[:]
    for ids in (tmp_path / "ids.csv", tmp_path / "ids.jsonl"):  # integer labels: CSV text, JSON Lines int64
        make_dataset.main(["--task", "s5", "--state_ids", "--depths", "1-3", "--n", "20", "--out", str(ids)])
        monkeypatch.setattr(records_module.Normalizer, "plain_batch", plain)
        integer = load_record_files(str(ids))
        monkeypatch.setattr(records_module.Normalizer, "plain_batch", lambda self, *a: None)
        assert integer.dataset[:] == load_record_files(str(ids)).dataset[:]


def test_a_records_format_is_its_training_vocabulary_and_reads_untrained_operations_only_when_asked():
    fmt = RecordFormat(query_names=("state",), candidates=("locked", "unlocked"),
                       operations=("coin", "push", "kick it"))
    tokenizer = build_record_tokenizer(fmt)
    assert fmt.untrained(["coin", "kick  it"]) == []
    assert fmt.untrained(["coin", "kick coin"]) == [{"unit": "operation 2", "sentence": "kick coin",
                                                     "nearest_trained": "kick it"}]
    with pytest.raises(PromptFormatError, match="operation 2 'kick coin' never occurs .*nearest known: 'kick it'"):
        fmt.encode(tokenizer, ["coin", "kick coin"])
    ids, ends, queries = fmt.encode(tokenizer, ["coin", "kick coin"], allow_untrained=True)
    words = tokenizer.convert_ids_to_tokens(ids)
    assert words == ["<bos>", "coin", "kick", "coin", "<q1>"] and ends == [0, 1, 3] and queries == [4]
    assert fmt.encode(tokenizer, ["coin", "kick it"], allow_untrained=True) == fmt.encode(tokenizer,
                                                                                          ["coin", "kick it"])
    with pytest.raises(PromptFormatError, match="'kick door' has a word this tokenizer does not know; an untrained "
                                                "operation can be read only from words of trained ones"):
        fmt.encode(tokenizer, ["kick door"], allow_untrained=True)


def test_json_list_operations_in_csv_cells_are_lists(tmp_path):
    """A CSV whose operations cell is JSON list text ('["coin", "push"]', as pandas or json.dumps writes a list) reads
    as those operations, not as the pieces '["coin",' and '"push"]'; broken JSON list text is one error."""
    path = tmp_path / "log.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["events", "state"])
        writer.writerow([json.dumps(["coin", "push"]), "locked"])
        writer.writerow([json.dumps(["kick", "coin", "coin push"]), "unlocked"])
    loaded = load_record_files(str(path))
    assert loaded.dataset["operations"] == [["coin", "push"], ["kick", "coin", "coin push"]]
    path.write_text('events,state\n"[""coin"", push]",locked\n')
    with pytest.raises(RecordError, match=r"record 0 \(0-based\), column 'events'.*not a valid JSON list"):
        load_record_files(str(path))


@pytest.mark.parametrize("delimiter, message", [
    ("(;|,)", r"has a capturing group.*e\.g\. '\(\?:;\|,\)'"),
    ("x*", "matches the empty string"),
    ("([", "is not a valid regular expression"),
])
def test_a_delimiter_that_would_split_wrongly_is_refused(tmp_path, delimiter, message):
    path = tmp_path / "log.csv"
    write_csv(path, turnstile_rows(4, 2, 3, seed=0))
    with pytest.raises(RecordError, match=r"--operation_delimiter .*" + message):
        load_record_files(str(path), RecordColumns(step_states="observed", delimiter=delimiter))
    kept = load_record_files(str(path), RecordColumns(step_states="observed", delimiter="(?:;|,)"))
    assert all(";" not in op for ops in kept.dataset["operations"] for op in ops)


@pytest.mark.parametrize("bad_piece", ["{b", "{x"])
def test_a_record_is_accepted_or_refused_whatever_its_batch(tmp_path, monkeypatch, bad_piece):
    """One normalization rule for both paths: a step-state piece the record-by-record path refuses ('{b': JSON that
    does not parse) is refused whether or not the rest of its batch is plain (the Arrow fast path was accepting it)."""
    from state_tracking import records as records_module

    path = tmp_path / "log.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["events", "observed"])
        writer.writerows([["coin push", "unlocked locked"], ["coin kick", f"unlocked {bad_piece}"]])
    columns = RecordColumns(step_states="observed")
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(records_module.Normalizer, "plain_batch", lambda self, *a: None)
        with pytest.raises(RecordError, match=r"record 1 \(0-based\), column 'observed'"):
            load_record_files(str(path), columns)


# ---------------------------------------------------------------------------------------------- labels as written
@pytest.mark.parametrize("sep, ext", [(",", "csv"), ("\t", "tsv")])
def test_csv_and_tsv_cells_are_the_text_written_in_them(tmp_path, monkeypatch, sep, ext):
    """No type inference: the states 01, 02, 10, 007 are four labels (not 1, 2, 7, 10), 1.50 is not 1.5, NA and null
    are labels (not missing, not skipped), an operation 01 is not 1; on the Arrow path and the record path alike. An
    empty cell is still one error naming the file, the record and the column."""
    from state_tracking import records as records_module

    path = tmp_path / f"log.{ext}"
    states = ["01", "02", "10", "007", "1.50", "NA", "null", "True"]
    path.write_text(f"events{sep}state\n" + "".join(f"01 1{sep}{state}\n" for state in states))
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(records_module.Normalizer, "plain_batch", lambda self, *a: None)
        loaded = load_record_files(str(path), skip_bad_records=True)
        assert loaded.skipped == [] and [labels[-1] for labels in loaded.dataset["labels"]] == [[s] for s in states]
        assert loaded.dataset["operations"] == [["01", "1"]] * len(states)
        record_format = discover_format(loaded)
        assert record_format.candidates == ("01", "02", "007", "10", "1.50", "NA", "True", "null")
        assert record_format.operations == ("01", "1")
    path.write_text(f"events{sep}state\n01 1{sep}01\n01{sep}\n")
    with pytest.raises(RecordError, match=r"log\.[ct]sv, record 1 \(0-based\), column 'state'.*the state is missing"):
        load_record_files(str(path))


def test_json_lines_labels_are_strings_as_written_and_numbers_by_their_value(tmp_path, monkeypatch):
    """JSON keeps a string's form ("007", "1.50", "NA"); a JSON number or boolean is its value's text, so 2, 2.0 and
    "2" are one label and 1.50 is "1.5" (write "1.50" to keep that form) — whatever the other cells of its column
    (an int64, a double or a column mixing strings and numbers, which datasets reads as JSON text) and on both
    paths."""
    from state_tracking import records as records_module

    written = ['"007"', "7", '"2"', "2", "2.0", "1.50", '"1.50"', "true", '"NA"', '" 1.5 "', '"1e3"', "1e3"]
    expected = ["007", "7", "2", "2", "2", "1.5", "1.50", "true", "NA", "1.5", "1e3", "1000"]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(f'{{"operations": ["a"], "state": {w}}}\n' for w in written))
    ints = tmp_path / "ints.jsonl"  # an int64 column, then a double one
    ints.write_text('{"operations": ["a"], "state": 2}\n{"operations": ["a"], "state": 7}\n')
    doubles = tmp_path / "doubles.jsonl"
    doubles.write_text('{"operations": ["a"], "state": 2}\n{"operations": ["a"], "state": 2.5}\n')
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(records_module.Normalizer, "plain_batch", lambda self, *a: None)
        assert [labels[-1][0] for labels in load_record_files(str(path)).dataset["labels"]] == expected
        assert [labels[-1][0] for labels in load_record_files(str(ints)).dataset["labels"]] == ["2", "7"]
        assert [labels[-1][0] for labels in load_record_files(str(doubles)).dataset["labels"]] == ["2", "2.5"]


# ---------------------------------------------------------------------------------------------- one whitespace rule
def test_the_whitespace_rule_is_pythons_unicode_whitespace():
    """Both paths collapse and strip the same characters, the ones `normalize_operation` (str.split) collapses, so a
    checkpoint reads an operation as training read it."""
    import sys

    from modeling_par.record_format import normalize_operation
    from state_tracking.records.normalize import WHITESPACE, splitter_of

    assert set(WHITESPACE) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    for space in "\xa0\x0b\u3000\t\x85\u2028\x1c":
        assert normalize_operation(f"{space}push{space}{space}x{space}") == "push x"
        assert splitter_of(RecordColumns()).split(f"a{space}b") == ["a", "b"]


def _both_paths(table, columns, first=0):
    """(the Arrow path's normalized records or None, the record-by-record path's) of one raw batch."""
    from state_tracking.records.normalize import Normalizer

    normalizer = Normalizer(columns, "t.jsonl", 0, ["state"], skip_bad=True)
    fast = normalizer.plain_batch(table, first)
    normalizer.plain_batch = lambda *args: None
    return (None if fast is None else fast.to_pydict()), normalizer(table, list(range(first, first + len(table))))


@pytest.mark.parametrize("kind", ["list operations", "string operations and step states"])
def test_both_paths_read_unicode_whitespace_alike_and_a_record_whatever_its_batch(kind):
    """An adversarial batch of operations and labels written with Unicode whitespace (NBSP, \\v, \\u3000, tabs, ...)
    and JSON-looking pieces: every record the Arrow path accepts alone it reads as the record-by-record path does,
    and the whole batch reads as its records one by one (accepted or refused the same, whatever its neighbours)."""
    import pyarrow as pa

    spaces = [chr(c) for c in range(0x3001) if chr(c).isspace()]  # Unicode whitespace: NBSP, \v, \u3000, \t, ...
    rng = np.random.default_rng(0)
    letters, odd = ["a", "b", "c", "push x"], ["[", "{", '"', ","]

    def piece(lo, hi):
        chars = [letters[rng.integers(4)] if u < 0.6 else spaces[rng.integers(len(spaces))] if u < 0.96
                 else odd[rng.integers(4)] for u in rng.random(int(rng.integers(lo, hi + 1)))]
        return "".join(chars)

    n = 300
    if kind == "list operations":
        columns = RecordColumns(operations="operations", state="state")
        table = pa.table({"operations": pa.array([[piece(1, 4) for _ in range(rng.integers(1, 4))] for _ in range(n)],
                                                 pa.list_(pa.string())),
                          "state": pa.array([piece(1, 3) for _ in range(n)])})
    else:
        columns = RecordColumns(operations="operations", step_states="steps")
        ops = [piece(1, 8) for _ in range(n)]
        table = pa.table({"operations": ops, "steps": [
            "\u3000".join(piece(1, 2) for _ in range(max(1, len(o.split())))) for o in ops]})
    accepted = 0
    one_by_one = {}
    for i in range(n):
        fast, slow = _both_paths(table.slice(i, 1), columns, first=i)
        if fast is not None:
            accepted += 1
            assert fast == slow, (table.slice(i, 1).to_pylist(), fast, slow)
        for key, values in slow.items():
            one_by_one.setdefault(key, []).extend(values)
    assert accepted >= n // 5  # the Arrow path is exercised, not bypassed
    fast, slow = _both_paths(table, columns)
    assert slow == one_by_one and fast in (None, one_by_one)


def test_a_json_lines_file_with_nbsp_inside_list_operations_trains(tmp_path, monkeypatch):
    """NBSP inside an operation of a list is whitespace on both paths ('push\\xa0x' is 'push x'): the file reads and its
    vocabulary is built (it was an internal prompt_format error naming no file), the same whether a state is written
    2 or "2" (the column then mixes types and goes record by record). A bad state names its file, record, column."""
    from state_tracking import records as records_module
    from state_tracking.records import read_record_splits

    rows = [{"operations": ["push\xa0x", "pop"], "state": "1"}, {"operations": ["pop", "push\u3000 x\v"], "state": "2"}]
    strings, mixed = tmp_path / "strings.jsonl", tmp_path / "mixed.jsonl"
    strings.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mixed.write_text("".join(json.dumps(dict(r, state=int(r["state"]) if k else r["state"])) + "\n"
                             for k, r in enumerate(rows)))
    read = {}
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(records_module.Normalizer, "plain_batch", lambda self, *a: None)
        for path in (strings, mixed):
            records = read_record_splits(RecordColumns(), str(path), validation_split_percentage=0)
            read[fast, path.name] = (records.record_format.operations, records.record_format.candidates,
                                     records.train.dataset[:])
    assert read[True, "strings.jsonl"][0] == ("push x", "pop") and read[True, "strings.jsonl"][1] == ("1", "2")
    assert len({(ops, labels, json.dumps(data)) for ops, labels, data in read.values()}) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"operations": ["pop"], "state": {"": s}}) + "\n" for s in "12"))
    with pytest.raises(RecordError, match=r"bad.jsonl, record 0 \(0-based\), column 'state'.*empty query name"):
        read_record_splits(RecordColumns(), str(bad), validation_split_percentage=0)
