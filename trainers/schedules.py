"""Depth schedules and the batch sampler that gives every batch (and every rank) one depth.

The run's batches are a pure function of the seed: the same on every rank, and the same after a resume (the
Trainer replays the sampler to skip the batches already seen).
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Sampler


def curriculum_max_depth(step: int, start_depth: int | None, every_steps: int, increment: int,
                         max_depth: int) -> int:
    """Depth curriculum: d_max(t) = min(d_max, start + increment · ⌊t / every⌋); no curriculum: d_max."""
    if start_depth is None:
        return max_depth
    return min(max_depth, start_depth + increment * (step // every_steps))


def stretch_max_scale(step: int, phase_start: int, phase_steps: int, max_scale: float) -> float:
    """Positional-stretch phase: s_max ramps linearly 1 → max_scale over [phase_start, phase_start + steps);
    1 (no stretch) outside the phase's start. Samples then draw s ~ U[1, s_max]."""
    if phase_steps <= 0 or step < phase_start:
        return 1.0
    progress = min(1.0, (step - phase_start + 1) / phase_steps)
    return 1.0 + (max_scale - 1.0) * progress


class DepthBatchSampler(Sampler[list[int]]):
    """Yields `num_batches` global batches; batch i has one depth d drawn uniformly from the dataset's depths in
    [min_depth, curriculum_max_depth(i // accumulation)], and the next `batch_size` examples of that depth's pool.

    Each depth's pool is walked in a shuffled order without replacement (a new shuffle per pass), so every example of
    a depth is seen once before any is seen twice: N built examples are N distinct samples, not ~63% of them.

    With `split_batches=True` (set by `ParTrainingArguments`) accelerate cuts each global batch across ranks,
    so every rank trains on the same d at every step and no rank waits for a longer loop.
    """

    def __init__(self, depths: np.ndarray, batch_size: int, num_batches: int, seed: int, min_depth: int,
                 max_depth: int, curriculum_start: int | None = None, curriculum_every: int = 40,
                 curriculum_increment: int = 1, accumulation: int = 1):
        depths = np.asarray(depths)
        self.batch_size, self.num_batches, self.seed = batch_size, num_batches, seed
        self.min_depth, self.max_depth, self.accumulation = min_depth, max_depth, accumulation
        self.curriculum = (curriculum_start, curriculum_every, curriculum_increment)
        order = np.argsort(depths, kind="stable")
        values, starts = np.unique(depths[order], return_index=True)
        self.by_depth = dict(zip(values.tolist(), np.split(order, starts[1:])))
        self.available = np.array(sorted(d for d in self.by_depth if min_depth <= d <= max_depth))
        if len(self.available) == 0:
            raise ValueError(
                f"the training dataset has no example with depth in [min_train_depth={min_depth}, "
                f"max_train_depth={max_depth}]; it has depths {sorted(self.by_depth)}."
            )
        first_cap = curriculum_max_depth(0, curriculum_start, curriculum_every, curriculum_increment, max_depth)
        if self.available[0] > first_cap:
            raise ValueError(
                f"curriculum_start_depth={curriculum_start} admits no depth present in the dataset "
                f"(smallest {self.available[0]})."
            )

    def depth_at(self, batch_index: int, rng: np.random.Generator) -> int:
        cap = curriculum_max_depth(batch_index // self.accumulation, *self.curriculum, self.max_depth)
        return int(rng.choice(self.available[self.available <= cap]))

    def _shuffled(self, depth: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, depth, epoch, 1]).permutation(self.by_depth[depth])

    def __iter__(self):
        cursor: dict[int, tuple[int, int]] = {}  # depth -> (pass over its pool, position in that pass)
        for i in range(self.num_batches):
            depth = self.depth_at(i, np.random.default_rng([self.seed, i]))
            epoch, position = cursor.get(depth, (0, 0))
            taken: list[int] = []
            while len(taken) < self.batch_size:
                order = self._shuffled(depth, epoch)
                chunk = order[position : position + self.batch_size - len(taken)]
                taken.extend(chunk.tolist())
                position += len(chunk)
                if position == len(order):
                    epoch, position = epoch + 1, 0
            cursor[depth] = (epoch, position)
            yield taken

    def __len__(self) -> int:
        return self.num_batches
