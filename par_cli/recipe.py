"""The recipe a records run trains with when the user gives only the data flags (`train_par.py --recipe auto`): chosen
from the training records by rules measured in results/own_data_cpu/README.md (the "README" below), each rule a small
function that returns the flags it sets and one reason citing its evidence.

    record_statistics(records)      the records as the rules see them (`RecordStatistics`)
    choose_recipe(statistics, ...)  pure: the rules' flags and reasons (`Recipe`)
    effective_flags(recipe, given)  the flags the user did not give; a rule whose flag the user gave is dropped whole
                                    (its flags belong together: a model size, a curriculum); `use_recipe` chooses them
                                    on the run's `par_cli.resolution.Resolution`, which builds the arguments with them

The rules, in the order they decide (each docstring says its rule, its evidence, and where it is a judgement call):
step states -> the default recipe; answer feedback (`feedback_rule`) and with it a small eager model
(`model_size_rule`, `compile_rule`); the curriculum (`curriculum_rule`); a smaller core's regularization at few records
(`regularization_rule`); one token per statement (`operation_tokens_rule`); Adam's β2 (`optimizer_rule`).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow.compute as pc

from state_tracking.records import SCALAR_QUERY, RecordSplits, has_step_states, whole_token_clashes

logger = logging.getLogger(__name__)

RECIPE_MODES = ("auto", "off", "race")
README = "results/own_data_cpu/README.md"

# thresholds of the rules (each rule's docstring says which are measured and which are judgement calls)
WHOLE_STATE_MIN_CHECKED = 20  # fewer checked transitions than this: the answer's wholeness is unknown
WHOLE_STATE_CHECK_RECORDS = 20_000  # the shortest this many training records are checked (seconds at most)
MANY_RECORDS = 8_000  # feedback recipes: the quarter-size model from here (measured 16,000), the regularized below
MULTI_WORD = 2.0  # mean words per operation from which an operation is a statement to read whole
MIN_REPEATS = 20  # every distinct operation repeated verbatim at least this often to get its own token
FEW_RECORDS_NOTE, LONG_SHORTEST_NOTE, MANY_LABELS_NOTE = 1_000, 16, 100


def check_recipe(value) -> None:
    """`--recipe` is one of `RECIPE_MODES`, else one error naming the flag and what it takes."""
    if value not in RECIPE_MODES:
        raise ValueError(f"--recipe must be one of {list(RECIPE_MODES)} (auto: the recipe chosen from the training "
                         f"records, par_cli.recipe; off: the fixed records defaults; race: candidates the rules order, "
                         f"measured on the validation split, par_cli.recipe_race); got {value!r}.")


@dataclass(frozen=True)
class RecordStatistics:
    """What the rules read from the training records (`record_statistics`)."""

    records: int  # training records (after the validation split is held out)
    queries: int  # state columns: 1 for a single label, else the mapping's entries
    state_shape: str  # "label" (one label per state) or "mapping" (query -> label)
    labels: int  # distinct labels over all queries (the model's answer candidates)
    labels_per_query: int  # the most distinct labels one query takes (in any recorded state)
    step_states: bool  # records carry the state after each operation
    initial_state: bool  # records carry the state before the operations
    shortest: int  # operations in the shortest training record
    longest: int
    distinct_operations: int
    operation_occurrences: int
    min_operation_repeats: int  # how often the rarest distinct operation occurs verbatim
    median_operation_repeats: float
    words_per_operation: float  # mean over occurrences, words as `--operation_tokens words` splits them
    whole_state: bool | None  # the answer is the whole state (`whole_state_check`); None: too few records to tell
    transitions_checked: int
    transition_conflicts: int
    # operations written as a token the record tokenizer reserves ("Yes", "No", ...): no whole-operation tokens
    whole_token_clashes: list = field(default_factory=list)

    def describe(self) -> str:
        whole = {True: "names the whole state", False: "does not name the whole state",
                 None: "may or may not name the whole state (too few short records to tell)"}
        shape = (f"one label of {self.labels}" if self.state_shape == "label" else
                 f"a mapping of {self.queries} entries, {self.labels} labels")
        return (f"{self.records} training records with {'step' if self.step_states else 'final'} states, lengths "
                f"{self.shortest}..{self.longest}; the state {shape}; the "
                f"answer {whole[self.whole_state]} ({self.transition_conflicts} of {self.transitions_checked} "
                f"transitions conflict); {self.distinct_operations} distinct operations, "
                f"{self.words_per_operation:.1f} words each, the rarest repeated {self.min_operation_repeats} times")


def record_statistics(records: RecordSplits) -> RecordStatistics:
    """The statistics of a run's training records (`RecordSplits.train`: normalized, the validation split held out)."""
    from tokenizers.pre_tokenizers import Whitespace

    table = records.train.dataset.data.table
    lengths = pc.list_value_length(table.column("operations")).to_numpy(zero_copy_only=False)
    counts = pc.value_counts(pc.list_flatten(table.column("operations"))).to_pylist()
    repeats = np.array([c["counts"] for c in counts], dtype=np.int64)
    splitter = Whitespace()
    words = np.array([len(splitter.pre_tokenize_str(c["values"])) for c in counts], dtype=np.float64)
    queries = len(records.train.query_names)
    recorded = pc.list_flatten(pc.list_flatten(table.column("labels")))  # (record, step, query) in order
    per_query = [len(set(pc.unique(pc.take(recorded, np.arange(q, len(recorded), queries))).to_pylist()) - {""})
                 for q in range(queries)]
    whole, checked, conflicts = whole_state_check(records.train.dataset, lengths)
    return RecordStatistics(
        records=len(lengths), queries=queries,
        state_shape="label" if list(records.train.query_names) == [SCALAR_QUERY] else "mapping",
        labels=len(records.record_format.candidates), labels_per_query=max(per_query),
        step_states=has_step_states(records.train), initial_state=bool(records.record_format.initial_state),
        shortest=int(lengths.min()), longest=int(lengths.max()), distinct_operations=len(repeats),
        operation_occurrences=int(repeats.sum()), min_operation_repeats=int(repeats.min()),
        median_operation_repeats=float(np.median(repeats)),
        words_per_operation=round(float((words * repeats).sum() / repeats.sum()), 3),
        whole_state=whole, transitions_checked=checked, transition_conflicts=conflicts,
        whole_token_clashes=whole_token_clashes(records.record_format))


