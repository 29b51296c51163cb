"""Shared tiny fixtures: random Qwen2 parents and PAR models small enough for CPU tests."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking


@pytest.fixture(autouse=True)
def _no_datasets_cache():
    """Every map in a test runs (datasets' cache off): a test that swaps a code path must see it run, never a cached
    result of another test. The cache test turns it on for itself."""
    import datasets

    datasets.disable_caching()
    yield
    datasets.enable_caching()


VOCAB = 40
ANSWER_IDS = [10, 11, 12, 13, 14]
HALT_IDS = (20, 21)


def tiny_qwen2_config(**overrides) -> Qwen2Config:
    kwargs = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0,
    )
    kwargs.update(overrides)
    return Qwen2Config(**kwargs)


def tiny_par_config(**overrides) -> ParLoopedQwenConfig:
    kwargs = tiny_qwen2_config().to_dict()
    for key in ("model_type", "transformers_version", "architectures"):
        kwargs.pop(key, None)
    kwargs.update(prelude_layers=2, core_layers=2, coda_layers=2, answer_token_ids=ANSWER_IDS, halt_token_ids=HALT_IDS)
    kwargs.update(overrides)
    return ParLoopedQwenConfig(**kwargs)


def make_model(seed: int = 0, **overrides) -> ParLoopedQwenForStateTracking:
    """A random tiny PAR model whose adapter is perturbed away from [0 | I] so e feeds every iteration."""
    torch.manual_seed(seed)
    model = ParLoopedQwenForStateTracking(tiny_par_config(**overrides)).eval()
    with torch.no_grad():
        model.adapter.weight.add_(0.05 * torch.randn_like(model.adapter.weight))
    return model


@pytest.fixture
def tiny_parent():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_qwen2_config()).eval()


@pytest.fixture
def tiny_model():
    return make_model()


def load_example(relative_path: str):
    """Import a script under examples/ as a module (registered, so its dataclasses resolve)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / relative_path
    name = "example_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
