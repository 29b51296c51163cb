"""A checkpoint's sentence reader: which known sentence each sentence of a prompt means, and how sure that is.

A checkpoint answers reliably only in the wordings its training used (`prompt_format.trained`). A sentence encoder
(all-MiniLM-L6-v2 in this project, any transformers encoder with a `last_hidden_state`) saved in the checkpoint's
`reader/` subfolder reads a new wording as its nearest *known* one; the pipeline then lets the loop read that known
wording in its place, or refuses the prompt when the reading is not sure enough (`pipeline_par.py`).

Known sentences: every wording training used, per role (`known_sentences`): each start sentence with its state filled
in (`start`, named by the state), each operation wording (`operation`, named by the operation), each question wording
with its '?' (`question`, named by the query). From `prompt_format.trained` where the checkpoint records it, else every
sentence the format lists. Their encodings are computed once and cached in `reader/known_sentences.safetensors` (one
float32 tensor "encodings", K × H, unit rows) beside `reader/known_sentences.json` (their role, slot, name and text, in
the same order); a checkpoint whose format no longer matches that list is refused by name. A user may add example
wordings of their own (`example_sentences`: few-shot reading, no training); they are known sentences with `trained`
False, listed after the trained ones.

The reading of one sentence u (`SentenceReader.read`), with e(v) the encoder's last hidden states h_t mean-pooled over
the sentence's tokens and normalized:

    e(u) = ẽ / |ẽ|,  ẽ = Σ_t m_t h_t / Σ_t m_t                 (m_t = 1 on the sentence's tokens, 0 on padding)
    cos(u, v) = e(u) · e(v)
    s_m(u) = max over the known wordings v of meaning m of cos(u, v)      (meaning m = (role, slot, name))
    A(u), the meanings u's content allows: every question meaning when u ends with '?'; else every operation
          meaning and the start meanings of the states u names (a state's name as a whole word, any case: a start
          sentence states its state by name, as the format's "{candidate}" templates write it)
    an exact known wording (compared as the format compares units): its own meaning and role, known, confidence 1.0;
    else read(u) = argmax over m in A(u) of s_m(u): role and read_as are its role and name (so the role is the one
          of the most similar known sentence among those u's content allows), nearest_known its most similar wording
    replacement(u) = the trained wording v of read(u) with the largest cos(u, v): what the loop reads in u's place
          (u itself when u is a trained wording; a user's example wording is replaced too)
    confidence(u) = s_read(u) − max over m' in A(u), m' ≠ read(u), of s_m'(u)
          (when A(u) holds no other meaning, e.g. the one question of a one-question task: over every other meaning)

The confidence is the *margin* between the meaning read and the runner-up, not the similarity s_read itself: a new
wording is misread when two meanings are about equally near (in issue 69's measurement on held-out set 2, the 80% of
sentences with the largest margin were read right at 92.1% against 83.3% for all), while a wording far from every known
sentence but clearly nearest one meaning is still read right. The allowed meanings A(u) come from what the sentence
says: without them an operation worded around a state ("Heat-up finished.") is read as a start sentence ("The batch
reactor is heating."), the first design's commonest miss on set 2 (results/sentence_reader/README.md). A known
wording is read by its exact text, with confidence 1.0 by definition (no encoder call). `similarity` (s_read) is
reported beside it.

Selective answering: a sentence is *answered* when it is known or its confidence is ≥ the checkpoint's threshold
(`config.sentence_reader["threshold"]`; None: no threshold reached the calibration target, so every new wording is
under it). `choose_threshold` picks it on a calibration split: the smallest threshold whose answered sentences are read
right at ≥ the target share.

Remote code: imports only torch, transformers, the standard library and sibling modules.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer
from transformers.utils import cached_file

from .prompt_format import CANDIDATE, QUESTION_MARK, PromptFormat, PromptFormatError, require_prompt_text
from .sentences import collapse_whitespace

READER_FOLDER = "reader"  # the checkpoint's subfolder holding the encoder, its tokenizer and the known sentences
KNOWN_ENCODINGS = "known_sentences.safetensors"
KNOWN_INDEX = "known_sentences.json"
CONFIDENCE = "margin"  # the confidence this module computes (config.sentence_reader["confidence"])
ROLES = ("start", "operation", "question")


@dataclass(frozen=True)
class KnownSentence:
    """One wording the reader knows: its role, slot (which start sentence / question; 0 for an operation), name (the
    state, operation or query it means), text, and whether training used it (`trained`; False: a user's example
    wording, `example_sentences`, which the loop never read)."""

    role: str
    slot: int
    name: str
    text: str
    trained: bool = True

    @property
    def meaning(self) -> tuple[str, int, str]:
        return self.role, self.slot, self.name


@dataclass(frozen=True)
class Reading:
    """What one sentence was read as (see the module docstring for each field's formula)."""

    sentence: str
    role: str
    read_as: str
    nearest_known: str
    confidence: float
    known: bool
    similarity: float
    slot: int = 0
    replacement: str = ""  # the trained wording the loop reads in its place (the sentence itself when trained)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("slot")
        return out


@dataclass(frozen=True)
class PromptReading:
    """A prompt read sentence by sentence: the readings, the prompt with each new wording replaced by its nearest known
    one (`canonical`), and the readings under the threshold (`unsure`, weakest first; empty: confident)."""

    readings: tuple[Reading, ...]
    canonical: str
    unsure: tuple[Reading, ...]

    @property
    def confident(self) -> bool:
        return not self.unsure


# ---------------------------------------------------------------------------------------------------- the formulas
def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ẽ = Σ_t m_t h_t / Σ_t m_t: (b, T, H) hidden states and (b, T) mask -> (b, H)."""
    mask = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


@torch.no_grad()
def encode_sentences(encoder, tokenizer, sentences: list[str], batch_size: int = 64) -> torch.Tensor:
    """e(u) for every sentence: the encoder's last hidden states mean-pooled (`mean_pool`) and scaled to unit length;
    (n, H) float32 on the CPU."""
    rows = []
    device = next(encoder.parameters()).device
    for i in range(0, len(sentences), batch_size):
        batch = tokenizer(list(sentences[i:i + batch_size]), padding=True, truncation=True, return_tensors="pt")
        batch = {k: v.to(device) for k, v in batch.items()}
        hidden = encoder(**batch).last_hidden_state
        rows.append(torch.nn.functional.normalize(mean_pool(hidden, batch["attention_mask"]).float(), dim=-1).cpu())
    if not rows:
        return torch.zeros(0, int(encoder.config.hidden_size))
    return torch.cat(rows)


def meaning_scores(similarities: torch.Tensor, meaning_of: torch.Tensor, num_meanings: int) -> torch.Tensor:
    """s_m(u) = max over the known wordings v of meaning m of cos(u, v): (n, K) similarities and (K,) meaning index
    of each known wording -> (n, M)."""
    scores = torch.full((similarities.shape[0], num_meanings), -2.0)
    return scores.scatter_reduce(1, meaning_of.expand_as(similarities), similarities, reduce="amax")


def margin(scores: torch.Tensor, read: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """confidence = s_read − max over the other allowed meanings m' of s_m': (n, M) scores, (n,) meaning read and
    (n, M) allowed meanings (None: all) -> (n,). A row whose allowed meanings hold no other one takes the runner-up
    over every other meaning; with a single meaning in all there is none: the confidence is s_read itself."""
    best = scores.gather(1, read[:, None])[:, 0]
    if scores.shape[1] < 2:
        return best
    others = scores.scatter(1, read[:, None], -float("inf"))
    if allowed is not None:
        alone = allowed.sum(1) < 2
        others = torch.where(allowed | alone[:, None], others, -float("inf"))
    return best - others.max(1).values


def named_states(sentence: str, states) -> set[str]:
    """The states whose name occurs in `sentence` as a whole word (any case)."""
    return {state for state in states if re.search(rf"(?<!\w){re.escape(state)}(?!\w)", sentence, re.IGNORECASE)}


def choose_threshold(confidences, correct, target: float) -> float | None:
    """The smallest threshold t (one of the confidences) such that the sentences with confidence ≥ t are read right
    at a share ≥ `target`; None when no t reaches it (then every new wording is under the threshold: refused, or
    answered with confident False on request)."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1]; got {target!r}.")
    confidences, correct = [float(c) for c in confidences], [bool(r) for r in correct]
    if len(confidences) != len(correct):
        raise ValueError(f"confidences and correct must have the same length; got {len(confidences)} and "
                         f"{len(correct)}.")
    pairs = sorted(zip(confidences, correct))
    right, total = sum(r for _, r in pairs), len(pairs)
    i = 0
    while i < total:  # the answered set at t = pairs[i][0] is pairs[i:]
        t = pairs[i][0]
        if right / (total - i) >= target:
            return t
        while i < total and pairs[i][0] == t:  # ties share one threshold
            right -= pairs[i][1]
            i += 1
    return None


