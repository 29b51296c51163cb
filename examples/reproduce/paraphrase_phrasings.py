"""Training phrasings written by an instruct parent: new wordings of every *trained* operation sentence of a task file,
generated and filtered by the model, never by hand (issue 49's paraphrase lever).

    python -m par_studies.parents fetch qwen2.5-coder-0.5b
    python examples/reproduce/paraphrase_phrasings.py \
        --task_file examples/tasks/batch_process_phrasings.json --parent qwen2.5-coder-0.5b --seed 0 \
        --out examples/tasks/batch_process_paraphrased.json

What it does, per operation of the task file:
1. Generate: the instruct parent is shown the operation's *trained* wordings (every alternative but the held-out
   ones: `held_out_phrasings`) and asked for more lines that report the same event (chat template, sampling).
2. Keep a candidate only if it is one plain sentence (ends in '.', 2–12 words, no '?' and no braces), is not already
   a wording of any operation of the task file (trained or held out: a held-out wording written again would leak the
   test), and the parent itself reads it as this operation: as a generative classifier, the line is likelier after
   this operation's trained wordings ("These batch reactor log lines all report the same event:" and the wordings,
   one per line) than after any other operation's (log P(line | context), plain text). Two zero-shot judges were
   tried first and dropped: a yes / no "same event?" question (the 0.5B parent's log P(yes) − log P(no) was about
   −0.9 for every pair, matched or not) and a lettered multiple choice (it answered "B" for every line).
3. Write a task file: the input task with the kept candidates inserted *before* the held-out wordings (so `held_out`
   evaluates exactly the same sentences as before), and a record (`--record`, default beside --out, .record.json)
   with the command, parent, seed, prompts, every candidate and why each was kept or dropped.

Nothing reads the task file's held-out wordings except the leak filter of step 2 (a candidate equal to one is
dropped), and nothing reads the second held-out set (examples/tasks/batch_process_heldout2.json).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

ASK = ("A chemical plant's batch reactor log reports the event below in these ways:\n{examples}\n"
       "Write {n} more log lines that report exactly the same event in other words, one short sentence each, "
       "one per line, no numbering.")
CONTEXT = "These batch reactor log lines all report the same event:\n{examples}\n"
MIN_WORDS, MAX_WORDS = 2, 12


def plain_sentence(text: str) -> str | None:
    """The candidate as one plain sentence, or None: leading list marks and quotes stripped; it must end in '.' and
    hold no other sentence end ('.', '?', '!', ';'), no braces or newline, and 2–12 words."""
    text = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", text.strip()).strip().strip('"').strip("'").strip()
    if not text.endswith(".") or any(c in text for c in "?!;{}\n") or "." in text[:-1]:
        return None  # one sentence: the prompt's delimiter cuts at every sentence end
    return text if MIN_WORDS <= len(text.split()) <= MAX_WORDS else None


def normalized(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


class Parent:
    """The instruct parent (fp32, one thread): sampling and the generative classifier."""

    def __init__(self, name: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from par_studies.parents import get_parent

        torch.set_num_threads(1)
        parent = get_parent(name)
        folder = parent.ensure()
        self.tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=parent.gguf_file)
        self.model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=parent.gguf_file,
                                                          dtype=torch.float32).eval()
        self.name, self.label = name, parent.label

    def _chat(self, text: str):
        return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                  return_tensors="pt", return_dict=True)

    def generate(self, prompt: str, num: int, seed: int, max_new_tokens: int = 96) -> list[str]:
        import torch

        inputs = self._chat(prompt)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(**inputs, do_sample=True, temperature=0.9, top_p=0.95,
                                      max_new_tokens=max_new_tokens, num_return_sequences=num)
        start = inputs["input_ids"].shape[1]
        return [self.tokenizer.decode(o[start:], skip_special_tokens=True) for o in out]

    def continuation_logprob(self, context: str, line: str) -> float:
        """log P(line | context) under the parent (plain text, no chat template), summed over the line's tokens."""
        import torch

        context_ids = self.tokenizer.encode(context, add_special_tokens=False)
        line_ids = self.tokenizer.encode(line, add_special_tokens=False)
        ids = torch.tensor([context_ids + line_ids])
        with torch.no_grad():
            logprobs = self.model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        targets = ids[0, len(context_ids):]
        return float(logprobs[len(context_ids) - 1:].gather(1, targets[:, None]).sum())


def trained_and_held(options: list[str], held_out: int) -> tuple[list[str], list[str]]:
    if held_out and len(options) > held_out:
        return options[:-held_out], options[-held_out:]
    return options, []


