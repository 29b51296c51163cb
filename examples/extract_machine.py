"""Extract the state machine a records checkpoint has learned, as a task JSON this package loads.

    python examples/extract_machine.py --model runs/par-records --out machine.json --plot machine.png
    python examples/extract_machine.py --model DIR --out m.json --initial_state '{"x0": "true", "x1": "false"}'

A model state is the tuple of its answers (one label per query) after a sequence of operations (forced R = ⌈d / c⌉).
Breadth-first search from the start: a state keeps the shortest sequence reaching it (its *representative*); its
transition under op o is the model's answer after representative + o (every op of every frontier state in one batched
run). At most `--max_states` states: a transition beyond the cap leads to an added sink ``unexplored`` (self-loops)
and ``"truncated": true``.

The start. Data with initial states: `--initial_state` (a label or a JSON mapping query -> label), representative [].
Data without: the model never answers before the first op, so the start is a pseudo-state ``__start__`` whose
transitions are the model's one-op states. In the task it is an extracted state with exactly those transitions where
one exists (``start.kind`` "equivalent": the same answers after any ≥ 1 ops), else an added state ``start``
(``start.kind`` "pseudo": never a model answer, never re-entered).

Output JSON: ``task`` (`state_tracking.tasks` format, ``load_task(out["task"])`` works; names sanitized to
[A-Za-z0-9_], op sentences = the original op strings), ``operation_names`` / ``state_names`` (sanitized -> original;
a multi-query state's original is ``x0=true,x1=false``, a scalar one's its label), ``queries``, ``states`` (name,
original, answers, representative), ``start``, ``num_states``, ``max_states``, ``truncated``, ``unexplored``,
``agreement`` (on `--agreement_n` uniform random sequences of `--agreement_depth` ops, seeded: the fraction where the
table run from the start ends in the model's final answer), ``model``, ``command``, ``date``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modeling_par.record_format import RECORDS, RecordFormat, load_prompt_format  # noqa: E402
from par_cli.cli import require_checkpoint, run_cli  # noqa: E402
from state_tracking import StateTrackingCollator  # noqa: E402
from state_tracking.tasks import RESERVED_WORDS, load_task  # noqa: E402

PLOT_MAX_STATES = 12


def record_format_of(config) -> RecordFormat:
    """`config.prompt_format` as a `RecordFormat`; a ValueError naming the field when it is not a records format."""
    spec = getattr(config, "prompt_format", None)
    if not isinstance(spec, dict) or spec.get("rendering") != RECORDS:
        found = spec.get("rendering") if isinstance(spec, dict) else spec
        raise ValueError(f"config.prompt_format must be a records format ('rendering': '{RECORDS}', a checkpoint "
                         f"trained with --train_file / --dataset_name); got rendering {found!r}.")
    return load_prompt_format(spec)


def read_states(model, tokenizer, fmt: RecordFormat, sequences, initial=None, batch_size: int = 256) -> list[tuple]:
    """The model's answer (a tuple of candidate indices, one per query) after the last op of each sequence of op
    indices, forced R = ⌈d / c⌉."""
    collate = StateTrackingCollator(int(model.config.pad_token_id))
    c, device, out = int(model.config.step_size), getattr(model, "device", torch.device("cpu")), []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        rows = [dict(zip(("input_ids", "operation_ends", "query_positions"),
                         fmt.encode(tokenizer, [fmt.operations[o] for o in seq], initial))) for seq in chunk]
        batch = {k: v.to(device) for k, v in collate(rows).items()}
        reads = torch.tensor([math.ceil(len(seq) / c) for seq in chunk], device=device)
        prediction = model.predict(batch["input_ids"], attention_mask=batch["attention_mask"],
                                   query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                                   num_iterations=reads)
        out += [tuple(row) for row in prediction.answers.tolist()]
    return out


def explore(model, tokenizer, fmt: RecordFormat, initial=None, max_states: int = 64, batch_size: int = 256) -> dict:
    """Breadth-first search over the model's states. Node 0 is the start (the initial state, or the pseudo-state
    before any op when `initial` is None); returns ``keys`` (node -> answer tuple, None for the pseudo-start),
    ``reps`` (node -> shortest op sequence), ``table`` (node -> op -> node, -1 beyond the cap), ``truncated``."""
    root = None if initial is None else tuple(fmt.candidate_indices(initial))
    keys, reps, table, truncated = [root], [[]], {}, False
    index = {} if root is None else {root: 0}
    frontier, num_ops = [0], len(fmt.operations)
    while frontier:
        runs = [(node, op) for node in frontier for op in range(num_ops)]
        answers = read_states(model, tokenizer, fmt, [reps[node] + [op] for node, op in runs], initial, batch_size)
        frontier = []
        for (node, op), key in zip(runs, answers):
            if key not in index and len(index) < max_states:
                index[key] = len(keys)
                keys.append(key)
                reps.append(reps[node] + [op])
                frontier.append(index[key])
            truncated |= key not in index
            table.setdefault(node, [-1] * num_ops)[op] = index.get(key, -1)
    return {"keys": keys, "reps": reps, "table": table, "truncated": truncated}


def safe_names(originals, taken: set) -> dict:
    """original -> a distinct name of [A-Za-z0-9_] not in `taken` (and not a reserved word); updates `taken`."""
    out = {}
    for name in originals:
        base = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "x"
        base = base + "_" if base in RESERVED_WORDS else base
        candidate, k = base, 2
        while candidate in taken:
            candidate, k = f"{base}_{k}", k + 1
        taken.add(candidate)
        out[name] = candidate
    return out


def agreement(model, tokenizer, fmt, found: dict, initial, depth: int, n: int, seed: int, batch_size: int) -> dict:
    """On n uniform random sequences of `depth` ops: the fraction where the table, run from node 0, ends in the
    state the model answers after the whole sequence (a run that leaves the table counts as a disagreement)."""
    ops = np.random.default_rng(seed).integers(0, len(fmt.operations), size=(n, depth))
    model_keys = read_states(model, tokenizer, fmt, ops.tolist(), initial, batch_size)
    sink = len(found["keys"])
    table = np.full((sink + 1, len(fmt.operations)), sink)
    for node, row in found["table"].items():
        table[node] = [sink if t < 0 else t for t in row]
    node = np.zeros(n, dtype=np.int64)
    for t in range(depth):
        node = table[node, ops[:, t]]
    agree = sum(int(i) != sink and found["keys"][i] == key for i, key in zip(node, model_keys))
    return {"depth": depth, "n": n, "seed": seed, "agree": agree, "fraction": agree / n}


def machine_json(fmt: RecordFormat, found: dict, task_name: str, max_states: int) -> dict:
    """The explored machine as the output JSON (without agreement / command; see the module docstring)."""
    q, keys, table = fmt.query_names, found["keys"], found["table"]
    real = [i for i, key in enumerate(keys) if key is not None]

    def original(key):
        labels = [fmt.candidates[c] for c in key]
        return labels[0] if len(q) == 1 else ",".join(f"{n}={v}" for n, v in zip(q, labels))

    names, taken = {i: original(keys[i]) for i in real}, set()
    safe = dict(zip(real, safe_names([names[i] for i in real], taken).values()))
    ops = safe_names(fmt.operations, taken)
    sink = safe_names(["unexplored"], taken)["unexplored"] if found["truncated"] else None
    start_row = table[0]
    if keys[0] is not None:
        start_kind, start = "initial_state", 0
    else:  # an existing state with the pseudo-start's transitions, else an added state
        start = next((i for i in real if table[i] == start_row), None)
        start_kind = "equivalent" if start is not None else "pseudo"
        if start is None:
            start, safe[0] = 0, safe_names(["start"], taken)["start"]
    target = lambda t: sink if t < 0 else safe[t]  # noqa: E731
    nodes = real + ([0] if start_kind == "pseudo" else [])
    operations = {ops[op]: {safe[i]: target(table[i][o]) for i in nodes} for o, op in enumerate(fmt.operations)}
    if sink:
        for row in operations.values():
            row[sink] = sink
    state_names = {safe[i]: names.get(i, "__start__") for i in nodes} | ({sink: "<unexplored>"} if sink else {})
    task = {"name": task_name, "states": list(state_names), "initial_state": safe[start], "operations": operations,
            "text": {"operations": {ops[op]: op for op in fmt.operations}}}
    load_task(task)  # it must load
    return {
        "task": task, "queries": list(q), "operation_names": {v: k for k, v in ops.items()}, "state_names": state_names,
        "states": [{"name": safe[i], "original": names[i],
                    "answers": {n: fmt.candidates[c] for n, c in zip(q, keys[i])},
                    "representative": [fmt.operations[o] for o in found["reps"][i]]} for i in real],
        "start": {"state": safe[start], "kind": start_kind,
                  "transitions": {op: target(start_row[o]) for o, op in enumerate(fmt.operations)}},
        "num_states": len(real), "max_states": max_states, "truncated": found["truncated"],
        "unexplored": [{"state": safe[i], "operation": fmt.operations[o]} for i in nodes
                       for o, t in enumerate(table[i]) if t < 0],
    }


def plot_machine(machine: dict, path: str) -> bool:
    """States on a circle, arrows labelled by op (parallel ops joined); skipped (False) above PLOT_MAX_STATES."""
    task = machine["task"]
    if len(task["states"]) > PLOT_MAX_STATES:
        print(f"--plot skipped: {len(task['states'])} states (a picture is drawn for ≤ {PLOT_MAX_STATES})")
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    states, names, edges = task["states"], machine["state_names"], {}
    angles = [math.pi / 2 + 2 * math.pi * i / len(states) for i in range(len(states))]
    xy = {s: (math.cos(a), math.sin(a)) for s, a in zip(states, angles)}
    for op, row in task["operations"].items():
        for s, t in row.items():
            edges.setdefault((s, t), []).append(machine["operation_names"][op])
    fig, ax = plt.subplots(figsize=(6, 6))
    for (s, t), label in edges.items():
        text = ", ".join(label)
        if s == t:
            ax.text(xy[s][0], xy[s][1] - 0.17, "↻ " + text, ha="center", va="center", fontsize=8)  # under it
            continue
        ax.annotate("", xy=xy[t], xytext=xy[s], arrowprops=dict(arrowstyle="-|>", shrinkA=18, shrinkB=18,
                                                                connectionstyle="arc3,rad=0.15", color="0.3"))
        (x0, y0), (x1, y1) = xy[s], xy[t]  # the label beside the arc's middle (it bends right of s -> t)
        ax.text((x0 + x1) / 2 + 0.1 * (y1 - y0), (y0 + y1) / 2 - 0.1 * (x1 - x0), text, ha="center", va="center",
                fontsize=8, color="tab:blue")
    for s in states:
        bold = s == task["initial_state"]
        ax.text(*xy[s], names[s], ha="center", va="center", fontsize=9, fontweight="bold" if bold else "normal",
                bbox=dict(boxstyle="round", fc="lightyellow" if bold else "white", ec="0.2"))
    ax.set(xlim=(-1.6, 1.6), ylim=(-1.6, 1.6))
    ax.set_axis_off()
    ax.set_title(f"{task['name']}: {len(states)} states (start in bold), agreement "
                 f"{machine['agreement']['fraction']:.3f}", fontsize=10)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a checkpoint trained on records (train_par.py --train_file)")
    parser.add_argument("--out", required=True, help="the JSON to write")
    parser.add_argument("--plot", default=None, help="a picture of the machine (≤ 12 states)")
    parser.add_argument("--max_states", type=int, default=64)
    parser.add_argument("--initial_state", default=None,
                        help="a label or a JSON mapping query -> label (needed when the data had initial states)")
    parser.add_argument("--agreement_depth", type=int, default=256)
    parser.add_argument("--agreement_n", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    args = parser.parse_args(argv)
    if args.max_states < 1 or args.agreement_depth < 1 or args.agreement_n < 1 or args.batch_size < 1:
        parser.error("--max_states, --agreement_depth, --agreement_n and --batch_size must be >= 1")
    require_checkpoint("--model", args.model)
    return args


def extract(model, tokenizer, initial=None, max_states=64, agreement_depth=256, agreement_n=256, seed=0,
            batch_size=256) -> dict:
    """The output JSON (without command / date) for a loaded model and its tokenizer."""
    fmt = record_format_of(model.config)
    if fmt.initial_state and initial is None:
        raise ValueError("this checkpoint was trained with initial states: give --initial_state (a label or a JSON "
                         f"mapping of {list(fmt.query_names)} to labels).")
    if not fmt.initial_state and initial is not None:
        raise ValueError("this checkpoint was trained without initial states: --initial_state has no meaning.")
    with torch.no_grad():
        found = explore(model, tokenizer, fmt, initial, max_states, batch_size)
        machine = machine_json(fmt, found, f"{fmt.task_name}_extracted", max_states)
        machine["agreement"] = agreement(model, tokenizer, fmt, found, initial, agreement_depth, agreement_n, seed,
                                         batch_size)
    return machine


def main(argv=None) -> dict:
    from transformers import AutoModel, AutoTokenizer

    args = parse_args(argv)
    initial = args.initial_state
    if initial is not None and initial.strip().startswith("{"):
        try:
            initial = json.loads(initial)
        except json.JSONDecodeError as error:
            raise ValueError(f"--initial_state {initial!r} is not a valid JSON mapping ({error}).") from None
    model = AutoModel.from_pretrained(args.model, trust_remote_code=True)
    record_format_of(model.config)  # before anything else: a clear error for a non-records checkpoint
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    machine = extract(model, tokenizer, initial, args.max_states, args.agreement_depth, args.agreement_n, args.seed,
                      args.batch_size)
    given = sys.argv[1:] if argv is None else [str(a) for a in argv]
    machine.update(model=str(args.model), command="python examples/extract_machine.py " + " ".join(given),
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(machine, indent=2, ensure_ascii=False) + "\n")
    if args.plot:
        plot_machine(machine, args.plot)
    a = machine["agreement"]
    print(f"{machine['num_states']} states{' (truncated at --max_states)' if machine['truncated'] else ''}, start "
          f"{machine['start']['state']} ({machine['start']['kind']}); agreement {a['fraction']:.4f} "
          f"({a['agree']}/{a['n']} at depth {a['depth']}); wrote {args.out}")
    return machine


if __name__ == "__main__":
    run_cli(main)
