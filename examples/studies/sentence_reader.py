"""Issue 69: how well a sentence encoder reads wordings no training used as the known ones, and what answering only
when it is sure buys. No model is trained; the loop is not run (see the report for what that leaves out).

    python examples/studies/sentence_reader.py                # calibrate on set 1, measure set 2
    python examples/studies/sentence_reader.py --final_set3   # once, at the end, with the final code: also set 3

Known sentences: the trained wordings of the recipe `qwen_stage2_determiners` (`examples/tasks/
batch_process_determiners.json`'s seen phrasings: every wording but the last of each list, start sentences with
every state, as a random-start training writes them). Reader: all-MiniLM-L6-v2 (`par_studies.parents`), read by
`modeling_par.sentence_reader` exactly as a checkpoint with that reader reads prompts (confidence: the margin over the
next meaning). Sets: every wording of the set's task file that is not a known wording (set 1:
`batch_process_phrasings.json`, its held-out last wording of each list; set 2: `batch_process_heldout2.json`; set 3:
`batch_process_heldout3.json`, six wordings per sentence each), start sentences filled with each of the 6 states.

The threshold is chosen on set 1 only (`examples/add_sentence_reader.py`'s `calibrate`: the smallest confidence whose
answered sentences are read right at ≥ 0.99). Per set: per-sentence reading accuracy (every sentence read as its
nearest meaning), coverage (the share with confidence ≥ the threshold) and answered accuracy (read right among those),
overall and per role; every miss listed. Prompt level (`prompt_level`): a prompt of d operations whose start sentence,
d operation sentences and question are drawn independently and uniformly from the set's sentences of each role is
answered when all d + 2 are, and read right when all are: coverage(d) = c_start · c_question · c_op^d, P(answered
and all read right)(d) = b_start · b_question · b_op^d (b: the share answered *and* read right), answered accuracy(d)
= their ratio; without a threshold, all read right = a_start · a_question · a_op^d. These are the reading's figures:
the loop then reads known wordings, at its own accuracy on trained wordings (97.14% at 8× for the recipe, 3 seeds:
results/pretrained_cpu/README.md), which multiplies them.

Set 3 is read once: `--final_set3` refuses when the results file already holds it; a run without it never opens the
file and keeps a set-3 entry already written. Output: results/sentence_reader/results.json.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import torch  # noqa: E402
import transformers  # noqa: E402

from modeling_par.prompt_format import CANDIDATE  # noqa: E402
from modeling_par.sentence_reader import SentenceReader  # noqa: E402
from par_studies.parents import get_reader  # noqa: E402
from par_studies.runs import held_out_study_start  # noqa: E402
from state_tracking import load_task, prompt_format_of  # noqa: E402

TASKS = REPO / "examples" / "tasks"
KNOWN_TASK = TASKS / "batch_process_determiners.json"
SETS = {"set1": TASKS / "batch_process_phrasings.json", "set2": TASKS / "batch_process_heldout2.json",
        "set3": TASKS / "batch_process_heldout3.json"}
OUT = REPO / "results" / "sentence_reader" / "results.json"
TARGET = 0.99
DEPTHS = (1, 8, 16, 64)
ROLES = ("start", "operation", "question")


def _add_sentence_reader():
    path = REPO / "examples" / "add_sentence_reader.py"
    spec = importlib.util.spec_from_file_location("add_sentence_reader", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recipe_format():
    """The text format of the determiner-swapped task with the recipe's trained wordings recorded as `trained`."""
    task = load_task(KNOWN_TASK)
    preamble, operations, queries = task.phrasing_options("seen")
    trained = {"operations": {name: list(operations[o]) for o, name in enumerate(task.op_names)},
               "preamble": [[t.replace(CANDIDATE, c) for t in templates for c in task.candidate_names]
                            for templates in preamble],
               "queries": [list(words) for words in queries],
               "source": "batch_process_determiners.json's seen phrasings (qwen_stage2_determiners' training)"}
    return prompt_format_of(task, "text").with_trained(trained)


def rates(rows: list[dict]) -> dict:
    """n, reading accuracy, coverage, answered accuracy, and b (answered and right) of some sentences."""
    n = len(rows)
    answered = [r for r in rows if r["answered"]]
    right_answered = sum(r["right"] for r in answered)
    return {"n": n, "reading_accuracy": round(sum(r["right"] for r in rows) / n, 4),
            "coverage": round(len(answered) / n, 4),
            "answered_accuracy": round(right_answered / len(answered), 4) if answered else None,
            "answered_and_right": round(right_answered / n, 4)}


