"""Export a PAR checkpoint as a Hub-ready folder and, when asked, push it.

    python examples/push_to_hub.py --checkpoint checkpoints/par-swap-s5-small --output_dir export/par-swap-s5-small
    python examples/push_to_hub.py --checkpoint DIR --output_dir export/par-swap-s5 --repo_id you/par-swap-s5 --push

The folder holds safetensors weights, a config with `auto_map`, the remote code (the modules the config names and
those they import, written from modeling_par/ by scripts/sync_remote_code.py), the tokenizer, the task spec (if the
checkpoint has one) and the rendered model card (hub_card.md) as README.md.

Measured accuracies also go into the card's YAML front matter as `model-index` (the Hub's structured results,
shown on the model page): from `measured=` (see `model_index`), or from `--results` when that is an evaluator
JSON (examples/evaluate_par.py --out). A card with no measured numbers has no model-index. A run of
`train_par.py --train_file ...` (a records run) needs neither: its card is titled by its task, carries the
accuracy per length of each evaluated split as text and `model-index`, and its data section names the files, the
record counts, the columns and the vocabulary (`records_run`, from the run's summary.json and eval_*.json).

Re-exporting a checkpoint whose folder already has a card written from `hub_card.md` (every checkpoint this script
or `train_par.py` exported) keeps that card's results, `model-index`, training data and limits unless new ones are
given; a card that does not follow the template is reported and not carried.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import torch
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from modeling_par import ParLoopedQwenForStateTracking  # noqa: E402
from modeling_par.record_format import load_prompt_format  # noqa: E402
from par_cli.cli import require_file, run_cli  # noqa: E402
from par_cli.flag_values import true_or_false  # noqa: E402
from scripts.sync_remote_code import write_remote_code  # noqa: E402

CARD_TEMPLATE = REPO_ROOT / "hub_card.md"
EXTRA_FILES = ("state_tracking_task.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "chat_template.jinja")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODE_LABELS = {"forced": "forced depth (R = d)", "halting": "learned halting (no R given)"}  # evaluator mode -> row
NO_MODEL_INDEX = "# no model-index: no measured results were attached to this export"


def model_index(model_name: str, measured: dict | list[dict] | None) -> list[dict] | None:
    """The card's `model-index` (spec: huggingface/hub-docs modelcard.md), or None when nothing was measured.

    `measured`: {"task": name, "depths": [d, ...], "rows": {mode label: [accuracy (fraction) per depth, ...]},
    optional "train_max_depth", "n_sequences", "task_spec" (the spec file in the repo), "split" (the dataset split
    evaluated, e.g. a records run's "test"), "n_by_depth" (sequences per depth where they differ, as a records split's
    lengths do)}, or a list of them (one per split); a row may be shorter than `depths` (a stop rule ended its sweep),
    the same convention as `results_section`. One result per split and test depth with at least one number: task
    `state-tracking`; dataset = the task (type `par-state-tracking/<task>`, config `d<depth>`, the split if given — the
    Hub tells results apart by task, dataset type, config and split, not by args — and args test_depth,
    train_max_depth, n_sequences, task_spec); one `accuracy` metric per mode measured at that depth: overall state
    accuracy (all queries right) in percent, 2 decimals, as the metric name says."""
    blocks = [] if not measured else [measured] if isinstance(measured, dict) else list(measured)
    results = [result for block in blocks for result in _index_results(block)]
    return [{"name": model_name, "results": results}] if results else None


def _index_results(measured: dict) -> list[dict]:
    """`model_index`'s results for one `measured` block."""
    if not any(measured["rows"].values()):
        return []
    task, depths, train_depth = measured.get("task"), list(measured["depths"]), measured.get("train_max_depth")
    if not task:
        raise ValueError("measured results need a task name (measured['task']); it names the model-index dataset.")
    for label, accuracy in measured["rows"].items():
        if len(accuracy) > len(depths) or not all(0 <= a <= 1 for a in accuracy):
            raise ValueError(f"row {label!r}: expected at most {len(depths)} accuracies in [0, 1], got {accuracy}")
    n_by_depth = measured.get("n_by_depth")
    if n_by_depth is not None and len(n_by_depth) != len(depths):
        raise ValueError(f"n_by_depth: expected one count per depth ({len(depths)}), got {n_by_depth}")
    args = {k: measured[k] for k in ("train_max_depth", "n_sequences", "task_spec") if measured.get(k) is not None}
    split = {"split": measured["split"]} if measured.get("split") else {}
    results = []
    for i, depth in enumerate(depths):
        scale = f" ({depth / train_depth:g}x)" if train_depth else ""
        metrics = [{"type": "accuracy", "value": round(100 * float(accuracy[i]), 2),
                    "name": f"overall state accuracy (%), {label}, d = {depth}{scale}"}
                   for label, accuracy in measured["rows"].items() if i < len(accuracy)]
        if metrics:
            depth_args = {"test_depth": int(depth), **args}
            if n_by_depth is not None:
                depth_args["n_sequences"] = int(n_by_depth[i])
            results.append({"task": {"type": "state-tracking", "name": "State tracking"},
                            "dataset": {"type": f"par-state-tracking/{task}", "name": task, "config": f"d{depth}",
                                        **split, "args": depth_args},
                            "metrics": metrics})
    return results


