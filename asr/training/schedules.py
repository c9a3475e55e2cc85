"""Schedules: everything that moves while a run trains, as one kind of object.

A :class:`Schedule` is asked once per optimiser update for its value, given the
number of updates already made (``step``: 0 for the first update). It may also
hear the validation metrics at the end of each epoch (:meth:`Schedule.observe`,
for a rate that decays on a plateau), and its state goes into ``last.pt`` with
the run, as a PyTorch LR scheduler's does. The trainer holds them in one
:class:`ScheduleSet` and never names a quantity itself: a new thing that changes
during training is a new schedule target, not a new branch in the loop.

Targets, each set in the recipe (``train.schedules.<name>``), with what drives them:

=======================  =========================================================================
``lr``                   the optimiser's learning rate: ``train.lr`` times ``train.scheduler``'s
                         factor (:mod:`asr.schedulers`; its ``plateau`` kind observes validation)
``ctc_weight``           the CTC share of the loss (a model target; the model needs its CTC head,
                         so ``model.ctc_weight`` must be above 0)
``label_smoothing``      of the attention loss (model target)
``sampling_probability`` LAS's scheduled sampling (model target)
``attention_prior``      LAS: the strength of a soft diagonal prior on the attention energies in
                         teacher forcing (model target; wav2letter's SoftPretrainWindow)
``listener_layers``      LAS: how many listener layers run, the rest bypassed (model target; rounded
                         to a whole layer, at most ``model.listener.num_layers``; Zeyer et al. 2018)
``spec_augment``         the share of training utterances SpecAugment masks (data target; 1 = all,
                         what ``features.spec_augment.enabled`` alone gives)
``max_duration``         the longest training utterance, in seconds, a batch may hold (data target):
                         batches with a longer one are left out of the epoch (a length curriculum)
=======================  =========================================================================

A schedule in the recipe is a list of ``[update, value]`` points::

    train:
      schedules:
        ctc_weight: {points: [[0, 0.5], [4000, 0.5], [6000, 0.3]], interpolation: linear}
        spec_augment: {points: [[0, 0], [2000, 1]]}    # off, then on from update 2000
        max_duration: {points: [[0, 8], [1500, 1e9]]}  # utterances of at most 8 s until update 1500

Before the first point the value is the first point's, after the last the last's; between two
points it holds the earlier one (``interpolation: hold``, the default) or moves linearly
(``linear``). Model targets without a schedule keep the model config's value; ``spec_augment`` is
1 and ``max_duration`` unbounded.

Data targets are evaluated where a batch is planned, not where it is trained (:mod:`asr.training.plan`):
an epoch's batches are planned when it starts, each with the update it is expected to serve, so that
its worker can prepare it ahead of time and a resumed run plans the same batches again.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Callable, Literal

from asr.config import ConfigError
from asr.schedulers import SchedulerConfig, cooldown_factor, lr_factor, planned_share

logger = logging.getLogger("asr.train")

MODEL_TARGETS = ("ctc_weight", "label_smoothing", "sampling_probability", "attention_prior", "listener_layers")
DATA_TARGETS = ("spec_augment", "max_duration")
TARGETS = MODEL_TARGETS + DATA_TARGETS

# The values a target may take: (low, high, whether high itself is allowed).
_RANGES = {
    "ctc_weight": (0.0, 1.0, True),  # 1.0: a CTC-only phase (the decoder idle); the last value must be below
    "label_smoothing": (0.0, 1.0, False),
    "sampling_probability": (0.0, 1.0, True),
    "attention_prior": (0.0, math.inf, False),
    "listener_layers": (1.0, math.inf, False),
    "spec_augment": (0.0, 1.0, True),
    "max_duration": (0.0, math.inf, True),
}


@dataclass
class ScheduleConfig:
    """``train.schedules.<target>``: a value over optimiser updates, as ``[update, value]`` points."""

    points: list[list[float]] = field(default_factory=list)
    interpolation: Literal["hold", "linear"] = "hold"

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("points: give at least one [update, value] pair")
        for point in self.points:
            if len(point) != 2:
                raise ValueError(f"points: each point is [update, value], got {point!r}")
            # .nan compares false with everything, so it would pass the order check below unseen
            if not all(math.isfinite(number) for number in point):
                raise ValueError(f"points: each update and value must be a finite number, got {point!r}")
        updates = [p[0] for p in self.points]
        if any(u < 0 for u in updates) or updates != sorted(updates):
            raise ValueError(f"points: the updates must be >= 0 and increasing, got {updates}")
        if self.interpolation not in ("hold", "linear"):
            raise ValueError(f"interpolation must be 'hold' or 'linear', got {self.interpolation!r}")


class Schedule(ABC):
    """A value asked for once per optimiser update."""

    @abstractmethod
    def value(self, step: int) -> float:
        """The value for the update made after ``step`` completed ones."""

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        """Hear the validation ``metrics`` after ``step`` updates; return a line for the log when the
        schedule changes course because of them (None otherwise)."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class PiecewiseSchedule(Schedule):
    """:class:`ScheduleConfig`'s points, held or linearly interpolated. A pure function of the step."""

    def __init__(self, config: ScheduleConfig):
        self.updates = [float(u) for u, _ in config.points]
        self.values = [float(v) for _, v in config.points]
        self.linear = config.interpolation == "linear"

    def value(self, step: int) -> float:
        index = bisect_right(self.updates, step) - 1
        if index < 0:
            return self.values[0]
        if index == len(self.updates) - 1 or not self.linear:
            return self.values[index]
        start, end = self.updates[index], self.updates[index + 1]
        share = (step - start) / (end - start)
        return self.values[index] + share * (self.values[index + 1] - self.values[index])


