"""Depth schedules and the batch sampler that gives every batch (and every rank) one depth.

The run's batches are a pure function of the seed: the same on every rank, and the same after a resume (the
Trainer replays the sampler to skip the batches already seen).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch.utils.data import Sampler


def curriculum_max_depth(step: int, start_depth: int | None, every_steps: int, increment: int,
                         max_depth: int) -> int:
    """Depth curriculum: d_max(t) = min(d_max, start + increment · ⌊t / every⌋); no curriculum: d_max."""
    if start_depth is None:
        return max_depth
    return min(max_depth, start_depth + increment * (step // every_steps))


def mastery_levels(start_depth: int, increment: int, max_depth: int, lengths=None) -> list[int]:
    """The caps a mastery curriculum moves through, one per growth: c_0 = start, c_{i+1} = min(d_max, c_i + increment),
    where the training lengths are given moved up to the shortest length present ≥ c_i + increment (d_max if none):
    a cap between two lengths would admit no new length, and its mastery (measured at the cap's longest length) would
    already be the previous cap's, so the curriculum moves straight on to the next length the data has."""
    present = sorted({int(d) for d in lengths}) if lengths is not None else None
    levels = [min(start_depth, max_depth)]
    while levels[-1] < max_depth:
        target = levels[-1] + increment
        if present is not None:
            target = next((d for d in present if d >= target), max_depth)
        levels.append(min(max_depth, target))
    return levels


def mastery_max_depth(step: int, start_depth: int, increment: int, max_depth: int, advances: list[int],
                      lengths=None) -> int:
    """Mastery curriculum: d_max(t) = c_n, n = #{a ∈ advances : a ≤ t}, over the caps of `mastery_levels` (without
    `lengths`: min(d_max, start + increment · n)); `advances` the steps from which each growth applies (decided during
    training by `MasteryCurriculum`)."""
    return _cap_at(mastery_levels(start_depth, increment, max_depth, lengths), advances, step)


def curriculum_cap(step: int, max_depth: int, start_depth: int | None, every_steps: int, increment: int,
                   mastery: MasteryCurriculum | None = None) -> int:
    """d_max at optimizer step `step`: the mastery curriculum's cap (`MasteryCurriculum.max_depth_at`) when there is
    one, else the fixed pace's (`curriculum_max_depth`). The batch sampler and the trainer read the cap here."""
    if mastery is not None:
        return mastery.max_depth_at(step)
    return curriculum_max_depth(step, start_depth, every_steps, increment, max_depth)


def curriculum_done(cap_at: Callable[[int], int], steps_done: int, max_depth: int) -> bool:
    """Whether the depth curriculum has reached the longest training length within the first `steps_done` optimizer
    steps: the cap of the last step trained, `cap_at(steps_done − 1)` (steps are 0-based), is `max_depth`.
    `cap_at(steps_done)` would be the cap of the step not yet trained (the Trainer's `state.global_step` at a step's end
    counts the steps done). `cap_at`: `ParTrainer.curriculum_cap`, `DepthBatchSampler.cap_at`."""
    return steps_done >= 1 and cap_at(steps_done - 1) >= max_depth


def fixed_pace_levels(start_depth: int, increment: int, max_depth: int) -> list[int]:
    """The caps the fixed pace moves through: min(d_max, start + increment · n), n = 0, 1, … until d_max."""
    levels = [min(start_depth, max_depth)]
    while levels[-1] < max_depth:
        levels.append(min(max_depth, levels[-1] + increment))
    return levels


def curriculum_steps_needed(start_depth: int, increment: int, max_depth: int, every_steps: int,
                            window: int | None = None, lengths=None) -> int:
    """Optimizer steps before the curriculum's cap reaches d_max.

    Fixed pace (`window` None): exactly every · (number of growths), growths = ⌈(d_max − start) / increment⌉.
    Mastery (`window` the advance test's window): the expected steps if every length were mastered as soon as it is
    measured, Σ over the caps c below d_max of max(every, window · n_c), n_c the training lengths present ≤ c: a
    growth waits for `window` steps whose batch is at the frontier length, and the sampler draws each length ≤ c
    alike (probability 1 / n_c), and for at least `every` steps. A model that needs longer to master a length takes
    longer still, so a budget below this number leaves the longest lengths untrained."""
    if window is None:
        return every_steps * (len(fixed_pace_levels(start_depth, increment, max_depth)) - 1)
    present = sorted({int(d) for d in lengths}) if lengths is not None else list(range(1, max_depth + 1))
    levels = mastery_levels(start_depth, increment, max_depth, present)
    return sum(max(every_steps, window * max(1, sum(1 for d in present if d <= cap))) for cap in levels[:-1])


def _cap_at(levels: list[int], advances: list[int], step: int) -> int:
    """c_n, n = #{a ∈ advances : a ≤ step} (the last cap once every growth has applied)."""
    return levels[min(len(levels) - 1, sum(1 for a in advances if a <= step))]


class MasteryCurriculum:
    """Depth curriculum by mastery (instead of a fixed pace): d_max starts at `start_depth` and grows by `increment`
    once the mean final-answer accuracy (every query right at the last supervised iteration) of the last `window`
    optimizer steps whose batches had depth d_max reaches `threshold`, and at least `min_steps` steps after the previous
    growth. A growth decided at step t applies from step t + `lookahead` (more than the data loader has already drawn),
    so the run's batches stay a function of the seed and of `advances`, which a checkpoint keeps (`state_dict`): a
    resumed run draws the batches the uninterrupted one drew.

    `lengths`, the training lengths present (None: every length): mastery is measured at the longest length present
    under the cap, and a growth moves the cap to the next length present (`mastery_levels`), so gapped lengths
    ({8, 16, 32}) are all visited instead of the cap stalling at 9 where no batch ever has depth 9."""

    def __init__(self, start_depth: int, increment: int, max_depth: int, threshold: float, window: int,
                 min_steps: int, lookahead: int = 2, lengths=None):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"MasteryCurriculum.threshold must be in (0, 1]; got {threshold!r}.")
        for name, value in (("window", window), ("min_steps", min_steps), ("lookahead", lookahead)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MasteryCurriculum.{name} must be an integer >= 1; got {value!r}.")
        self.start_depth, self.increment, self.max_depth = start_depth, increment, max_depth
        self.lengths = None if lengths is None else sorted({int(d) for d in lengths})
        self.levels = mastery_levels(start_depth, increment, max_depth, self.lengths)
        self.threshold, self.window, self.min_steps, self.lookahead = threshold, window, min_steps, lookahead
        self.advances: list[int] = []  # the step from which each growth applies
        self.recent: list[float] = []  # accuracies of the last steps at depth d_max (at most `window`)
        self._pending: list[float] = []  # this step's micro-batches at depth d_max

    def max_depth_at(self, step: int) -> int:
        """d_max at `step` (`mastery_max_depth` over this curriculum's caps and growths)."""
        return _cap_at(self.levels, self.advances, step)

    def measured_depth_at(self, step: int) -> int:
        """The length whose batches decide mastery at `step`: the cap, or the longest length present under it."""
        cap = self.max_depth_at(step)
        if self.lengths is None:
            return cap
        return max((d for d in self.lengths if d <= cap), default=cap)

    def observe(self, step: int, depth: int, accuracy: float) -> None:
        """One training micro-batch of `depth` at optimizer step `step` had this final-answer accuracy."""
        if depth == self.measured_depth_at(step):
            self._pending.append(float(accuracy))

    def end_step(self, step: int, accuracy: float | None) -> bool:
        """Close optimizer step `step` (0-based) with the accuracy of its micro-batches at d_max (None: none was);
        returns whether d_max grows (from step + lookahead)."""
        self._pending = []
        if accuracy is None or (self.advances and step < self.advances[-1]):  # none at d_max, or d_max is changing
            return False
        self.recent = (self.recent + [float(accuracy)])[-self.window:]
        last = self.advances[-1] - self.lookahead if self.advances else 0
        if (len(self.recent) == self.window and sum(self.recent) / self.window >= self.threshold
                and self.max_depth_at(step + self.lookahead) < self.max_depth and step + 1 - last >= self.min_steps):
            self.advances.append(step + self.lookahead)
            self.recent = []
            return True
        return False

    def pending_accuracy(self) -> tuple[float, int]:
        """(sum, count) of this step's accuracies at d_max, to reduce across ranks."""
        return float(sum(self._pending)), len(self._pending)

    def state_dict(self) -> dict:
        return {"advances": list(self.advances), "recent": list(self.recent)}

    def load_state_dict(self, state: dict) -> None:
        self.advances, self.recent = [int(a) for a in state["advances"]], [float(a) for a in state["recent"]]


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
                 curriculum_increment: int = 1, accumulation: int = 1, mastery: MasteryCurriculum | None = None):
        depths = np.asarray(depths)
        self.batch_size, self.num_batches, self.seed = batch_size, num_batches, seed
        self.min_depth, self.max_depth, self.accumulation = min_depth, max_depth, accumulation
        self.curriculum = (curriculum_start, curriculum_every, curriculum_increment)
        self.mastery = mastery  # a mastery curriculum replaces the fixed pace (read when each batch is drawn)
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

    def cap_at(self, step: int) -> int:
        """d_max at optimizer step `step` (the mastery curriculum's, else the fixed pace's)."""
        return curriculum_cap(step, self.max_depth, *self.curriculum, mastery=self.mastery)

    def depth_at(self, batch_index: int, rng: np.random.Generator) -> int:
        cap = self.cap_at(batch_index // self.accumulation)
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
