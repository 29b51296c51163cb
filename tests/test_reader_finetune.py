"""examples/studies/reader_finetune.py's loss: supervised contrastive (SupCon) as its docstring writes it, and a batch
with no positive pair (one view) refused rather than trained on a NaN loss. No encoder is loaded."""

import math

import pytest
import torch

from tests.conftest import load_example

finetune = load_example("examples/studies/reader_finetune.py")


def test_supcon_is_the_formula_of_the_docstring():
    torch.manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(6, 4), dim=-1)
    labels, tau = torch.tensor([0, 1, 2, 0, 1, 2]), 0.1
    by_hand = []
    for i in range(6):
        log_denominator = math.log(sum(math.exp(float(z[i] @ z[j]) / tau) for j in range(6) if j != i))
        positives = [p for p in range(6) if p != i and labels[p] == labels[i]]
        by_hand.append(-sum(float(z[i] @ z[p]) / tau - log_denominator for p in positives) / len(positives))
    assert float(finetune.supcon(z, labels, tau)) == pytest.approx(sum(by_hand) / 6, rel=1e-5)


def test_a_batch_without_positives_is_refused():
    z = torch.nn.functional.normalize(torch.randn(3, 4), dim=-1)
    with pytest.raises(ValueError, match="no two sentences of one meaning"):
        finetune.supcon(z, torch.tensor([0, 1, 2]), 0.1)
    with pytest.raises(SystemExit):  # one view per batch: every meaning once, nothing to pull together
        finetune.main(["--views", "1"])