def prompt_level(by_role: dict) -> dict:
    """The prompt-level figures of the module docstring, per depth d (rounded to 4 places)."""
    def product(key: str, d: int) -> float:
        value = 1.0
        for role in ROLES:
            value *= by_role[role][key] ** (d if role == "operation" else 1)
        return value

    out = {}
    for d in DEPTHS:
        coverage, answered_right = product("coverage", d), product("answered_and_right", d)
        out[str(d)] = {"coverage": round(coverage, 4), "answered_accuracy":
                       round(answered_right / coverage, 4) if coverage else None,
                       "all_read_right_without_threshold": round(product("reading_accuracy", d), 4)}
    return out


def measure(reader: SentenceReader, path: Path, helper) -> dict:
    """Every sentence of the set read, with its figures (see the module docstring)."""
    sentences = helper.calibration_sentences(load_task(path), reader.prompt_format, reader)
    readings = reader.read([s for s, _ in sentences])
    rows = []
    for reading, (sentence, meaning) in zip(readings, sentences):
        rows.append({"sentence": sentence, "role": meaning[0], "means": meaning[2], "read_as": reading.read_as,
                     "read_role": reading.role, "nearest_known": reading.nearest_known,
                     "confidence": reading.confidence, "similarity": reading.similarity,
                     "right": (reading.role, reading.slot, reading.read_as) == meaning,
                     "answered": reader.answered(reading)})
    by_role = {role: rates([r for r in rows if r["role"] == role]) for role in ROLES}
    return {"file": str(path.relative_to(REPO)), "all": rates(rows), "by_role": by_role,
            "prompt_level": prompt_level(by_role),
            "misses": [r for r in rows if not r["right"]],
            "answered_misses": [r for r in rows if r["answered"] and not r["right"]]}


def environment_of() -> dict:
    """The machine, date and versions of a run of this study (or of `few_shot_reading.py`)."""
    return {"machine": f"{os.cpu_count()}-core CPU ({platform.machine()}, {platform.processor() or 'cpu'}), no GPU; "
                       "one torch thread",
            "date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def main(argv=None) -> dict:
    final, previous = held_out_study_start(__doc__, OUT, "set3", argv)
    helper = _add_sentence_reader()
    spec = get_reader("all-minilm-l6-v2")
    folder = spec.ensure(quiet=True)
    started = time.time()
    from transformers import AutoModel, AutoTokenizer

    reader = SentenceReader(recipe_format(), AutoModel.from_pretrained(folder), AutoTokenizer.from_pretrained(folder))
    calibration_sentences = helper.calibration_sentences(load_task(SETS["set1"]), reader.prompt_format, reader)
    calibration = helper.calibrate(reader, calibration_sentences, TARGET)
    reader.threshold = calibration["threshold"]
    environment = {**environment_of(), "command": "python examples/studies/sentence_reader.py"
                   + (" --final_set3" if final else "")}
    out = {"question": "issue 69: per-sentence reading of new wordings by a sentence encoder, with a threshold "
                       "calibrated on held-out set 1",
           "environment": environment,
           "reader": {"encoder": f"{spec.label} ({spec.wheel})", "sha256": spec.sha256, "confidence": "margin",
                      "known_sentences": len(reader.known), "known_from": str(KNOWN_TASK.relative_to(REPO))},
           "calibration": {"file": str(SETS["set1"].relative_to(REPO)), "target": TARGET, **calibration},
           "set2": measure(reader, SETS["set2"], helper)}
    if final:
        out["set3"] = {**measure(reader, SETS["set3"], helper), "read_once": True,
                       "date": environment["date"], "environment": environment}
    elif "set3" in previous:
        out["set3"] = previous["set3"]
    out["seconds"] = round(time.time() - started, 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for name in ("set2", "set3"):
        if name in out:
            figures = out[name]["all"]
            ops = out[name]["by_role"]["operation"]
            print(f"{name}: reading {100 * figures['reading_accuracy']:.1f}% of {figures['n']} sentences; threshold "
                  f"{reader.threshold}: coverage {100 * figures['coverage']:.1f}%, answered accuracy "
                  f"{figures['answered_accuracy']}; operations: reading {100 * ops['reading_accuracy']:.1f}% of "
                  f"{ops['n']}, coverage {100 * ops['coverage']:.1f}%, answered accuracy {ops['answered_accuracy']}")
    return out


if __name__ == "__main__":
    main()
