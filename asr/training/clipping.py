"""A watch on gradient clipping: say in ``train.log`` when clipping, not the gradient, sets the updates.

``train.grad_clip`` rescales the whole gradient when its global norm is above the limit. A gradient a
hundred or a million times over the limit is not a spike that clipping trims: the update's size is then
the limit's, whatever the gradient says, and its direction is the gradient's largest part. Where one
module group (a LAS's listener, say) holds almost all of the norm, every other group's gradient reaches the
optimiser shrunk by that factor. A layer-normalised LSTM whose recurrent norm undoes the LSTM's small
initialisation does this from the first update (docs/studies/ln_open_vocabulary.md), and the run looks like
one that "stops converging": the loss falls slowly while the attention stays put.

:class:`ClippingWatch` warns at the first update whose norm is more than :data:`FAR_ABOVE` times the
limit, naming the groups' norms where that update's were measured (the first update's always are:
:class:`asr.training.reporting.RunLog` logs it in detail), and when the run ends counts such updates.
It keeps nothing in the checkpoint (:mod:`asr.training.hooks`): after ``--resume`` it counts from there.
"""

from __future__ import annotations

import logging
import math

from asr.training.hooks import Hook, RunEnd, Update

logger = logging.getLogger("asr.train")

# How many times the limit a gradient norm must be for the watch to speak. A run that learns clips now and
# then by a small factor; this is a gradient that clipping, not training, decides the size of.
FAR_ABOVE = 100.0

STUDY = "docs/studies/ln_open_vocabulary.md"
RECURRENT_GROUPS = ("listener", "speller")  # a LAS's LSTM stacks, as asr.training.step.gradient_groups names them


class ClippingWatch(Hook):
    """Warns once when the gradient's norm before clipping is over ``FAR_ABOVE`` x ``grad_clip``, and
    counts such updates for the run's last lines. ``grad_clip`` 0 (no clipping) or ``main`` False (not the
    main rank) keeps it quiet."""

    def __init__(self, grad_clip: float, main: bool = True):
        self.limit = grad_clip
        self.quiet = not (grad_clip > 0) or not main
        self.count = 0
        self.first: int | None = None        # the first such update's number
        self.largest: tuple[float, int] | None = None  # (norm, update)

    def on_update(self, trainer, update: Update) -> None:
        norm = update.grad_norm
        if self.quiet or norm is None or not norm > FAR_ABOVE * self.limit:
            return
        self.count += 1
        if self.largest is None or norm > self.largest[0]:
            self.largest = (norm, update.step)
        if self.first is None:
            self.first = update.step
            logger.warning("%s", first_warning(update.step, norm, self.limit, update.group_norms))

    def on_run_end(self, trainer, end: RunEnd) -> None:
        if self.count:
            norm, step = self.largest
            logger.warning("%d update(s) from update %d on had a gradient norm over %g x train.grad_clip (the largest "
                           "%s at update %d); grad_norm/<group> in TensorBoard shows which group, and %s why",
                           self.count, self.first, FAR_ABOVE, about(norm), step, STUDY)


def first_warning(step: int, norm: float, limit: float, group_norms: dict[str, float] | None) -> str:
    """The warning for update ``step``, whose gradient norm before clipping was ``norm`` against the limit
    ``limit``; ``group_norms`` (each module group's norm, where measured) name where the norm is, largest
    first."""
    factor = norm / limit
    text = (f"update {step}: the gradient's norm before clipping is {about(norm)}, {about(factor)} times "
            f"train.grad_clip ({limit:g}); clipping, not the gradient, sets this update's size")
    if group_norms:
        ranked = sorted(group_norms.items(), key=lambda item: -item[1])
        top, top_norm = ranked[0]
        where = ", ".join(f"{group} {about(value)}" for group, value in ranked)
        share = min(1.0, (top_norm / norm) ** 2)
        text += (f", and the {top} holds {100 * share:.0f}% of its square ({where}): every group's gradient reaches "
                 f"the optimiser {about(factor)} times smaller")
        if top in RECURRENT_GROUPS:
            return text + f". A layer-normalised LSTM's recurrent norm can do this from the first updates: see {STUDY}"
    return text + f". Where it comes from: grad_norm/<group> in TensorBoard, asr.compare RUN --diagnose"


def about(value: float) -> str:
    """``value`` to three significant digits, written out: ``5,770,000``, ``2,500``, ``4.97``, ``0.00863``."""
    if not math.isfinite(value) or abs(value) < 999.5:
        return f"{value:.3g}"
    return f"{round(value, 2 - int(math.floor(math.log10(abs(value))))):,.0f}"
