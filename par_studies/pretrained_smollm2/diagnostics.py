"""What a trained, recorded row reads and where it fails, each kept in the row's record: held-out wordings one slot
at a time (`--diagnose`), each operation sentence alone (`--sentences`), random start states (`--random_start`), and
the accuracy of every iteration (`--profile`)."""

from __future__ import annotations

import json
import time

from .. import save_record
from .evaluation import evaluate_phrasing, test_task
from .rows import DEPTHS, PHRASINGS, REPO, SCREEN_N, TASK_FILE, TRAIN_MAX_DEPTH
from .training import record_path, run_path


def add_to_record(row: str, seed: int, key: str, value, option: str) -> None:
    """A diagnostic's result kept in the row's existing record: `key`, and `<key>_command` the command that measured
    it (this script with `option ROW --seed SEED`)."""
    path = record_path(row, seed)
    record = json.loads(path.read_text())
    record[key] = value
    record[f"{key}_command"] = f"python examples/reproduce/pretrained_smollm2.py {option} {row} --seed {seed}"
    save_record(record, path)


SLOTS = {"operations": "operation sentences held out; start and question as trained",
         "start": "start sentence held out; operations and question as trained",
         "question": "question words held out; start and operations as trained"}
SLOT_KEYS = {"operations": "operations", "start": "initial", "question": "query"}
SLOT_DEPTHS, SLOT_N = [8, 64], 256


def slot_task(slot: str):
    """The task with the held-out phrasing of every slot but `slot` removed: its `held_out` prompts then use held-out
    sentences in `slot` only (the others fall back to a trained phrasing, `Task.phrasing_options`)."""
    from state_tracking import load_task

    spec = json.loads((REPO / TASK_FILE).read_text())
    text = spec["text"]
    for name, key in SLOT_KEYS.items():
        if name == slot:
            continue
        if key == "operations":
            text[key] = {op: options[:-1] for op, options in text[key].items()}
        else:
            text[key] = text[key][:-1]
    return load_task(spec)


def diagnose_slots(row: str, seed: int) -> dict:
    """Which held-out slot costs accuracy: held-out prompts with the unseen phrasing in one slot only (SLOT_N prompts
    per depth, the row's test seed), kept in the row's record under "slots"."""
    import torch

    from par_studies import load_run
    from state_tracking import evaluate_length_generalization

    torch.set_num_threads(1)
    model, tokenizer, _ = load_run(run_path(row, seed), max(SLOT_DEPTHS))
    slots = {}
    for slot, label in SLOTS.items():
        started = time.time()
        result = evaluate_length_generalization(model, tokenizer, slot_task(slot), SLOT_DEPTHS, n_per_depth=SLOT_N,
                                                mode="forced", seed=seed, rendering="text", phrasing="held_out",
                                                train_max_depth=TRAIN_MAX_DEPTH, progress=False)
        slots[slot] = {"label": label, "depths": result["depths"], "accuracy": result["accuracy"], "n": SLOT_N,
                       "seconds": round(time.time() - started, 1)}
        print(f"{row} s{seed} held out in {slot} only: " + " ".join(
            f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])), flush=True)
    add_to_record(row, seed, "slots", slots, "--diagnose")
    return slots


def sentence_task(spec: dict, op: str, wording: str):
    """The task of `spec` with `wording` as the first (canonical) way of operation `op`, so that a canonical prompt
    writes it; every other sentence keeps its own first way. Every wording stays in the task (segmentation knows
    it); `spec` itself is not changed."""
    from state_tracking import load_task

    spec = json.loads(json.dumps(spec))
    options = spec["text"]["operations"][op]
    spec["text"]["operations"][op] = [wording, *(o for o in options if o != wording)]
    return load_task(spec)


def read_as(answers: list[int], transitions, op_names: list[str]) -> list[str]:
    """The operations whose transition from every start state gives `answers` (answer per start state), or, where
    none does, those agreeing on the most start states: what a one-operation prompt's answers say the sentence was
    read as."""
    agreement = [sum(int(transitions[o][s]) == a for s, a in enumerate(answers)) for o in range(len(op_names))]
    best = max(agreement)
    return [op_names[o] for o, count in enumerate(agreement) if count == best]


