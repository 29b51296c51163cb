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


def test_reproduce_swap_s5_tiny(tmp_path):
    out, work, ckpt = tmp_path / "results", tmp_path / "work", tmp_path / "ckpt"
    swap_s5.main(["--scale", "cpu", "--runs", "par_seed0,par_seed1,par_halting", "--budget_seconds", "1", "--n", "8",
                  "--out", str(out), "--work_dir", str(work), "--checkpoint_dir", str(ckpt), "--extra", TINY])
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