class LearningRateSchedule(Schedule):
    """``train.lr`` times the factor of ``train.scheduler`` (:func:`asr.schedulers.lr_factor`).

    The ``plateau`` kind (warmup, a flat rate, then decay on a plateau: RETURNN's and SpeechBrain's
    NewBob, ESPnet's decay when validation stops improving) multiplies the rate by ``decay_factor``
    each time ``plateau_metric`` has failed to improve by more than ``plateau_threshold`` (relative)
    for ``plateau_patience`` validations in a row, down to ``min_factor``. Its state (the decays so
    far, the best value, the validations without improvement) is saved with the run.

    ``cooldown`` then brings the rate down to ``final_factor`` over the run's last share: ``spent(step)``
    says how much of the run the update after ``step`` completed ones has used, from 0 to 1 (the trainer's
    :func:`run_spent`: planned updates or the clock, whichever is further on); without it, the planned
    updates alone (``total_updates``).
    """

    def __init__(self, base_lr: float, config: SchedulerConfig, d_model: int | None, total_updates: int | None,
                 higher_is_better: Callable[[str], bool] | None = None,
                 spent: Callable[[int], float] | None = None):
        self.base_lr = base_lr
        self.config = config
        self.factor = lr_factor(config, d_model=d_model, total_updates=total_updates)
        if spent is None and config.cooldown > 0:
            if total_updates is None:
                raise ValueError("a cooldown needs the run's planned updates or its clock")
            spent = run_spent(total_updates)
        self.spent = spent
        self._higher_is_better = higher_is_better or (lambda name: False)
        self.decays = 0
        self.best: float | None = None
        self.without_improvement = 0

    def value(self, step: int) -> float:
        config = self.config
        decay = max(config.decay_factor**self.decays, config.min_factor) if self.decays else 1.0
        cooldown = cooldown_factor(self.spent(step), config.cooldown, config.final_factor) if config.cooldown else 1.0
        return self.base_lr * self.factor(step) * decay * cooldown

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        config = self.config
        if config.kind != "plateau" or config.plateau_metric not in metrics:
            return None
        value = metrics[config.plateau_metric]
        if not math.isfinite(value):
            return None
        sign = -1.0 if self._higher_is_better(config.plateau_metric) else 1.0
        if self.best is None or sign * value < sign * self.best - config.plateau_threshold * abs(self.best):
            self.best, self.without_improvement = value, 0
            return None
        self.without_improvement += 1
        if self.without_improvement < config.plateau_patience or step < config.warmup_steps:
            return None
        if config.decay_factor**self.decays <= config.min_factor:
            return None
        self.decays += 1
        self.without_improvement = 0
        from asr.training.metrics import format_value  # the best as train.log shows it (WER in percent)

        return (f"learning rate x{config.decay_factor} (now {self.value(step):.3g}): {config.plateau_metric} "
                f"has not improved on {format_value(config.plateau_metric, self.best)} for "
                f"{config.plateau_patience} validation(s)")

    def state_dict(self) -> dict:
        return {"decays": self.decays, "best": self.best, "without_improvement": self.without_improvement}

    def load_state_dict(self, state: dict) -> None:
        if "decays" not in state:
            return  # a LambdaLR's state (runs of older versions): its rate is a function of the step alone
        self.decays = int(state["decays"])
        self.best = state["best"]
        self.without_improvement = int(state["without_improvement"])


