"""Issue 68: what a pretrained parent loses at R = 1 under each position scheme of the full view.

SmolLM2-135M whole (10 + 10 + 10) and its first 4 layers (1 + 2 + 1) retrofitted at R = 1 under rope, rope + a causal
depthwise convolution (zero-initialised), NoPE, and NoPE + the convolution, against the parent: max |Δlogit|, top-1
next-token agreement and the mean next-token loss on a few texts.

    python examples/reproduce/full_view_positions.py --parent_loss      # the command results/.../parent_loss.json names
    python examples/studies/full_view_parent_loss.py                    # the same

Writes results/full_view_positions/parent_loss.json.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from par_studies import save_record  # noqa: E402

OUT = REPO / "results" / "full_view_positions"

PARENT_TEXTS = [
    "The capital of France is Paris. It is known for the Eiffel Tower, museums and cafes along the river.",
    "Box 1 contains the apple. Box 2 contains the banana. swap 1 2. Box 1 contains the banana.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Once upon a time there was a little girl who lived in a village near the forest.",
]


def lm_logits_r1(model, ids):
    """Next-token logits over the whole vocabulary of a retrofit at R = 1 (prelude, one core pass, coda, LM head), the
    full view: what the parent's language modelling becomes under the retrofit's scheme.  # (1, t) -> (1, t, vocab)"""
    from modeling_par.loop_types import LoopState

    backend = model._backend(ids, None, None, None)
    step = backend.advance(LoopState(0, backend.initial_state(), None), 1)[0]
    view = backend.full_view
    return model.lm_head(model.parts.coda(step.state, view.mask, view.cos, view.sin))


def parent_loss() -> dict:
    """results/full_view_positions/parent_loss.json: SmolLM2-135M whole (10 + 10 + 10) and its first 4 layers
    (1 + 2 + 1) retrofitted at R = 1 under each scheme, against the parent: max |Δlogit|, top-1 next-token agreement and
    the mean next-token loss on a few texts. A scheme that keeps the rotary (and a zero-initialised convolution) is
    the parent exactly; NoPE changes every attention score."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modeling_par import ParLoopedQwenForStateTracking
    from par_studies.parents import get_parent
    from state_tracking.evaluation import environment_info

    torch.set_num_threads(1)
    spec = get_parent("smollm2-135m")
    folder = str(spec.ensure(quiet=True))
    parent = AutoModelForCausalLM.from_pretrained(folder, gguf_file=spec.gguf_file, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=spec.gguf_file)
    cases = []
    for layers, truncate in (((10, 10, 10), False), ((1, 2, 1), True)):
        reference = parent
        if truncate:
            config = parent.config.to_dict()
            config["num_hidden_layers"] = sum(layers)
            reference = AutoModelForCausalLM.from_config(parent.config.__class__(**config)).eval()
            reference.load_state_dict(parent.state_dict(), strict=False)
        for scheme, kwargs in (("rope", {}), ("conv", {"core_conv_kernel": 4}), ("nope", {"position_encoding": "nope"}),
                               ("nope_conv", {"position_encoding": "nope", "core_conv_kernel": 4})):
            model = ParLoopedQwenForStateTracking.from_pretrained_parent(
                parent, *layers, answer_token_ids=[0], truncate=truncate, **kwargs).eval()
            diffs, agree, losses, parent_losses = [], [], [], []
            with torch.no_grad():
                for text in PARENT_TEXTS:
                    ids = tokenizer(text, return_tensors="pt").input_ids
                    expected, got = reference(ids).logits, lm_logits_r1(model, ids)
                    diffs.append((got - expected).abs().max().item())
                    agree.append((got.argmax(-1) == expected.argmax(-1)).float().mean().item())
                    losses.append(torch.nn.functional.cross_entropy(got[0, :-1], ids[0, 1:]).item())
                    parent_losses.append(torch.nn.functional.cross_entropy(expected[0, :-1], ids[0, 1:]).item())
            cases.append({"split": list(layers), "truncated": truncate, "scheme": scheme,
                          "max_abs_logit_diff": max(diffs), "top1_agreement": sum(agree) / len(agree),
                          "next_token_loss": sum(losses) / len(losses),
                          "parent_next_token_loss": sum(parent_losses) / len(parent_losses)})
            c = cases[-1]
            print(f"{layers} {scheme}: max|d| {c['max_abs_logit_diff']:.3g}, top-1 agreement "
                  f"{100 * c['top1_agreement']:.1f}%, loss {c['next_token_loss']:.2f} (parent "
                  f"{c['parent_next_token_loss']:.2f})", flush=True)
    record = {"command": "python examples/reproduce/full_view_positions.py --parent_loss", "parent": spec.label,
              "texts": PARENT_TEXTS, "cases": cases, "date": time.strftime("%Y-%m-%d"),
              "environment": environment_info(torch.device("cpu"))}
    save_record(record, OUT / "parent_loss.json")
    return record


if __name__ == "__main__":
    parent_loss()