def whole_state_check(dataset, lengths: np.ndarray, limit: int = WHOLE_STATE_CHECK_RECORDS) -> tuple:
    """Whether the recorded state is the whole state: whether a machine whose states are the labels themselves,
    next label = δ(label, operation), explains the records (what answer feedback needs: all one iteration hands the
    next is its answer). The shortest `limit` records are read in order of length: a record whose walk through the δ
    known so far (from its initial state, or one shared start) reaches its last operation votes δ(label before it,
    operation) = its final label (and every recorded step state votes too); a record whose operations are the first
    k of another's gives the state after those k (so logs that open with assignments, none short, are checked too).
    δ is each transition's majority, a vote against it a conflict. A label that is only part of the state (an alarm
    flag of a larger machine) shows as conflicts. The rule: whole when no checked transition conflicts. One conflict
    is a (label, operation) whose next label the label does not determine — exactly what answer feedback cannot
    carry — however rare (a watchdog alarm driven by a hidden register conflicts on ~1% of its transitions; a noisy
    log is better trained without feedback than with it). Returns (whole: True / False / None where under
    `WHOLE_STATE_MIN_CHECKED` transitions could be checked, transitions checked, conflicts)."""
    order = np.argsort(lengths, kind="stable")[:limit]
    rows = dataset.select(order.tolist()).select_columns(["operations", "labels", "initial"]).to_dict()
    votes: dict[tuple, Counter] = defaultdict(Counter)
    delta: dict[tuple, tuple] = {}
    # a record whose operations are another's first k: its final label is the state there (records that all open
    # with assignments, none shorter than 5, are checked this way where no walk can start). The records' operations
    # as a trie per start, [children, final label]: a walk follows it one operation at a time (linear in the
    # operations read, where looking each prefix up as a tuple was quadratic in the record's length)
    tries: dict[tuple, list] = {}
    for start, ops, labels in zip(rows["initial"], rows["operations"], rows["labels"]):
        if ops and all(labels[-1]):
            node = tries.setdefault(tuple(start), [{}, None])
            for op in ops:
                node = node[0].setdefault(op, [{}, None])
            if node[1] is None:
                node[1] = tuple(labels[-1])
    ordered_lengths = lengths[order]
    for length in np.unique(ordered_lengths):  # δ of shorter records walks the longer ones
        changed = set()
        for i in np.flatnonzero(ordered_lengths == length):
            start, ops = tuple(rows["initial"][i]), rows["operations"][i]
            state, node = start or ("<start>",), tries.get(start)
            for k, (op, labels) in enumerate(zip(ops, rows["labels"][i])):
                if k and node is not None and node[1] is not None:  # the state after ops[:k], another record's final
                    state = node[1]
                if all(labels):  # a recorded state: a vote where the state before it is known, and a known state
                    if state is not None:
                        votes[(state, op)][tuple(labels)] += 1
                        changed.add((state, op))
                    state = tuple(labels)
                else:
                    state = delta.get((state, op)) if state is not None else None
                node = node[0].get(op) if node is not None else None
        delta.update({key: votes[key].most_common(1)[0][0] for key in changed})
    checked = sum(sum(counter.values()) for counter in votes.values())
    conflicts = sum(sum(counter.values()) - counter.most_common(1)[0][1] for counter in votes.values())
    if checked < WHOLE_STATE_MIN_CHECKED:
        return None, checked, conflicts
    return conflicts == 0, checked, conflicts


