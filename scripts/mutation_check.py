"""Mutation check for the review-fix tests: apply each mutation to the source, run the test meant to catch
it, restore the file. Every line should say FAILS (caught).

    python scripts/mutation_check.py [NAME ...]
"""
import pathlib
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parents[1]
MUTATIONS = [  # (name, file, original text, mutated text, the test that must fail)
    ("balanced loss -> plain mean", "trainers/objectives.py",
     "    return torch.stack(means).mean()", "    return ce.mean()",
     "tests/test_trainers.py::test_balanced_halt_loss_weighs_classes_equally"),
    ("no adapter lr group", "trainers/par_trainer.py",
     "        lr = self.args.adapter_learning_rate\n        if lr is None:",
     "        lr = self.args.adapter_learning_rate\n        if True:",
     "tests/test_trainers.py::test_loss_falls_within_a_few_dozen_steps"),
    ("no extra negative", "trainers/par_trainer.py",
     "            if below > 1:", "            if False:",
     "tests/test_trainers.py::test_extra_halting_negative_is_a_no_example"),
    ("par objective reads final targets", "trainers/par_trainer.py",
     '        if self.args.objective == "par":\n            targets = progress_targets',
     "        if False:\n            targets = progress_targets",
     "tests/test_trainers.py::test_every_objective_supervises_its_targets_and_stretch_reaches_the_rotary"),
    ("stretch never reaches the model", "trainers/par_trainer.py",
     "readout_iterations=list(plan.all_reads), position_scale=plan.position_scale,",
     "readout_iterations=list(plan.all_reads), position_scale=None,",
     "tests/test_trainers.py::test_every_objective_supervises_its_targets_and_stretch_reaches_the_rotary"),
    ("stretch: same draw on every rank", "trainers/par_trainer.py",
     "[rank * batch_size : (rank + 1) * batch_size]", "[:batch_size]",
     "tests/test_trainers.py::test_stretch_scales_are_drawn_for_the_global_batch_and_sliced_per_rank"),
    ("sampler with replacement", "trainers/schedules.py",
     "                chunk = order[position : position + self.batch_size - len(taken)]",
     "                chunk = np.random.default_rng([self.seed, i, len(taken)])"
     ".choice(order, self.batch_size - len(taken))",
     "tests/test_trainers.py::test_sampler_walks_each_depth_without_replacement"),
    ("distillation reads step labels", "trainers/self_distillation.py",
     "            loss_kl = distillation_kl(out.answer_logits[distilled], teacher, self.args.distill_temperature)",
     "            loss_kl = answer_loss(out.answer_logits[distilled], "
     "inputs['step_labels'][:, iterations[distilled]].transpose(0, 1))",
     "tests/test_self_distillation.py::test_self_distillation_reads_no_step_label_but_the_final_one"),
    ("halting under forced allowed", "trainers/arguments.py",
     '        if self.halting_loss_weight > 0 and self.depth_schedule == "forced":', "        if False:",
     "tests/test_trainers.py::test_halting_needs_iterations_past_d"),
    ("no EMA warm-up", "trainers/self_distillation.py",
     "    return min(decay, (1.0 + step) / (10.0 + step))", "    return decay",
     "tests/test_self_distillation.py::test_self_distillation_rejects_halting_and_warms_up_its_ema"),
    ("hold default pareto", "trainers/arguments.py",
     '    hold_tail: str = field(default="additive"', '    hold_tail: str = field(default="pareto"',
     "tests/test_trainers.py::test_default_hold_window_always_overlaps_the_progress_region"),
    ("halted-only iterations mixed with unconfirmed", "state_tracking/evaluation.py",
     '"mean_iterations_halted": float(iterations[halted].mean())', '"mean_iterations_halted": float(iterations.mean())',
     "tests/test_evaluator.py::test_evaluator_on_a_real_tiny_par_model"),
    ("evaluator accuracy per box, not all boxes", "state_tracking/evaluation.py",
     '"accuracy": overall_state_accuracy(answers, targets),',
     '"accuracy": float(per_query_accuracy(answers, targets).mean()),',
     "tests/test_evaluator.py::test_evaluator_on_a_real_tiny_par_model"),
    ("retrofit keeps scratch lr", "examples/train_par.py",
     "        defaults.update(RETROFIT_TRAINING)", "        pass",
     "tests/test_examples.py::test_retrofit_takes_the_papers_schedule_unless_given"),
]
only = sys.argv[1:]
for name, path, old, new, test in MUTATIONS:
    if only and name not in only:
        continue
    f = root / path
    text = f.read_text()
    assert old in text, (name, old)
    f.write_text(text.replace(old, new, 1))
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", test], cwd=root, capture_output=True, text=True)
        status = "FAILS (caught)" if r.returncode != 0 else "PASSES (not caught!)"
    finally:
        f.write_text(text)
    print(f"{name}: {status}", flush=True)