def card_fields(card: str) -> dict[str, str] | None:
    """The values a card written from `hub_card.md` was filled with ({placeholder: text}), read back by matching the
    template (its literal text as is, each {{placeholder}} as any text); None when the card does not follow it."""
    template = CARD_TEMPLATE.read_text()
    pattern, seen = [], set()
    for i, piece in enumerate(re.split(r"{{(\w+)}}", template)):
        if i % 2 == 0:
            pattern.append(re.escape(piece))
        else:
            pattern.append(f"(?P={piece})" if piece in seen else f"(?P<{piece}>.*?)")
            seen.add(piece)
    match = re.fullmatch("".join(pattern), card, flags=re.DOTALL)
    return None if match is None else match.groupdict()


def carried_card(checkpoint: Path) -> dict | None:
    """What a re-export keeps from the checkpoint's own card (README.md): {"results", "training_data", "limits",
    "model_index" (the front matter's `model-index` list, or None)}; None when there is no card. A card that does not
    follow `hub_card.md` is reported on stderr and carries nothing."""
    path = checkpoint / "README.md"
    if not path.is_file():
        return None
    fields = card_fields(path.read_text())
    if fields is None:
        print(f"push_to_hub: {path} does not follow hub_card.md; its results and model-index are not carried "
              "(give --results to attach results).", file=sys.stderr)
        return None
    index = None
    if fields["model_index"] != NO_MODEL_INDEX:
        index = (yaml.safe_load(fields["model_index"]) or {}).get("model-index")
    return {"results": fields["results"], "training_data": fields["training_data"], "limits": fields["limits"],
            "model_index": index}


def segmentation_rule(prompt_format: dict | None) -> str:
    """How the checkpoint finds its operations in raw input, in the card's words (from `config.prompt_format`)."""
    if not prompt_format:
        return "none recorded: the caller passes operation_ends"
    delimiter = prompt_format.get("delimiter")
    if prompt_format.get("rendering") == "records":
        return ("a list of operation strings, or one string split at " +
                (f"the delimiter {delimiter!r}" if delimiter else "whitespace"))
    if prompt_format.get("rendering") == "text":
        return f"one operation per piece between matches of {delimiter!r}" if delimiter else \
            "one operation per sentence"
    return "one token per operation"


