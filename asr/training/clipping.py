"""A watch on gradient clipping: say in ``train.log`` when clipping, not the gradient, sets the updates.

``train.grad_clip`` rescales the whole gradient when its global norm is above the limit. A gradient a
hundred or a million times over the limit is not a spike that clipping trims: the update's size is then
the limit's, whatever the gradient says, and its direction is the gradient's largest part. Where one
module group (a LAS's listener, say) holds almost all of the norm, every other group's gradient reaches the
optimiser shrunk by that factor. A layer-normalised LSTM whose recurrent norm undoes the LSTM's small
initialisation does this from its first updates on (docs/studies/ln_open_vocabulary.md), and the
run looks like one that "stops converging": the loss falls slowly while the attention stays put.

:class:`ClippingWatch` counts the updates whose norm is more than :data:`FAR_ABOVE` times the limit. A
run that learns can have one or two at its start (docs/usage.md); when :data:`PERSISTENT` of them have
come, it warns, naming the largest and, where an update's group norms were measured (the first update's
always are: :class:`asr.training.reporting.RunLog` logs it in detail), the groups' norms and shares. When
the run ends it says how many there were. It keeps nothing in the checkpoint (:mod:`asr.training.hooks`):
after ``--resume`` it counts from there.
"""

from __future__ import annotations

import logging
import math

from asr.training.hooks import Hook, RunEnd, Update

logger = logging.getLogger("asr.train")

# How many times the limit a gradient norm must be to count: a gradient that clipping, not training,
# decides the size of. A run that learns clips now and then by a small factor.
FAR_ABOVE = 100.0
# How many such updates make a warning: not a spike at the start but a regime.
PERSISTENT = 10

STUDY = "docs/studies/ln_open_vocabulary.md"
RECURRENT_GROUPS = ("listener", "speller")  # a LAS's LSTM stacks, as asr.training.step.gradient_groups names them


class ClippingWatch(Hook):
    """Counts the updates whose gradient norm before clipping is over ``FAR_ABOVE`` x ``grad_clip``, warns
    at the ``PERSISTENT``-th, and says how many there were when the run ends. ``grad_clip`` 0 (no clipping)
    or ``main`` False (not the main rank) keeps it quiet."""

    def __init__(self, grad_clip: float, main: bool = True):
        self.limit = grad_clip
        self.quiet = not (grad_clip > 0) or not main
        self.count = 0
        self.first: int | None = None                   # the first such update's number
        self.largest: tuple[float, int] | None = None   # (norm, update)
        self.measured: tuple[int, float, dict[str, float]] | None = None  # the first with its group norms

    def on_update(self, trainer, update: Update) -> None:
        norm = update.grad_norm
        if self.quiet or norm is None or not norm > FAR_ABOVE * self.limit:
            return
        self.count += 1
        if self.first is None:
            self.first = update.step
        if self.largest is None or norm > self.largest[0]:
            self.largest = (norm, update.step)
        if self.measured is None and update.group_norms:
            self.measured = (update.step, norm, update.group_norms)
        if self.count == PERSISTENT:
            logger.warning("%s", warning(update.step, self.count, self.first, self.largest, self.limit, self.measured))

    def on_run_end(self, trainer, end: RunEnd) -> None:
        if not self.count:
            return
        norm, step = self.largest
        log = logger.warning if self.count >= PERSISTENT else logger.info
        log("%d update(s) from update %d on had a gradient norm over %g x train.grad_clip (the largest %s at update "
            "%d); grad_norm/<group> in TensorBoard shows which group", self.count, self.first, FAR_ABOVE, about(norm),
            step)


def warning(step: int, count: int, first: int, largest: tuple[float, int], limit: float,
            measured: tuple[int, float, dict[str, float]] | None) -> str:
    """The warning at update ``step``: ``count`` updates from update ``first`` on were over the limit
    ``limit`` by ``FAR_ABOVE`` or more, the ``largest`` (norm, update); ``measured`` (update, norm, group
    norms) names where the norm was at the first such update whose groups were measured, largest first."""
    norm, at = largest
    text = (f"update {step}: {count} updates from update {first} on had a gradient norm before clipping over "
            f"{FAR_ABOVE:g} x train.grad_clip ({limit:g}), the largest {about(norm)} at update {at} "
            f"({about(norm / limit)} times the limit): clipping, not the gradient, sets their size")
    if measured is None:
        return text + ". Where it comes from: grad_norm/<group> in TensorBoard, asr.compare RUN --diagnose"
    step_measured, norm_measured, groups = measured
    ranked = sorted(groups.items(), key=lambda item: -item[1])
    top, top_norm = ranked[0]
    share = min(1.0, (top_norm / norm_measured) ** 2)
    where = ", ".join(f"{group} {about(value)}" for group, value in ranked)
    text += (f". At update {step_measured} the {top} held {100 * share:.0f}% of the norm's square ({where}), and "
             f"every group's gradient reached the optimiser {about(norm_measured / limit)} times smaller")
    if top in RECURRENT_GROUPS:
        return text + (f". A layer-normalised LSTM's recurrent norm can do this (Ba et al.'s cell at its published "
                       f"gain; model.lnlstm_recurrent_gain starts it lower): see {STUDY}")
    return text + ". More: asr.compare RUN --diagnose"


def about(value: float) -> str:
    """``value`` to three significant digits, written out: ``5,770,000``, ``2,500``, ``4.97``, ``0.00863``."""
    if not math.isfinite(value) or abs(value) < 999.5:
        return f"{value:.3g}"
    return f"{round(value, 2 - int(math.floor(math.log10(abs(value))))):,.0f}"
