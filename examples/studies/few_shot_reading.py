"""Issue 69, item 3: few-shot reading. A user gives k of their own wordings of each sentence (`add_sentence_reader.py
--examples`); how much better does the sentence reader then read the wordings they did not give? No training.

    python examples/studies/few_shot_reading.py                 # sets 2 and 3 (development) -> few_shot.json
    python examples/studies/few_shot_reading.py --final_set4    # once, at the end, with the final code: also set 4

Setting: the reader of `examples/studies/sentence_reader.py` (all-MiniLM-L6-v2, the recipe `qwen_stage2_determiners`'
61 trained wordings as known sentences, confidence the margin). Each held-out set lists six new wordings of every
sentence (the start template, each of the 8 operations, the question stem). For k in `KS` and each draw r in
`range(DRAWS)` (k = 0: one draw): for every sentence, k of its six wordings are drawn (`random.Random(1000 k + r)`)
and given as examples (`sentence_reader.example_sentences`: the start templates filled with every state); the other
6 − k wordings of each sentence are read. Two protocols (`PROTOCOLS`): `random`, each sentence's k examples drawn
on their own; `same_kind`, k positions drawn once and the wordings at those positions given for every sentence (the
sets write one wording of each kind per sentence at the same position in set 3, e.g. the log lines second, so a
user who writes every sentence in the same few styles; set 2's positions are only loosely kinds). The threshold is
calibrated for each reader on held-out set 1 (as in
`sentence_reader.py`: the smallest margin whose answered set-1 sentences are read right at ≥ 0.99), never on the set
read. Per set and k: per-sentence reading accuracy, coverage and answered accuracy (overall, per role), and the prompt
figures at d = 8 (`sentence_reader.prompt_level`: a prompt of a start sentence, d operations and a question drawn
independently from the read sentences), as mean and sd over the draws, every draw kept.

Set 4 (`batch_process_heldout4.json`, written and committed before this study's first run) is read once: `--final_set4`
refuses when the results already hold it. Sets 2 and 3 are development data here (set 3 was read once before, by the
zero-shot reader). Output: results/sentence_reader/few_shot.json.
"""

from __future__ import annotations

import importlib.util
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from modeling_par.sentence_reader import SentenceReader, example_sentences  # noqa: E402
from par_studies.parents import get_reader  # noqa: E402
from par_studies.runs import held_out_study_start  # noqa: E402
from state_tracking import load_task  # noqa: E402

TASKS = REPO / "examples" / "tasks"
SETS = {"set2": TASKS / "batch_process_heldout2.json", "set3": TASKS / "batch_process_heldout3.json",
        "set4": TASKS / "batch_process_heldout4.json"}
OUT = REPO / "results" / "sentence_reader" / "few_shot.json"
KS = (0, 1, 2, 4)
PROTOCOLS = ("random", "same_kind")
DRAWS = 5
NEW_WORDINGS = 6  # every list of a held-out set: the canonical sentence, then six new wordings