# ---- the rules: each returns (the flags it sets, or {} to keep today's default, and its reason) ----

def few_records_feedback(s: RecordStatistics, feedback: bool) -> bool:
    """The few-records feedback recipe (row par_final_small_reg_fb) applies: answer feedback and fewer than
    `MANY_RECORDS` training records. Read by the model size, regularization and curriculum rules alike."""
    return feedback and s.records < MANY_RECORDS


def feedback_rule(s: RecordStatistics) -> tuple[dict, str]:
    """Answer feedback (`--answer_feedback true`) for final-state records whose answer is the whole state
    (`whole_state_check`: a machine on the labels alone explains the records).

    Measured (README, "Fourth pass: answer feedback"; defaults.md): with it the quarter-size model is exact at 16x on
    register3, batch_process and swap-S5 final mappings (16,000 records, lengths 1..16, 3 seeds each) at 1.1-1.8x the
    time of an LSTM of PAR's default size (hidden 288; rnn.py's default hidden 128 is 2.6-3.8x faster), and register3
    at 1,000 records goes from 56.41% to 100.00% at 16x (3 seeds). Records that all open with assignments need no
    short ones: on counters4 (shortest 5 statements) 27.44% without feedback -> 100.00% at 16x, and on var_swap5
    (shortest 6) 99.22% in 1,425 s -> 99.61% in 664 s (seed 0 each, defaults.md, variants). The earlier verdict that
    feedback stays at chance without short records came from runs stopped at 600-1,250 steps; both logs sit near
    chance for 1,250-3,500 steps, then learn."""
    if s.whole_state is not True:
        why = ("a machine on the labels alone conflicts with the records" if s.whole_state is False else
               "too few records to check that the labels alone determine the next label (none short, and too few "
               "that are the first operations of another)")
        return {}, (f"off: {why} ({s.transition_conflicts} of {s.transitions_checked} transitions conflict); answer "
                    f"feedback hands each iteration only its answer, so the answer must be the whole state ({README}, "
                    "Fourth pass)")
    return {"answer_feedback": True}, (
        f"on: final states only, and the answer names the whole state ({s.transition_conflicts} of "
        f"{s.transitions_checked} transitions conflict); measured exact at 16x on register3, batch_process and swap-S5 "
        "final mappings (3 seeds each, 1.1-1.8x the time of an LSTM of hidden 288; 2.6-3.8x that of rnn.py's default "
        "hidden 128, results/own_data_cpu/defaults.md), on register3 at 1,000 records (56.41% -> 100.00%) and, "
        "with no record shorter than 5, on counters4 (27.44% -> 100.00%) and var_swap5 (99.61%) "
        f"({README}, Fourth pass; results/own_data_cpu/defaults.md)")


