"""`pipeline("state-tracking", model=DIR, trust_remote_code=True)`: raw text in, the state out.

    >>> from transformers import pipeline
    >>> tracker = pipeline("state-tracking", model="checkpoints/par-batch-process-text", trust_remote_code=True)
    >>> tracker("The batch reactor is idle. The operator presses start. The level sensor reports full. "
    ...         "The reactor is now ?")
    {'answers': {'state': 'heating'}, 'iterations': 2, 'halted': True, 'mode': 'forced depth', 'depth': 2}

The checkpoint's `config.prompt_format` (see `prompt_format.py`) segments each prompt into preamble, operations and
queries; a prompt it cannot segment raises `PromptFormatError` and is never answered. A checkpoint trained on recorded
data (`record_format.py`) takes a record instead: a list of operation strings, a string of them split at its delimiter,
or ``{"operations": ..., "initial_state": ...}`` (a batch: a list of those); an operation or label its training files
never held raises `PromptFormatError`.

Only what training used is answered: a sentence the format knows but the training data never used (a held-out
phrasing, a start state an idle-start checkpoint never saw; `prompt_format.trained`) raises one `PromptFormatError`
naming it and the nearest trained sentence, and so does a sentence no task file lists. `allow_untrained=True` answers
anyway: every unit the delimiter cuts out is read from its words — a new start, operation or (for a task with one
question) question, the operation boundaries being the units' ends (`PromptFormat.segment`) — and each result then
carries ``"untrained"``: the list of such units (``{"unit", "sentence", "nearest_trained"}``; empty when there were
none), or None for a checkpoint saved before formats recorded what training used when every sentence is one its
format lists (nothing is known: such a checkpoint answers every prompt its format segments, with or without the flag,
as it always did). The model then runs learned
halting when the checkpoint was trained for it (`config.learned_halting`), forced depth R = ⌈d / step_size⌉ from the
segmentation otherwise; `mode` says which (override with `halting=True/False`). `return_trajectory=True` adds the
state after each operation, read from the progress readouts y_k = Q(s_k) of iterations k = 1..R (iteration k
targets the state after min(c·k, d) operations). Batching (`batch_size`), padding, `device` and `dtype` are the
Pipeline's own.

A checkpoint with a sentence reader (`config.sentence_reader` and a `reader/` subfolder, written by
examples/add_sentence_reader.py; `sentence_reader.py`) reads every sentence first: its role comes from what it says
(a known wording's role; else a '?' ending makes a question; else the role of the nearest known sentence among those
its words allow, a start sentence naming its state), never from where it stands, and must fit the prompt's layout; a
new wording read with confidence ≥ the checkpoint's calibrated threshold is replaced by its nearest known wording
before the loop reads the prompt; one under it makes the prompt one `PromptFormatError` naming the weakest sentence,
its nearest known wording and its confidence, unless `answer_unconfident=True` (then answered the same way, with
``"confident": False``). Such a result always carries ``"confident"``; `return_readings=True` adds ``"readings"``,
one dict per sentence (`Reading.to_dict`). `allow_untrained=True` skips the reader (the loop reads the new words as
written; readings still reported on request). Without a reader nothing of this applies and both arguments are errors.

Remote code: `modeling_par.py` imports this module so that `save_pretrained` copies it into every checkpoint, and
`ParLoopedQwenConfig` names it in `custom_pipelines`.
"""

from __future__ import annotations

import torch
from transformers import Pipeline

from .configuration_par import CUSTOM_PIPELINES
from .prompt_format import PromptFormatError
from .record_format import RecordFormat, load_prompt_format
from .sentence_reader import load_sentence_reader
from .sentences import collapse_whitespace
from .token_boundaries import token_boundaries, unknown_word

PIPELINE_TASK = next(iter(CUSTOM_PIPELINES))  # "state-tracking"


