"""Weight-space ensembling of a fine-tuned retrofit with its own initialisation (WiSE-FT, Wortsman et al. 2022,
"Robust fine-tuning of zero-shot models"): a study tool for reading wordings never trained (issue 49)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from trainers import is_adapter_parameter


def interpolate_from_init(model: torch.nn.Module, initial: Mapping[str, torch.Tensor], alpha: float) -> list[str]:
    """WiSE-FT in place: every parameter the parent gave (all but the loop's adapter, which the retrofit initialises
    at random) becomes θ_α = θ_0 + α (θ_ft − θ_0), with θ_ft the model's fine-tuned value and θ_0 its value in
    `initial` (the retrofit before training); α = 1 is the fine-tuned model, α = 0 the parent's weights with the
    fine-tuned adapter. Returns the names interpolated. α outside [0, 1], or an `initial` that lacks a parameter or
    gives it another shape, is an error naming it."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha}")
    done = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if is_adapter_parameter(name):
                continue
            if name not in initial:
                raise ValueError(f"the initial weights lack {name}")
            start = initial[name]
            if start.shape != parameter.shape:
                raise ValueError(f"{name}: initial shape {tuple(start.shape)}, fine-tuned {tuple(parameter.shape)}")
            parameter.copy_(start.to(parameter.dtype) + alpha * (parameter - start.to(parameter.dtype)))
            done.append(name)
    return done


def initial_weights(flags: Mapping[str, str], seed: int, scratch: Path) -> dict[str, torch.Tensor]:
    """The state dict a train_par.py run with `flags` and `seed` starts from (its parent's weights and the
    seed's adapter), built by train_par's own steps 1–3 (parse, data, model) without training; `scratch` is a
    throw-away --output_dir."""
    from .rows import argv
    from .runs import load_train_par

    train_par = load_train_par()
    flags = {**flags, "--output_dir": str(scratch), "--seed": str(seed)}
    flags.pop("--resume_from_checkpoint", None)
    model_args, task_args, data_args, train_args, given = train_par.parse_all_args(argv(flags))
    train_par.check_arguments(model_args, task_args, data_args, train_args, given)
    data = train_par.load_data(model_args, task_args, data_args, train_args, given)
    model = train_par.load_model(data, model_args, train_args)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
