"""Hooks: what watches or steers a run plugs into the loop as one object, on a short list of events.

The loop (:class:`asr.training.trainer.Trainer`) calls each hook it was given, in their order, with itself
and the event:

==========================  ======================================================================
``on_update``               after each optimiser update (:class:`Update`)
``on_validation``           after each validation (:class:`Validated`): at an epoch's end, inside an
                            epoch (``train.valid_every_steps``), or where a limit stopped the run
``on_epoch_end``            after a finished epoch is ranked and checkpointed (:class:`EpochDone`)
``on_run_end``              when the loop has ended as planned (:class:`RunEnd`): its epochs, a limit,
                            early stopping
``close``                   last, when ``fit`` returns or raises (an error, a stop signal): let go of
                            what the hook holds (a file, a writer)
==========================  ======================================================================

A hook that reports an update in detail says so with :meth:`Hook.detailed`: the loop then measures the
gradient norm of each module group and the loader's share of the wall time for that update (a norm per
parameter and a clock reading, not spent on the updates no hook reports).

A hook keeps nothing in the checkpoint: one that steers the run derives what it does from what the
events carry (the update's number, the epoch's), so a run stopped and resumed sees the same events and
does the same as one run straight. The run's own reporting (``train.log``, TensorBoard and the closing
summary: :class:`asr.training.reporting.Reporting`) and its runtime record
(:class:`asr.training.reporting.RunRecord`, which writes ``config.yaml`` when the run is built and logs what
ran when it ends) are hooks, and so are the plateau rule that watches the epochs' validations
(:class:`asr.training.schedules.WatchedSchedules`) and the warning on gradients far over their clipping limit
(:class:`asr.training.clipping.ClippingWatch`); a new one is a class in a file of its own, handed to
:func:`asr.run.build_trainer` (``hooks=[...]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asr.training.validation import Validation


@dataclass(frozen=True)
class Update:
    """One optimiser update, as it was made."""

    epoch: int                      # the epoch's number, from 1
    step: int                       # updates made so far, this one included
    loss: float                     # the last batch's loss (averaged over the ranks)
    grad_norm: float | None         # the global gradient norm before clipping
    values: dict[str, float]        # what the schedules set for it: lr, ctc_weight, ... (asr.training.schedules)
    epochs_done: float              # epochs done with this one's share: 2.5 halfway through the third
    group_norms: dict[str, float] | None = None  # per module group, where a hook asked (Hook.detailed)
    timing: dict[str, float] = field(default_factory=dict)  # seconds_per_update, loader_wait since the last detailed update


@dataclass(frozen=True)
class Validated:
    """A validation after update ``step`` in epoch number ``epoch``."""

    epoch: int
    step: int
    validation: Validation          # its metrics (empty: it scored nothing) and counts
    epochs_done: float              # equal to epoch at the epoch's end; less inside it

    @property
    def metrics(self) -> dict[str, float]:
        return self.validation.metrics

    @property
    def at_epoch_end(self) -> bool:
        return self.epochs_done == self.epoch


@dataclass(frozen=True)
class EpochDone:
    """Epoch number ``epoch`` finished after update ``step``, ranked by its ``metrics`` and checkpointed."""

    epoch: int
    step: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class RunEnd:
    """The loop ended after update ``step``: ``why`` names what ended it (``train.max_epochs=20``, ...)."""

    why: str
    step: int
    epochs_done: float


class Hook:
    """The events a hook may answer; each does nothing unless overridden. ``trainer`` is the loop, with its
    model (``raw_model``), data, ``progress`` and ``device``."""

    def detailed(self, step: int) -> bool:
        """Whether this hook reports update ``step`` in detail (its group norms and timing)."""
        return False

    def on_update(self, trainer, update: Update) -> None:
        pass

    def on_validation(self, trainer, validated: Validated) -> None:
        pass

    def on_epoch_end(self, trainer, epoch: EpochDone) -> None:
        pass

    def on_run_end(self, trainer, end: RunEnd) -> None:
        pass

    def close(self, trainer) -> None:
        pass