def boundary_marks(length: int, operation_ends: list[int], query_positions: list[int]) -> tuple[list[int], list[int]]:
    """Token-aligned marks (padded like input_ids, so either padding side keeps them in place): 1 where the preamble
    or an operation ends, and j + 1 at query j's readout token."""
    ends, queries = [0] * length, [0] * length
    for t in operation_ends:
        ends[t] = 1
    for j, t in enumerate(query_positions):
        queries[t] = j + 1
    return ends, queries


def model_inputs(ids: list[int], operation_ends: list[int], query_positions: list[int],
                 untrained: list[dict] | None = None) -> dict:
    """One prompt's tensors for `_forward`: its ids, mask and the token-aligned boundary marks (batched by padding),
    and its untrained units (a batch of one: a list the Pipeline's collation keeps per prompt)."""
    end_marks, query_marks = boundary_marks(len(ids), operation_ends, query_positions)
    return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "operation_end_marks": torch.tensor([end_marks]), "query_marks": torch.tensor([query_marks]),
            "untrained": [untrained]}


def boundaries_from_marks(end_marks: torch.Tensor, query_marks: torch.Tensor, num_queries: int):
    """Inverse of `boundary_marks` for a padded batch: operation_ends (b, D+1) with −1 past each sample's d, and
    query_positions (b, Q)."""
    marked = end_marks.bool()
    counts = marked.sum(-1)  # (b,) d + 1
    # marked indices first, in order
    order = torch.argsort((~marked).int(), dim=-1, stable=True)[:, : int(counts.max())]
    width = torch.arange(order.shape[1], device=order.device)
    operation_ends = torch.where(width[None] < counts[:, None], order, -1)
    query_positions = torch.stack([(query_marks == j + 1).int().argmax(-1) for j in range(num_queries)], dim=-1)
    return operation_ends, query_positions


