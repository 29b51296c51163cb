"""The study scripts on train_par.py: examples/reproduce/paper_protocol.py (its rows, a tiny protocol trained, resumed,
evaluated and tabulated, the S5 / A5 rows, the second stage's curriculum) and examples/studies/s5_breakthrough.py (its
rows, and the study end to end at --tiny scale)."""

import json

import pytest
from transformers import AutoModel

from tests.conftest import load_example
from tests.test_examples import REPO, TINY, train_par
from trainers.model_setup import PAPER_VIEW, RECIPE_VIEW, resolve_view


def test_paper_protocol_rows_are_valid_and_explicit():
    """Every PAR row of examples/reproduce/paper_protocol.py parses as train_par.py flags, sets its view explicitly,
    trains to d = 32 with the stated curriculum (32 reached at step 750), and the recipe row trains halting with the
    offset-1 labels; the RNN rows take the same curriculum and steps."""
    from par_studies import argv
    from trainers import curriculum_max_depth

    protocol = load_example("examples/reproduce/paper_protocol.py")
    p = protocol.PROTOCOLS["swap_s5"]
    for name, row in protocol.ROWS.items():
        if row.kind == "rnn":
            rnn = load_example("examples/baselines/rnn.py").parse_args(argv({**protocol.common_rnn(p), **row.flags}))
            assert (rnn.max_train_depth, rnn.curriculum_every_steps, rnn.eval_n) == (32, 25, 1024)
            assert rnn.depths == p.grid
            continue
        model_args, _, args = train_par.parse_args(argv({**protocol.common_par(p), **row.flags})
                                                   + ["--output_dir", "x"])
        view = resolve_view(model_args)
        assert view == {k: getattr(model_args, k) for k in view}, name
        assert args.max_train_depth == 32 and args.save_strategy == "steps"
        assert args.restore_callback_states_from_checkpoint
        start, every = args.curriculum_start_depth, args.curriculum_every_steps
        if args.curriculum_advance_accuracy is not None:  # mastery: from d ≤ 2, grown by accuracy, not by step
            assert start == 2 and args.curriculum_advance_accuracy == 0.9, name
        else:
            assert curriculum_max_depth(749, start, every, 1, 32) == 31
            assert curriculum_max_depth(750, start, every, 1, 32) == 32
        if name == "recipe_halting":
            assert view == RECIPE_VIEW and args.halt_label_offset == 1 and args.halting_loss_weight > 0
        if name.startswith("full_view"):
            assert view == PAPER_VIEW
            assert (args.stretch_steps > 0) == name.endswith("stretch")


def tiny_protocol(protocol, tmp_path, monkeypatch):
    """The swap-S5 protocol shrunk to test scale (monkeypatched into PROTOCOLS) and four of its rows with small
    models (ROWS): recipe_halting, lstm, recipe_mastery and the two-stage recipe_then_halting."""
    from dataclasses import replace

    tiny = replace(protocol.PROTOCOLS["swap_s5"], run_dir=REPO / "runs" / "test_paper_protocol" / tmp_path.name,
                   out=tmp_path / "results", train_max_depth=3, grid=[3, 6, 24, 48, 96], n=16, steps=2, save_steps=2,
                   profile_depths=[6], profile_n=8, in_range_depths=[2, 3], in_range_n=8, long_grid=[12, 30],
                   long_n=8, long_batch=4, curriculum_every=1)
    monkeypatch.setitem(protocol.PROTOCOLS, "swap_s5", tiny)
    small = {"--hidden_size": "32", "--intermediate_size": "64", "--num_attention_heads": "2",
             "--num_key_value_heads": "2", "--per_device_train_batch_size": "8", "--use_cpu": "true"}

    def shrunk(name, **flags):  # the row at test scale: its flags with these over them
        return replace(protocol.ROWS[name], flags={**protocol.ROWS[name].flags, **small, **flags})

    rows = {"recipe_halting": shrunk("recipe_halting"),
            "lstm": replace(protocol.ROWS["lstm"], flags={"--cell": "lstm", "--hidden": "16"}),
            # its mastery pace shrunk with its steps (a pace that cannot reach the longest length is refused)
            "recipe_mastery": shrunk("recipe_mastery", **{"--max_steps": "2", "--curriculum_window": "1",
                                                          "--curriculum_every_steps": "1"}),
            "recipe_then_halting": shrunk("recipe_then_halting", **{"--max_steps": "2"})}
    monkeypatch.setattr(protocol, "ROWS", rows)
    return tiny