def render_card(model, repo_id: str, results_markdown: str | None = None, training_data: str | None = None,
                limits: str | None = None, measured: dict | list[dict] | None = None,
                index: list[dict] | None = None, model_name: str | None = None) -> str:
    """Fill `hub_card.md`'s {{placeholders}}; an unknown placeholder is an error, not a blank. `measured` (see
    `model_index`) becomes the front matter's `model-index`; `index` (an existing `model-index` list, e.g. a source
    card's) is used as is, renamed to this model, when nothing is measured. `model_name` (the title and the
    model-index name) defaults to the repository's name."""
    c = model.config
    model_name = model_name or repo_id.split("/")[-1]
    index = model_index(model_name, measured) or (
        None if index is None else [{**entry, "name": model_name} for entry in index])
    values = {
        "model_index": NO_MODEL_INDEX if index is None else yaml.safe_dump(
            {"model-index": index}, sort_keys=False, allow_unicode=True, width=120).rstrip("\n"),
        "example_prompt": repr(load_prompt_format(c.prompt_format).example()) if c.prompt_format else
        '"..."  # this checkpoint has no prompt_format: export it with --rendering to add one',
        "model_name": model_name,
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
        "answer_feedback": "on" if getattr(c, "answer_feedback", False) else "off",
        "training_data": training_data or "Not stated by the exporter.",
        "results": results_markdown or "No results were attached to this export.",
        "limits": limits or "Trained from the configuration above; see the training data section.",
        "segmentation_rule": segmentation_rule(c.prompt_format),
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


def measured_from_evaluation(record: dict) -> dict | None:
    """`measured` from an evaluator JSON (examples/evaluate_par.py --out, or a run's eval_*.json); None for any other
    JSON. A records evaluation (it names its split) carries the split and its number of records per length."""
    if not isinstance(record, dict) or not {"depths", "accuracy", "mode"} <= set(record):
        return None
    measured = {"task": record.get("task"), "depths": record["depths"],
                "rows": {MODE_LABELS.get(record["mode"], record["mode"]): record["accuracy"]},
                "train_max_depth": record.get("train_max_depth"), "n_sequences": record.get("n_per_depth")}
    if record.get("split"):
        measured["split"] = record["split"]
        measured["n_by_depth"] = [row["n"] for row in record["per_depth"]]
    return measured


SPLIT_ORDER = ("test", "validation")  # a records run's splits, the held-out test first


def _file_names(sources: list[str]) -> str:
    """Data sources as a card shows them: a path by its file name (a local folder says nothing on the Hub), a dataset
    name or a relative path as given."""
    return ", ".join(f"`{Path(s).name if Path(s).is_absolute() else s}`" for s in sources)


def _listed(kind: str, names: list[str], at_most: int = 20) -> str:
    """Names as a card lists them, e.g. "2 operations (`pay`, `ship`)"; past `at_most`, the count alone."""
    shown = " (" + ", ".join(f"`{n}`" for n in names) + ")" if len(names) <= at_most else ""
    return f"{len(names)} {kind}{'' if len(names) == 1 else 's'}{shown}"


def _evaluated_splits(checkpoint: Path, summary: dict) -> tuple[dict[str, list[dict]], list[str]]:
    """A records run's eval_<key>.json per key of summary.json's "accuracy", grouped by split, and the order the card
    shows the splits in: the held-out test first (`SPLIT_ORDER`), then the others by name."""
    splits: dict[str, list[dict]] = {}
    for key in summary.get("accuracy", {}):  # "test", "test_halting", "validation", ...
        path = checkpoint / f"eval_{key}.json"
        if path.is_file():
            record = json.loads(path.read_text())
            splits.setdefault(record["split"], []).append(record)
    order = sorted(splits, key=lambda s: (SPLIT_ORDER.index(s) if s in SPLIT_ORDER else len(SPLIT_ORDER), s))
    return splits, order


def _split_results(split: str, records: list[dict], task: str, train_depth: int | None) -> tuple[dict, list[str], str]:
    """One evaluated split of a records run: its `measured` block (every mode's row), its table lines for the card
    and its line in the data section."""
    block = None
    for record in records:
        m = measured_from_evaluation(record)
        if block is None:
            block = m
        elif m["depths"] == block["depths"]:
            block["rows"].update(m["rows"])
    block["task"] = task
    first = records[0]
    data_line = f"- {split}: {first['n_records']:,} records from {_file_names(first['source'])}"
    lines = [f"**{split}** ({first['n_records']:,} records):", "",
             "| length | records | " + " | ".join(block["rows"]) + " |", "|---|---|" + "---|" * len(block["rows"])]
    for i, (depth, n) in enumerate(zip(block["depths"], block["n_by_depth"])):
        scale = f" ({depth / train_depth:g}x)" if train_depth and depth > train_depth else ""
        cells = [f"{100 * acc[i]:.1f}" if i < len(acc) else "–" for acc in block["rows"].values()]
        lines.append(f"| {depth}{scale} | {n:,} | " + " | ".join(cells) + " |")
    lines.append("")
    return block, lines, data_line


def _how_trained(summary: dict) -> str:
    """The card's sentence on the training run: steps, records seen, time, seed and where the probe stopped it."""
    stops = []
    if summary.get("probe_stopped_at") is not None:
        stops.append(f"the validation probe stopped it at step {summary['probe_stopped_at']}")
    if summary.get("probe_restored_step") is not None:
        stops.append(f"the weights are those of step {summary['probe_restored_step']}, its best probe")
    return (f"Trained {summary.get('steps')} of at most {summary.get('max_steps')} steps "
            f"({summary.get('samples_seen', 0):,} records seen, {summary.get('train_seconds')} s, "
            f"seed {summary.get('seed')})" + ("; " + "; ".join(stops) if stops else "") + ".")


def _records_training_data(records: dict, fmt: dict, task: str, data_lines: list[str]) -> str:
    """The card's data section for a records run: files, record counts, columns, the vocabulary, the training mode
    and the records skipped."""
    columns = fmt.get("columns") or {}
    delimiter = fmt.get("delimiter")
    roles = [f"operations `{columns.get('operations') or 'operations'}`"
             + (f" (split at {delimiter!r})" if delimiter else " (split at whitespace)")]
    roles += [f"{role.replace('_', ' ')} `{columns[role]}`" for role in ("state", "step_states", "initial_state")
              if columns.get(role)]
    skipped = {k: v for k, v in (records.get("skipped") or {}).items() if v}
    return "\n".join([
        f"Records from the files below (task `{task}`), read and split by `examples/train_par.py`:", "",
        f"- training: {records['train_records']:,} records from {_file_names(records.get('train_sources', []))}",
        *data_lines,
        "- columns: " + ", ".join(roles),
        "- learned from the training files: " + ", ".join([
            _listed("operation", fmt.get("operations", [])), _listed("query", fmt.get("query_names", [])),
            _listed("label", fmt.get("candidates", []))]),
        f"- training mode: {records['training_mode'].split(':')[0]}",
        *(["- records skipped as bad (--skip_bad_records): " + ", ".join(f"{k} {v}" for k, v in skipped.items())]
          if skipped else [])])


def records_run(checkpoint: Path) -> dict | None:
    """What a records run folder (examples/train_par.py with --train_file / --dataset_name: summary.json with its
    "records" part, eval_<split>[_halting].json per evaluated split) tells its card: {"task", "measured" (one block
    per split, see `model_index`), "results", "training_data", "limits"}; None for any other folder."""
    summary_path = checkpoint / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    records = summary.get("records")
    if not records:
        return None
    fmt = json.loads((checkpoint / "config.json").read_text()).get("prompt_format") or {}
    train_depth = summary.get("max_train_depth")
    splits, order = _evaluated_splits(checkpoint, summary)
    task = fmt.get("task_name") or next((r["task"] for rs in splits.values() for r in rs if r.get("task")), None)
    task = task or checkpoint.name
    measured, lines, data_lines = [], [], []
    for split in order:
        block, table, data_line = _split_results(split, splits[split], task, train_depth)
        measured.append(block)
        lines += table
        data_lines.append(data_line)
    results = "\n".join([
        "Overall state accuracy (%, every query right) by record length (number of operations) on the run's "
        f"evaluation splits, as `examples/train_par.py` measured them; training records had at most {train_depth} "
        "operations, so a longer length (its multiple in brackets) measures length generalization.", "", *lines,
        _how_trained(summary)]) + "\n"
    limits = (f"Trained on records of at most {train_depth} operations from the files above; on other data, or at "
              "lengths the results do not show, nothing is measured. An operation, query or label the training files "
              "never held is refused, not answered.")
    return {"task": task, "measured": measured, "results": results,
            "training_data": _records_training_data(records, fmt, task, data_lines), "limits": limits}


def _with_task(measured: dict | list[dict], checkpoint: Path) -> dict | list[dict]:
    """`measured` with its task name (from the checkpoint's task spec when not given) and spec file."""
    if not isinstance(measured, dict):
        return [_with_task(block, checkpoint) for block in measured]
    spec_path = checkpoint / EXTRA_FILES[0]
    spec = json.loads(spec_path.read_text()) if spec_path.is_file() else {}
    task = measured.get("task") or spec.get("name") or spec.get("group")
    if not task:
        raise ValueError(f"measured results need a task name: give measured['task'] or a {spec_path.name} in "
                         f"{checkpoint}.")
    return {**measured, "task": task, **({"task_spec": spec_path.name} if spec_path.is_file() else {})}


def export_for_hub(checkpoint: str | Path, output_dir: str | Path, repo_id: str | None = None,
                   dtype: str | None = None, results: str | Path | None = None,
                   training_data: str | None = None, limits: str | None = None,
                   measured: dict | None = None, rendering: str | None = None,
                   learned_halting: bool | None = None) -> Path:
    """`measured` (see `model_index`; "task" defaults to the checkpoint's task spec) is the card's model-index;
    without it, an evaluator JSON given as `results` supplies one; with neither, the checkpoint's own card (see
    `carried_card`) supplies its results and model-index, and training data / limits where not given — except for a
    records run folder (train_par.py with --train_file: see `records_run`), whose card tells the run's own results per
    split, its files, record counts, columns and vocabulary, titled `par-<task>` when no `repo_id` is given.
    The remote code is written from modeling_par/ (scripts/sync_remote_code.py). `rendering` ("symbolic" / "text")
    writes the task's segmentation rule into a checkpoint saved before configs carried one (`config.prompt_format`,
    what the `state-tracking` pipeline reads raw text with); `learned_halting` records whether its halting head was
    trained."""
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    if not (checkpoint / "config.json").is_file():
        raise ValueError(f"--checkpoint must be a folder with config.json; {checkpoint} has none.")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}; got {dtype!r}.")
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ValueError(f"--output_dir {output_dir} exists and is not empty; give a new folder.")
    model = _model_for_export(checkpoint, dtype, rendering, learned_halting)
    _write_model_files(model, checkpoint, output_dir)
    card = _export_card(model, checkpoint, repo_id, results, training_data, limits, measured)
    (output_dir / "README.md").write_text(card)
    return output_dir


