"""A grammar of batch-reactor wordings, for a contrastive fine-tune of the sentence reader (issue 69, item 3).

The batch-process machine's 15 meanings: the start sentence of each state (`STATES`), its 8 operations (`OPERATIONS`)
and the question "The reactor is now ?" (`QUESTION`). Each meaning is written in *forms* (`CONTENT`: what the sentence
says and its grammar): `trained` (the wordings training used, given by the caller), `clause` (a present-tense
statement), `past` (past tense or passive), `terse` (a headline: "tank full"), `code` (an event code in capitals:
"LEVEL_OK"), `person` (first person or imperative: "I press start", "press start"). A *style* (`Style`) is how a
plant log or an operator dresses a sentence: a prefix (a date and time, a clock time, a unit tag, a log level, a
sequence number, in combinations), a detail (instrument tags, numbers with units, operator ids: `DETAILS`), the case
(as written, lower, ALL CAPS), the end ('.', none, '!'), and typos (a character dropped, doubled or two swapped; never
in a state's name, which a start sentence must keep: the reader allows the start role only to a sentence naming its
state).

`generate(trained, groups, seed)` writes `groups` *groups*: one style and one form drawn per group and shared by all 15
meanings of the group (the same prefix, the same timestamp, the same case), so a group holds 15 sentences that differ
in meaning and not in style: the hard negatives of a contrastive loss, where two groups' sentences of one meaning are
the positives. Deterministic: `random.Random(seed)` only.

Written from general knowledge of how plant and controller logs and operators write, not from the held-out sets.
`held_out_wordings` lists the wordings of held-out task files (sets 1-3: the calibration and development sets) that
training did not use, and `generate` (its `held_out`) drops a content phrase or generated sentence equal to one of them
(compared by `normalized`: lowercase, whitespace collapsed, trailing '.', '!', '?' dropped), so that no held-out
wording enters training, dressed or not. Imports only the standard library.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

STATES = ("idle", "filling", "heating", "holding", "draining", "fault")
OPERATIONS = ("start", "level_ok", "temp_ok", "timer_done", "drained", "abort", "alarm", "reset")
QUESTION = "state"  # the query's name: "The reactor is now ?"
FORMS = ("trained", "clause", "past", "terse", "code", "person")
STATE = "{state}"

# ------------------------------------------------------------------------------------------------------- content
# Per form, per meaning: lowercase phrases without an end mark. A start sentence's phrases hold {state}; a question's
# get '?' when dressed. Meanings are ("start", state), ("operation", name), ("question", "state").
START_CONTENT = {
    "clause": ["the reactor is {state}", "the vessel is {state} right now", "reactor one is {state} to begin with",
               "the batch reactor starts out {state}", "the unit begins in the {state} state",
               "the kettle is {state} as the shift begins", "our reactor sits {state} at the outset",
               "the reactor is in {state} mode", "the reactor status reads {state}"],
    "past": ["the reactor was {state} at handover", "the vessel was found {state} by the night shift",
             "the reactor had been left {state}", "the batch reactor was {state} when logging began",
             "the unit was put in {state} before this log", "the reactor was reported {state} at shift change"],
    "terse": ["reactor {state}", "initial mode {state}", "unit {state} at shift start", "state on entry {state}",
              "starting condition {state}", "reactor status {state}", "mode at handover {state}"],
    "code": ["init_state={state}", "state {state}", "mode: {state}", "st0 {state}", "initial_mode {state}",
             "boot state {state}"],
    "person": ["I find the reactor {state}", "we start with the reactor {state}",
               "I took over with the vessel {state}", "we have the reactor {state} at the moment",
               "I note the reactor is {state} before anything happens", "my reactor is {state} to start"],
}
OPERATION_CONTENT = {
    "start": {
        "clause": ["the operator pushes the start button", "the batch begins", "the operator launches the recipe",
                   "the start button is pushed", "the sequence begins", "the recipe is started",
                   "the operator kicks off the batch", "the run is started from the panel"],
        "past": ["start was pushed", "the batch was launched", "the operator launched the recipe",
                 "the start command was given", "the batch sequence was initiated", "the run got started"],
        "terse": ["batch start", "start pushed", "start cmd", "cycle start", "recipe started", "run begun"],
        "code": ["start", "cmd_start", "batch_start", "evt start_pb", "seq_begin", "start_req"],
        "person": ["I press start", "I started the batch", "press start", "start the batch", "we kick off the batch",
                   "begin the run", "I hit the start button"],
    },
    "level_ok": {
        "clause": ["the vessel reaches its fill level", "the high level switch closes",
                   "the level reaches its setpoint", "the charge is complete", "the level probe shows full",
                   "the reactor is full to the mark", "the feed reaches the target volume"],
        "past": ["the tank was filled", "the fill setpoint was reached", "full level was detected",
                 "the vessel got full", "the charge was completed", "the target volume was reached"],
        "terse": ["tank full", "level ok", "level high", "fill complete", "full level", "charge done"],
        "code": ["level_ok", "lvl_high", "lsh on", "fill_done", "lvl_sp_reached", "charge_cmplt"],
        "person": ["I see the tank is full", "I stopped the feed at full level", "we confirm the vessel is full",
                   "confirm full level", "I read full on the level gauge", "we have a full tank"],
    },
    "temp_ok": {
        "clause": ["the batch reaches its target temperature", "the heater reports set point reached",
                   "the contents are up to temperature", "the temperature controller reports on target",
                   "the jacket brings the batch to set point", "the reactor temperature hits the setpoint"],
        "past": ["the target temperature was reached", "the batch was heated to set point",
                 "the setpoint temperature has been reached", "the contents were brought up to temperature",
                 "the temperature setpoint was achieved"],
        "terse": ["temp ok", "at temperature", "setpoint reached", "temperature reached", "temp at sp",
                  "target temp reached"],
        "code": ["temp_ok", "tsp_reached", "tic at sp", "temp_sp_ok", "t_target_ok", "temp_reached"],
        "person": ["I read the target temperature on the display", "we have reached the set point",
                   "confirm temperature at set point", "I see the batch up to temperature",
                   "we are at the target temperature"],
    },
    "timer_done": {
        "clause": ["the hold period ends", "the soak timer runs out", "the dwell time is complete",
                   "the hold countdown reaches zero", "the residence time is over", "the hold clock runs down"],
        "past": ["the hold time has elapsed", "the hold timer expired", "the hold period was completed",
                 "the soak finished", "the dwell time ran out", "the hold countdown ended"],
        "terse": ["hold done", "timer done", "hold complete", "dwell over", "soak time up", "hold time elapsed"],
        "code": ["timer_done", "hold_tmr_exp", "hold_end", "tmr dn", "dwell_cmplt", "soak_done"],
        "person": ["I see the hold timer at zero", "we finished the hold", "end the hold now",
                   "I note the hold time is up", "we are done with the soak"],
    },
    "drained": {
        "clause": ["the low level switch shows empty", "the vessel is empty", "the discharge is finished",
                   "the reactor has no liquid left", "the outlet runs dry", "the level probe reads empty"],
        "past": ["the tank was drained", "the vessel was emptied", "the contents were discharged",
                 "the drain was completed", "the reactor was emptied out", "empty level was detected"],
        "terse": ["tank empty", "drain done", "vessel empty", "empty", "discharge complete", "level low low"],
        "code": ["drained", "lvl_low_low", "drain_done", "lsll on", "empty_ok", "dischg_cmplt"],
        "person": ["I see the tank is empty", "we emptied the vessel", "I confirm the drain is done",
                   "we have an empty reactor", "I read empty on the level gauge"],
    },
    "abort": {
        "clause": ["the operator cancels the run", "the batch is stopped early", "the recipe is aborted",
                   "the operator terminates the batch", "the run is called off", "the operator halts the recipe"],
        "past": ["the run was cancelled", "the recipe was terminated by the operator", "the batch got cancelled",
                 "the batch was stopped before completion", "the run was aborted", "an abort was requested"],
        "terse": ["batch aborted", "abort", "run cancelled", "abort cmd", "batch cancelled", "recipe aborted"],
        "code": ["abort", "cmd_abort", "batch_abort", "evt cancel", "seq_abort", "abort_req"],
        "person": ["I abort the batch", "I cancelled the run", "abort the batch", "cancel the recipe",
                   "we call off the batch", "I stop the recipe early"],
    },
    "alarm": {
        "clause": ["the safety alarm sounds", "a high temperature alarm goes off", "the interlock trips",
                   "the horn sounds", "an alarm is raised", "the alarm beacon flashes", "a trip alarm comes in"],
        "past": ["an alarm was raised", "the alarm tripped", "the interlock tripped", "the safety alarm went off",
                 "a trip was recorded", "the horn sounded"],
        "terse": ["alarm", "alarm active", "high alarm", "trip", "interlock trip", "alarm on"],
        "code": ["alarm", "alm_active", "alm hi", "trip", "alm_raised", "sis_trip"],
        "person": ["I hear the alarm", "we got an alarm", "I see an alarm on the panel", "we have a trip",
                   "I hear the horn"],
    },
    "reset": {
        "clause": ["the operator acknowledges and resets the alarm", "the interlock is reset", "the fault is cleared",
                   "the trip is cleared", "the operator clears the alarm", "the alarm gets reset"],
        "past": ["the alarm was reset", "the fault was cleared", "the operator reset the interlock",
                 "the trip was cleared", "the alarm has been acknowledged and reset"],
        "terse": ["alarm reset", "reset", "fault cleared", "reset done", "trip cleared", "alarm cleared"],
        "code": ["reset", "alm_reset", "cmd_reset", "flt_clr", "rst", "trip_reset"],
        "person": ["I reset the alarm", "reset the alarm", "we cleared the fault", "clear the trip",
                   "I acknowledge and reset"],
    },
}
QUESTION_CONTENT = {
    "clause": ["what state is the reactor in now", "which state is the reactor in at this point",
               "where is the batch reactor now", "what is the reactor doing now", "in which state is the vessel now"],
    "past": ["what state did the reactor end in", "what was the reactor state after that",
             "which state was the reactor left in", "what did the reactor end up as"],
    "terse": ["reactor state now", "current state", "state now", "reactor status now", "final state"],
    "code": ["state", "get state", "query state", "state now", "read_state"],
    "person": ["tell me the reactor state", "can you tell me the reactor state now",
               "what do I have in the reactor now", "what state should I expect now"],
}

# Per meaning: details a log adds (instrument tags, numbers with units, operator ids); {n} a tag number, {t} a
# temperature, {p} a percentage, {v} a volume, {m} minutes, {s} a small percentage, {a} an alarm code.
DETAILS = {
    ("start", "idle"): ["no batch loaded", "valves closed", "agitator off", "all pumps stopped"],
    ("start", "filling"): ["feed valve XV-{n} open", "level {p} %", "feed pump P-{n} running", "charging {v} L"],
    ("start", "heating"): ["jacket at {t} °C", "TT-{n} reads {t} C", "steam valve open", "heater on"],
    ("start", "holding"): ["at {t} °C", "hold timer running", "TIC-{n} in control", "agitator on"],
    ("start", "draining"): ["outlet valve XV-{n} open", "level {p} %", "discharge pump P-{n} on", "drain valve open"],
    ("start", "fault"): ["alarm code A{a} active", "interlock I-{n} set", "trip pending", "needs attention"],
    ("operation", "start"): ["recipe R{n}", "batch B-{n}", "operator {n}", "from panel HMI-{n}"],
    ("operation", "level_ok"): ["LT-{n} at {p} %", "{v} L", "LSH-{n}", "level {p} %"],
    ("operation", "temp_ok"): ["TT-{n} = {t} °C", "{t} C", "TIC-{n} at setpoint", "SP {t} °C"],
    ("operation", "timer_done"): ["after {m} min", "{m} min elapsed", "TMR-{n}", "hold {m} min"],
    ("operation", "drained"): ["LT-{n} at {s} %", "LSL-{n}", "{s} L left", "level {s} %"],
    ("operation", "abort"): ["operator {n}", "recipe R{n}", "reason operator request", "from panel HMI-{n}"],
    ("operation", "alarm"): ["TAH-{n}", "PAH-{n}", "code A{a}", "priority 1"],
    ("operation", "reset"): ["operator {n}", "ALM-{n} acknowledged", "code A{a}", "from panel HMI-{n}"],
    ("question", QUESTION): [],
}
UNITS = ("R-101", "R2", "RX-3", "cell-2", "reactor B", "unit 4", "K-7", "line 1", "BR-12", "V-205")
LEVELS = ("INFO", "EVENT", "NOTE", "MSG", "LOG", "EVT")
SEPARATORS = (" ", ": ", " - ", " | ", " > ")
DETAIL_JOINS = (" ({})", ", {}", " - {}", " [{}]", " @ {}")


def meanings() -> list[tuple[str, str]]:
    """The 15 meanings in a fixed order: start sentences (per state), operations, the question."""
    return [("start", s) for s in STATES] + [("operation", o) for o in OPERATIONS] + [("question", QUESTION)]


def content(meaning: tuple[str, str], form: str, trained: dict) -> list[str]:
    """A meaning's phrases in `form` (start sentences with the state filled in); `trained` for the form "trained":
    {"operations": {name: wordings}, "preamble": [[start sentences, state filled in]], "queries": [[stems]]} (a
    `PromptFormat.trained` record)."""
    role, name = meaning
    if form == "trained":
        if role == "start":
            phrases = [s for s in trained["preamble"][0] if _names(s) == {name}]
        elif role == "operation":
            phrases = list(trained["operations"][name])
        else:
            phrases = list(trained["queries"][0])
        return [_bare(p) for p in phrases]
    if role == "start":
        return [p.replace(STATE, name) for p in START_CONTENT[form]]
    if role == "operation":
        return list(OPERATION_CONTENT[name][form])
    return list(QUESTION_CONTENT[form])


def _bare(sentence: str) -> str:
    """A wording without its end mark and with a lowercase first letter (the content phrases' shape)."""
    text = " ".join(sentence.split()).rstrip(" .!?")
    return text[:1].lower() + text[1:]


def _names(sentence: str) -> set[str]:
    return {s for s in STATES if re.search(rf"(?<!\w){s}(?!\w)", sentence, re.IGNORECASE)}


# --------------------------------------------------------------------------------------------------------- styles
@dataclass(frozen=True)
class Style:
    """How a group's sentences are dressed (one draw shared by the group's 15 meanings)."""

    prefix: str  # the whole prefix with its separator ("" for none)
    detail: bool  # add a meaning's detail
    join: str  # how the detail is attached (a DETAIL_JOINS entry)
    case: str  # "as_written", "lower", "upper"
    end: str  # ".", "", "!"
    typos: int  # typos per sentence (0, 1 or 2)

    @property
    def name(self) -> str:
        parts = [("prefix" if self.prefix else "no_prefix"), self.case]
        parts += ["detail"] if self.detail else []
        parts += [f"typos{self.typos}"] if self.typos else []
        return "+".join(parts)


def _time(rng: random.Random) -> str:
    return f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"


def _prefix(rng: random.Random) -> str:
    """One of the log prefixes, values drawn."""
    date = f"20{rng.randrange(19, 27)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    unit, level, clock = rng.choice(UNITS), rng.choice(LEVELS), _time(rng)
    kinds = [f"{date} {clock}", f"[{clock}]", clock[:5], f"[{unit}]", f"{unit}:", f"{level}:",
             f"{date} {clock} [{unit}] {level}", f"{date}T{clock}Z {unit}", f"#{rng.randrange(1, 9999):04d}",
             f"{clock} {unit}", f"[{clock}] [{level}]", f"{clock[:5]} {level} {unit}", f"<{unit}>",
             f"{date} {clock},{rng.randrange(1000):03d} {level}"]
    prefix = rng.choice(kinds)
    separator = rng.choice(SEPARATORS)
    if prefix.endswith(":"):
        separator = " "
    return prefix + separator


def draw_style(rng: random.Random) -> Style:
    """A style: half the groups with a prefix, a third with a detail, mostly as written, three in ten with typos."""
    prefix = _prefix(rng) if rng.random() < 0.5 else ""
    detail = rng.random() < 0.35
    join = rng.choice(DETAIL_JOINS)
    case = rng.choices(("as_written", "lower", "upper"), weights=(6, 2, 2))[0]
    end = rng.choices((".", "", "!"), weights=(6, 3, 1))[0]
    typos = rng.choices((0, 1, 2), weights=(7, 2, 1))[0]
    return Style(prefix, detail, join, case, end, typos)


def _fill_detail(template: str, rng: random.Random) -> str:
    values = {"n": str(rng.randrange(100, 400)), "t": f"{rng.randrange(55, 140)}.{rng.randrange(10)}",
              "p": str(rng.randrange(85, 101)), "v": str(rng.randrange(800, 5000, 50)), "m": str(rng.randrange(5, 121)),
              "s": str(rng.randrange(0, 4)), "a": str(rng.randrange(10, 99))}
    return template.format(**values)


def typo(word: str, rng: random.Random) -> str:
    """One character dropped, doubled, or two neighbours swapped (the word is at least 4 letters)."""
    i = rng.randrange(1, len(word) - 1)
    kind = rng.choice(("drop", "swap", "double"))
    if kind == "drop":
        return word[:i] + word[i + 1:]
    if kind == "double":
        return word[:i] + word[i] + word[i:]
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]


