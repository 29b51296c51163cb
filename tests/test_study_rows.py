"""The study rows (par_studies and the scripts under examples/reproduce/ and examples/studies/): every row's effective
train command equals the one the scripts of 6ca0968 ran (tests/fixtures/study_rows_effective_flags.json, made by
tests/fixtures/study_rows_snapshot.py), now with each flag once; the one override rule refuses a flag given twice;
halting is a property of the row; no study script reaches another through sys.path."""

import dataclasses
import json
from pathlib import Path

import pytest

from par_studies import HALTING, LOCAL, MASTERY, Preset, Row, argv, combine, halting, parse_argv, rows_by_name
from tests.conftest import load_example
from tests.fixtures.study_rows_snapshot import FIXTURE, effective, snapshot, standin_parent

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT_MACHINES = ("batch_process", "register3", "swap_s5", "s5_ids")  # own_data.py's machines at 6ca0968
OWN_DATA_ROWS_SINCE = ("par_final_fast", "par_final_whole", "par_final_whole_fast", "par_final_whole_fast_2x",
                        "par_final_whole_fast_2x_lr5e-4", "par_final_small_fast",
                        "par_final_whole_fast_2x_b95",
                        "par_final_fast_eager", "par_final_small_fast_eager",
                        "lstm_final_whole", "gru_final_whole", "par_final_small_reg",
                        "par_final_small_reg_fb", "par_final_fb", "par_final_small_fast_eager_fb",
                        "par_final_whole_fast_2x_b95_fb", "par_final_whole_small_reg_fb",
                        "par_final_whole_small_fast_b95")  # own_data.py rows added later
SCRIPTS = ["examples/reproduce/paper_protocol.py", "examples/reproduce/swap_s5.py",
           "examples/reproduce/batch_process_text.py", "examples/studies/comparisons.py",
           "examples/studies/length_generalization.py", "examples/studies/s5_breakthrough.py",
           "examples/studies/own_data.py"]


def rebased(module, root: Path):
    """The module with every path of the repository it holds moved under `root` (nothing is written to the repo)."""
    for name, value in list(vars(module).items()):
        if isinstance(value, Path) and value.is_relative_to(REPO):
            setattr(module, name, root / value.relative_to(REPO))
    if hasattr(module, "PROTOCOLS"):
        module.PROTOCOLS = {name: dataclasses.replace(p, out=root / p.out.relative_to(REPO),
                                                      run_dir=root / p.run_dir.relative_to(REPO))
                            for name, p in module.PROTOCOLS.items()}
    return module


def rows_today(root: Path, load, fresh):
    """The same rows as the fixture's (tests/fixtures/study_rows_snapshot.rows_6ca0968), from today's scripts."""
    def script(relative: str):
        return rebased(load_example(relative), root)

    protocol = script("examples/reproduce/paper_protocol.py")
    for name, p in protocol.PROTOCOLS.items():
        for row in protocol.rows_of(p):
            key = f"paper_protocol.py --protocol {name} --row {row}"
            spec = protocol.ROWS[row]
            fresh()
            if spec.kind == "rnn":
                yield key, protocol.train_and_evaluate_rnn, (p, row, 0)
                fresh()
                yield key.replace("--row", "--long"), protocol.evaluate_long, (p, row, 0)
                continue
            if spec.init_from:
                standin_parent(protocol.run_path(p, spec.init_from, 0))
            yield key, protocol.train_par, (p, row, 0)
    swap = script("examples/reproduce/swap_s5.py")
    for scale in ("cpu", "gpu"):
        for run in swap.ROWS:
            fresh()
            yield f"swap_s5.py --scale {scale} --runs {run}", swap.main, (["--scale", scale, "--runs", run],)
    for row in ("idle_start", "random_start"):
        text = script("examples/reproduce/batch_process_text.py")
        fresh()
        yield f"batch_process_text.py --row {row}", text.train, (row, 0)
        text = script("examples/reproduce/batch_process_text.py")
        fresh()
        yield (f"batch_process_text.py --tiny DIR --row {row} --steps 6", text.main,
               (["--tiny", "runs/tiny", "--row", row, "--steps", "6"],))
    comparisons = script("examples/studies/comparisons.py")
    for run in comparisons.ROWS:
        fresh()
        yield f"comparisons.py --run {run}", comparisons.run, (run, 0)
    study = script("examples/studies/length_generalization.py")
    for run in study.ROWS:
        fresh()
        yield f"length_generalization.py --run {run}", study.train, (run, 0)
    breakthrough = script("examples/studies/s5_breakthrough.py")
    for row, spec in breakthrough.ROWS.items():
        for tiny in (False, True):
            fresh()
            if spec.init_from:
                standin_parent(breakthrough.run_path(spec.init_from, 0, tiny))
            yield f"s5_breakthrough.py --run {row}" + (" --tiny" if tiny else ""), breakthrough.train, (row, 0, tiny)
    own = script("examples/studies/own_data.py")
    for machine in own.MACHINES:
        if machine not in SNAPSHOT_MACHINES:
            continue  # a machine added after the fixture's commit: its rows have no earlier command to equal
        for row in own.ROWS:
            if own.ROWS[row].kind == "automata" or row in OWN_DATA_ROWS_SINCE:
                continue  # rows added after the fixture's commit
            for train_n in (own.TRAIN_N, 250):
                fresh()
                yield (f"own_data.py --machine {machine} --row {row} --train_n {train_n}", own.train_row,
                       (machine, row, 0, train_n))