def _model_for_export(checkpoint: Path, dtype: str | None, rendering: str | None,
                      learned_halting: bool | None) -> ParLoopedQwenForStateTracking:
    """The checkpoint's model as `export_for_hub` writes it: with the task's segmentation rule for `rendering` (the
    trained sentences kept where the config already records them for that rendering) and `learned_halting` where
    given, checked (`validate_par`), then cast to `dtype`."""
    model = ParLoopedQwenForStateTracking.from_pretrained(checkpoint)
    if rendering is not None:
        from state_tracking import load_task_from_dir, prompt_format_of

        before = model.config.prompt_format or {}
        fmt = prompt_format_of(load_task_from_dir(checkpoint), rendering)
        if before.get("rendering") == rendering and before.get("trained") is not None:  # keep what training used
            fmt = fmt.with_trained(before["trained"])
        model.config.prompt_format = fmt.to_dict()
    if learned_halting is not None:
        model.config.learned_halting = learned_halting
    model.config.validate_par(require_answers=True)
    if dtype is not None:
        model = model.to(DTYPES[dtype])
    return model


def _write_model_files(model, checkpoint: Path, output_dir: Path) -> None:
    """The weights and config, the remote code, the tokenizer and task files and any sentence reader, into
    `output_dir`."""
    model.save_pretrained(output_dir, safe_serialization=True)
    write_remote_code(output_dir)  # the files its config names and their imports, as they are in modeling_par/
    for name in TOKENIZER_FILES + EXTRA_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, output_dir / name)
    if (checkpoint / "reader").is_dir():  # a sentence reader (examples/add_sentence_reader.py) travels with its config
        shutil.copytree(checkpoint / "reader", output_dir / "reader")