def model_size_rule(s: RecordStatistics, feedback: bool) -> tuple[dict, str]:
    """With answer feedback: hidden 64 (MLP 128), 1 + 1 + 1 layers from `MANY_RECORDS` training records, hidden 64 with
    the default 1 + 2 + 1 layers below. Without it: the default model (hidden 128, 1 + 2 + 1).

    Measured (README, Fourth pass; time_to_result.md): h64 1+1+1 with feedback, 16,000 records: register3 1.3x,
    batch_process 1.1x, swap-S5 1.8x the time of an LSTM of hidden 288 (not rnn.py's default 128: defaults.md), exact
    at 16x (3 seeds each); h64 1+2+1 with feedback at 1,000 and 4,000 register3 records: 100.00% (3 seeds each), the
    default model with feedback at 1,000: validation 0.44. Without feedback the quarter-size model missed (var_swap5:
    59.77% at 16x; register3 compiled: 98.14% for one seed of 3).
    The boundary of 8,000 records is a judgement call between the sizes measured (4,000 and 16,000)."""
    if not feedback:
        return {}, ("default (hidden 128, 1 + 2 + 1 layers): without answer feedback the quarter-size model missed on "
                    f"the variable-swap log (59.77% at 16x) ({README}, Fourth pass, What did not work)")
    if not few_records_feedback(s, feedback):
        return {"hidden_size": 64, "intermediate_size": 128, "prelude_layers": 1, "core_layers": 1,
                "coda_layers": 1}, (
            f"hidden 64, 1 + 1 + 1 layers: {s.records} records (>= {MANY_RECORDS}) with answer feedback; measured "
            "exact at 16x in 1.1-1.8x the time of an LSTM of hidden 288 on three logs of 16,000 records (row "
            f"par_final_small_fast_eager_fb, 3 seeds each) ({README}, Fourth pass; "
            "results/own_data_cpu/time_to_result.md)")
    return {"hidden_size": 64, "intermediate_size": 128}, (
        f"hidden 64, 1 + 2 + 1 layers: {s.records} records (< {MANY_RECORDS}) with answer feedback; measured 100.00% "
        "at 16x on register3 at 1,000 and 4,000 records (row par_final_small_reg_fb, 3 seeds each), where the default "
        f"model with feedback stalled (validation 0.44) ({README}, Fourth pass)")


def regularization_rule(s: RecordStatistics, feedback: bool) -> tuple[dict, str]:
    """With answer feedback below `MANY_RECORDS` records: the gradient through 16 iterations (`--grad_window 16`) and
    weight decay 0.1, the rest of the few-records recipe measured (row par_final_small_reg_fb: register3 at 1,000
    and 4,000 records, 100.00% at 16x, 3 seeds each; README, Third and Fourth pass). Otherwise the defaults."""
    if few_records_feedback(s, feedback):
        return {"grad_window": 16, "weight_decay": 0.1}, (
            f"grad window 16, weight decay 0.1: {s.records} records (< {MANY_RECORDS}); the smaller, regularized core "
            "of row par_final_small_reg_fb (register3, 1,000 records: 43.65% -> 64.06% without feedback, 100.00% with "
            f"it) ({README}, Third and Fourth pass)")
    return {}, (f"default (grad window 8, weight decay 0.01): the few-records recipe applies below {MANY_RECORDS} "
                "records with answer feedback")