# --------------------------------------------------------------------------------------------------- known sentences
def question_text(words: str) -> str:
    """A question wording as a sentence: its words and '?'."""
    return f"{collapse_whitespace(words)} {QUESTION_MARK}"


def sentence_key(prompt_format: PromptFormat, sentence: str) -> str:
    """What a sentence is compared by: a question by its words (whitespace before '?' ignored), any other sentence as
    the format compares units."""
    text = collapse_whitespace(sentence)
    if text.endswith(QUESTION_MARK):
        return question_text(text[:-1])
    return prompt_format._key(text)


def known_sentences(prompt_format: PromptFormat) -> list[KnownSentence]:
    """Every wording training used (`prompt_format.trained`; every sentence the format lists when it records none),
    per role, in the format's order: start sentences (state filled in), operations, questions."""
    if not isinstance(prompt_format, PromptFormat) or prompt_format.rendering != "text":
        raise ValueError("a sentence reader needs a text prompt format (a symbolic or records checkpoint reads "
                         "tokens or operation strings, not sentences).")
    trained, key = prompt_format.trained, prompt_format._key
    known = []
    for j, templates in enumerate(prompt_format.preamble):
        state_of = {key(t.replace(CANDIDATE, c)): c for t in templates for c in prompt_format.candidates}
        filled = [t.replace(CANDIDATE, c) for t in templates for c in prompt_format.candidates]
        for sentence in (filled if trained is None else trained["preamble"][j]):
            known.append(KnownSentence("start", j, state_of[key(sentence)], sentence))
    for name, units in prompt_format.operations.items():
        for sentence in (units if trained is None else trained["operations"].get(name, ())):
            known.append(KnownSentence("operation", 0, name, sentence))
    for j, words in enumerate(prompt_format.queries if trained is None else trained["queries"]):
        known += [KnownSentence("question", j, prompt_format.query_names[j], question_text(w)) for w in words]
    return known


