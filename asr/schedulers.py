"""Learning-rate schedules as ``torch.optim.lr_scheduler.LambdaLR`` multipliers.

Each ``*_lambda`` returns ``f(step) -> float``, the factor LambdaLR multiplies
the optimizer's configured ``lr`` by. ``step`` is LambdaLR's counter: 0 before
the first update, then one more after every ``scheduler.step()``. We evaluate
the formulas at ``s = step + 1`` so the first update already has a non-zero
rate and update number ``warmup_steps`` is the one with the peak rate.

Formulas (``s = step + 1``, ``w = warmup_steps``, ``d = d_model``):

``noam``          factor = d^-0.5 * min(s^-0.5, s * w^-1.5)
                  Vaswani et al. (2017), eq. 3. The optimizer's ``lr`` is the
                  extra constant k (ESPnet's ``transformer-lr``); the peak rate
                  is ``lr * (d * w)^-0.5``, reached at s = w.
``inverse_sqrt``  factor = min(s / w, sqrt(w / s))
                  The same shape as noam, normalised so the peak factor is 1:
                  the optimizer's ``lr`` is the peak rate (fairseq's
                  ``inverse_sqrt``). noam = (d * w)^-0.5 * inverse_sqrt.
``linear_warmup`` factor = min(s / w, 1)
                  Linear warmup, then constant: for models that need only the
                  start tamed.
``cosine``        factor = s / w while s <= w, then f + (1 - f) * (1 + cos(pi * p)) / 2
                  with p = (s - w) / (T - w): linear warmup, then half a cosine from 1
                  down to ``final_factor`` f at the run's planned last update T
                  (``max_epochs`` epochs, or ``max_steps``), where it stays.
                  Loshchilov & Hutter (2017), without restarts.
``constant``      factor = 1.
``plateau``       factor = s / w while s <= w, then 1, times ``decay_factor`` for each plateau of
                  ``plateau_metric`` (no relative improvement above ``plateau_threshold`` for
                  ``plateau_patience`` validations), never below ``min_factor``: warmup, a flat rate,
                  then decay on a plateau (RETURNN's LibriSpeech attention setups, SpeechBrain's
                  NewBob, ESPnet's RNN recipes). The decay needs the validations, so it lives in
                  :class:`asr.training.schedules.LearningRateSchedule`; here it is the warmup alone.

``cooldown`` (a share c of the run, for the kinds with a flat phase: ``linear_warmup``, ``constant``,
``plateau``) multiplies any of them by a linear fall from 1 to ``final_factor`` over the run's last c:
warmup, stable, decay (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed
Training Durations"; MiniCPM's WSD). The run is its planned updates (``max_steps``, ``max_epochs``) or
its time budget (``max_minutes``), whichever it spends faster, so a run cut short by the clock still
lands at the low rate (budget-aware decay, Li et al. 2020). It lives in
:class:`asr.training.schedules.LearningRateSchedule`, which knows the run's clock.

Post-norm Transformers need one of the warmup schedules (the gradients near
the output are large at initialisation, see docs/normalization.md); pre-norm
ones train with ``constant`` as well.

Use::

    optimizer = torch.optim.Adam(model.parameters(), lr=5.0, betas=(0.9, 0.98))
    scheduler = build_scheduler(optimizer, SchedulerConfig(kind="noam", warmup_steps=25000), d_model=256)
    for batch in batches:
        ...; optimizer.step(); scheduler.step()
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch.optim.lr_scheduler import LambdaLR

from asr.config import ConfigError

SCHEDULE_KINDS = ("noam", "inverse_sqrt", "linear_warmup", "cosine", "constant", "plateau")
COOLDOWN_KINDS = ("linear_warmup", "constant", "plateau")


@dataclass
class SchedulerConfig:
    """How the learning rate moves over updates (the ``optimizer.lr`` is scaled by it)."""

    # how the rate moves over the updates: warmup and decay as each kind's function says (below)
    kind: Literal["noam", "inverse_sqrt", "linear_warmup", "cosine", "constant", "plateau"] = "noam"
    # Where the peak falls as a share of the run matters, not the count: 25k updates put it at
    # ~80% of recipes/librispeech100_transformer.yaml's 100 epochs (see the recipe); on small data
    # sets use a few hundred to a few thousand so the peak is reached at all.
    warmup_steps: int = 25000
    final_factor: float = 0.0  # cosine and cooldown: the share of the peak rate left at the end of the run
    # linear_warmup, constant and plateau: the last share of the run (its planned updates or train.max_minutes,
    # whichever runs out first) over which the rate falls linearly to final_factor; 0: no cooldown
    cooldown: float = 0.0
    # plateau only: the validation metric watched (any registered name, asr.training.metrics), how many
    # validations without a relative improvement above the threshold make a plateau, what each plateau
    # multiplies the rate by, and the lowest share of the peak rate it may reach
    plateau_metric: str = "valid_loss"
    plateau_patience: int = 1
    plateau_threshold: float = 0.0
    decay_factor: float = 0.5
    min_factor: float = 0.01

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"kind must be one of {SCHEDULE_KINDS}, got {self.kind!r}")
        if self.warmup_steps < 1 and self.kind != "constant":
            raise ValueError(f"warmup_steps must be >= 1 for the {self.kind!r} schedule, got {self.warmup_steps}")
        if not 0.0 <= self.final_factor <= 1.0:
            raise ValueError(f"final_factor must be within [0, 1], got {self.final_factor}")
        if not 0.0 <= self.cooldown < 1.0:
            raise ValueError(f"cooldown must be within [0, 1), got {self.cooldown}")
        if self.cooldown > 0 and self.kind not in COOLDOWN_KINDS:
            raise ValueError(f"cooldown is for the kinds with a flat phase {COOLDOWN_KINDS}, not {self.kind!r} "
                             "(cosine decays by itself)")
        if self.plateau_patience < 1:
            raise ValueError(f"plateau_patience must be >= 1, got {self.plateau_patience}")
        if self.plateau_threshold < 0:
            raise ValueError(f"plateau_threshold must be >= 0, got {self.plateau_threshold}")
        if not 0.0 < self.decay_factor < 1.0:
            raise ValueError(f"decay_factor must be in (0, 1), got {self.decay_factor}")
        if not 0.0 < self.min_factor <= 1.0:
            raise ValueError(f"min_factor must be in (0, 1], got {self.min_factor}")


def warmup_updates(config: SchedulerConfig) -> int:
    """The updates over which ``config`` warms the learning rate up (0 for ``constant``, which has no warmup)."""
    return 0 if config.kind == "constant" else config.warmup_steps


def _check_warmup(warmup_steps: int) -> None:
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")


def noam_lambda(d_model: int, warmup_steps: int) -> Callable[[int], float]:
    """Vaswani et al. (2017): ``d^-0.5 * min(s^-0.5, s * w^-1.5)`` at ``s = step + 1``."""
    _check_warmup(warmup_steps)
    if d_model < 1:
        raise ValueError(f"d_model must be >= 1, got {d_model}")

    def factor(step: int) -> float:
        s = step + 1
        return d_model**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)

    return factor


def inverse_sqrt_lambda(warmup_steps: int) -> Callable[[int], float]:
    """Linear warmup to 1 at ``s = w``, then ``sqrt(w / s)``; the optimizer's lr is the peak."""
    _check_warmup(warmup_steps)

    def factor(step: int) -> float:
        s = step + 1
        return min(s / warmup_steps, (warmup_steps / s) ** 0.5)

    return factor


