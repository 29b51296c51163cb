"""examples/reproduce/batch_process_text.py end to end at tiny scale: train, evaluate per phrasing, diagnose, export
with the pipeline, check raw strings through it in a package-blocked process, collect."""

import json

from tests.conftest import load_example


def test_batch_process_text_tiny_end_to_end(tmp_path, scripts_in_process):
    """train_par.py runs in this process with the command the record shows (`scripts_in_process`); the pipeline
    check is still the fresh, package-blocked process."""
    script = load_example("examples/reproduce/batch_process_text.py")
    script.main(["--tiny", str(tmp_path), "--row", "random_start", "--steps", "6", "--export", "random_start",
                 "--collect"])
    record = json.loads((tmp_path / "results" / "runs" / "random_start_s0.json").read_text())
    assert ["python " + " ".join(command) for command in scripts_in_process] == record["train_commands"]
    assert set(record["evaluation"]) == {f"{p}/{m}" for p in ("canonical", "seen", "held_out")
                                         for m in ("forced", "halting")}
    assert "--random_initial true" in record["train_commands"][0] and record["steps"] == 6
    diagnosis = record["diagnosis"]
    assert len(diagnosis["profile"]) == 64 and diagnosis["n"] == 16
    assert sum(diagnosis["first_wrong_transition"].values()) == diagnosis["wrong_samples"]
    assert abs(sum(record["train_state_visits"].values()) - 1) < 1e-3
    check = record["pipeline_check"]["by_phrasing"]
    assert set(check) == {"canonical", "seen", "held_out"} and all(v["n"] == 16 for v in check.values())
    assert all(v["mode"] == "learned halting" for v in check.values())
    checkpoint = tmp_path / "checkpoint"
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["learned_halting"] is True and config["prompt_format"]["rendering"] == "text"
    trained = config["prompt_format"]["trained"]  # what the 6 x 64 training prompts used, kept through the export
    held_out = {options[-1] for options in config["prompt_format"]["operations"].values()}
    assert trained["operations"] and not held_out & {u for units in trained["operations"].values() for u in units}
    assert "n=384, depths=(1, 8), seed=0, random_initial=True" in trained["source"]
    assert "state-tracking" in config["custom_pipelines"]
    card = (checkpoint / "README.md").read_text()
    assert "model-index:" in card and "held-out phrasing" in card
    readme = (tmp_path / "results" / "README.md").read_text()
    assert "| random_start | 0 | held_out | forced |" in readme and "Pipeline check" in readme