class StateTrackingPipeline(Pipeline):
    """Answers raw state-tracking prompts with a PAR looped model (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = getattr(self.model.config, "prompt_format", None)
        if spec is None:
            raise ValueError(
                "this checkpoint has no prompt_format in its config, so raw text cannot be segmented; set "
                "model.config.prompt_format = state_tracking.prompts.prompt_format_of(task, rendering).to_dict() and "
                "save it again (train_par.py and the export do this).")
        self.prompt_format = load_prompt_format(spec)
        if self.tokenizer is None or not getattr(self.tokenizer, "is_fast", False):
            raise ValueError("the state-tracking pipeline needs the checkpoint's fast tokenizer (character offsets "
                             "find the operation boundaries); load it with use_fast=True.")
        self.sentence_reader = load_sentence_reader(self.model, self.prompt_format)

    def _sanitize_parameters(self, return_trajectory=None, halting=None, max_iterations=None, delimiter=None,
                             allow_untrained=None, return_readings=None, answer_unconfident=None, **kwargs):
        if kwargs:
            raise ValueError(f"state-tracking pipeline: unknown argument(s) {sorted(kwargs)}; allowed: "
                             "return_trajectory, halting, max_iterations, delimiter, allow_untrained, return_readings, "
                             "answer_unconfident, batch_size, device, dtype.")
        preprocess, forward, post = {}, {}, {}
        for name, value in (("return_readings", return_readings), ("answer_unconfident", answer_unconfident)):
            if value is None:
                continue
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool; got {value!r}.")
            if getattr(self, "sentence_reader", None) is None:
                raise ValueError(f"{name}: this checkpoint has no sentence reader (config.sentence_reader); "
                                 "examples/add_sentence_reader.py adds one.")
            preprocess[name] = value
        if answer_unconfident and allow_untrained:
            raise ValueError("answer_unconfident=True and allow_untrained=True: choose one (allow_untrained skips the "
                             "sentence reader, so nothing is read with a confidence).")
        if return_readings is not None:
            post["return_readings"] = return_readings
        if delimiter is not None:
            preprocess["delimiter"] = delimiter
        if allow_untrained is not None:
            if not isinstance(allow_untrained, bool):
                raise ValueError(f"allow_untrained must be a bool; got {allow_untrained!r}.")
            preprocess["allow_untrained"] = post["allow_untrained"] = allow_untrained
        if return_trajectory is not None:
            if not isinstance(return_trajectory, bool):
                raise ValueError(f"return_trajectory must be a bool; got {return_trajectory!r}.")
            forward["return_trajectory"] = post["return_trajectory"] = return_trajectory
        if halting is not None:
            if not isinstance(halting, bool):
                raise ValueError(f"halting must be None (the checkpoint decides), True or False; got {halting!r}.")
            forward["halting"] = post["halting"] = halting
        if max_iterations is not None:
            forward["max_iterations"] = max_iterations
        return preprocess, forward, post

    def __call__(self, inputs, **kwargs):
        # a records checkpoint reads one record as a list of operation strings; a batch is a list of such lists (or of
        # {"operations": ..., "initial_state": ...} dicts, or of delimited strings). A list of strings is a batch of
        # delimited strings when one of them is not a trained operation and holds the format's delimiter ("coin push",
        # "kick coin" under whitespace), else one record ("flip x0" is one trained operation); a batch of
        # one-operation records is a list of lists.
        if isinstance(self.prompt_format, RecordFormat) and isinstance(inputs, (list, tuple)) and not inputs:
            raise PromptFormatError("no input: give one record (a list of operation strings, a delimited string, or a "
                                    "dict with its operations) or a non-empty batch of records.")
        if isinstance(self.prompt_format, RecordFormat) and isinstance(inputs, (list, tuple)) and inputs and all(
                isinstance(op, str) for op in inputs):
            record_format = self.prompt_format
            if kwargs.get("delimiter") is not None:
                record_format = record_format.with_delimiter(kwargs["delimiter"])
            known = set(record_format.operations)
            if any(collapse_whitespace(op) not in known and len(record_format.split(op)) > 1 for op in inputs
                   if op.strip()):
                return super().__call__(list(inputs), **kwargs)
            return super().__call__({"operations": list(inputs)}, **kwargs)
        return super().__call__(inputs, **kwargs)

    def preprocess(self, prompt, delimiter=None, allow_untrained=False, return_readings=False,
                   answer_unconfident=False):
        prompt_format = self.prompt_format if delimiter is None else self.prompt_format.with_delimiter(delimiter)
        if isinstance(prompt_format, RecordFormat):
            return self._preprocess_record(prompt_format, prompt, allow_untrained)
        reading = None
        if self.sentence_reader is not None and (return_readings or not allow_untrained):
            reading = self.sentence_reader.read_prompt(prompt, prompt_format, check_roles=not allow_untrained)
            if not allow_untrained:
                if not reading.confident and not answer_unconfident:
                    raise self.sentence_reader.refusal(reading)
                prompt = reading.canonical  # every new wording replaced by its nearest known one
        inputs = self._preprocess_text(prompt_format, prompt, allow_untrained)
        if reading is not None:
            inputs["reading"] = [{"confident": reading.confident,
                                  "readings": [r.to_dict() for r in reading.readings]}]
        return inputs

    def _preprocess_text(self, prompt_format, prompt, allow_untrained=False):
        """A text prompt -> the model's tensors (segmented by the format; refused as the module docstring says)."""
        segments = prompt_format.segment(prompt, allow_untrained)
        if segments.untrained and not allow_untrained:
            raise prompt_format.untrained_error(segments)
        encoding = self.tokenizer([prompt], add_special_tokens=True)
        ids = encoding["input_ids"][0]
        word = unknown_word(self.tokenizer, encoding, 0, prompt)
        if word is not None:
            raise PromptFormatError(f"word {word!r} of the prompt is unknown to the checkpoint's tokenizer (even a new "
                                    "wording is read only in words its vocabulary holds).")
        operation_ends, query_positions = token_boundaries(encoding, 0, prompt, segments)
        untrained = None if segments.untrained is None else list(segments.untrained)
        return model_inputs(ids, operation_ends, query_positions, untrained)

    def _preprocess_record(self, record_format: RecordFormat, record, allow_untrained=False):
        """A record (a delimited string, a list of operation strings, or a dict with "operations" and optionally
        "initial_state") -> the same tensors as a text prompt."""
        initial = None
        if isinstance(record, dict):
            # the keys "operations" / "initial_state", or the training file's own column names for them
            ops_keys = list(dict.fromkeys(["operations", record_format.column("operations") or "operations"]))
            initial_keys = list(dict.fromkeys(["initial_state", record_format.column("initial_state") or
                                               "initial_state"]))
            given_ops = [k for k in ops_keys if k in record]
            unknown = sorted(set(record) - set(ops_keys) - set(initial_keys))
            if unknown or len(given_ops) != 1 or sum(k in record for k in initial_keys) > 1:
                raise PromptFormatError(f"a record is a dict with its operations under one of {ops_keys} (and "
                                        f"optionally the initial state under one of {initial_keys}); got keys "
                                        f"{sorted(record)}.")
            initial = next((record[k] for k in initial_keys if k in record), None)
            record = record[given_ops[0]]
        ids, operation_ends, query_positions = record_format.encode(self.tokenizer, record, initial, allow_untrained)
        untrained = record_format.untrained(record) if allow_untrained else []
        return model_inputs(ids, operation_ends, query_positions, untrained)

    def _uses_halting(self, halting):
        return bool(getattr(self.model.config, "learned_halting", False)) if halting is None else halting

    def _forward(self, inputs, return_trajectory=False, halting=None, max_iterations=None):
        config = self.model.config
        operation_ends, query_positions = boundaries_from_marks(inputs["operation_end_marks"], inputs["query_marks"],
                                                                len(self.prompt_format.query_names))
        depth = (operation_ends >= 0).sum(-1) - 1  # (b,)
        steps = torch.clamp((depth + config.step_size - 1) // config.step_size, min=1)  # R = ⌈d / c⌉
        kw = dict(attention_mask=inputs["attention_mask"], query_positions=query_positions,
                  operation_ends=operation_ends)
        if self._uses_halting(halting):
            prediction = self.model.predict(inputs["input_ids"], halting=True, max_iterations=max_iterations, **kw)
        else:
            prediction = self.model.predict(inputs["input_ids"], num_iterations=steps, **kw)
        out = {"answers": prediction.answers, "iterations": prediction.iterations, "halted": prediction.halted,
               "depth": depth, "untrained": inputs["untrained"]}
        if "reading" in inputs:
            out["reading"] = inputs["reading"]
        if return_trajectory:
            reads = list(range(1, int(steps.max()) + 1))
            logits = self.model(inputs["input_ids"], num_iterations=reads[-1], readout_iterations=reads,
                                **kw).answer_logits  # (R, b, Q, C)
            out["trajectory"] = logits.argmax(-1).transpose(0, 1)  # (b, R, Q)
            out["trajectory_steps"] = steps
        return out

    def postprocess(self, outputs, return_trajectory=False, halting=None, allow_untrained=False,
                    return_readings=False):
        names, candidates = getattr(self.prompt_format, "answer_names", self.prompt_format.query_names), \
            self.prompt_format.candidates

        def named(row):
            return {name: candidates[int(c)] for name, c in zip(names, row)}

        depth = int(outputs["depth"][0])
        result = {"answers": named(outputs["answers"][0]), "iterations": int(outputs["iterations"][0]),
                  "halted": bool(outputs["halted"][0]),
                  "mode": "learned halting" if self._uses_halting(halting) else "forced depth", "depth": depth}
        if allow_untrained:
            result["untrained"] = outputs["untrained"][0]
        if "reading" in outputs:
            reading = outputs["reading"][0]
            if not allow_untrained:
                result["confident"] = reading["confident"]
            if return_readings:
                result["readings"] = reading["readings"]
        if return_trajectory:
            c = self.model.config.step_size
            steps = int(outputs["trajectory_steps"][0])
            result["trajectory"] = [{"after_operations": min(c * k, depth), "answers": named(row)}
                                    for k, row in enumerate(outputs["trajectory"][0][:steps].tolist(), start=1)]
        return result


__all__ = ["CUSTOM_PIPELINES", "PIPELINE_TASK", "StateTrackingPipeline", "boundaries_from_marks", "boundary_marks"]