def curriculum_rule(s: RecordStatistics, feedback: bool) -> tuple[dict, str]:
    """Final states only: the fast mastery curriculum (`--curriculum_window 5 --curriculum_every_steps 20`), except
    the few-records feedback recipe's fixed pace (`--curriculum_advance_accuracy none --curriculum_every_steps 100`).

    Measured (README, One token per statement; time_to_result.md): the fast mastery curriculum is exact at 16x on
    register3 (3 seeds, 241 s against 809 s under the default curriculum) and batch_process (3 seeds), and is part of
    every measured fast recipe (var_swap5, the feedback rows); the fixed pace is the curriculum of row
    par_final_small_reg_fb (register3 at 1,000 records, 100.00%, 3 seeds)."""
    if few_records_feedback(s, feedback):
        return {"curriculum_advance_accuracy": None, "curriculum_every_steps": 100}, (
            f"fixed pace (one more length every 100 steps): the curriculum of the few-records feedback recipe, 100.00% "
            f"at 16x on register3 at 1,000 and 4,000 records ({README}, Fourth pass)")
    return {"curriculum_window": 5, "curriculum_every_steps": 20}, (
        "fast mastery curriculum (window 5, every 20 steps): the default window holds a mastered length ~300 steps; "
        "fast, register3 was exact at 16x in 241 s against 809 s (3 seeds), and every measured fast recipe uses it "
        f"({README}, One token per statement; results/own_data_cpu/time_to_result.md)")


def operation_tokens_rule(s: RecordStatistics) -> tuple[dict, str]:
    """One token per distinct operation (`--operation_tokens whole`) when operations are statements of several words
    (mean at least `MULTI_WORD` words) and every distinct one repeats verbatim at least `MIN_REPEATS` times in training
    (a closed set of statements: an evaluation split's operation training never held is refused either way, and only
    a checkpoint reading words can read a new wording in the pipeline).

    Measured (README, One token per statement and Third pass): on the variable-swap log (statements of 3-7 words,
    30 distinct, each thousands of times) words 8.79% at 16x, whole with the fast curriculum 99.09 +- 1.41 (3 seeds),
    with Adam β2 0.95 too 99.64 +- 0.37; the LSTM 37.99% -> 100.00% the same way. The thresholds 2 words and 20
    repeats are judgement calls: below them a word-level reading keeps rare or new wordings readable."""
    if s.words_per_operation < MULTI_WORD:
        return {}, (f"words (the default): {s.words_per_operation:.1f} words per operation, so whole would read about "
                    "the same tokens")
    if s.whole_token_clashes:
        return {}, (f"words (the default): operations {list(s.whole_token_clashes)[:3]} are written as tokens the "
                    "record tokenizer reserves (the halting readout's Yes / No, the query and label tokens), so they "
                    "cannot have whole tokens of their own")
    if s.min_operation_repeats < MIN_REPEATS:
        return {}, (f"words (the default): the rarest of {s.distinct_operations} distinct operations occurs "
                    f"{s.min_operation_repeats} times (< {MIN_REPEATS}): one token each would be barely trained, "
                    "while their words are shared")
    return {"operation_tokens": "whole"}, (
        f"whole: statements of {s.words_per_operation:.1f} words on average, {s.distinct_operations} distinct, each "
        f"repeated at least {s.min_operation_repeats} times; on the variable-swap log one token per statement took "
        f"PAR from 8.79% to 99.09-99.64% at 16x (3 seeds) and the LSTM from 37.99% to 100.00% ({README}, One token per "
        "statement, Third pass); the checkpoint then reads no wording training never held (--operation_tokens words "
        "does)")


def optimizer_rule(s: RecordStatistics, feedback: bool) -> tuple[dict, str]:
    """Without answer feedback, with the fast curriculum: Adam β2 0.95.

    Measured on the variable-swap log only (README, Third pass): β2 0.999 collapsed one seed of 3 (88.18% at 16x)
    when the fast curriculum admitted the longest records; β2 0.95 put all 3 seeds >= 99.22%. A judgement call
    elsewhere: with feedback (register3, batch_process, swap-S5) the measured rows kept β2 0.999 and are kept."""
    if feedback:
        return {}, "default (β2 0.999): the measured feedback recipes used it"
    return {"adam_beta2": 0.95}, (
        "Adam β2 0.95: with the fast curriculum and no feedback, β2 0.999 collapsed one var_swap5 seed of 3 to 88.18% "
        f"at 16x when the longest records arrived; 0.95 kept all 3 at >= 99.22% ({README}, Third pass; a judgement "
        "call beyond that log)")


