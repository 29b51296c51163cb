"""Export a PAR checkpoint as a Hub-ready folder and, when asked, push it.

    python examples/push_to_hub.py --checkpoint checkpoints/par-swap-s5-small --output-dir /tmp/export
    python examples/push_to_hub.py --checkpoint DIR --output-dir /tmp/export --repo-id you/par-swap-s5 --push

The folder holds safetensors weights, a config with `auto_map`, the two remote-code files, the tokenizer,
the task spec (if the checkpoint has one) and the rendered model card (hub_card.md) as README.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from modeling_par import ParLoopedQwenForStateTracking  # noqa: E402

CARD_TEMPLATE = REPO_ROOT / "hub_card.md"
EXTRA_FILES = ("state_tracking_task.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "chat_template.jinja")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def render_card(model, repo_id: str, results_markdown: str | None = None, training_data: str | None = None,
                limits: str | None = None) -> str:
    """Fill `hub_card.md`'s {{placeholders}}; an unknown placeholder is an error, not a blank."""
    c = model.config
    values = {
        "model_name": repo_id.split("/")[-1],
        "repo_id": repo_id,
        "prelude_layers": c.prelude_layers, "core_layers": c.core_layers, "coda_layers": c.coda_layers,
        "step_size": c.step_size, "norm_anchoring": "on" if c.norm_anchoring else "off",
        "num_candidates": len(c.answer_token_ids), "halt_threshold": c.halt_threshold,
        "halt_confirm": c.halt_confirm, "halt_window": c.halt_window, "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "vocab_size": c.vocab_size, "grad_window": c.grad_window, "max_iterations": c.max_iterations,
        "num_parameters": f"{sum(p.numel() for p in model.parameters()):,}",
        "loop_view": c.loop_view, "progress_positions": "on" if c.progress_positions else "off",
        "bidirectional_queries": "on" if c.bidirectional_queries else "off",
        "training_data": training_data or "Not stated by the exporter.",
        "results": results_markdown or "No results were attached to this export.",
        "limits": limits or "Trained from the configuration above; see the training data section.",
    }
    template = CARD_TEMPLATE.read_text()
    missing = sorted(set(re.findall(r"{{(\w+)}}", template)) - set(values))
    if missing:
        raise ValueError(f"hub_card.md has placeholders the exporter does not fill: {missing}")
    return re.sub(r"{{(\w+)}}", lambda m: str(values[m.group(1)]), template)


def results_section(intro: str, depths: list[int], rows: dict[str, list[float]], halting: dict | None = None,
                    curve: list[dict] | None = None) -> str:
    """A card's results in markdown: `intro`, one accuracy row (%) per label over `depths`, the halting iterations
    (an evaluator's `per_depth` rows) and the training curve (loss, last-iteration accuracy, curriculum depth)."""
    lines = [intro, "", "| mode | " + " | ".join(f"d={d}" for d in depths) + " |", "|---|" + "---|" * len(depths)]
    for label, accuracy in rows.items():
        cells = [f"{100 * a:.1f}" for a in accuracy] + ["–"] * (len(depths) - len(accuracy))  # '–': stop rule
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if halting:
        lines += ["", "Learned halting: mean iterations " + ", ".join(
            f"d={p['depth']}: {p['mean_iterations']:.1f}" for p in halting) + "; never halted: " + ", ".join(
            f"{100 * p['fraction_not_halted']:.1f}%" for p in halting) + "."]
    if curve:
        lines += ["", "Training curve (loss, readout accuracy at the last iteration, curriculum depth):", "",
                  "| step | loss | acc (last iteration) | max depth |", "|---|---|---|---|"]
        lines += [f"| {c['step']} | {c['loss']:.4g} | {c.get('acc_last_iteration', float('nan')):.3f} | "
                  f"{c.get('curriculum_max_depth', '')} |" for c in curve]
    return "\n".join(lines) + "\n"


def export_for_hub(checkpoint: str | Path, output_dir: str | Path, repo_id: str | None = None,
                   dtype: str | None = None, results: str | Path | None = None,
                   training_data: str | None = None, limits: str | None = None) -> Path:
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    if not (checkpoint / "config.json").is_file():
        raise ValueError(f"--checkpoint must be a folder with config.json; {checkpoint} has none.")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}; got {dtype!r}.")
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ValueError(f"--output-dir {output_dir} exists and is not empty; give a new folder.")
    model = ParLoopedQwenForStateTracking.from_pretrained(checkpoint)
    if dtype is not None:
        model = model.to(DTYPES[dtype])
    model.save_pretrained(output_dir, safe_serialization=True)
    for name in TOKENIZER_FILES + EXTRA_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, output_dir / name)
    results_markdown = None
    if results is not None:
        results = Path(results)
        results_markdown = results.read_text() if results.suffix == ".md" else (
            "```json\n" + json.dumps(json.loads(results.read_text()), indent=1)[:4000] + "\n```")
    card = render_card(model, repo_id or f"local/{checkpoint.name}", results_markdown, training_data, limits)
    (output_dir / "README.md").write_text(card)
    return output_dir


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a folder written by save_pretrained")
    parser.add_argument("--output-dir", required=True, help="a new folder for the export")
    parser.add_argument("--repo-id", default=None, help="Hub repository, e.g. you/par-swap-s5")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast the weights before saving")
    parser.add_argument("--results", default=None, help="a results .md (inserted) or .json (quoted) for the card")
    parser.add_argument("--training-data", default=None, help="one paragraph for the card")
    parser.add_argument("--limits", default=None, help="one line for the card's limits")
    parser.add_argument("--push", action="store_true", help="upload the export to --repo-id")
    parser.add_argument("--private", action="store_true")
    args = parser.parse_args(argv)
    if args.push and not args.repo_id:
        parser.error("--push needs --repo-id")
    out = export_for_hub(args.checkpoint, args.output_dir, args.repo_id, args.dtype, args.results,
                         args.training_data, args.limits)
    print(f"exported to {out}: {sorted(p.name for p in out.iterdir())}")
    if args.push:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(args.repo_id, private=args.private, exist_ok=True)
        api.upload_folder(folder_path=str(out), repo_id=args.repo_id, commit_message="Upload PAR checkpoint")
        print(f"pushed to https://huggingface.co/{args.repo_id}")


if __name__ == "__main__":
    main()