def _module(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def draw_examples(text: dict, k: int, rng: random.Random, protocol: str) -> dict:
    """k of the six new wordings of every sentence of a held-out set's "text" (the first wording of each list is the
    canonical one, not drawn), in an examples file's shape; `protocol` as the module docstring says."""
    positions = rng.sample(range(1, 1 + NEW_WORDINGS), k) if protocol == "same_kind" else None

    def pick(wordings: list[str]) -> list[str]:
        if positions is not None:
            return [wordings[i] for i in positions]
        return rng.sample(wordings[1:1 + NEW_WORDINGS], k)

    return {"initial": pick(text["initial"]), "query": pick(text["query"]),
            "operations": {name: pick(wordings) for name, wordings in text["operations"].items()}}


def one_draw(study, helper, fmt, encoder, tokenizer, path: Path, k: int, draw: int, protocol: str) -> dict:
    """One reader with k examples per sentence of the set at `path`, calibrated on set 1; the set's other wordings
    read (`sentence_reader.measure`)."""
    text = json.loads(path.read_text())["text"]
    examples = draw_examples(text, k, random.Random(1000 * k + draw), protocol) if k else {}
    reader = SentenceReader(fmt, encoder, tokenizer, examples=example_sentences(fmt, examples))
    calibration = helper.calibrate(reader, helper.calibration_sentences(load_task(study.SETS["set1"]), fmt, reader),
                                   study.TARGET)
    reader.threshold = calibration["threshold"]
    figures = study.measure(reader, path, helper)
    return {"k": k, "draw": draw, "examples": examples, "threshold": reader.threshold,
            "calibration_answered_accuracy": calibration["answered_accuracy"], "all": figures["all"],
            "by_role": figures["by_role"], "prompt_level": figures["prompt_level"],
            "answered_misses": [{key: m[key] for key in ("sentence", "means", "read_as", "confidence")}
                                for m in figures["answered_misses"]]}


def summarize(draws: list[dict]) -> dict:
    """Mean and sd over the draws of the per-sentence and d = 8 prompt figures (None where a draw answered none)."""
    series = {"reading_accuracy": [d["all"]["reading_accuracy"] for d in draws],
              "coverage": [d["all"]["coverage"] for d in draws],
              "answered_accuracy": [d["all"]["answered_accuracy"] for d in draws],
              "operation_reading_accuracy": [d["by_role"]["operation"]["reading_accuracy"] for d in draws],
              "prompt8_coverage": [d["prompt_level"]["8"]["coverage"] for d in draws],
              "prompt8_answered_accuracy": [d["prompt_level"]["8"]["answered_accuracy"] for d in draws],
              "prompt8_all_read_right": [d["prompt_level"]["8"]["all_read_right_without_threshold"] for d in draws]}
    out = {}
    for name, values in series.items():
        values = [v for v in values if v is not None]
        out[name] = {"mean": round(statistics.mean(values), 4) if values else None,
                     "sd": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0, "n": len(values)}
    return out


def read_set(study, helper, fmt, encoder, tokenizer, name: str) -> dict:
    """Every protocol, k and draw on one set."""
    out = {"file": str(SETS[name].relative_to(REPO))}
    for protocol in PROTOCOLS:
        rows = [one_draw(study, helper, fmt, encoder, tokenizer, SETS[name], k, draw, protocol)
                for k in KS for draw in range(DRAWS if k else 1)]
        out[protocol] = {"by_k": {str(k): summarize([r for r in rows if r["k"] == k]) for k in KS}, "draws": rows}
    return out


def main(argv=None) -> dict:
    final, previous = held_out_study_start(__doc__, OUT, "set4", argv)
    study = _module("examples/studies/sentence_reader.py")
    helper = _module("examples/add_sentence_reader.py")
    spec = get_reader("all-minilm-l6-v2")
    folder = spec.ensure(quiet=True)
    from transformers import AutoModel, AutoTokenizer

    encoder, tokenizer = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    fmt = study.recipe_format()
    started = time.time()
    environment = {**study.environment_of(), "command": "python examples/studies/few_shot_reading.py"
                   + (" --final_set4" if final else "")}
    out = {"question": "issue 69 item 3: few-shot reading, k example wordings per sentence, no training",
           "environment": environment, "ks": list(KS), "draws": DRAWS, "protocols": list(PROTOCOLS),
           "reader": {"encoder": f"{spec.label} ({spec.wheel})", "sha256": spec.sha256, "confidence": "margin"},
           **{name: read_set(study, helper, fmt, encoder, tokenizer, name) for name in ("set2", "set3")}}
    if final:
        out["set4"] = {**read_set(study, helper, fmt, encoder, tokenizer, "set4"), "read_once": True,
                       "date": environment["date"]}
    elif "set4" in previous:
        out["set4"] = previous["set4"]
    out["seconds"] = round(time.time() - started, 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for name in ("set2", "set3", "set4"):
        for protocol in PROTOCOLS if name in out else ():
            for k, figures in out[name][protocol]["by_k"].items():
                print(f"{name} {protocol} k={k}: " + ", ".join(f"{key} {value['mean']}±{value['sd']}"
                                                                for key, value in figures.items()))
    return out


if __name__ == "__main__":
    main()