def test_every_row_runs_the_flags_it_ran_before_each_once(tmp_path, capsys):
    before = json.loads(FIXTURE.read_text())
    now = snapshot(tmp_path.resolve(), rows_today)
    capsys.readouterr()  # swap_s5.py prints each command it starts
    assert sorted(now) == sorted(before["rows"])
    assert len(now) == 221
    changed = {key: (before["rows"][key]["flags"], got["flags"]) for key, got in now.items()
               if (got["script"], got["flags"]) != (before["rows"][key]["script"], before["rows"][key]["flags"])}
    assert not changed, json.dumps(changed, indent=1)[:4000]
    assert not [key for key, got in now.items() if got["given_twice"]]  # each flag once in every command
    # what the old commands relied on "last flag wins" for (e.g. --max_steps three times in a second-stage row)
    assert before["rows"]["paper_protocol.py --protocol s5 --row self_distill_mastery_more_decay"]["given_twice"]


def test_a_flag_given_twice_is_refused_by_name():
    with pytest.raises(ValueError, match=r"row 'mine': --grad_window is given twice \(preset 'learned halting"):
        Row.of("mine", "a row", HALTING, {"--grad_window": "8"})
    with pytest.raises(ValueError, match=r"row 'x': --max_steps is given twice"):
        combine("x", {"--max_steps": "1"}, {"--max_steps": "2"})
    with pytest.raises(ValueError, match=r"--curriculum_every_steps is given twice"):
        Row.of("pace", "a row", MASTERY, {"--curriculum_every_steps": "25"})
    with pytest.raises(ValueError, match="flags are '--name': 'value' strings"):
        Row.of("bad", "a row", {"--max_steps": 10})
    with pytest.raises(ValueError, match="flags are '--name': 'value' strings"):
        Row.of("bad", "a row", {"max_steps": "10"})
    with pytest.raises(ValueError, match="kind must be one of"):
        Row.of("bad", "a row", kind="lstm")
    with pytest.raises(ValueError, match="row 'a' is declared twice"):
        rows_by_name(Row.of("a", "one"), Row.of("a", "two"))
    with pytest.raises(ValueError, match="'--flag value' pairs"):
        parse_argv(["--hidden_size", "32", "--bf16"], "--extra")
    with pytest.raises(ValueError, match="--extra: --eval_n is given twice"):
        parse_argv(["--eval_n", "8", "--eval_n", "16"], "--extra")
    assert parse_argv(argv({"--a": "1", "--b": "2"})) == {"--a": "1", "--b": "2"}
    row = Row.of("ok", "a row", LOCAL, {"--max_steps": "10"})
    assert argv(row.flags)[:2] == ["--loop_view", "local"] and row.flags["--max_steps"] == "10"
    with pytest.raises(TypeError):
        row.flags["--max_steps"] = "20"  # a declared row does not change


def test_halting_is_a_property_of_the_row_and_its_presets():
    assert HALTING.halting and not LOCAL.halting and not Preset("p", {"--halting_loss_weight": "0.5"}).halting
    assert Row.of("h", "halting", LOCAL, HALTING).halting and not Row.of("f", "forced", LOCAL).halting
    assert "--halt_label_offset" not in halting(label_offset=None).flags  # the first halting runs: train_par's default
    assert halting(extra=16, grad_window=24).flags["--hold_extra_iterations"] == "16"
    for relative in SCRIPTS:
        module = load_example(relative)
        for name, row in module.ROWS.items():  # the property agrees with what the row trains
            weight = float(row.flags.get("--halting_loss_weight", 0))
            assert row.halting == (weight > 0), (relative, name)
    protocol = load_example("examples/reproduce/paper_protocol.py")
    assert {name for name, row in protocol.ROWS.items() if row.halting} == {"recipe_halting", "recipe_then_halting"}


def test_study_scripts_import_the_shared_module_not_each_other():
    for relative in SCRIPTS:
        source = (REPO / relative).read_text()
        assert "sys.path" not in source, relative
        assert "from par_studies import" in source, relative
        for other in SCRIPTS:
            assert f"from {Path(other).stem} import" not in source and f"import {Path(other).stem}\n" not in source


def test_effective_reads_the_last_occurrence_and_names_repeats(tmp_path):
    got = effective(["python", str(tmp_path / "examples/train_par.py"), "--max_steps", "1", "--output_dir",
                     str(tmp_path / "runs/x"), "--max_steps", "2"], tmp_path)
    assert got == {"script": "examples/train_par.py", "flags": {"--max_steps": "2", "--output_dir": "runs/x"},
                   "given_twice": ["--max_steps"]}