def add_typos(text: str, count: int, rng: random.Random) -> str:
    """`count` typos in distinct words of at least 4 letters that are not a state's name (the start role needs it)."""
    words = text.split(" ")
    eligible = [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 4 and w.lower() not in STATES]
    for i in rng.sample(eligible, min(count, len(eligible))):
        words[i] = typo(words[i], rng)
    return " ".join(words)


def dress(phrase: str, meaning: tuple[str, str], form: str, style: Style, rng: random.Random) -> str:
    """A content phrase as one sentence in `style` (a question ends with '?', whatever the style's end)."""
    role = meaning[0]
    text = phrase
    if style.typos:
        text = add_typos(text, style.typos, rng)
    if form == "code":
        text = text.upper()
    if style.detail and DETAILS[meaning]:
        text += style.join.format(_fill_detail(rng.choice(DETAILS[meaning]), rng))
    if style.case == "lower":
        text = text.lower()
    elif style.case == "upper":
        text = text.upper()
    elif form != "code":
        text = text[:1].upper() + text[1:]
    text = style.prefix + text
    end = " ?" if role == "question" and rng.random() < 0.3 else "?" if role == "question" else style.end
    return " ".join((text + end).split())


# ------------------------------------------------------------------------------------------------------ generation
@dataclass(frozen=True)
class Wording:
    """One generated sentence: its text, meaning (role, name), form, style name and group."""

    text: str
    role: str
    name: str
    form: str
    style: str
    group: int

    @property
    def meaning(self) -> tuple[str, str]:
        return self.role, self.name