def compile_rule(s: RecordStatistics, feedback: bool) -> tuple[dict, str]:
    """With answer feedback: eager (`--compile_core false`), as every measured feedback row ran; a run that stops
    after ~1,000-2,000 steps spends more time compiling a graph per length than it saves (README, Third pass: h64
    register3 eager 111 s against compiled 158 s mean, 3 seeds). Otherwise `auto` (the swap-log rows compiled)."""
    if feedback:
        return {"compile_core": "false"}, (
            "eager: the feedback rows ran eager and stop after 1,000-2,750 steps; compiling costs minutes on a cold "
            f"cache (h64 register3: eager 111 s, compiled 158 s mean of 3 seeds) ({README}, Third pass)")
    return {}, "auto (the default): the measured swap-log rows compiled"


@dataclass
class Recipe:
    """What `choose_recipe` picked: flag -> value, one reason per rule, and notes where no rule has a remedy."""

    chosen: dict
    reasons: dict
    notes: list = field(default_factory=list)
    rule_flags: dict = field(default_factory=dict)  # rule -> the flags it set (applied together, or not at all)


def choose_recipe(s: RecordStatistics, answer_feedback: bool | None = None, self_distillation: bool = False) -> Recipe:
    """The recipe for records with statistics `s`. `answer_feedback`: the user's `--answer_feedback` where given (the
    rules after `feedback_rule` read feedback as it will be); `self_distillation`: the user's mode (the recipes were
    measured with final-answer training, so it keeps the defaults)."""
    notes = recipe_notes(s)
    if s.step_states or self_distillation:
        why = ("the records carry step states: the default recipe was measured exact on the step-state files of "
               "register3, batch_process and swap-S5, the rules below on final states only" if s.step_states else
               "--self_distillation: the rules were measured with final-answer training")
        return Recipe({}, {"default": f"today's records defaults: {why} ({README})"}, notes)
    rules = {"answer_feedback": feedback_rule(s)}
    feedback = rules["answer_feedback"][0].get("answer_feedback", False) if answer_feedback is None else answer_feedback
    rules["model_size"] = model_size_rule(s, feedback)
    rules["regularization"] = regularization_rule(s, feedback)
    rules["curriculum"] = curriculum_rule(s, feedback)
    rules["operation_tokens"] = operation_tokens_rule(s)
    rules["optimizer"] = optimizer_rule(s, feedback)
    rules["compile"] = compile_rule(s, feedback)
    chosen = {flag: value for flags, _ in rules.values() for flag, value in flags.items()}
    return Recipe(chosen, {rule: reason for rule, (_, reason) in rules.items()}, notes,
                  {rule: sorted(flags) for rule, (flags, _) in rules.items()})


def recipe_notes(s: RecordStatistics) -> list[str]:
    """What the measurements say no recipe learns, for the log (no flag changes)."""
    notes = []
    if not s.step_states and s.shortest >= LONG_SHORTEST_NOTE:
        notes.append(f"no record shorter than {s.shortest} operations: with final states only, such a log was learned "
                     "by neither PAR nor the LSTM (var_swap5_long: 2.64% / 3.52% at 16x); put short records in the "
                     f"file if you can ({README})")
    if s.records < FEW_RECORDS_NOTE:
        notes.append(f"{s.records} training records: at 250 records no model learned register3 (PAR with feedback "
                     f"46.35%, LSTM 52.83% at 16x) ({README}; the per-run table: results/own_data_cpu/table.md)")
    if s.state_shape == "label" and s.labels > MANY_LABELS_NOTE:
        notes.append(f"one label among {s.labels}: S5 as one label among 120 was learned by neither PAR nor the LSTM, "
                     f"the same group as a mapping of five boxes by both; a mapping state helps if you have one "
                     f"({README})")
    return notes


# a rule is also dropped when the user gives one of these flags (its flags would contradict theirs)
ALSO_DROPPED_BY = {"curriculum": ("curriculum_start_depth", "curriculum_increment", "curriculum_advance_accuracy",
                                  "curriculum_window", "curriculum_every_steps"),
                   "model_size": ("hidden_size", "intermediate_size", "prelude_layers", "core_layers", "coda_layers",
                                  "num_attention_heads", "num_key_value_heads")}


