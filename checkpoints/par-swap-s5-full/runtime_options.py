"""Runtime options of a PAR model: how the loop is computed, never what it computes.

Every option here selects between the reference computation and a faster one that is tested equal to it
(tests/test_speed_paths.py, tests/test_loop_views.py). They are not saved with the checkpoint: a loaded model
starts from these defaults. Set them on `model.runtime`, e.g. `model.runtime.block_iterations = 1`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# "par_eager" attention (`par_attention.par_eager_attention`): blocks of at most this many keys are computed as
# broadcast multiply-and-sum products while torch.compile traces them. The local window's blocks (an operation's
# tokens + the query region) are this small; a module constant because the attention function sees no model.
SMALL_BLOCK_KEYS = 32


@dataclass
class ParRuntimeOptions:
    """The fast paths of `ParLoopedQwenForStateTracking`, each with its reference setting.

    local_window: `loop_view="local"`: run each iteration on its operations + the query region only (the loop
        backend `window_path.WindowLoop`; O(window) per iteration instead of O(prompt)). False: the masked
        full-prompt computation (`modeling_par.ReferenceLoop`).
    window_plan_iterations: local window: iterations whose windows (index, mask, rotary) are built in one
        vectorized pass (`window_path.window_plan`).
    block_iterations: local window, no grad: run this many iterations as one unit (`window_block`), one
        compiled graph under `compile_core`. 1: every iteration on its own.
    readout_batch_iterations: `forward`: readouts of up to this many iterations share one coda call.
    causal_fast_path: full view, sdpa, no padding in the batch: give the layers no mask, so sdpa runs its causal
        kernel (the same mask implicitly). False: always build `padded_causal_mask`.
    split_adapter: W [e ; s] = W_e e + W_s s, with W_e e computed once per batch (half the adapter's work per
        iteration). False, or an adapter that is not a plain bias-free `nn.Linear` (e.g. PEFT-wrapped, or with
        forward hooks): the adapter is called on [e ; s] every iteration.
    """

    local_window: bool = True
    window_plan_iterations: int = 16
    block_iterations: int = 4
    readout_batch_iterations: int = 8
    causal_fast_path: bool = True
    split_adapter: bool = True

    def __setattr__(self, name: str, value) -> None:
        kinds = {f.name: f.type for f in fields(self)}
        if name not in kinds:
            raise AttributeError(f"ParRuntimeOptions has no option {name!r}; the options are {sorted(kinds)}.")
        if kinds[name] in (bool, "bool"):
            if not isinstance(value, bool):
                raise ValueError(f"ParRuntimeOptions.{name} must be a bool; got {value!r}.")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"ParRuntimeOptions.{name} must be an int >= 1; got {value!r}.")
        object.__setattr__(self, name, value)


RUNTIME_OPTION_NAMES = tuple(f.name for f in fields(ParRuntimeOptions))

__all__ = ["ParRuntimeOptions", "RUNTIME_OPTION_NAMES", "SMALL_BLOCK_KEYS"]