def run_spent(total_updates: int, max_minutes: float | None = None,
              minutes: Callable[[], float] | None = None) -> Callable[[int], float]:
    """``spent(step)``: the share of the run the update after ``step`` completed ones uses, from 0 to 1:
    ``(step + 1) / total_updates``, or the minutes run so far over ``max_minutes`` when that is further on
    (a run on a slow or busy machine, which its time budget will end before its planned updates)."""
    def spent(step: int) -> float:
        share = planned_share(step, total_updates)
        if max_minutes and minutes is not None:
            share = max(share, min(minutes() / max_minutes, 1.0))
        return share

    return spent


def check_schedule_target(name: str) -> None:
    """Refuse a ``train.schedules`` entry that names no target."""
    if name not in TARGETS:
        raise ConfigError(f"train.schedules.{name}: no such schedule target (known: {', '.join(TARGETS)})")


def check_schedule_values(name: str, config: ScheduleConfig) -> None:
    """Refuse values outside ``name``'s range, naming ``train.schedules.<name>``."""
    check_schedule_target(name)
    low, high, high_allowed = _RANGES[name]
    for update, value in config.points:
        if not (low <= value < high or (high_allowed and value == high)):
            bracket = "]" if high_allowed else ")"
            raise ConfigError(
                f"train.schedules.{name}: value {value} at update {update} is outside [{low}, {high}{bracket}"
            )
    if name == "ctc_weight" and config.points[-1][1] >= 1.0:
        raise ConfigError(
            f"train.schedules.ctc_weight: the last value is {config.points[-1][1]}: a weight of 1.0 leaves the "
            "attention decoder idle (a CTC-only phase), so the schedule must end below it"
        )


@dataclass
class ScheduleSet:
    """The run's schedules by target name, and where each value goes.

    ``model``: the model whose targets are set (an object with ``set_scheduled(name, value)``);
    ``optimizer``: whose param groups get ``lr``. Values are set in :meth:`apply`, once per update.
    """

    schedules: dict[str, Schedule]
    model: object = None
    optimizer: object = None
    model_targets: tuple[str, ...] = ()
    # A model's own regularisation schedule (the Transformer's DropHead: step -> its rates by name)
    regularisation: Callable[[int], dict[str, float]] | None = None

    def apply(self, step: int) -> dict[str, float]:
        """Set every schedule's value for the update after ``step`` completed ones; returns them by name."""
        values = dict(self.regularisation(step)) if self.regularisation is not None else {}
        for name, schedule in self.schedules.items():
            value = schedule.value(step)
            values[name] = value
            if name == "lr" and self.optimizer is not None:
                for group in self.optimizer.param_groups:
                    group["lr"] = value
            elif name in self.model_targets and self.model is not None:
                self.model.set_scheduled(name, value)
        return values

    def value(self, name: str, step: int, default: float) -> float:
        schedule = self.schedules.get(name)
        return default if schedule is None else schedule.value(step)

    def observe(self, step: int, metrics: dict[str, float]) -> list[str]:
        return [line for s in self.schedules.values() if (line := s.observe(step, metrics)) is not None]

    def state_dict(self) -> dict:
        return {"schedules": {name: s.state_dict() for name, s in self.schedules.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved; an older run's LambdaLR state restores nothing (its
        rate followed the step alone)."""
        saved = state.get("schedules")
        if not isinstance(saved, dict):
            return
        for name, schedule in self.schedules.items():
            if name in saved:
                schedule.load_state_dict(saved[name])


def build_schedules(configs: dict[str, ScheduleConfig], lr: LearningRateSchedule, model, optimizer,
                    regularisation: Callable[[int], dict[str, float]] | None = None) -> ScheduleSet:
    """The run's :class:`ScheduleSet`: ``lr`` and one schedule per ``train.schedules`` entry.

    Model targets must be ones the model offers (``model.scheduled()``, name -> the config's value);
    those it offers without a recipe schedule are held at that value.
    """
    offered = dict(model.scheduled()) if hasattr(model, "scheduled") else {}
    schedules: dict[str, Schedule] = {"lr": lr}
    for name, config in configs.items():
        check_schedule_values(name, config)
        if name in MODEL_TARGETS and name not in offered:
            known = ", ".join(offered) or "none"
            raise ConfigError(
                f"train.schedules.{name}: the model ({type(model).__name__}) has no '{name}' to schedule "
                f"(it offers: {known})"
            )
        schedules[name] = PiecewiseSchedule(config)
    return ScheduleSet(schedules, model=model, optimizer=optimizer,
                       model_targets=tuple(n for n in schedules if n in offered), regularisation=regularisation)