EXAMPLE_KEYS = ("initial", "operations", "query")  # an examples file's keys, as a task file's "text" names them
STATE_SLOT = "{state}"  # where an example start sentence names its state (a task file's placeholder)


def example_sentences(prompt_format: PromptFormat, examples: dict) -> list[KnownSentence]:
    """A user's own wordings of the checkpoint's sentences (few-shot reading: no training), as known sentences with
    `trained` False, in a task file's "text" shape: {"initial": start templates with "{state}" (one list per start
    sentence when the format has several), "operations": {operation: wordings}, "query": question stems, their '?'
    optional (one list per question when several)}, every key optional. The reader then matches a new wording against
    them too, and the loop reads the meaning's nearest *trained* wording in its place. Refused by field: an unknown
    key, operation or state template, a wording that is not one sentence of the format, one that is a trained wording
    of another meaning or is given for two meanings, a meaning training never worded."""
    if not isinstance(examples, dict) or set(examples) - set(EXAMPLE_KEYS):
        raise ValueError(f"examples must be a dict with the keys {list(EXAMPLE_KEYS)} (a task file's \"text\" "
                         f"shape); got {sorted(examples) if isinstance(examples, dict) else type(examples).__name__}.")
    out = []
    for j, templates in enumerate(_per_slot(examples.get("initial", []), len(prompt_format.preamble), "initial")):
        for t in templates:
            if STATE_SLOT not in t:
                raise ValueError(f"examples['initial']: {t!r} has no {STATE_SLOT} (a start sentence names its state "
                                 f"where {STATE_SLOT} stands, as in a task file).")
            out += [KnownSentence("start", j, c, t.replace(STATE_SLOT, c), False) for c in prompt_format.candidates]
    operations = examples.get("operations", {})
    if not isinstance(operations, dict) or set(operations) - set(prompt_format.operations):
        raise ValueError(f"examples['operations'] must map operations of this checkpoint "
                         f"({list(prompt_format.operations)}) to wordings; got {operations!r}.")
    for name, wordings in operations.items():
        out += [KnownSentence("operation", 0, name, w, False) for w in _wordings(wordings, f"operations.{name}")]
    for j, stems in enumerate(_per_slot(examples.get("query", []), len(prompt_format.query_names), "query")):
        out += [KnownSentence("question", j, prompt_format.query_names[j], question_text(_stem(w)), False)
                for w in stems]
    trained = {sentence_key(prompt_format, k.text): k for k in known_sentences(prompt_format)}
    worded = {k.meaning for k in trained.values()}
    given: dict[str, KnownSentence] = {}
    for example in out:
        if len(prompt_format.units(example.text)) != 1:
            raise ValueError(f"examples: {example.text!r} is not one sentence of this format (its sentence rule "
                             "cuts it in pieces): give one sentence per wording.")
        key = sentence_key(prompt_format, example.text)
        same = trained.get(key)
        if same is not None and same.meaning != example.meaning:
            raise ValueError(f"examples: {example.text!r} is given as {example.role} {example.name!r} but training "
                             f"used it for {same.role} {same.name!r}.")
        first = given.setdefault(key, example)
        if first.meaning != example.meaning:  # the reader would read it, known, as the first one's meaning
            raise ValueError(f"examples: {example.text!r} is given as {example.role} {example.name!r} and as "
                             f"{first.role} {first.name!r}: one wording, one meaning.")
        if example.meaning not in worded:
            raise ValueError(f"examples: {example.text!r} means {example.role} {example.name!r}, which training "
                             "never worded: the loop has no trained wording to read in its place.")
    return out