def normalized(text: str) -> str:
    """What the held-out check compares: lowercase, whitespace collapsed, trailing '.', '!', '?' and spaces dropped."""
    return " ".join(text.lower().split()).rstrip(" .!?")


def task_wordings(path: str | Path) -> set[str]:
    """Every wording of a batch-process task file (`normalized`): start templates filled with each state,
    operations, question stems."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    text, states = spec["text"], spec["states"]
    out = {t.replace(STATE, s) for t in text["initial"] for s in states}
    out |= {w for wordings in text["operations"].values() for w in wordings}
    out |= set(text["query"])
    return {normalized(w) for w in out}


def trained_wordings(trained: dict) -> set[str]:
    """Every wording training used (`normalized`)."""
    out = set(trained["preamble"][0]) | set(trained["queries"][0])
    out |= {w for wordings in trained["operations"].values() for w in wordings}
    return {normalized(w) for w in out}


def held_out_wordings(paths, trained: dict) -> set[str]:
    """The wordings of the task files at `paths` that training did not use (`normalized`)."""
    out = set()
    for path in paths:
        out |= task_wordings(path)
    return out - trained_wordings(trained)


def generate(trained: dict, groups: int = 240, seed: int = 0, held_out: set[str] = frozenset(),
             forms: tuple[str, ...] = FORMS) -> tuple[list[Wording], dict]:
    """`groups` groups of 15 sentences (one per meaning, one style and form per group) and what was dropped: content
    phrases equal to a `held_out` wording (`normalized`) are never dressed, and a generated sentence equal to one is
    dropped. Returns (wordings, {"phrases_dropped": [...], "sentences_dropped": n})."""
    rng = random.Random(seed)
    dropped_phrases = []
    table = {}
    for meaning in meanings():
        for form in forms:
            phrases = []
            for phrase in content(meaning, form, trained):
                if normalized(phrase) in held_out:
                    dropped_phrases.append(phrase)
                else:
                    phrases.append(phrase)
            table[meaning, form] = phrases
    out, dropped = [], 0
    for group in range(groups):
        form = rng.choice(forms)
        style = draw_style(rng)
        for meaning in meanings():
            if not table[meaning, form]:  # every phrase of it dropped: the group goes without this meaning
                continue
            phrase = rng.choice(table[meaning, form])
            text = dress(phrase, meaning, form, style, rng)
            if normalized(text) in held_out:
                dropped += 1
                continue
            out.append(Wording(text, meaning[0], meaning[1], form, style.name, group))
    return out, {"phrases_dropped": sorted(set(dropped_phrases)), "sentences_dropped": dropped}


__all__ = ["DETAILS", "FORMS", "OPERATIONS", "OPERATION_CONTENT", "QUESTION", "QUESTION_CONTENT", "START_CONTENT",
           "STATES", "Style", "Wording", "add_typos", "content", "draw_style", "dress", "generate",
           "held_out_wordings", "meanings", "normalized", "task_wordings", "trained_wordings", "typo"]
