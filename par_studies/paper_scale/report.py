"""The dry run's outputs (`examples/reproduce/paper_retrofit.py --dry_run` / `--render`): dry_run.json with the
extrapolations and GPU-scale estimates recomputed from its cases, the peak-memory plot, and the results README
(results/paper_scale_cpu/)."""

from __future__ import annotations

import json
from pathlib import Path

from .flops import QWEN25, extrapolate, scale_estimates


def gb(x) -> str:
    return "—" if x is None else f"{x / 1e9:.2f}"


def write_outputs(record: dict, out: Path) -> None:
    """dry_run.json (with the extrapolations and the GPU-scale estimates recomputed from its cases), the plot, the
    README."""
    shape = {k: record["shape"][k] for k in QWEN25["0.5b"]}
    record["extrapolated"] = extrapolate(record["cases"], tuple(record["shape"]["split"]), shape,
                                         record["prompt_tokens"])
    record["estimates"] = scale_estimates(record)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dry_run.json").write_text(json.dumps(record, indent=2) + "\n")
    plot_memory(record, out / "peak_memory.png")
    (out / "README.md").write_text(readme(record))


def plot_memory(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[str, list] = {}
    optimizer_peaks: list[int] = []
    for entry in record["cases"]:
        case = entry["case"]
        if case["kind"] != "train":
            continue
        label = (f"window {case['window']}" + (" + checkpoint_core" if case.get("checkpoint_core") else "")
                 + (" (bf16 autocast)" if case.get("bf16") else ""))
        if entry.get("status") == "measured":
            step = entry["steps"][-1]
            series.setdefault(label, []).append((case["depth"], step["peak_rss_forward_backward_bytes"],
                                                 step["saved_activation_bytes"], False))
            optimizer_peaks.append(step["peak_rss_optimizer_bytes"])
        elif "predicted" in entry:
            series.setdefault(label, []).append((case["depth"], entry["predicted"]["peak_rss_forward_backward_bytes"],
                                                 entry["predicted"]["saved_activation_bytes"], True))
    for label, rows in sorted(series.items()):
        rows.sort()
        for ax, index in ((axes[0], 1), (axes[1], 2)):
            xs = [r[0] for r in rows]
            ys = [r[index] / 1e9 for r in rows]
            line = ax.plot(xs, ys, marker="o", label=label)[0]
            for x, y, r in zip(xs, ys, rows):
                if r[3]:
                    ax.plot([x], [y], marker="o", markerfacecolor="white", color=line.get_color(), markersize=9)
    if optimizer_peaks:
        axes[0].axhline(max(optimizer_peaks) / 1e9, color="gray", linestyle="--", linewidth=1,
                        label="AdamW step's peak (any d)")
    shape = record["shape"]["name"]
    axes[0].set_title(f"peak RSS, forward + backward, steady step ({shape}, fp32, batch 1)", fontsize=9)
    axes[1].set_title("bytes autograd saves for backward (activations)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("depth d (R = d iterations)")
        ax.set_ylabel("GB")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="open marker: predicted, not run", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# the README's closing paragraph: how to read the figures
README_READING = [
    "", "![peak memory against depth](peak_memory.png)", "",
    "Reading: the gradient window bounds what is kept for backward — the iterations before the window run "
    "without grad, so the saved activations grow with the window and the prompt's length, not with R; "
    "`--checkpoint_core` keeps only each windowed iteration's input (the prelude and the nine coda readouts "
    "still keep theirs). The forward + backward peak is weights, AdamW states, the activations and the "
    "gradients as they fill; the optimizer step has its own peak (weights, gradients, states and AdamW's "
    "foreach temporaries), which no window changes. The saved-activation bytes are the deterministic "
    "figure. FLOPs grow linearly in R (and the prompt's attention quadratically in its length). Full "
    "figures: dry_run.json.", ""
]


def readme(record: dict) -> str:
    """The results README of a dry-run record: the setting, the training steps, the evaluation forwards, the H200
    estimates (when the record has them) and how to read the figures."""
    lines = readme_header(record) + readme_train_rows(record) + readme_eval_rows(record)
    est = record.get("estimates")
    if est:
        lines += readme_estimates(est)
    lines += README_READING
    return "\n".join(lines)


def readme_header(record: dict) -> list[str]:
    """The title, the setting (command, machine, date), the prompt tokens and the training table's heading."""
    m = record["machine"]
    return [
        "# The paper's retrofit at Qwen2.5-0.5B's shape: a dry run on CPU",
        "",
        "Random weights in Qwen2.5-0.5B's published shape (hidden 896, MLP 4,864, 24 layers, 14 heads / 2 KV heads, "
        "vocabulary 151,936, tied embeddings), saved as a Qwen2 folder and retrofitted 8 / 8 / 8 through "
        "`examples/train_par.py`'s own path, then measured step by step in fp32 on CPU, batch 1, each case in a "
        "fresh process. What the figures mean for the real run (GPU hours, memory, 1.5B / 7B, DDP / FSDP): "
        "[docs/paper_scale.md](../../docs/paper_scale.md).",
        "",
        f"Command: `{record['command']}`  ",
        f"Machine: {m['cpu']}, {m['cpu_count']} cores (shared with other jobs: load average "
        f"{', '.join(f'{x:.1f}' for x in m['load_average_at_start'])} at the start), {m['memory_bytes'] / 2**30:.0f} "
        f"GiB memory, torch {m['torch']} with {m['torch_threads']} thread(s), transformers {m['transformers']}; "
        f"{record['date']}; {record['total_wall_seconds'] / 60:.1f} min in all.",
        "",
        "Prompt tokens (Qwen2-style pieces, 64 prompts per depth): " + ", ".join(
            f"d = {d}: {v['mean']:.0f}" for d, v in record["prompt_tokens"].items()) + ".",
        "",
        "## Training steps (R = d, the window's readouts + one extra halting negative, AdamW with the preset's groups)",
        "",
        "Per case two steps on two depth-d problems. FLOPs: the first step, counted by FlopCounterMode through its "
        "backward, beside the analytic count for its tokens. Time, memory and bytes: the second step, without the "
        "counter (AdamW's states exist during it). Peak RSS: VmHWM of the forward + backward, and of the optimizer "
        "step (AdamW's temporaries), "
        "each reset at the phase's start, with glibc serving tensors by mmap (`MALLOC_MMAP_THRESHOLD_=262144`) so that "
        "freed memory leaves the process and the mark follows live memory.",
        "",
        "| case | tokens (step 1 / 2) | s / step | peak RSS GB fwd+bwd / optimizer | params GB | grads GB "
        "| Adam state GB "
        "| saved activations GB | FLOPs / sample (counted) | analytic | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]


def readme_train_rows(record: dict) -> list[str]:
    """One row per training case: measured, or its predicted peak and why it was not run."""
    lines = []
    for entry in record["cases"]:
        case = entry["case"]
        if case["kind"] != "train":
            continue
        if entry.get("status") != "measured":
            p = entry.get("predicted", {})
            lines.append(f"| {entry['name']} | | | {gb(p.get('peak_rss_forward_backward_bytes'))} (predicted) | | | | "
                         f"{gb(p.get('saved_activation_bytes'))} (predicted) | | | {entry['status']}: "
                         f"{entry.get('reason', '')} |")
            continue
        step, first = entry["steps"][-1], entry["steps"][0]
        lines.append(
            f"| {entry['name']} | {' / '.join(str(s['tokens']) for s in entry['steps'])} | "
            f"{', '.join(f'{s:.1f}' for s in entry['seconds_per_step'])} "
            f"| {gb(step['peak_rss_forward_backward_bytes'])} / {gb(step['peak_rss_optimizer_bytes'])} | "
            f"{gb(entry['param_bytes'])} | {gb(step.get('grad_bytes'))} | "
            f"{gb(step.get('optimizer_state_bytes'))} | {gb(step['saved_activation_bytes'])} | "
            f"{first['flops'] / 1e12:.3f} T | {first['analytic_flops']['total'] / 1e12:.3f} T | measured |")
    return lines


def readme_eval_rows(record: dict) -> list[str]:
    """The evaluation table: each measured R of each evaluation case, then the extrapolation to R = d."""
    lines = ["", "## Forced-depth evaluation forwards (no grad), extrapolated to R = d", "",
             "| d | tokens | R | seconds | FLOPs (counted) | analytic | seconds per iteration (hooks) |",
             "|---|---|---|---|---|---|---|"]
    for entry in record["cases"]:
        if entry["case"]["kind"] != "eval":
            continue
        if entry.get("status") != "measured":
            lines.append(f"| {entry['case']['depth']} | | | | | | {entry['status']}: {entry.get('reason', '')} |")
            continue
        for run in entry["runs"]:
            lines.append(f"| {entry['case']['depth']} | {entry['tokens'][0]} | {run['R']} | {run['seconds']:.1f} | "
                         f"{run['flops'] / 1e12:.3f} T | "
                         f"{entry['analytic_flops'][str(run['R'])]['total'] / 1e12:.3f} T "
                         f"| {', '.join(f'{t:.1f}' for t in run['iteration_seconds'])} |")
    for d, e in record["extrapolated"]["evaluation"].items():
        lines.append(f"| {d} | {e['tokens']} | **{d}** (extrapolated) | {e['forced_R_equals_d']['seconds']:.0f} | "
                     f"{e['forced_R_equals_d']['flops'] / 1e12:.1f} T | | {e['seconds_per_iteration']:.1f} per "
                     "iteration (slope) |")
    return lines


def readme_estimates(est: dict) -> list[str]:
    """The H200 section (the record's `estimates`): how the figures are computed, then one row per backbone."""
    lines = ["", "## What this means on an H200 (the arithmetic: docs/paper_scale.md)", "",
             "FLOPs per sample from the analytic count (equal to the counted FLOPs of every measured step: "
             "ratios "
             f"{sorted({round(r, 4) for r in est['counted_over_analytic'].values()})}), prompt tokens T(d) = "
             f"{est['tokens_of_depth']['a']:.0f} + {est['tokens_of_depth']['b']:.2f}·d; hours at "
             f"{' / '.join(f'{int(m * 100)}%' for m in est['mfu_range'])} of {est['peak_flops'] / 1e12:.0f} "
             "TFLOP/s (dense bf16); memory in bf16 autocast over fp32 master weights at the per-device batch.", "",
             "| backbone | split | parameters | training FLOPs (400k samples) | evaluation FLOPs (6 seeds, forced "
             "+ halting) | H200-hours, 6 seeds, train + eval | memory |",
             "|---|---|---|---|---|---|---|"]
    for name, b in est["backbones"].items():
        hours = " / ".join(f"{row['all']:.0f}" for row in b["h200_hours"].values())
        mem = b["memory"]
        lines.append(
            f"| Qwen2.5-{name.upper()} | {'/'.join(map(str, b['split']))} | {b['parameters'] / 1e9:.2f} B | "
            f"{b['train_flops_400k']:.2e} | "
            f"{b['eval_flops_forced_six_seeds'] + b['eval_flops_halting_six_seeds']:.2e}"
            f" | {hours} | {mem['per_gpu_bytes'] / 1e9:.0f} GB per GPU at {mem['per_device_batch']} sequences "
            f"({mem['setting']}) |")
    return lines
