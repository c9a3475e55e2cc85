"""Why a step did not reach the weights, and what the loop does about it.

A step that leaves the weights as they were says why with a :class:`SkippedStep`: its :class:`SkipReason`,
which the loop acts on, and its message, which ``train.log`` shows with the batch's utterances. The loop's
answer (:class:`SkipPolicy`) depends on the reason alone:

- a non-finite loss, gradient norm or update: counted in a row; ``train.max_nonfinite_in_a_row`` of them
  stop the run;
- a batch that ran out of CUDA memory: its utterances are counted with the epoch's skipped ones (as
  ``CUDA out of memory``); ``train.max_oom_batches_in_a_row`` such batches in a row stop the run;
- a batch with no utterance left (every item's audio unreadable): logged only.

A made update ends both counts. The training items a batch lost before it reached the step (unreadable
audio, :class:`asr.data.report.Skip`) are logged and counted by their own reasons.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from asr.training.errors import TrainingError
from asr.training.state import Progress

logger = logging.getLogger("asr.train")


class SkipReason(Enum):
    """Why a step did not reach the weights; the value is how the epoch's skip count names it."""

    EMPTY_BATCH = "no utterance left in the batch"
    NONFINITE_LOSS = "non-finite loss"
    NONFINITE_GRADIENT = "non-finite gradient norm"
    NONFINITE_UPDATE = "non-finite update"  # the step made a weight or the optimiser's state non-finite: undone
    OUT_OF_MEMORY = "CUDA out of memory"

    @property
    def nonfinite(self) -> bool:
        return self in (SkipReason.NONFINITE_LOSS, SkipReason.NONFINITE_GRADIENT, SkipReason.NONFINITE_UPDATE)


@dataclass(frozen=True)
class SkippedStep:
    """A step that did not reach the weights: ``reason`` to act on, ``message`` to show
    (``"non-finite loss nan"``, ``"CUDA out of memory in the forward pass of a batch of 12 utterances, ..."``)."""

    reason: SkipReason
    message: str

    def __str__(self) -> str:
        return self.message


def describe(ids: list[str]) -> str:
    """The first few utterance ids of a batch, for a message about it."""
    return ", ".join(ids[:8]) + (f" ... ({len(ids)} utterances)" if len(ids) > 8 else "")


class SkipPolicy:
    """What the loop does with a skipped step or training item: log it, count it, and stop the run after
    ``max_nonfinite_in_a_row`` non-finite steps or ``max_oom_in_a_row`` batches out of memory in a row."""

    def __init__(self, max_nonfinite_in_a_row: int, max_oom_in_a_row: int):
        self.max_nonfinite_in_a_row = max_nonfinite_in_a_row
        self.max_oom_in_a_row = max_oom_in_a_row

    def items(self, progress: Progress, batch) -> None:
        """Log each training item of ``batch`` whose audio failed where it was read, and count it by reason
        for the epoch."""
        for skip in batch.skipped:
            logger.warning("training item skipped at epoch %d: %s [%s]", progress.epoch + 1, skip.message, skip.reason)
            progress.count_skip(skip.reason)

    def step(self, progress: Progress, skipped: SkippedStep, ids: list[str]) -> None:
        """A step that did not reach the weights: logged with its utterances ``ids``, counted by its reason;
        raises :class:`TrainingError` when too many came in a row."""
        logger.warning(
            "%s at epoch %d batch %d; step skipped, weights unchanged (utterances: %s)",
            skipped, progress.epoch + 1, progress.batch_in_epoch, describe(ids),
        )
        if skipped.reason is SkipReason.OUT_OF_MEMORY:
            progress.count_skip(SkipReason.OUT_OF_MEMORY.value, len(ids))
            progress.oom_in_a_row += 1
            if progress.oom_in_a_row >= self.max_oom_in_a_row:
                raise TrainingError(
                    f"{progress.oom_in_a_row} batches in a row ran out of CUDA memory "
                    f"(train.max_oom_batches_in_a_row={self.max_oom_in_a_row}); last batch: {describe(ids)}. "
                    "Lower data.max_frames_per_batch or use a smaller model."
                )
        elif skipped.reason.nonfinite:
            progress.nonfinite_in_a_row += 1
            if progress.nonfinite_in_a_row >= self.max_nonfinite_in_a_row:
                raise TrainingError(
                    f"{progress.nonfinite_in_a_row} non-finite steps in a row "
                    f"(train.max_nonfinite_in_a_row={self.max_nonfinite_in_a_row}); last batch: {describe(ids)}. "
                    "Lower train.lr, check the data, or enable gradient clipping."
                )

    @staticmethod
    def updated(progress: Progress) -> None:
        """An update was made: the counts in a row start again."""
        progress.nonfinite_in_a_row = progress.oom_in_a_row = 0