def linear_warmup_lambda(warmup_steps: int) -> Callable[[int], float]:
    """Linear warmup to 1 at ``s = w``, then constant."""
    _check_warmup(warmup_steps)

    def factor(step: int) -> float:
        return min((step + 1) / warmup_steps, 1.0)

    return factor


def cosine_lambda(warmup_steps: int, total_updates: int, final_factor: float = 0.0) -> Callable[[int], float]:
    """Linear warmup to 1 at ``s = w``, then half a cosine down to ``final_factor`` at ``s = total_updates``."""
    _check_warmup(warmup_steps)
    if total_updates <= warmup_steps:
        raise ConfigError(
            f"the cosine schedule needs more updates than train.scheduler.warmup_steps ({warmup_steps}); "
            f"the run plans {total_updates} (train.max_epochs, train.max_steps)"
        )

    def factor(step: int) -> float:
        s = step + 1
        if s <= warmup_steps:
            return s / warmup_steps
        done = min((s - warmup_steps) / (total_updates - warmup_steps), 1.0)
        return final_factor + (1.0 - final_factor) * 0.5 * (1.0 + math.cos(math.pi * done))

    return factor


def planned_share(step: int, total_updates: int) -> float:
    """The share of ``total_updates`` planned updates used by the update after ``step`` completed ones."""
    return min((step + 1) / total_updates, 1.0) if total_updates > 0 else 0.0


def cooldown_factor(spent: float, cooldown: float, final_factor: float) -> float:
    """1 until the share ``spent`` of the run reaches ``1 - cooldown``, then linearly down to
    ``final_factor`` at ``spent = 1`` (and held there)."""
    left = 1.0 - spent
    if cooldown <= 0.0 or left >= cooldown:
        return 1.0
    return final_factor + (1.0 - final_factor) * max(left, 0.0) / cooldown


def lr_factor(config: SchedulerConfig, d_model: int | None = None, total_updates: int | None = None) -> Callable[[int], float]:
    """The factor ``f(step)`` of ``config`` (the ``plateau`` kind's warmup only; its decays need the
    validations, :class:`asr.training.schedules.LearningRateSchedule`). ``d_model`` is required by (and
    only used by) ``noam``, ``total_updates`` (the run's planned updates) by ``cosine``."""
    if config.kind == "noam":
        if d_model is None:
            raise ValueError("scheduler.kind 'noam' needs the model's d_model (a Transformer setting)")
        return noam_lambda(d_model, config.warmup_steps)
    if config.kind == "inverse_sqrt":
        return inverse_sqrt_lambda(config.warmup_steps)
    if config.kind in ("linear_warmup", "plateau"):
        return linear_warmup_lambda(config.warmup_steps)
    if config.kind == "cosine":
        if total_updates is None:
            raise ValueError("scheduler.kind 'cosine' needs the run's planned number of updates")
        return cosine_lambda(config.warmup_steps, total_updates, config.final_factor)
    if config.kind == "constant":
        return _constant
    raise ValueError(f"scheduler.kind must be one of {SCHEDULE_KINDS}, got {config.kind!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: SchedulerConfig, d_model: int | None = None,
    total_updates: int | None = None,
) -> LambdaLR:
    """A LambdaLR of :func:`lr_factor` and the ``cooldown`` over ``total_updates`` (for loops of their own,
    such as tests; the trainer asks :class:`asr.training.schedules.LearningRateSchedule` instead, which
    also knows the run's clock)."""
    factor = lr_factor(config, d_model, total_updates)
    if not config.cooldown:
        return LambdaLR(optimizer, factor)
    if total_updates is None:
        raise ValueError("a cooldown needs the run's planned number of updates")
    cooldown, final = config.cooldown, config.final_factor
    return LambdaLR(optimizer, lambda step: factor(step) * cooldown_factor(planned_share(step, total_updates),
                                                                           cooldown, final))


def _constant(step: int) -> float:
    return 1.0
