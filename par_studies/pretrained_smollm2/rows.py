"""The study's rows as data (`examples/reproduce/pretrained_smollm2.py`): the task, the test grid, the presets each
row is built from, `ROWS` (described in the script's docstring), and what each row is evaluated on (`EVALUATION`)."""

from __future__ import annotations

from .. import LOCAL, REPO, Row, rows_by_name

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
# d <= 8 against 125; the time cap is the 2 hours per seed less the session's evaluation time
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
