"""examples/studies/full_view_row_probe.py: the linear probe it reads the loop's rows with (ridge onto one-hot
targets), on data whose answer is known."""

import torch

from tests.conftest import load_example


def test_the_ridge_probe_reads_linearly_separable_classes_and_not_shuffled_ones():
    study = load_example("examples/studies/full_view_row_probe.py")
    generator = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 16, generator=generator) * 3
    labels = torch.randint(0, 4, (400, 2), generator=generator)  # two questions, four classes each
    features = torch.cat([centers[labels[:, 0]], centers[labels[:, 1]]], 1) + 0.1 * torch.randn(400, 32,
                                                                                                   generator=generator)
    weights = study.fit_probe(features[:300], labels[:300], 4)
    assert weights.shape == (33, 8)  # a bias row; two questions x four classes
    assert (study.read_probe(weights, features[300:], 4) == labels[300:]).all()  # held-out rows, every question right
    shuffled = labels[torch.randperm(400, generator=generator)]
    weights = study.fit_probe(features[:300], shuffled[:300], 4)
    held_out = (study.read_probe(weights, features[300:], 4) == shuffled[300:]).all(-1).float().mean()
    assert held_out < 0.2  # chance for both questions is 1/16


def test_the_flag_wave_is_right_where_channel_0_is_positive_exactly_for_the_operations_read():
    study = load_example("examples/studies/full_view_row_probe.py")
    n, iterations, depth = 3, 4, 4
    states = torch.randn(n, iterations, depth, 8, generator=torch.Generator().manual_seed(0))
    read = torch.arange(1, depth + 1)[None, :] <= torch.arange(1, iterations + 1)[:, None]  # (R, d): j <= k
    states[..., 0] = torch.where(read, 5.0, -5.0)
    states[0, 2, 3, 0] = 5.0  # problem 0 at k = 3 calls operation 4 read: one row of 12 wrong at k = 3
    wave = study.flag_wave({"states": states})
    assert wave["whole_wave_right"] == [100.0, 100.0, 66.7, 100.0]
    assert wave["rows_right"] == [100.0, 100.0, 91.7, 100.0]
