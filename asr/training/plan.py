"""An epoch's batches, planned when it starts: which are trained on, and with which data settings.

The sampler gives the epoch's batches (:class:`asr.data.batching.BucketBatchSampler`). The plan walks
them in order and gives each the update it is expected to serve: the run's step when the epoch began,
plus the batches admitted before it divided by ``train.accum_grad``. There it asks the data schedules
(:mod:`asr.training.schedules`):

- ``max_duration``: a batch holding a longer utterance is left out of the epoch (a length curriculum:
  only short utterances while the alignment forms, as RETURNN's LibriSpeech setups do);
- ``spec_augment``: each index of an admitted batch carries the share of utterances SpecAugment masks
  at that update (:class:`PlannedIndex`), which the dataset reads in whichever worker prepares it.

The plan is a function of the sampler's order, the step the epoch began at and the schedules, all of
which a resumed run restores, so ``--resume`` plans the same batches again and skips those it has
consumed. An expected update is exact unless a step is skipped (a non-finite loss, out of memory),
which shifts the later batches of that epoch by one update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from asr.training.schedules import ScheduleSet


class PlannedIndex(int):
    """A dataset index that carries the share of utterances SpecAugment masks at its update."""

    spec_augment: float

    def __new__(cls, index: int, spec_augment: float = 1.0) -> "PlannedIndex":
        planned = super().__new__(cls, index)
        planned.spec_augment = float(spec_augment)
        return planned

    def __reduce__(self):  # to DataLoader workers
        return (PlannedIndex, (int(self), self.spec_augment))


@dataclass
class EpochPlan:
    batches: list[list[PlannedIndex]]  # the admitted batches, in the sampler's order
    left_out_batches: int = 0          # over the max_duration cap at their expected update
    left_out_utterances: int = 0


def plan_epoch(
    batches: list[list[int]], durations: list[float], first_step: int, accum_grad: int, schedules: ScheduleSet
) -> EpochPlan:
    """The plan of an epoch of ``batches`` (indices into ``durations``, seconds) that begins after
    ``first_step`` updates (module docstring)."""
    plan = EpochPlan([])
    admitted = 0
    for batch in batches:
        step = first_step + admitted // accum_grad
        cap = schedules.value("max_duration", step, math.inf)
        if batch and max(durations[i] for i in batch) > cap:
            plan.left_out_batches += 1
            plan.left_out_utterances += len(batch)
            continue
        share = schedules.value("spec_augment", step, 1.0)
        plan.batches.append([PlannedIndex(i, share) for i in batch])
        admitted += 1
    return plan