def two_stage_rows(protocol, tiny) -> tuple[dict, dict]:
    """A two-stage row needs its trained parent, then starts from it and counts its training time: (the parent's
    record, the staged row's)."""
    with pytest.raises(SystemExit, match="fine-tunes the trained recipe_mastery row"):
        protocol.main(["--row", "recipe_then_halting", "--seed", "0"])
    protocol.main(["--row", "recipe_mastery", "--seed", "0"])
    protocol.main(["--row", "recipe_then_halting", "--seed", "0"])
    staged = json.loads(protocol.record_path(tiny, "recipe_then_halting", 0).read_text())
    parent = json.loads(protocol.record_path(tiny, "recipe_mastery", 0).read_text())
    assert parent["curriculum"]["mastery_accuracy"] == 0.9
    assert isinstance(parent["curriculum"]["growth_steps"], list)
    assert parent["probe"] and parent["probe"][0]["step"] == 0  # the in-range probe ran
    assert staged["init_from"] == "recipe_mastery" and "--init_from_par" in staged["train_commands"][0]
    assert "runs/test_paper_protocol" in staged["train_commands"][0].split("--init_from_par ")[1]
    assert staged["train_seconds_total"] == pytest.approx(staged["train_seconds"] + parent["train_seconds"], abs=0.2)
    assert set(staged["evaluation"]) == {"forced", "halting"} and set(parent["evaluation"]) == {"forced"}
    return parent, staged


def resumed_row(protocol, tiny, monkeypatch):
    """recipe_halting trained, cut off (its summary removed), then resumed to 4 steps from checkpoint-2 and evaluated
    under the stop rule: (the protocol at 4 steps, the row's record)."""
    from dataclasses import replace

    protocol.main(["--row", "recipe_halting", "--seed", "0"])
    folder = protocol.run_path(tiny, "recipe_halting", 0)
    assert (folder / "checkpoint-2").is_dir()
    (folder / "summary.json").unlink()  # as if the segment had been cut off before the end
    tiny = replace(tiny, steps=4)
    monkeypatch.setitem(protocol.PROTOCOLS, "swap_s5", tiny)
    protocol.main(["--row", "recipe_halting", "--seed", "0"])
    record = json.loads(protocol.record_path(tiny, "recipe_halting", 0).read_text())
    assert [s["resumed_from"] for s in record["segments"]] == [None, "checkpoint-2"]
    assert "--resume_from_checkpoint" in record["train_commands"][1] and record["steps"] == 4
    before = record["segments"][1]["trained_seconds_before"]
    assert before > 0 and record["train_seconds"] == round(before + record["segments"][1]["wall_seconds"], 1)
    for mode in ("forced", "halting"):
        evaluation = record["evaluation"][mode]
        depths = evaluation["depths"]
        assert depths == tiny.grid[: len(depths)] and evaluation["n_per_depth"] == 16
        low = [a < 0.02 for a in evaluation["accuracy"]]
        assert (len(depths) < len(tiny.grid)) == (low[-2:] == [True, True]) == evaluation["stopped_early"]
    assert record["profile"] and record["padding_control"]
    assert record["in_range"]["depths"] == [2, 3] and record["in_range"]["n_per_depth"] == 8
    return tiny, record