def _export_card(model, checkpoint: Path, repo_id: str | None, results: str | Path | None,
                 training_data: str | None, limits: str | None, measured: dict | None) -> str:
    """The model card of `export_for_hub` (see its docstring for where the results, model-index, training data,
    limits and name come from)."""
    results_markdown, run = None, None
    if results is None and measured is None:  # a records run folder tells its own results and data
        run = records_run(checkpoint)
    if run is not None:
        results_markdown, measured = run["results"], run["measured"]
        training_data, limits = training_data or run["training_data"], limits or run["limits"]
    if results is not None:
        results = Path(results)
        results_markdown = results.read_text() if results.suffix == ".md" else (
            "```json\n" + json.dumps(json.loads(results.read_text()), indent=1)[:4000] + "\n```")
        if measured is None and results.suffix == ".json":
            measured = measured_from_evaluation(json.loads(results.read_text()))
    if measured is not None:
        measured = _with_task(measured, checkpoint)
    source = carried_card(checkpoint) or {}
    index = None
    if results is None and measured is None:  # nothing new measured: the source card's results stay
        results_markdown, index = source.get("results"), source.get("model_index")
    name = repo_id.split("/")[-1] if repo_id else (
        "par-" + re.sub(r"[^A-Za-z0-9._-]+", "-", run["task"]).strip("-") if run else checkpoint.name)
    return render_card(model, repo_id or f"local/{name}", results_markdown,
                       training_data or source.get("training_data"), limits or source.get("limits"), measured, index,
                       model_name=name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a folder written by save_pretrained")
    parser.add_argument("--output_dir", "--output-dir", required=True, help="a new folder for the export")
    parser.add_argument("--repo_id", "--repo-id", default=None, help="Hub repository, e.g. you/par-swap-s5")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast the weights before saving")
    parser.add_argument("--results", default=None, help="a results .md (inserted) or .json (quoted) for the card")
    parser.add_argument("--training_data", "--training-data", default=None, help="one paragraph for the card")
    parser.add_argument("--limits", default=None, help="one line for the card's limits")
    parser.add_argument("--rendering", default=None, choices=["symbolic", "text"],
                        help="write the task's segmentation rule (config.prompt_format) for the pipeline")
    parser.add_argument("--learned_halting", "--learned-halting", default=None, choices=["true", "false"],
                        help="whether the halting head was trained (the pipeline halts by it when true)")
    parser.add_argument("--push", type=true_or_false, nargs="?", const=True, default=False,
                        help="upload the export to --repo-id")
    parser.add_argument("--private", type=true_or_false, nargs="?", const=True, default=False)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.push and not args.repo_id:
        parser.error("--push needs --repo-id")
    require_file("--results", args.results, "a results file (.md, inserted; .json, quoted)")
    out = export_for_hub(args.checkpoint, args.output_dir, args.repo_id, args.dtype, args.results,
                         args.training_data, args.limits, rendering=args.rendering,
                         learned_halting=None if args.learned_halting is None else args.learned_halting == "true")
    print(f"exported to {out}: {sorted(p.name for p in out.iterdir())}")
    if args.push:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(args.repo_id, private=args.private, exist_ok=True)
        api.upload_folder(folder_path=str(out), repo_id=args.repo_id, commit_message="Upload PAR checkpoint")
        print(f"pushed to https://huggingface.co/{args.repo_id}")


if __name__ == "__main__":
    run_cli(main)