def _per_slot(value, slots: int, field: str) -> list[list[str]]:
    """An examples field as one list of wordings per slot: a flat list when the format has one slot."""
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        if len(value) != slots:
            raise ValueError(f"examples[{field!r}]: {len(value)} lists for the format's {slots} {field} sentence(s).")
        return [_wordings(v, field) for v in value]
    if slots != 1 and value:
        raise ValueError(f"examples[{field!r}]: the format has {slots} {field} sentences; give one list per sentence.")
    return [_wordings(value, field)] if value else []


def _stem(question: str) -> str:
    """A question example's words: a stem as a task file writes it, its '?' dropped where the user wrote one."""
    text = collapse_whitespace(question)
    return text[:-1].rstrip() if text.endswith(QUESTION_MARK) and text[:-1].strip() else text


def _wordings(value, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"examples[{field!r}] must be a list of non-empty strings; got {value!r}.")
    return value


def save_encodings(path: str | Path, encodings: torch.Tensor) -> None:
    """Write `encodings` as a safetensors file holding one float32 tensor "encodings" (the format written by hand:
    an 8-byte little-endian header length, the JSON header, the little-endian data)."""
    rows = encodings.detach().to(torch.float32).cpu().contiguous()
    header = json.dumps({"encodings": {"dtype": "F32", "shape": list(rows.shape),
                                       "data_offsets": [0, 4 * rows.numel()]}}).encode()
    header += b" " * (-len(header) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(header)) + header
                           + struct.pack(f"<{rows.numel()}f", *rows.flatten().tolist()))