def collected_table(protocol, tmp_path) -> None:
    """--collect writes the paper-shaped table: the paper's rows above ours, the two-stage row's steps, the rows past
    the protocol and inside the training range."""
    protocol.main(["--collect"])
    table = (tmp_path / "results" / "table.md").read_text()
    assert "Past the protocol (`--long`)" in table and "| d=12 (4×) | d=30 (10×) |" in table
    assert table.index("PAR + learned halting — *paper, reported*") < table.index("*ours, CPU*")
    assert "PAR recipe (local view) + halting labels, learned halting — *ours, CPU* | 1 |" in table
    assert "LSTM, hidden 288 (≈ PAR's parameters) — *ours, CPU* | 1 |" in table
    assert "| 2 + 2 |" in table  # the two-stage row: its parent's steps + its own
    assert "Inside the training range" in table and "| d=2 | d=3 | d=6 profile: iteration 1 / 2 |" in table


def exported_row(protocol, tiny, tmp_path) -> None:
    """The resumed row exported: its summary, a card with learned halting, and a folder that loads as remote code."""
    shipped = protocol.export(tiny, "recipe_halting", 0, target=tmp_path / "ckpt")
    summary = json.loads((shipped / "training_summary.json").read_text())
    assert summary["max_train_depth"] == 3 and summary["steps"] == 4 and summary["n_per_depth"] == 16
    card = (shipped / "README.md").read_text()
    assert "learned halting (no R given)" in card, card
    config = AutoModel.from_pretrained(shipped, trust_remote_code=True).config
    assert config.max_iterations >= 1 and config.learned_halting is True
    assert config.prompt_format["rendering"] == "symbolic" and "state-tracking" in config.custom_pipelines


def test_paper_protocol_trains_resumes_evaluates_and_tabulates(tmp_path, monkeypatch, scripts_in_process):
    """The protocol script at tiny scale: a PAR row trains with checkpoints, a second call after an interruption
    resumes from the newest checkpoint (two segments on record), the evaluation follows the stop rule on the grid,
    an RNN row scores the same grid, and --collect writes the paper-shaped table with the paper's rows above ours.
    train_par.py and rnn.py run in this process with the commands the protocol records (`scripts_in_process`; the
    fresh process of a study's row is tested by test_s5_breakthrough_tiny_trains_resumes_and_collects)."""
    protocol = load_example("examples/reproduce/paper_protocol.py")
    tiny = tiny_protocol(protocol, tmp_path, monkeypatch)
    try:
        parent, staged = two_stage_rows(protocol, tiny)
        tiny, record = resumed_row(protocol, tiny, monkeypatch)
        protocol.main(["--row", "lstm", "--seed", "0"])
        lstm = json.loads(protocol.record_path(tiny, "lstm", 0).read_text())
        assert lstm["evaluation"]["forced"]["depths"] == tiny.grid[: len(lstm["evaluation"]["forced"]["depths"])]
        ran = ["python " + " ".join(command) for command in scripts_in_process]  # what ran is what the records say
        assert ran == (parent["train_commands"] + staged["train_commands"] + record["train_commands"]
                       + lstm["train_commands"])
        for row in ("recipe_halting", "lstm"):  # past the protocol
            protocol.main(["--long", row, "--seed", "0"])
            long = json.loads((tmp_path / "results" / "long" / f"{row}_s0.json").read_text())
            assert long["evaluation"]["n_per_depth"] == 8 and long["evaluation"]["depths"][0] == 12
        assert len(scripts_in_process) == 6 and scripts_in_process[-1][0] == "examples/baselines/rnn.py"  # LSTM again
        collected_table(protocol, tmp_path)
        exported_row(protocol, tiny, tmp_path)
    finally:
        import shutil

        shutil.rmtree(REPO / "runs" / "test_paper_protocol", ignore_errors=True)


