"""The reference loop: every iteration on the whole prompt (`ReferenceLoop`, a `loop_types.LoopBackend`), with the full
view or the masked views of `loop_views`; the local window (`window_path.WindowLoop`) is tested against it.

Imports only torch, transformers' pieces the model hands it, and sibling modules (remote code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .loop_types import IterationView, LoopParts, LoopState, LoopStep, Readout, ReadoutInput
from .loop_views import LoopView, encoded_positions, padded_causal_mask, stretch_positions, whole_prompt_view


@dataclass(frozen=True)
class ReferenceLoop:
    """The loop on the whole prompt, a `loop_types.LoopBackend`: with the full view (one view for every iteration),
    or with the masked views of `loop_views` (`loop_view` "prefix"/"local", `progress_positions`), one per iteration.
    The reference the local window (`window_path.WindowLoop`) is tested against."""

    model: Any  # the ParLoopedQwenForStateTracking whose loop this is
    parts: LoopParts
    prelude_out: torch.Tensor  # (b, t, h) e
    e_half: torch.Tensor  # (b, t, h) W_e e (`adapter_e_half`)
    full_view: IterationView | None  # the full view (every iteration's), or None under a loop view
    loop: LoopView | None  # the loop view, or None under the full view
    query_positions: torch.Tensor  # (b, q)
    attention_mask: torch.Tensor  # (b, t)

    @classmethod
    def prepare(cls, model, hidden, attention_mask, query_positions, positions, position_scale,
                operation_ends) -> ReferenceLoop:
        """e = P(x) on the whole prompt, with the full view (stretched positions with `position_scale`) or, given
        `operation_ends`, the loop view's mask and positions of iteration 0."""
        full_view = loop = None
        if operation_ends is None:
            if position_scale is not None:
                positions = stretch_positions(positions, position_scale)
            rotary = model.model.rotary_emb(hidden, encoded_positions(model.config, positions))
            view = full_view = IterationView(model._full_view_mask(attention_mask, hidden), *rotary)
        else:
            loop = LoopView.of(operation_ends, attention_mask, positions, position_scale,
                               padded_causal_mask(attention_mask, None)[:, 0])
            view = whole_prompt_view(model.config, model.model.rotary_emb, loop, 0, hidden)
        parts = model.parts
        prelude_out = parts.prelude(hidden, view.mask, view.cos, view.sin)
        return cls(model, parts, prelude_out, model.adapter_e_half(prelude_out), full_view, loop, query_positions,
                   attention_mask)

    @property
    def num_queries(self) -> int:
        return self.query_positions.shape[1]

    def initial_state(self) -> torch.Tensor:
        return self.prelude_out

    def state_valid(self) -> torch.Tensor:
        return self.attention_mask.float()

    def advance(self, current: LoopState, last: int) -> list[LoopStep]:
        """Iteration k = current.iteration + 1 (one at a time: `last` bounds only the window's blocks):
        s_k = anchor(C(W [e ; s_{k−1}])) with iteration k's view. Under `loop_view="local"` only the query region
        iterates: the other rows restart from e."""
        k, model, x = current.iteration + 1, self.model, current.state
        view = self.full_view
        if self.loop is not None:
            view = whole_prompt_view(model.config, model.model.rotary_emb, self.loop, k, x)
            if model.config.loop_view == "local":
                x = torch.where(self.loop.query_region[..., None], x, self.prelude_out)
        conv = () if model.core_conv is None else (self.attention_mask,)  # the convolution reads padding as zeros
        update = model.run_core(self.parts.core_update, self.e_half, x, view.mask, view.cos, view.sin,
                                current.reference_rms, *conv)
        readout = ReadoutInput(update.state, view.mask, view.cos, view.sin, self.query_positions)
        computed = None
        if model.config.answer_feedback:  # the next iteration reads the answer alone (`answer_feedback_state`)
            computed = self.readouts([readout])[0]
            update = update._replace(state=model.feed_back(self.prelude_out, computed, self.query_positions,
                                                           update.state))
        return [model.loop_step(k, update, current.reference_rms, readout, computed)]

    def readouts(self, inputs: list[ReadoutInput]) -> list[Readout]:
        return self.model.readout(inputs)  # one view shape for every iteration: one coda call

    def select(self, keep: torch.Tensor) -> ReferenceLoop:
        full_view = None if self.full_view is None else IterationView(
            *(None if x is None else x[keep] for x in self.full_view))
        return ReferenceLoop(self.model, self.parts, self.prelude_out[keep], self.e_half[keep], full_view,
                             None if self.loop is None else self.loop.select(keep), self.query_positions[keep],
                             self.attention_mask[keep])


__all__ = ["ReferenceLoop"]