def paraphrase(task_file: Path, parent_name: str, seed: int, per_round: int, rounds: int,
               only: list[str] | None = None) -> tuple[dict, dict]:
    spec = json.loads(task_file.read_text())
    text = spec["text"]
    held_n = text.get("held_out_phrasings", 0)
    operations = text["operations"]
    every_wording = {normalized(s) for options in operations.values() for s in options}
    # the generative classifier's context per operation: its trained wordings, one per line
    contexts = {op: CONTEXT.format(examples="\n".join(trained_and_held(options, held_n)[0]))
                for op, options in operations.items()}
    parent = Parent(parent_name)
    record = {"command": " ".join(["python", "examples/reproduce/paraphrase_phrasings.py", *sys.argv[1:]]),
              "parent": parent.label, "seed": seed, "ask": ASK, "classifier_context": CONTEXT, "operations": {}}
    new_operations = {}
    for i, (op, options) in enumerate(operations.items()):
        trained, held = trained_and_held(options, held_n)
        if only and op not in only:
            new_operations[op] = options
            continue
        started = time.time()
        raw = []
        for r in range(rounds):
            prompt = ASK.format(examples="\n".join(trained), n=per_round)
            raw += [line for out in parent.generate(prompt, 2, seed * 1000 + 10 * i + r) for line in out.split("\n")]
        seen, candidates = set(), []
        for line in raw:
            sentence = plain_sentence(line)
            if sentence is None or normalized(sentence) in seen:
                continue
            seen.add(normalized(sentence))
            entry = {"sentence": sentence}
            if normalized(sentence) in every_wording:
                entry["dropped"] = "already a wording of the task file"
            else:
                # the parent as a generative classifier: which operation's wordings make the line most likely
                scores = {other: round(parent.continuation_logprob(context, sentence), 3)
                          for other, context in contexts.items()}
                entry["log_p_given"] = scores
                if max(scores, key=scores.get) != op:
                    entry["dropped"] = "the parent finds it likelier after another operation's wordings"
            candidates.append(entry)
            print(f"  {op}: {json.dumps(entry)}", flush=True)
        kept = [c["sentence"] for c in candidates if "dropped" not in c]
        new_operations[op] = trained + kept + held
        record["operations"][op] = {"trained": trained, "candidates": candidates, "kept": kept,
                                    "seconds": round(time.time() - started, 1)}
        print(f"{op}: {len(kept)} kept of {len(candidates)} ({time.time() - started:.0f} s): {kept}", flush=True)
    out = dict(spec, text=dict(text, operations=new_operations))
    return out, record


def refilter(task_file: Path, record_file: Path, out: Path) -> None:
    """Apply today's `plain_sentence` again to a record's candidates (their classifier scores are kept) and rewrite the
    task file and the record: a filter fixed after a long generation needs no new generation."""
    spec, record = json.loads(task_file.read_text()), json.loads(record_file.read_text())
    held_n = spec["text"].get("held_out_phrasings", 0)
    operations = dict(spec["text"]["operations"])
    for op, entry in record["operations"].items():
        for candidate in entry["candidates"]:
            if "dropped" not in candidate and plain_sentence(candidate["sentence"]) != candidate["sentence"]:
                candidate["dropped"] = "not one plain sentence"
        entry["kept"] = [c["sentence"] for c in entry["candidates"] if "dropped" not in c]
        trained, held = trained_and_held(operations[op], held_n)
        operations[op] = trained + entry["kept"] + held
    record["refiltered"] = " ".join(["python", "examples/reproduce/paraphrase_phrasings.py", *sys.argv[1:]])
    out.write_text(json.dumps(dict(spec, text=dict(spec["text"], operations=operations)), indent=2) + "\n")
    record_file.write_text(json.dumps(record, indent=1) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--task_file", type=Path, required=True)
    parser.add_argument("--parent", default="qwen2.5-coder-0.5b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per_round", type=int, default=6, help="lines asked for per generation")
    parser.add_argument("--rounds", type=int, default=2, help="generations (of 2 samples each) per operation")
    parser.add_argument("--operations", nargs="*", default=None, help="only these operations (a quick look)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--record", type=Path, default=None)
    parser.add_argument("--refilter", action="store_true",
                        help="no generation: apply the sentence filter again to --record's candidates, write --out")
    args = parser.parse_args(argv)
    if not args.task_file.is_file():
        parser.error(f"--task_file {args.task_file}: no such file")
    if args.refilter:
        refilter(args.task_file, args.record or args.out.with_suffix(".record.json"), args.out)
        return
    spec, record = paraphrase(args.task_file, args.parent, args.seed, args.per_round, args.rounds, args.operations)
    args.out.write_text(json.dumps(spec, indent=2) + "\n")
    record["date"] = time.strftime("%Y-%m-%d")
    (args.record or args.out.with_suffix(".record.json")).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