def test_paper_protocol_s5_a5_rows_train_the_group_to_16():
    """--protocol s5 / a5: the same rows on S5 / A5, train d ≤ 16 (reached at step 350), test 16 … 256; the label-free
    row is prefix self-distillation; rows outside the protocol and the swap-S5 export are refused."""
    from par_studies import argv
    from trainers import curriculum_max_depth

    protocol = load_example("examples/reproduce/paper_protocol.py")
    for name in ("s5", "a5"):
        p = protocol.PROTOCOLS[name]
        assert p.grid == [16, 32, 64, 128, 256] and p.out.parts[-2:] == ("s5_a5_cpu", name)
        for row in protocol.rows_of(p):
            spec = protocol.ROWS[row]
            if spec.kind == "rnn":
                rnn = load_example("examples/baselines/rnn.py").parse_args(
                    argv({**protocol.common_rnn(p), **spec.flags}))
                assert (rnn.task, rnn.max_train_depth, rnn.depths) == (name, 16, p.grid)
                continue
            _, task_args, args = train_par.parse_args(argv({**protocol.common_par(p), **spec.flags,
                                                            **protocol.probe_flags(p, row)}) + ["--output_dir", "x"])
            assert task_args.task == name and args.max_train_depth == 16
            start, every = args.curriculum_start_depth, args.curriculum_every_steps
            if "mastery" in row:  # grown by accuracy; probed in range, stops once learned unless nostop
                assert (args.curriculum_advance_accuracy, args.curriculum_window, every) == (0.9, 20, 100)
                stops = not row.endswith(("nostop", "_more", "_decay"))  # (self_distill_mastery_more_stop stops)
                assert (task_args.probe_depth, task_args.probe_stop_accuracy) == (16, 0.99 if stops else None)
                constant = row.startswith("self_distill_mastery") and not row.endswith(("cosine", "decay"))
                steps = 6_000 if row.endswith("decay") else 20_000 if constant else 10_000  # a constant rate
                assert (args.max_steps, args.lr_scheduler_type == "constant_with_warmup") == (  # does not run
                    (steps, constant)), row  # out while d_max grows
                if not spec.resume_curriculum:  # (that one reads its parent's run: next test)
                    curriculum = protocol.curriculum_of(p, row, protocol.REPO / "no-such-run", 0)
                    assert curriculum["mastery_accuracy"] == 0.9 and curriculum["growth_steps"] is None
            else:
                assert curriculum_max_depth(349, start, every, 1, 16) == 15
                assert curriculum_max_depth(350, start, every, 1, 16) == 16
                assert task_args.probe_depth is None
                assert protocol.curriculum_of(p, row, protocol.REPO, 0)["reaches_16_at_step"] == 350
            assert task_args.self_distillation == row.startswith("self_distill")
    from state_tracking import get_task

    a5 = protocol.PROTOCOLS["a5"]
    assert "no identity operation" in protocol.padding_control(a5, None, None, get_task("a5"), {})["skipped"]
    with pytest.raises(SystemExit):
        protocol.main(["--protocol", "s5", "--row", "full_view"])
    with pytest.raises(SystemExit):
        protocol.main(["--protocol", "a5", "--export", "recipe_halting"])


