"""examples/reproduce/paper_retrofit.py: the paper's run as one preset, its dry run at a tiny shape (the same code
as the 0.5B run), bad input, and FSDP2 on two CPU processes (gloo) for the retrofitted model."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from par_studies.paper_scale import flops, harness
from tests.conftest import load_example
from trainers.model_setup import PAPER_VIEW, resolve_view

REPO = Path(__file__).resolve().parents[1]
paper_retrofit = load_example("examples/reproduce/paper_retrofit.py")
train_par = load_example("examples/train_par.py")


def qwen2_folder(path: Path, layers: int = 24, model_type: str = "qwen2") -> Path:
    """A folder that looks like a Qwen2 checkpoint to the preset's checks (config.json only)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "num_hidden_layers": layers}))
    return path


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry run on the tiny shape, every case in this process: training at d = 4 and 32 (window 8), window 32 and
    checkpoint_core at d = 32, bf16 autocast at d = 4, evaluation at d = 16 for R = 1, 2."""
    base = tmp_path_factory.mktemp("dry")
    record = paper_retrofit.main(["--dry_run", "--shape", "tiny", "--depths", "4,32", "--windows", "8,32",
                                  "--eval_depths", "16", "--eval_iterations", "1,2", "--bf16_depths", "4",
                                  "--steps", "1", "--inline",
                                  "--out", str(base / "out"), "--work_dir", str(base / "work")])
    return record, base


def cases(record, kind):
    return {entry["name"]: entry for entry in record["cases"] if entry["case"]["kind"] == kind}


def test_dry_run_writes_every_figure(dry_run):
    record, base = dry_run
    saved = json.loads((base / "out" / "dry_run.json").read_text())
    assert saved["cases"] == json.loads(json.dumps(record["cases"]))
    for key in ("command", "date", "machine", "shape", "prompt_tokens", "cases", "extrapolated", "notes",
                "preset_command", "tokenizer"):
        assert key in saved, key
    assert saved["command"].startswith("python examples/reproduce/paper_retrofit.py --dry_run --shape tiny")
    assert {"cpu", "cpu_count", "memory_bytes", "torch", "torch_threads"} <= set(saved["machine"])
    assert saved["shape"]["split"] == [2, 2, 2] and saved["shape"]["saved_dtype"] == "bfloat16"
    assert (base / "out" / "peak_memory.png").stat().st_size > 1000
    readme = (base / "out" / "README.md").read_text()
    assert saved["command"] in readme and "| train d=32 window=8 |" in readme
    train = cases(record, "train")
    assert set(train) == {"train d=4 window=8", "train d=32 window=8", "train d=32 window=32",
                          "train d=32 window=8 checkpoint_core", "train d=4 window=8 bf16"}
    for entry in train.values():
        assert entry["status"] == "measured" and entry["trained"] == 1
        # the retrofit keeps fp32 master weights although the parent folder was saved in bf16
        assert entry["param_dtype"] == "float32"
        step = entry["steps"][0]
        assert step["grad_bytes"] == entry["param_bytes"]  # one fp32 gradient per (tied-once) parameter
        # AdamW: two fp32 moments per parameter, plus one step counter per tensor
        assert 2 * entry["param_bytes"] <= step["optimizer_state_bytes"] <= 2 * entry["param_bytes"] + 4096
        assert step["seconds"] > 0 and entry["peak_rss_bytes"] > entry["param_bytes"]
        # the preset's parameter groups: the adapter at 1e-4, the rest at 2e-5
        lrs = {}
        for group in entry["param_groups"]:
            lrs[group["lr"]] = lrs.get(group["lr"], 0) + group["parameters"]
        assert lrs == {2e-5: entry["parameters"]["total"] - entry["parameters"]["adapter"],
                       1e-4: entry["parameters"]["adapter"]}
    assert train["train d=32 window=8"]["steps"][0]["R"] == 32
    assert train["train d=32 window=8"]["steps"][0]["readouts"] == 9  # the window's 8 + the extra halting negative
    assert saved["prompt_tokens"]["512"]["mean"] > saved["prompt_tokens"]["32"]["mean"] * 10
    # bf16 autocast (the GPU run's precision) keeps the same FLOPs and fewer activation bytes than fp32
    bf16 = saved["extrapolated"]["bf16_autocast"]
    assert bf16["depth"] == 4 and 0.3 < bf16["activation_ratio"] < 1
    assert train["train d=4 window=8 bf16"]["steps"][0]["flops"] == train["train d=4 window=8"]["steps"][0]["flops"]


def test_flop_counter_matches_the_analytic_count(dry_run):
    """FlopCounterMode (with CPU flash attention registered) against `analytic_flops`, forward and training. Both use
    the 2·m·n·k convention over the same products, so on this torch they agree exactly; the 1% tolerance allows a
    different kernel route for the attention products (counted by another formula) while a missing or doubled
    layer pass (≥ 1/36 of a step at the 2 + 2 + 2 split) still fails."""
    record, _ = dry_run
    for entry in cases(record, "train").values():
        step = entry["steps"][0]
        analytic = step["analytic_flops"]
        assert step["flops"] == pytest.approx(analytic["total"], rel=0.01), entry["name"]
        assert step["forward_flops"] == pytest.approx(analytic["forward"], rel=0.01), entry["name"]
    for entry in cases(record, "eval").values():
        for run in entry["runs"]:
            assert run["flops"] == pytest.approx(entry["analytic_flops"][str(run["R"])]["total"], rel=0.01)
    # and the counter itself sees the attention products (registered for the CPU kernel), not only the matmuls
    shape = record["shape"]
    layer = flops.layer_flops(shape, 100)
    assert layer["attention"] == 4 * 100 * 100 * shape["hidden_size"]


def test_gradient_window_bounds_activation_memory(dry_run):
    """At d = 32 the window, not R, sets what autograd keeps: window 8 saves fewer bytes and runs fewer backward
    FLOPs than window 32 (all 32 iterations); checkpoint_core saves fewer still and pays one recomputed forward of
    the window. Saved-tensor bytes and FLOPs are deterministic (RSS is not asserted)."""
    record, _ = dry_run
    train = cases(record, "train")
    w8, w32 = train["train d=32 window=8"]["steps"][0], train["train d=32 window=32"]["steps"][0]
    ckpt = train["train d=32 window=8 checkpoint_core"]["steps"][0]
    assert w8["saved_activation_bytes"] < 0.5 * w32["saved_activation_bytes"]
    assert ckpt["saved_activation_bytes"] < 0.75 * w8["saved_activation_bytes"]
    backward = {name: s["flops"] - s["forward_flops"] for name, s in (("w8", w8), ("w32", w32), ("ckpt", ckpt))}
    assert backward["w8"] < 0.5 * backward["w32"]
    assert backward["ckpt"] - backward["w8"] == ckpt["analytic_flops"]["recompute"] > 0
    assert w8["forward_flops"] == ckpt["forward_flops"]
    # bytes per kept layer pass are the same whatever the window (the prediction used for cases not run)
    split = (2, 2, 2)
    per_pass = [s["saved_activation_bytes"] / flops.grad_layer_passes(split, 32, w)
                for s, w in ((w8, 8), (w32, 32))]
    assert per_pass[0] == pytest.approx(per_pass[1], rel=0.1)


def test_evaluation_is_linear_in_the_iterations(dry_run):
    record, _ = dry_run
    (entry,) = cases(record, "eval").values()
    ext = record["extrapolated"]["evaluation"]["16"]
    lin = ext["linearity"]
    assert lin["every_iteration_same_flops"] and lin["slope_is_one_iteration"]
    assert ext["flops_per_iteration"] == lin["analytic_core_iteration"]
    one, two = entry["runs"]
    assert ext["forced_R_equals_d"]["flops"] == one["flops"] + 15 * ext["flops_per_iteration"]
    assert ext["status"] == "extrapolated" and entry["status"] == "measured"


def test_tokenizer_is_qwens_class_with_one_token_per_piece(dry_run):
    from transformers import AutoTokenizer

    from state_tracking import get_task, model_token_ids

    _, base = dry_run
    tokenizer = AutoTokenizer.from_pretrained(base / "work" / "qwen2-tiny-random")
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    pieces = tokenizer.convert_ids_to_tokens(tokenizer(" Swap the contents of Box 3 and Box 5.")["input_ids"])
    assert pieces == ["ĠSwap", "Ġthe", "Ġcontents", "Ġof", "ĠBox", "Ġ", "3", "Ġand", "ĠBox", "Ġ", "5", "."]
    ids = model_token_ids(tokenizer, get_task("swap_s5"))
    assert len(ids["answer_token_ids"]) == 5 and ids["pad_token_id"] == tokenizer.convert_tokens_to_ids("<|endoftext|>")


def test_print_command_holds_every_preset_flag(tmp_path, capsys):
    folder = qwen2_folder(tmp_path / "qwen")
    paper_retrofit.main(["--init_from_parent", str(folder), "--print_command"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("python examples/train_par.py --init_from_parent ")
    argv = shlex.split(line)[2:]
    flags = paper_retrofit.parse_flags(argv)  # (an error if a flag came twice)
    assert len(flags) == len(argv) // 2 == len(paper_retrofit.PRESET) + 1
    for flag, value in paper_retrofit.PRESET.items():
        assert flags[flag] == paper_retrofit.flag_value(value), flag
    assert flags["--init_from_parent"] == str(folder)
    paper_retrofit.main(["--init_from_qwen2", str(folder), "--print_command"])  # the old name, an alias
    assert capsys.readouterr().out.strip() == line
    assert int(flags["--per_device_train_batch_size"]) * int(flags["--gradient_accumulation_steps"]) * int(
        flags["--max_steps"]) == 400_000
    # another seed gets its own folder; flags after the script's own win
    paper_retrofit.main(["--init_from_qwen2", str(folder), "--print_command", "--seed", "3", "--max_steps", "10"])
    flags = paper_retrofit.parse_flags(shlex.split(capsys.readouterr().out)[2:])
    assert (flags["--seed"], flags["--output_dir"], flags["--max_steps"]) == ("3", "runs/paper_retrofit/s3", "10")
    # train_par.py accepts the command as it is: the paper's values reach its arguments
    model_args, task_args, _, train_args, _ = train_par.parse_all_args(argv + ["--use_cpu", "true"])
    assert (model_args.prelude_layers, model_args.core_layers, model_args.coda_layers) == (8, 8, 8)
    assert model_args.grad_window == 8 and resolve_view(model_args) == PAPER_VIEW
    assert (train_args.learning_rate, train_args.adapter_learning_rate, train_args.warmup_steps) == (2e-5, 1e-4, 200)
    assert train_args.halting_loss_weight == 0.5 and train_args.depth_schedule == "hold"
    assert (train_args.min_train_depth, train_args.max_train_depth, train_args.curriculum_start_depth) == (1, 32, 32)
    assert task_args.rendering == "text" and task_args.eval_n == 1024 and task_args.eval_halting


@pytest.mark.parametrize("argv, message", [
    ([], "--init_from_parent is required for a run"),
    (["--init_from_parent", "{tmp}/absent"], "is not a folder"),
    (["--init_from_parent", "{tmp}/empty"], "has no config.json"),
    (["--init_from_qwen2", "{tmp}/llama"], "holds model_type 'llama'"),
    (["--init_from_qwen2", "{tmp}/qwen28"], "has num_hidden_layers = 28"),
    (["--dry_run", "--depths", "0,8"], "--depths must be comma-separated integers >= 1"),
    (["--dry_run", "--eval_iterations", "4"], "--eval_iterations needs two or more R"),
    (["--dry_run", "--max_steps", "3"], "--dry_run takes no train_par.py flags"),
    (["--init_from_qwen2", "{tmp}/qwen28", "--max_steps", "3", "--max_steps", "4"], "--max_steps is given twice"),
])
def test_bad_input_gives_one_clear_error(tmp_path, argv, message):
    (tmp_path / "empty").mkdir()
    qwen2_folder(tmp_path / "llama", model_type="llama")
    qwen2_folder(tmp_path / "qwen28", layers=28)
    with pytest.raises(SystemExit, match=message):
        paper_retrofit.main([a.replace("{tmp}", str(tmp_path)) for a in argv])


def test_another_split_is_checked_against_the_folder(tmp_path, capsys):
    """A 28-layer backbone (Qwen2.5-1.5B / 7B) runs with its own split given after the script's flags."""
    folder = qwen2_folder(tmp_path / "q15", layers=28)
    paper_retrofit.main(["--init_from_qwen2", str(folder), "--print_command", "--prelude_layers", "10",
                         "--core_layers", "8", "--coda_layers", "10"])
    flags = paper_retrofit.parse_flags(shlex.split(capsys.readouterr().out)[2:])
    assert (flags["--prelude_layers"], flags["--core_layers"], flags["--coda_layers"]) == ("10", "8", "10")


