"""Issue 69, item 3: a short contrastive fine-tune of the sentence reader's encoder (all-MiniLM-L6-v2) on the trained
wordings and wordings a grammar writes (`par_studies/wording_grammar.py`): does it read wordings no training used
better than the frozen encoder?

    python examples/studies/reader_finetune.py --steps 0                     # the frozen encoder (a row, no training)
    python examples/studies/reader_finetune.py --steps 200 --seed 0          # one fine-tune, read sets 2 and 3
    python examples/studies/reader_finetune.py --tag grouped_v2_st400_lr2e-05_t0.05 --seeds 0 1 2 --final_set4  # once
                                       # (set 4 read by the frozen encoder too, as the baseline, in that same run)

Training data: the recipe `qwen_stage2_determiners`' trained wordings (`sentence_reader.recipe_format()`: 61) and the
grammar's groups (`--grammar_groups` groups of 15 sentences, one per meaning, the style and form of a group shared by
its 15 meanings; grammar seed `--grammar_seed`, fixed). No wording of held-out sets 1-3 enters training: a grammar
phrase or sentence equal to one (lowercase, whitespace collapsed, end mark dropped) is dropped and the run asserts
none is left. Set 4 is never opened except by `--final_set4`.

A batch (`--batch_mode`): `grouped` (default), `--views` groups of 15: the first a *trained* group (one trained
wording per meaning, a question as "<stem> ?") with probability `--p_trained`, else a grammar group, the others
grammar groups, so each sentence's positives are its meaning in other styles and its negatives include the other 14
meanings in its own style (hard negatives); `mixed` (ablation), the same meanings but each sentence from a group of
its own (no shared style); `trained_only` (ablation: no grammar), every view a trained group.
Loss: supervised contrastive (SupCon) over the mean-pooled, normalized encodings (`sentence_reader.mean_pool`, as
the reader reads): for a sentence i with positives P(i) (the batch's other sentences of its meaning),
L_i = −mean over p in P(i) of log softmax_j≠i(cos(i, j) / τ)[p], τ = `--temperature`; AdamW (`--lr`, weight decay
0.01), 10% linear warm-up then linear decay, gradient norm clipped at 1, dropout on, the word embeddings frozen unless
`--train_embeddings`; one torch thread; `torch.manual_seed(seed)` and `random.Random(seed)` for the batches.

Reading (as `sentence_reader.py`): the fine-tuned encoder is saved under runs/reader_finetune/<tag>_s<seed>/
(`save_pretrained`, with its tokenizer: `add_sentence_reader.py --reader_folder` takes it), loaded back from there, and
read by `modeling_par.sentence_reader.SentenceReader` with the 61 trained wordings as known sentences; the threshold
calibrated on held-out set 1 (the smallest margin whose answered set-1 sentences are read right at ≥ 0.99); sets 2
and 3 measured (`sentence_reader.measure`). Also the grammar's own held-out groups (grammar seed 1, never trained on):
an in-distribution check. Every run appends one row per seed to results/reader_finetune/results.json with its
command and environment.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import torch  # noqa: E402

from modeling_par.sentence_reader import SentenceReader, mean_pool, question_text  # noqa: E402
from par_studies import wording_grammar as grammar  # noqa: E402
from par_studies.parents import get_reader  # noqa: E402
from state_tracking import load_task  # noqa: E402

TASKS = REPO / "examples" / "tasks"
SET4 = TASKS / "batch_process_heldout4.json"  # opened only by --final_set4
OUT = REPO / "results" / "reader_finetune" / "results.json"
RUNS = REPO / "runs" / "reader_finetune"
MAX_LENGTH = 48
CHECK_GROUPS = 20  # the grammar's held-out groups (seed 1) read after training


def _module(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=200, help="training steps (0: the frozen encoder)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (one row each)")
    parser.add_argument("--seed", type=int, default=0, help="one seed (when --seeds is not given)")
    parser.add_argument("--tag", default=None, help="the configuration's name (default: from the settings)")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--views", type=int, default=2, help="groups of 15 per batch (batch = 15 × views)")
    parser.add_argument("--p_trained", type=float, default=0.5, help="chance the first view is a trained group")
    parser.add_argument("--batch_mode", choices=("grouped", "mixed", "trained_only"), default="grouped")
    parser.add_argument("--grammar_groups", type=int, default=240, help="grammar groups of 15 sentences")
    parser.add_argument("--grammar_seed", type=int, default=0)
    parser.add_argument("--train_embeddings", action="store_true", help="also train the word embeddings")
    parser.add_argument("--final_set4", action="store_true",
                        help="read set 4 once with the saved encoders of --tag and --seeds (no training)")
    return parser


def tag_of(args) -> str:
    if args.tag:
        return args.tag
    if args.steps == 0:
        return "frozen"
    return (f"{args.batch_mode}_v{args.views}_st{args.steps}_lr{args.lr:g}_t{args.temperature:g}"
            + ("_emb" if args.train_embeddings else ""))


# ------------------------------------------------------------------------------------------------------- the data
def trained_group(trained: dict, rng: random.Random) -> list[str]:
    """One trained wording per meaning, in `grammar.meanings()` order (a question as the reader's '<stem> ?')."""
    out = []
    for role, name in grammar.meanings():
        if role == "start":
            out.append(rng.choice([s for s in trained["preamble"][0] if grammar._names(s) == {name}]))
        elif role == "operation":
            out.append(rng.choice(trained["operations"][name]))
        else:
            out.append(question_text(rng.choice(trained["queries"][0])))
    return out


HELD_OUT_SETS = (TASKS / "batch_process_phrasings.json", TASKS / "batch_process_heldout2.json",
                 TASKS / "batch_process_heldout3.json")  # sets 1-3: no wording of theirs is trained on


def held_out_of(fmt) -> set[str]:
    """The wordings of sets 1-3 that training did not use (`wording_grammar.normalized`)."""
    return grammar.held_out_wordings(HELD_OUT_SETS, fmt.trained)


def training_data(fmt, grammar_groups: int, grammar_seed: int) -> tuple[list[list[str]], dict]:
    """The grammar's groups (each 15 texts in `grammar.meanings()` order) and the held-out check's record."""
    sets = HELD_OUT_SETS
    held_out = held_out_of(fmt)
    wordings, dropped = grammar.generate(fmt.trained, grammar_groups, grammar_seed, held_out)
    leaks = [w.text for w in wordings if grammar.normalized(w.text) in held_out]
    assert not leaks, f"held-out wordings in the training data: {leaks}"
    groups = {}
    for w in wordings:
        groups.setdefault(w.group, {})[w.meaning] = w.text
    full = [[g[m] for m in grammar.meanings()] for g in groups.values() if len(g) == len(grammar.meanings())]
    record = {"grammar_sentences": len(wordings), "groups": len(full), "grammar_seed": grammar_seed,
              "held_out_wordings_checked": len(held_out), "held_out_files": [str(p.relative_to(REPO)) for p in sets],
              **dropped}
    return full, record


def make_batch(mode: str, views: int, p_trained: float, groups: list[list[str]], trained: dict,
               rng: random.Random) -> tuple[list[str], list[int]]:
    """The texts and meaning labels of one batch (`--batch_mode`, see the module docstring)."""
    n = len(grammar.meanings())
    texts = []
    for view in range(views):
        if mode == "trained_only" or (view == 0 and rng.random() < p_trained):
            texts += trained_group(trained, rng)
        elif mode == "mixed":
            texts += [rng.choice(groups)[m] for m in range(n)]
        else:
            texts += rng.choice(groups)
    return texts, [m for _ in range(views) for m in range(n)]


# -------------------------------------------------------------------------------------------------------- training
def supcon(z: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """Supervised contrastive loss of unit encodings z (b, H) with meaning labels (b,) (module docstring)."""
    self_mask = torch.eye(len(labels), dtype=torch.bool)
    logits = (z @ z.T / temperature).masked_fill(self_mask, -float("inf"))
    log_prob = logits.log_softmax(1)
    positive = (labels[:, None] == labels[None]) & ~self_mask
    if not positive.any():  # the mean over no rows would be NaN, and the step would train on nothing
        raise ValueError("supcon: no two sentences of one meaning in the batch (nothing to pull together); give "
                         "--views 2 or more.")
    per_row = -log_prob.masked_fill(~positive, 0.0).sum(1) / positive.sum(1).clamp(min=1)
    return per_row[positive.any(1)].mean()


def encode_train(encoder, tokenizer, texts: list[str]) -> torch.Tensor:
    batch = tokenizer(texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    hidden = encoder(**batch).last_hidden_state
    return torch.nn.functional.normalize(mean_pool(hidden, batch["attention_mask"]), dim=-1)


def fine_tune(encoder, tokenizer, args, seed: int, groups, trained) -> dict:
    """Train `encoder` in place; the loss curve and timings."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    for p in encoder.embeddings.word_embeddings.parameters():
        p.requires_grad = args.train_embeddings
    params = [p for p in encoder.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (args.steps - s) / max(1, args.steps - warmup))))
    encoder.train()
    losses = []
    wall, cpu = time.time(), time.process_time()
    for step in range(args.steps):
        texts, labels = make_batch(args.batch_mode, args.views, args.p_trained, groups, trained, rng)
        loss = supcon(encode_train(encoder, tokenizer, texts), torch.tensor(labels), args.temperature)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(float(loss.detach()), 4))
        if step % 50 == 0 or step == args.steps - 1:
            print(f"  step {step}: loss {loss.item():.4f} ({time.time() - wall:.0f} s)", flush=True)
    encoder.eval()
    k = min(20, len(losses))
    return {"train_wall_seconds": round(time.time() - wall, 1),
            "train_cpu_seconds": round(time.process_time() - cpu, 1),
            "loss_first20": round(sum(losses[:k]) / k, 4) if k else None,
            "loss_last20": round(sum(losses[-k:]) / k, 4) if k else None,
            "trainable_parameters": sum(p.numel() for p in params), "losses": losses}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------------------- reading
def summary(figures: dict) -> dict:
    """The row's figures of one set: all, by role, d = 8 prompts, answered misses (`sentence_reader.measure`)."""
    return {"all": figures["all"], "by_role": figures["by_role"], "prompt_level_8": figures["prompt_level"]["8"],
            "misses": len(figures["misses"]),
            "answered_misses": [{k: m[k] for k in ("sentence", "means", "read_as", "confidence")}
                                for m in figures["answered_misses"]]}


def read_sets(folder: Path, fmt, study, helper, names: tuple[str, ...]) -> dict:
    """The encoder at `folder` as the reader: calibrated on set 1, the sets `names` measured."""
    from transformers import AutoModel, AutoTokenizer

    reader = SentenceReader(fmt, AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder))
    calibration = helper.calibrate(reader, helper.calibration_sentences(load_task(study.SETS["set1"]), fmt, reader),
                                   study.TARGET)
    reader.threshold = calibration["threshold"]
    paths = {**study.SETS, "set4": SET4}
    out = {"calibration": calibration}
    for name in names:
        out[name] = summary(study.measure(reader, paths[name], helper))
    check, _ = grammar.generate(fmt.trained, CHECK_GROUPS, 1, held_out_of(fmt))
    readings = reader.read([w.text for w in check])
    right = [(r.role, r.read_as) == w.meaning for r, w in zip(readings, check)]
    out["grammar_check"] = {"sentences": len(check), "reading_accuracy": round(sum(right) / len(right), 4),
                            "grammar_seed": 1}
    return out


def brief(row: dict) -> str:
    parts = []
    for name in ("set2", "set3", "set4"):
        if name in row:
            a, op = row[name]["all"], row[name]["by_role"]["operation"]
            parts.append(f"{name} {100 * a['reading_accuracy']:.1f}% (ops {100 * op['reading_accuracy']:.1f}%), "
                         f"coverage {100 * a['coverage']:.1f}%, answered {a['answered_accuracy']}")
    return (f"threshold {row['calibration']['threshold']}; " + "; ".join(parts)
            + f"; grammar check {row['grammar_check']['reading_accuracy']}")


def read_final_set4(results: dict, args, seeds: list[int], tag: str, fmt, study, helper, environment: dict) -> dict:
    """--final_set4: sets 2, 3 and 4 read once, by the frozen encoder (the baseline) and by each seed's saved encoder
    of `tag` (refused when set 4 was read before, or an encoder is missing or not the measured one); the rows are
    written to OUT as `results["set4"]`."""
    if "set4" in results:
        raise SystemExit(f"{OUT} already holds set 4 (read once, {results['set4']['date']}): not read again.")
    frozen = Path(get_reader("all-minilm-l6-v2").ensure(quiet=True))  # the baseline, read in the same one time
    rows = [{"tag": "frozen", "seed": None, "folder": "all-minilm-l6-v2 (frozen)",
             **read_sets(frozen, fmt, study, helper, ("set2", "set3", "set4"))}]
    print(f"frozen: {brief(rows[-1])}")
    for seed in seeds:
        folder = RUNS / f"{tag}_s{seed}"
        trained_row = next((r for r in results["rows"] if r["tag"] == tag and r["seed"] == seed), None)
        if trained_row is None or not (folder / "model.safetensors").is_file():
            raise SystemExit(f"no saved encoder of {tag!r} seed {seed} ({folder}); train it first.")
        if trained_row.get("sha256") and sha256_of(folder / "model.safetensors") != trained_row["sha256"]:
            raise SystemExit(f"{folder}: weights differ from the row's sha256; not the measured encoder.")
        rows.append({"tag": tag, "seed": seed, "folder": str(folder.relative_to(REPO)),
                     **read_sets(folder, fmt, study, helper, ("set2", "set3", "set4"))})
        print(f"{tag} seed {seed}: {brief(rows[-1])}")
    results["set4"] = {"read_once": True, "date": environment["date"], "environment": environment, "rows": rows}
    OUT.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    return results


def train_and_read(args, seed: int, tag: str, command: str, environment: dict, data_record: dict, base, groups,
                   fmt, study, helper) -> dict:
    """One seed's row: the encoder fine-tuned (`fine_tune`, saved under RUNS/<tag>_s<seed>) or, with --steps 0, the
    frozen one at `base`, read on sets 2 and 3 (`read_sets`); with its command, config, data, timings, sha256 and
    losses."""
    from transformers import AutoModel, AutoTokenizer

    started = time.time()
    config = {k: getattr(args, k) for k in ("steps", "lr", "temperature", "views", "p_trained", "batch_mode",
                                            "grammar_groups", "grammar_seed", "train_embeddings")}
    row = {"tag": tag, "seed": seed, "command": command.strip(), "environment": environment, "config": config,
           "batch_size": 15 * args.views, "data": data_record}
    if args.steps == 0:
        folder, training = Path(base), {"train_wall_seconds": 0.0, "train_cpu_seconds": 0.0}
    else:
        tokenizer = AutoTokenizer.from_pretrained(base)
        encoder = AutoModel.from_pretrained(base)
        training = fine_tune(encoder, tokenizer, args, seed, groups, fmt.trained)
        folder = RUNS / f"{tag}_s{seed}"
        encoder.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    row.update({k: v for k, v in training.items() if k != "losses"})
    row["folder"] = str(folder) if args.steps == 0 else str(folder.relative_to(REPO))
    row["sha256"] = sha256_of(Path(folder) / "model.safetensors")
    cpu = time.process_time()
    row.update(read_sets(Path(folder), fmt, study, helper, ("set2", "set3")))
    row["read_cpu_seconds"] = round(time.process_time() - cpu, 1)
    row["wall_seconds"] = round(time.time() - started, 1)
    row["losses"] = training.get("losses", [])
    return row


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.views < 2:  # one group per batch holds each meaning once: no positive pair for the loss
        parser.error(f"--views must be at least 2 (each sentence's positives are its meaning in the other views); "
                     f"got {args.views}.")
    torch.set_num_threads(1)
    seeds = args.seeds if args.seeds is not None else [args.seed]
    command = "python examples/studies/reader_finetune.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    study = _module("examples/studies/sentence_reader.py")
    helper = _module("examples/add_sentence_reader.py")
    environment = {**study.environment_of(), "command": command.strip()}
    results = json.loads(OUT.read_text()) if OUT.is_file() else {"rows": []}
    fmt = study.recipe_format()
    tag = tag_of(args)
    if args.final_set4:
        return read_final_set4(results, args, seeds, tag, fmt, study, helper, environment)

    spec = get_reader("all-minilm-l6-v2")
    base = spec.ensure(quiet=True)
    groups, data_record = training_data(fmt, args.grammar_groups, args.grammar_seed)
    for seed in seeds:
        row = train_and_read(args, seed, tag, command, environment, data_record, base, groups, fmt, study, helper)
        results["rows"].append(row)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        print(f"{tag} seed {seed}: {row['wall_seconds']} s; {brief(row)}", flush=True)
    return results

if __name__ == "__main__":
    main()