def test_paper_protocol_second_stage_resumes_the_parents_curriculum(tmp_path):
    """A `resume_curriculum` row (self_distill_mastery_more) starts from its parent's trained weights with the mastery
    curriculum at the parent's last d_max (start + growths, at most train_max_depth), and says so in its record; a
    parent without a curriculum state is refused by name."""
    from dataclasses import replace

    from par_studies import argv

    protocol = load_example("examples/reproduce/paper_protocol.py")
    p = replace(protocol.PROTOCOLS["s5"], run_dir=tmp_path)
    row, parent = "self_distill_mastery_more", "self_distill_mastery"
    assert protocol.ROWS[row].init_from == parent
    parent_checkpoint = protocol.run_path(p, parent, 1) / "checkpoint-900"
    parent_checkpoint.mkdir(parents=True)
    (parent_checkpoint / "trainer_state.json").write_text("{}")  # a complete checkpoint (trainer_state written last)
    (protocol.run_path(p, parent, 1) / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match="no curriculum state"):
        protocol.parent_flags(p, row, 1)
    (parent_checkpoint / "curriculum_state.json").write_text(json.dumps({"advances": [300, 500, 800], "recent": []}))
    flags = protocol.parent_flags(p, row, 1)
    assert flags["--curriculum_start_depth"] == "5" and "--init_from_par" in flags
    _, _, args = train_par.parse_args(argv(protocol.train_flags(p, row, 1)) + ["--output_dir", "x"])
    assert args.curriculum_start_depth == 5 and args.curriculum_advance_accuracy == 0.9
    assert protocol.curriculum_of(p, row, tmp_path / "no-such-run", 1)["start"] == 5
    (parent_checkpoint / "curriculum_state.json").write_text(json.dumps({"advances": list(range(30)), "recent": []}))
    assert protocol.curriculum_of(p, row, tmp_path / "no-such-run", 1)["start"] == 16  # capped at d ≤ 16
    assert protocol.resumed_curriculum_flags(p, "recipe_then_halting", 1) == {}


def test_s5_breakthrough_rows_are_valid_and_explicit(tmp_path, monkeypatch):
    """Every row of examples/studies/s5_breakthrough.py parses as train_par.py flags: S5, the recipe's view set
    explicitly, train d ≤ 8, the study's cap (10,000 steps, 7,200 s), a checkpoint and a probe (d = 8, 256 sequences)
    every 250 steps; each variant trains what it says and each change is in the flags."""
    from par_studies import argv

    study = load_example("examples/studies/s5_breakthrough.py")
    rows = study.ROWS
    assert {name for name, spec in rows.items() if spec.label.startswith("baseline")} == set(study.VARIANTS)
    monkeypatch.setattr(study, "RUN_DIR", tmp_path)
    for parent in {spec.init_from for spec in rows.values()} - {None}:  # trained parents, as a fine-tune needs
        study.run_path(parent, 0).mkdir()
        (study.run_path(parent, 0) / "summary.json").write_text("{}")
    for name, spec in rows.items():
        flags = argv(study.train_flags(name, 0))
        model_args, task_args, args = train_par.parse_args(flags + ["--output_dir", "x", "--seed", "0"])
        assert resolve_view(model_args) == RECIPE_VIEW == {
            k: getattr(model_args, k) for k in RECIPE_VIEW}, name
        assert task_args.task == "s5" and args.max_train_depth == 8 and args.max_train_seconds == 7200
        fine_tune = {"self_distill_stretch_ft": 1000, "halting_from_labels": 2000}
        assert args.max_steps == fine_tune.get(name, 10_000), name
        # from-scratch rows stop once two probes in a row reach 99%; fine-tuning rows start near it and run on
        assert task_args.probe_stop_accuracy == (None if spec.init_from else 0.99), name
        assert task_args.probe_stop_patience == 2, name
        assert args.save_strategy == "steps" and args.save_steps == 250 and args.restore_callback_states_from_checkpoint
        assert (task_args.probe_depth, task_args.probe_n, task_args.probe_every_steps) == (8, 256, 250)
        assert task_args.self_distillation == (spec.group == "self_distill"), name
        assert (args.depth_schedule == "hold") == (spec.group == "halting"), name
        assert (args.halting_loss_weight == 0.5) == (spec.group == "halting" and name != "halting_noloss"), name
        assert task_args.eval_halting == (args.halting_loss_weight > 0) == spec.halting, name
        change = name[len(spec.group) + 1:]
        if change.startswith("lr"):
            assert args.learning_rate == float(change[2:]) and args.adapter_learning_rate == 2 * args.learning_rate
        if change == "width192":
            assert (model_args.hidden_size, model_args.intermediate_size) == (192, 384)
        if change == "pace25":
            assert (args.curriculum_start_depth, args.curriculum_every_steps) == (2, 25)
        if change.startswith("ema"):
            assert args.ema_decay == float(change[3:])
        if name == "self_distill_stretch_ft":
            assert args.stretch_steps == args.max_steps and args.stretch_max_scale == 8
        if spec.init_from is not None:
            with pytest.raises(SystemExit, match=f"fine-tunes the trained {spec.init_from} row"):
                study.train_flags(name, 12345)  # no trained parent for that seed
    assert study.left_chance_step([{"step": 0, "accuracy": 0.0}, {"step": 250, "accuracy": 0.099},
                                   {"step": 500, "accuracy": 0.1}, {"step": 750, "accuracy": 0.0}]) == 500
    assert study.left_chance_step([{"step": 0, "accuracy": 0.05}]) is None
    with pytest.raises(ValueError, match="need --probe_depth"):  # probe settings without a probe change nothing
        train_par.main(TINY + ["--output_dir", "x", "--probe_every_steps", "10"])


