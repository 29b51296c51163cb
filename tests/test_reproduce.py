"""The reproduction script end to end at a tiny scale (two runs in parallel, seconds of training)."""

import json
from pathlib import Path

from safetensors import safe_open

from tests.conftest import load_example

REPO = Path(__file__).resolve().parents[1]
swap_s5 = load_example("examples/reproduce/swap_s5.py")

TINY = ("--hidden_size 32 --intermediate_size 64 --num_attention_heads 2 --num_key_value_heads 2 "
        "--per_device_train_batch_size 8 --train_size 2000 --eval_depths 2,8,16 --eval_batch_size 8 "
        "--max_iterations 30")


def test_reproduce_swap_s5_tiny(tmp_path, monkeypatch, scripts_in_process):
    """par_seed0 trains in a fresh process, as the script starts every run; while it runs, par_seed1 and par_halting
    train in this process with the commands the script built (`scripts_in_process`: no second and third start of
    torch and transformers, which cost most of a tiny run)."""
    import subprocess
    from types import SimpleNamespace

    from par_studies import runs

    in_process = runs.subprocess.run  # scripts_in_process's runner: train_par.py's main with the command's argv

    def popen(command, **kwargs):
        if Path(command[command.index("--output_dir") + 1]).name == "par_seed0":
            return subprocess.Popen(command, **kwargs)
        script = str(Path(command[1]).relative_to(REPO))
        done = in_process([command[0], script, *command[2:]], cwd=kwargs["cwd"], stdout=kwargs["stdout"])
        return SimpleNamespace(wait=lambda: done.returncode, returncode=done.returncode)

    monkeypatch.setattr(swap_s5, "subprocess", SimpleNamespace(Popen=popen, STDOUT=subprocess.STDOUT))
    out, work, ckpt = tmp_path / "results", tmp_path / "work", tmp_path / "ckpt"
    swap_s5.main(["--scale", "cpu", "--runs", "par_seed0,par_seed1,par_halting", "--budget_seconds", "1", "--n", "8",
                  "--out", str(out), "--work_dir", str(work), "--checkpoint_dir", str(ckpt), "--extra", TINY])
    assert [Path(command[command.index("--output_dir") + 1]).name for command in scripts_in_process] == \
        ["par_seed1", "par_halting"]
    for run in ("par_seed0", "par_seed1", "par_halting"):
        record = json.loads((out / f"{run}.json").read_text())
        assert record["steps"] >= 1 and record["samples_seen"] == 8 * record["steps"]
        assert record["evaluation"]["forced"]["depths"] == [2, 8, 16]
        assert record["machine"]["torch"] and record["reproduce_command"].startswith("python examples/reproduce")
    halting = json.loads((out / "par_halting.json").read_text())["evaluation"]
    assert set(halting) == {"forced", "halting"}
    report = (out / "README.md").read_text()
    assert "| PAR (recipe) — forced depth (2) |" in report and "learned halting (1)" in report
    assert "95.5 ± 11.0" in report
    assert (out / "accuracy_vs_depth.png").stat().st_size > 1000
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        assert str(f.get_tensor("adapter.weight").dtype) == "torch.bfloat16"
    assert {"modeling_par.py", "configuration_par.py", "tokenizer.json", "state_tracking_task.json",
            "training_summary.json", "README.md"} <= {p.name for p in ckpt.iterdir()}