def overridden_flags(recipe: Recipe, given: set) -> list[str]:
    """The recipe's flags the user's win over: every flag of a rule the user gave a flag of (or one of
    `ALSO_DROPPED_BY` that rule), sorted; a rule's flags go together."""
    return sorted(flag for rule, flags in recipe.rule_flags.items()
                  if given & (set(flags) | set(ALSO_DROPPED_BY.get(rule, ()))) for flag in flags)


def effective_flags(recipe: Recipe | None, given: set) -> dict:
    """What a recipe sets once the user's flags win (None: the fixed defaults, nothing)."""
    if recipe is None:
        return {}
    dropped = set(overridden_flags(recipe, given))
    return {flag: value for flag, value in recipe.chosen.items() if flag not in dropped}


def recipe_summary(recipe: Recipe | None, statistics: RecordStatistics | None, overridden: list[str]) -> dict:
    """summary.json's "recipe": mode, chosen (flag -> value), reasons (rule -> why), overridden_by_user, notes,
    statistics; `recipe` None: --recipe off."""
    if recipe is None:
        return {"mode": "off", "chosen": {}, "reasons": {}, "overridden_by_user": [], "notes": [], "statistics": None}
    return {"mode": "auto", "chosen": recipe.chosen, "reasons": recipe.reasons, "overridden_by_user": overridden,
            "notes": recipe.notes, "statistics": asdict(statistics)}


def use_recipe(records: RecordSplits, given: set, task_args, run) -> dict:
    """`--recipe auto` on a run's records: their statistics, the recipe chosen from them, its flags chosen on `run` (a
    `par_cli.resolution.Resolution`) where the user gave no flag of their rule (`effective_flags`), and one block of
    the log; `--recipe off`: nothing is chosen. Returns summary.json's "recipe" (`recipe_summary`)."""
    check_recipe(run.data.recipe)
    if run.data.recipe == "off":
        summary = recipe_summary(None, None, [])
    else:
        statistics = record_statistics(records)
        recipe = choose_recipe(statistics, run.model.answer_feedback if "answer_feedback" in given else None,
                               task_args.self_distillation)
        run.choose(effective_flags(recipe, given))
        summary = recipe_summary(recipe, statistics, overridden_flags(recipe, given))
    logger.warning(recipe_log(summary))
    return summary


def recipe_log(summary: dict) -> str:
    """The recipe as one block of the log."""
    if summary["mode"] == "off":
        return "recipe: off (--recipe off): the fixed records defaults"
    lines = ["recipe (chosen from the records; --recipe off for the fixed defaults, any flag you give wins):",
             f"  records: {RecordStatistics(**summary['statistics']).describe()}"]
    flags = " ".join(f"--{flag} {'none' if value is None else str(value).lower()}"
                     for flag, value in summary["chosen"].items() if flag not in summary["overridden_by_user"])
    lines.append(f"  flags: {flags or '(none: the defaults)'}")
    lines += [f"  {rule}: {reason}" for rule, reason in summary["reasons"].items()]
    if summary["overridden_by_user"]:
        lines.append("  yours instead: " + ", ".join(f"--{f}" for f in summary["overridden_by_user"]))
    if "operation_tokens" in summary["chosen"] and "operation_tokens" not in summary["overridden_by_user"]:
        lines.append(f"  the records are read again with --operation_tokens {summary['chosen']['operation_tokens']}")
    lines += [f"  note: {note}" for note in summary["notes"]]
    return "\n".join(lines)


__all__ = ["RECIPE_MODES", "Recipe", "RecordStatistics", "check_recipe", "choose_recipe",
           "compile_rule", "curriculum_rule", "effective_flags", "feedback_rule", "few_records_feedback",
           "model_size_rule", "operation_tokens_rule", "optimizer_rule", "overridden_flags", "record_statistics",
           "recipe_log", "recipe_notes", "recipe_summary", "regularization_rule", "use_recipe", "whole_state_check"]