def test_s5_breakthrough_tiny_trains_resumes_and_collects(tmp_path, monkeypatch, request):
    """The study end to end at --tiny scale: a row trains with probes at steps 0, 2, 4 and checkpoints; run again after
    an interruption it resumes from the newest checkpoint (two segments on record, the probes of both in one curve);
    --collect writes the README table and the curve plot. The first segment is a fresh process, as a study runs a
    row; the resumed one runs in this process with the command on record (`scripts_in_process`)."""
    study = load_example("examples/studies/s5_breakthrough.py")
    monkeypatch.setattr(study, "TINY_RUN_DIR", tmp_path / "runs")
    monkeypatch.setattr(study, "TINY_OUT", tmp_path / "study")
    study.main(["--run", "labels", "--seed", "0", "--tiny"])
    folder = study.run_path("labels", 0, tiny=True)
    first = json.loads(study.record_path("labels", 0, tiny=True).read_text())
    assert [p["step"] for p in first["curve"]] == [0, 2, 4] and first["steps"] == 4
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in first["curve"]) and (folder / "checkpoint-4").is_dir()
    assert first["final_probe_accuracy"] == first["curve"][-1]["accuracy"]  # the final test at d = 8: the probe set
    assert "--probe_depth 8" in first["train_commands"][0] and "--max_train_seconds 7200" in first["train_commands"][0]

    (folder / "summary.json").unlink()  # as if the segment had been cut off before the end
    monkeypatch.setattr(study, "TINY_STEPS", 6)
    in_process = request.getfixturevalue("scripts_in_process")  # from here on, train_par.py runs in this process
    study.main(["--run", "labels", "--seed", "0", "--tiny", "--collect"])
    record = json.loads(study.record_path("labels", 0, tiny=True).read_text())
    assert ["python " + " ".join(command) for command in in_process] == record["train_commands"][1:]
    assert [s["resumed_from"] for s in record["segments"]] == [None, "checkpoint-4"]
    assert "--resume_from_checkpoint" in record["train_commands"][1]
    assert [p["step"] for p in record["curve"]] == [0, 2, 4, 6] and record["steps"] == record["max_steps"] == 6
    assert record["curve"][:3] == first["curve"]  # the first segment's probes come back with the checkpoint
    before = record["segments"][1]["trained_seconds_before"]
    assert before > 0 and record["train_seconds"] == round(before + record["segments"][1]["wall_seconds"], 1)
    assert record["stopped_by"] == "max_steps" and record["probe"]["left_chance_threshold"] == 0.1
    readme = (tmp_path / "study" / "README.md").read_text()
    assert "| `labels` | labels | baseline: forced depth + step labels | 0 | 6 |" in readme
    assert "Not run yet: `halting`, `self_distill`" in readme and "EMA warm-up" in readme
    assert (tmp_path / "study" / "accuracy_vs_step.png").is_file()