def diagnose_sentences(row: str, seed: int) -> dict:
    """How a trained row reads each operation sentence on its own: for every wording of every operation (trained and
    held out), one-operation prompts (d = 1, R = 1) from each of the machine's start states, the other sentences in
    their first (trained) way; per wording the accuracy over the start states and the operation(s) its answers are
    consistent with (`read_as`). Kept in the row's record under "sentences"."""
    import numpy as np
    import torch

    from par_studies import load_run
    from state_tracking.data import StateTrackingCollator
    from state_tracking.evaluation import predict_encoded
    from state_tracking.tokenization import encode_batch, model_token_ids

    torch.set_num_threads(1)
    model, tokenizer, trained = load_run(run_path(row, seed), 1)
    spec = json.loads((REPO / TASK_FILE).read_text())
    held = spec["text"]["held_out_phrasings"]
    states = np.arange(len(trained.candidate_names))
    collate = StateTrackingCollator(model_token_ids(tokenizer, trained)["pad_token_id"], padding_side="right")
    sentences = []
    for o, op in enumerate(trained.op_names):
        wordings = spec["text"]["operations"][op]
        for w, wording in enumerate(wordings):
            task = sentence_task(spec, op, wording)
            ops, initial = np.full((len(states), 1), o), states[:, None]
            encoded = encode_batch(task, tokenizer, "text", ops, initial, "canonical")
            answers, _, _ = predict_encoded(model, encoded, collate, "forced", 1, len(states), 1, model.device)
            answers = answers[:, 0].tolist()
            targets = task.final_states(ops, initial)[:, 0].tolist()
            sentences.append({"operation": op, "wording": wording, "held_out": w >= len(wordings) - held,
                              "accuracy": float(np.mean([a == t for a, t in zip(answers, targets)])),
                              "answers": [trained.candidate_names[a] for a in answers],
                              "read_as": read_as(answers, trained.transitions, trained.op_names)})
            print(f"{row} s{seed} {'held-out' if sentences[-1]['held_out'] else 'trained '} {wording!r:46} "
                  f"{100 * sentences[-1]['accuracy']:6.1f}%  read as {', '.join(sentences[-1]['read_as'])}",
                  flush=True)
    if record_path(row, seed).is_file():
        add_to_record(row, seed, "sentences", sentences, "--sentences")
    return {"sentences": sentences}


def random_start(row: str, seed: int, n: int = SCREEN_N) -> dict:
    """The row's test with random start states stated in the prompt (the training distribution; the study's test
    starts idle): both phrasings at d = 8 and 64, `n` prompts per depth of the row's seed, kept in the row's record
    under "random_start". The held-out phrasing writes the start sentence in its held-out way too."""
    import torch

    from par_studies import load_run

    torch.set_num_threads(1)
    model, tokenizer, trained = load_run(run_path(row, seed), max(DEPTHS))
    task = test_task(row, trained)
    out = {"n_per_depth": n, "depths": DEPTHS}
    for phrasing in PHRASINGS:
        out[phrasing], _ = evaluate_phrasing(model, tokenizer, task, DEPTHS, n, seed, phrasing,
                                             f"{row} s{seed} random start,", random_initial=True)
    add_to_record(row, seed, "random_start", out, "--random_start")
    return out


PROFILE_DEPTH, PROFILE_N = 64, 256


def profile_row(row: str, seed: int) -> dict:
    """Inside the loop of a trained row: the accuracy of every iteration k = 1 … 64 against the state after k
    operations (`state_tracking.progress_profile`, d = 64, PROFILE_N prompts, idle start, each phrasing), kept in the
    row's record under "profile". A readout that decays with k past the trained depth is the recurrence drifting; one
    that holds to k = 64 while the final answer fails would point elsewhere."""
    import torch

    from par_studies import load_run
    from state_tracking import progress_profile

    torch.set_num_threads(1)
    model, tokenizer, trained = load_run(run_path(row, seed), PROFILE_DEPTH)
    task = test_task(row, trained)  # the study's test wordings (an augmented row's trained file adds variants)
    profiles = {}
    for phrasing in PHRASINGS:
        started = time.time()
        result = progress_profile(model, tokenizer, task, [PROFILE_DEPTH], n_per_depth=PROFILE_N, seed=seed,
                                  rendering="text", phrasing=phrasing)
        profiles[phrasing] = {"profile": [round(a, 4) for a in result["profile"][0]],
                              "first_below_50": result["first_failure"][0], "seconds": round(time.time() - started, 1)}
        shown = {k: profiles[phrasing]["profile"][k - 1] for k in (1, 8, 9, 16, 32, 64) if k <= PROFILE_DEPTH}
        print(f"{row} s{seed} {phrasing} d={PROFILE_DEPTH}: " + " ".join(f"k={k}:{100 * a:.1f}" for k, a in
                                                                        shown.items()), flush=True)
    profile = {"depth": PROFILE_DEPTH, "n": PROFILE_N, **profiles}
    add_to_record(row, seed, "profile", profile, "--profile")
    return profile