FSDP_WORKER = '''
import json, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from tests.conftest import make_model
import transformers.models.qwen2.modeling_qwen2 as qwen2

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
unit = getattr(qwen2, sys.argv[1])  # the shard unit the accelerate config names, and its resharding choice
reshard = sys.argv[2] == "True"
model = make_model(seed=0, loop_view="full", grad_window=3).train()
reference = make_model(seed=0, loop_view="full", grad_window=3).train()
total = sum(p.numel() for p in model.parameters())
for module in model.modules():
    if isinstance(module, unit):
        fully_shard(module, reshard_after_forward=reshard)
fully_shard(model, reshard_after_forward=reshard)
ids = torch.randint(1, 40, (2 * world, 12), generator=torch.Generator().manual_seed(1))

def loss_of(m, x):  # R = 5 > window 3: two no-grad iterations, the shared core called 5 times, 3 readouts
    out = m(input_ids=x, num_iterations=5, readout_iterations=[3, 4, 5])
    return out.answer_logits.pow(2).mean() + out.halt_logits.pow(2).mean()

loss_of(model, ids[2 * rank: 2 * rank + 2]).backward()
sum(loss_of(reference, ids[2 * r: 2 * r + 2]) for r in range(world)).div(world).backward()
worst = max(((p.grad.full_tensor() - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-12)).item()
            for p, q in zip(model.parameters(), reference.parameters()))
local = sum(p.to_local().numel() for p in model.parameters())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
optimizer.step()
state = sum(v.to_local().numel() for s in optimizer.state.values() for v in s.values() if v.dim() > 0)
# one file per rank: the two processes' stdout lines can interleave on one line under torch.distributed.run
with open(f"{sys.argv[3]}/rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "worst": worst, "local": local, "total": total, "state": state,
               "sharded": type(next(model.parameters())).__name__}, f)
dist.barrier()
dist.destroy_process_group()
'''


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with the gloo backend is not available")
def test_fsdp2_shards_the_retrofitted_model_on_two_cpu_processes(tmp_path):
    """FSDP2 (`fully_shard` on every decoder layer named by accelerate_fsdp.yaml, then the root) on two gloo
    processes: the same gradients as one unsharded model on the whole batch (the weight-shared core is gathered at
    each of its 5 calls), each rank holding about half of the parameters and of AdamW's states. (The HF Trainer cannot
    take this path on a CPU: accelerate enables FSDP only for accelerator backends and trains DDP instead.)"""
    config = yaml.safe_load((REPO / "examples" / "reproduce" / "accelerate_fsdp.yaml").read_text())
    fsdp = config["fsdp_config"]
    assert config["distributed_type"] == "FSDP" and fsdp["fsdp_version"] == 2
    unit = fsdp["fsdp_transformer_layer_cls_to_wrap"]
    worker = tmp_path / "fsdp_worker.py"
    worker.write_text(FSDP_WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                           str(worker), unit, str(fsdp["fsdp_reshard_after_forward"]), str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    for row in rows:
        assert row["sharded"] == "DTensor" and row["worst"] < 1e-4
        assert 0.4 * row["total"] < row["local"] < 0.6 * row["total"]
        assert row["state"] == 2 * row["local"]
    assert sum(r["local"] for r in rows) == rows[0]["total"]


def test_a_run_passes_every_flag_it_does_not_own_through(tmp_path, capsys):
    """In a run the wrapper owns only --init_from_parent (or its old name), --seed, --print_command: --eval_depths (a
    dry-run flag of the same name) and --bf16 (once an abbreviation of --bf16_depths) reach train_par.py unchanged."""
    folder = qwen2_folder(tmp_path / "qwen")
    command = paper_retrofit.main(["--init_from_qwen2", str(folder), "--print_command", "--eval_depths", "32,64",
                                   "--bf16", "false", "--eval_halting=false"])
    flags = dict(zip(command[::2], command[1::2]))
    assert flags["--eval_depths"] == "32,64" and flags["--bf16"] == "false" and flags["--eval_halting"] == "false"
    with pytest.raises(SystemExit):
        paper_retrofit.main(["--dry_run", "--bf16", "4"])  # no abbreviation in the dry run either


def test_a_killed_run_continues_from_its_newest_checkpoint_and_deletes_nothing(tmp_path):
    """Run the same command again after an interruption: it resumes from the newest checkpoint of its output folder
    (the earlier checkpoints stay, save_total_limit rotates the continued run's); a finished run is refused."""
    parent = tmp_path / "parent"
    harness.make_parent(parent, "tiny")
    out = tmp_path / "out"
    argv = ["--init_from_qwen2", str(parent), "--prelude_layers", "2", "--core_layers", "2", "--coda_layers", "2",
            "--max_train_depth", "3", "--curriculum_start_depth", "3", "--max_steps", "4", "--save_steps", "2",
            "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--warmup_steps", "0",
            "--bf16", "false", "--eval_depths", "3", "--eval_n", "4", "--eval_batch_size", "4", "--logging_steps", "1",
            "--output_dir", str(out), "--use_cpu", "true", "--disable_tqdm", "true", "--max_grad_norm", "1.0"]
    first = paper_retrofit.main(argv)
    assert first["steps"] == 4 and sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    with pytest.raises(SystemExit, match="holds a finished run"):
        paper_retrofit.main(argv)
    (out / "summary.json").unlink()  # as if killed after checkpoint-2 was written
    import shutil

    shutil.rmtree(out / "checkpoint-4")
    second = paper_retrofit.main(argv)
    assert "--resume_from_checkpoint" in second["command"] and "checkpoint-2" in second["command"]
    assert second["steps"] == 4
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert [row["step"] for row in second["curve"]] == [1, 2, 3, 4]  # steps 1-2 from the checkpoint, not trained again


def test_print_command_false_runs_the_command_with_no_stray_value(tmp_path, capsys, monkeypatch):
    """`--print_command false` (also `=false`, `no`) runs train_par.py instead of printing, and the value is the
    wrapper's: it was read as a bare --print_command, and `false` reached train_par.py as a stray positional."""
    from types import SimpleNamespace

    assert paper_retrofit.split_run_argv(["--print_command", "false", "--max_steps", "3"]) == (
        ["--print_command", "false"], ["--max_steps", "3"])
    assert paper_retrofit.split_run_argv(["--print_command", "--max_steps", "3"]) == (
        ["--print_command"], ["--max_steps", "3"])
    folder = qwen2_folder(tmp_path / "qwen")
    ran = []
    monkeypatch.setattr(paper_retrofit, "load_train_par", lambda: SimpleNamespace(main=ran.append))
    common = ["--init_from_qwen2", str(folder), "--output_dir", str(tmp_path / "run"), "--max_steps", "3"]
    printed = paper_retrofit.main(["--print_command", "true", *common])
    assert capsys.readouterr().out.startswith("python examples/train_par.py") and not ran
    assert paper_retrofit.parse_flags(printed)["--max_steps"] == "3"  # flag / value pairs: no stray positional
    for flag in (["--print_command", "false"], ["--print_command=false"], ["--print_command", "no"]):
        paper_retrofit.main([*flag, *common])
        assert capsys.readouterr().out == "" and ran[-1] == printed  # run: the command printing shows
    assert len(ran) == 3