def load_encodings(path: str | Path) -> torch.Tensor:
    """The "encodings" tensor of a safetensors file written by `save_encodings` (F32)."""
    blob = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    entry = json.loads(blob[8:8 + size])["encodings"]
    if entry["dtype"] != "F32":
        raise ValueError(f"{path}: encodings must be F32; got {entry['dtype']}.")
    start, end = (8 + size + offset for offset in entry["data_offsets"])
    values = struct.unpack(f"<{(end - start) // 4}f", blob[start:end])
    return torch.tensor(values, dtype=torch.float32).reshape(entry["shape"])


# -------------------------------------------------------------------------------------------------------- the reader
class SentenceReader:
    """Reads the sentences of a text checkpoint's prompts (see the module docstring). `threshold`: the confidence a
    new wording needs to be answered (None: none is enough)."""

    def __init__(self, prompt_format: PromptFormat, encoder, tokenizer, threshold: float | None = None,
                 known_encodings: torch.Tensor | None = None, examples: list[KnownSentence] | None = None):
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
            raise ValueError(f"sentence_reader threshold must be a number or None; got {threshold!r}.")
        self.prompt_format, self.encoder, self.tokenizer = prompt_format, encoder.eval(), tokenizer
        self.threshold = None if threshold is None else float(threshold)
        self.known = known_sentences(prompt_format) + list(examples or ())
        self.meanings = list(dict.fromkeys(k.meaning for k in self.known))
        self._meaning_of = torch.tensor([self.meanings.index(k.meaning) for k in self.known])
        self._index = {}
        self._trained = torch.tensor([k.trained for k in self.known])
        for i, k in enumerate(self.known):
            self._index.setdefault(sentence_key(prompt_format, k.text), i)
        if known_encodings is None:
            known_encodings = encode_sentences(encoder, tokenizer, [k.text for k in self.known])
        if tuple(known_encodings.shape[:1]) != (len(self.known),):
            raise ValueError(f"{len(self.known)} known sentences but {known_encodings.shape[0]} encodings.")
        self.known_encodings = known_encodings

    # -------------------------------------------------------------------------------------------- files and loading
    def save(self, folder: str | Path) -> None:
        """Write the known sentences' encodings and index into `folder` (a checkpoint's reader/ subfolder)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_encodings(folder / KNOWN_ENCODINGS, self.known_encodings)
        (folder / KNOWN_INDEX).write_text(json.dumps([asdict(k) for k in self.known], indent=1) + "\n")

    @classmethod
    def from_checkpoint(cls, source: str, prompt_format: PromptFormat, settings: dict) -> SentenceReader:
        """The reader of checkpoint `source` (a folder or a Hub repo): the encoder and tokenizer of its reader/
        subfolder, its cached known encodings (checked against the format's known sentences) and the threshold of
        `settings` (`config.sentence_reader`)."""
        if not isinstance(settings, dict) or "threshold" not in settings:
            raise ValueError(f"config.sentence_reader must be a dict with a 'threshold'; got {settings!r}.")
        if settings.get("confidence", CONFIDENCE) != CONFIDENCE:
            raise ValueError(f"config.sentence_reader['confidence'] is {settings['confidence']!r}; this code computes "
                             f"{CONFIDENCE!r}.")
        try:
            index_path = cached_file(source, KNOWN_INDEX, subfolder=READER_FOLDER)
            encodings_path = cached_file(source, KNOWN_ENCODINGS, subfolder=READER_FOLDER)
        except OSError as error:
            raise ValueError(f"{source}: config.sentence_reader is set but its reader/ files are missing ({error}); "
                             "run examples/add_sentence_reader.py on the folder.") from error
        encoder = AutoModel.from_pretrained(source, subfolder=READER_FOLDER, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(source, subfolder=READER_FOLDER)
        stored = [KnownSentence(**k) for k in json.loads(Path(index_path).read_text())]
        reader = cls(prompt_format, encoder, tokenizer, settings["threshold"],
                     known_encodings=load_encodings(encodings_path), examples=[k for k in stored if not k.trained])
        if stored != reader.known:
            raise ValueError(f"{source}: reader/{KNOWN_INDEX} does not list the known sentences of the checkpoint's "
                             "prompt_format; run examples/add_sentence_reader.py on the folder again.")
        return reader

    # ---------------------------------------------------------------------------------------------------- reading
    def read(self, sentences: list[str]) -> list[Reading]:
        """One `Reading` per sentence (the module docstring's formulas); known wordings are not encoded."""
        readings: list[Reading | None] = [None] * len(sentences)
        new = []
        for i, sentence in enumerate(sentences):
            k = self._index.get(sentence_key(self.prompt_format, sentence))
            if k is None:
                new.append(i)
            else:
                known = self.known[k]
                replacement = sentence if known.trained else self._replacement(
                    self.meanings.index(known.meaning), self.known_encodings[k] @ self.known_encodings.T)
                readings[i] = Reading(sentence, known.role, known.name, known.text, 1.0, True, 1.0, known.slot,
                                      replacement)
        if new:
            similarities = encode_sentences(self.encoder, self.tokenizer, [sentences[i] for i in new]) \
                @ self.known_encodings.T  # (n, K)
            scores = meaning_scores(similarities, self._meaning_of, len(self.meanings))
            for row, i in enumerate(new):
                allowed = self.allowed_meanings(sentences[i])[None]
                read = int(torch.where(allowed[0], scores[row], -float("inf")).argmax())
                wordings = (self._meaning_of == read).nonzero()[:, 0]
                nearest = int(wordings[similarities[row, wordings].argmax()])
                confidence = float(margin(scores[row:row + 1], torch.tensor([read]), allowed)[0])
                role, slot, name = self.meanings[read]
                readings[i] = Reading(sentences[i], role, name, self.known[nearest].text, round(confidence, 6),
                                      False, round(float(scores[row, read]), 6), slot,
                                      self._replacement(read, similarities[row]))
        return readings

    def _replacement(self, meaning: int, similarities: torch.Tensor) -> str:
        """The trained wording of meaning `meaning` most similar to a sentence ((K,) similarities to every known
        wording): what the loop reads in the sentence's place."""
        wordings = ((self._meaning_of == meaning) & self._trained).nonzero()[:, 0]
        return self.known[int(wordings[similarities[wordings].argmax()])].text

    def allowed_meanings(self, sentence: str) -> torch.Tensor:
        """A(u) of the module docstring as an (M,) mask: the question meanings for a sentence ending with '?'; else
        the operation meanings and the start meanings of the states it names."""
        if collapse_whitespace(sentence).endswith(QUESTION_MARK):
            return torch.tensor([role == "question" for role, _, _ in self.meanings])
        named = named_states(sentence, self.prompt_format.candidates)
        return torch.tensor([role == "operation" or (role == "start" and name in named)
                             for role, _, name in self.meanings])

    def answered(self, reading: Reading) -> bool:
        """A known wording, or a new one read with confidence ≥ the threshold."""
        return reading.known or (self.threshold is not None and reading.confidence >= self.threshold)

    def read_prompt(self, prompt: str, prompt_format: PromptFormat | None = None,
                    check_roles: bool = True) -> PromptReading:
        """Every unit of `prompt` (the format's sentence rule or delimiter; `prompt_format`: the reader's own, or
        one with another delimiter) read, the roles checked in order (start sentences, operations, questions:
        `PromptFormatError` naming the first misplaced one; `check_roles=False` only reports them), and the prompt
        with each wording training did not use replaced by the trained wording read in its place (`replacement`)."""
        prompt_format = prompt_format or self.prompt_format
        require_prompt_text(prompt)
        spans = prompt_format.units(prompt)
        readings = self.read([prompt[a:b] for a, b in spans])
        if check_roles:
            roles_in_order(readings, prompt_format)
        pieces, last = [], 0
        for (a, b), reading in zip(spans, readings):
            pieces += [prompt[last:a], reading.replacement]
            last = b
        unsure = sorted((r for r in readings if not self.answered(r)), key=lambda r: r.confidence)
        return PromptReading(tuple(readings), "".join(pieces) + prompt[last:], tuple(unsure))

    def refusal(self, reading: PromptReading) -> PromptFormatError:
        """The one error for a prompt with a sentence under the threshold: the weakest, its nearest known wording and
        its confidence."""
        weakest, more = reading.unsure[0], len(reading.unsure) - 1
        position = next(i for i, r in enumerate(reading.readings) if r is weakest) + 1
        bar = ("no new wording reached the calibration target, so none is answered" if self.threshold is None else
               f"under this checkpoint's threshold {self.threshold:.3f}")
        return PromptFormatError(
            f"sentence {position} {weakest.sentence!r} is read as {weakest.role} {weakest.read_as!r} with confidence "
            f"{weakest.confidence:.3f} (margin over the next meaning; nearest known wording: "
            f"{weakest.nearest_known!r}), {bar}" + (f"; {more} more sentence(s) under it" if more else "")
            + ". Not answered: write it the way training did, or pass answer_unconfident=True to answer anyway (the "
            "result then says 'confident': False).")


def roles_in_order(readings: list[Reading], prompt_format: PromptFormat) -> None:
    """The roles read must come as the format orders them: its start sentences (slot by slot), then operations, then
    its questions (slot by slot); `PromptFormatError` naming the first sentence out of place and what it reads as."""
    p, q = len(prompt_format.preamble), len(prompt_format.query_names)
    example = prompt_format.preamble[0][0].replace(CANDIDATE, prompt_format.candidates[0])
    layout = (f"a {prompt_format.task_name} prompt is {p} start sentence(s) (e.g. {example!r}), then the operations, "
              f"then {q} question(s) ending with '?'")
    if len(readings) < p + q:
        raise PromptFormatError(f"the prompt has {len(readings)} sentence(s); {layout}.")
    for i, reading in enumerate(readings):
        if i < p:
            expected = ("start", i)
        elif i >= len(readings) - q:
            expected = ("question", i - (len(readings) - q))
        else:
            expected = ("operation", 0)
        if (reading.role, reading.slot) != expected:
            how = "a known wording" if reading.known else f"confidence {reading.confidence:.3f}"
            raise PromptFormatError(
                f"sentence {i + 1} {reading.sentence!r} reads as {reading.role} {reading.read_as!r} ({how}; nearest "
                f"known: {reading.nearest_known!r}) where a {expected[0]} sentence belongs: {layout}.")


def load_sentence_reader(model, prompt_format) -> SentenceReader | None:
    """The reader of a loaded checkpoint (`config.sentence_reader` and its reader/ subfolder), or None when it has
    none."""
    settings = getattr(model.config, "sentence_reader", None)
    if settings is None:
        return None
    source = getattr(model.config, "_name_or_path", None) or getattr(model, "name_or_path", None)
    if not source:
        raise ValueError("config.sentence_reader is set but the checkpoint's folder is not known (load it with "
                         "from_pretrained(folder)).")
    return SentenceReader.from_checkpoint(str(source), prompt_format, settings)


__all__ = ["CONFIDENCE", "EXAMPLE_KEYS", "KNOWN_ENCODINGS", "KNOWN_INDEX", "READER_FOLDER", "ROLES", "KnownSentence",
           "PromptReading", "Reading", "SentenceReader", "choose_threshold", "encode_sentences", "example_sentences",
           "known_sentences", "load_encodings", "load_sentence_reader", "margin", "mean_pool", "meaning_scores",
           "named_states", "roles_in_order", "save_encodings", "sentence_key"]
