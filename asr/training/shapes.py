"""Schedule shapes: how a value moves over the optimiser updates, one class per shape, one registry.

A shape is asked for its value at ``step``, the number of updates already made (0 for the first), once
per update. It may hear the validation metrics at the end of an epoch (:meth:`Shape.observe`, for a rate
that decays on a plateau) and keep state for that, which is saved with the run (:meth:`Shape.state_dict`),
as a PyTorch LR scheduler's is. The learning rate (``train.scheduler``), everything else that moves
(``train.schedules.<name>``) and DropHead's rate (``model.drophead_schedule``) are all drawn from this
one vocabulary: a recipe names a shape and gives its options,

    train:
      scheduler: {kind: noam, warmup_steps: 25000}          # the learning rate: train.lr times noam
      schedules:
        ctc_weight: {points: [[0, 0.5], [4000, 0.3]]}      # shape: points, the default
        label_smoothing: {shape: cosine, scale: 0.1, warmup_steps: 0, final_factor: 0}

Shapes (``s = step + 1``, ``w = warmup_steps``, ``T`` the run's planned updates; the value is ``scale``
times the factor below, so ``scale`` is ``train.lr`` for the learning rate and the peak for DropHead):

``points``        ``[update, value]`` pairs, held (``interpolation: hold``) or linear between them;
                  before the first the first's value, after the last the last's. No ``scale``.
``noam``          d^-0.5 * min(s^-0.5, s * w^-1.5), with d the model's width (Vaswani et al. 2017,
                  eq. 3; ``scale`` is the extra constant k, ESPnet's ``transformer-lr``, so the peak
                  is ``scale * (d * w)^-0.5``, reached at s = w).
``inverse_sqrt``  min(s / w, sqrt(w / s)): noam normalised to a peak of 1 (fairseq's ``inverse_sqrt``).
``linear_warmup`` min(s / w, 1): the start tamed, then constant.
``cosine``        s / w while s <= w, then f + (1 - f) * (1 + cos(pi * p)) / 2 with p = (s - w) / (T - w):
                  half a cosine from 1 down to ``final_factor`` f at T, where it stays (Loshchilov &
                  Hutter 2017, without restarts). ``w = 0``: no warmup.
``constant``      1.
``plateau``       ``linear_warmup``, times ``decay_factor`` for each plateau of ``plateau_metric`` (no
                  relative improvement above ``plateau_threshold`` for ``plateau_patience`` validations),
                  never below ``min_factor`` (RETURNN's and SpeechBrain's NewBob, ESPnet's RNN recipes).
``vshape``        1 - step / w during the warmup, then min(1, (step - w) / (T - w)): from 1 to 0 at the
                  end of the learning rate's warmup (``warmup_steps`` unset) and back to 1 at T
                  (Zhou et al. 2020, Scheduled DropHead; without warmup it only rises).

``cooldown`` (``linear_warmup``, ``constant``, ``plateau``: the shapes with a flat phase) multiplies the
factor by a linear fall from 1 to ``final_factor`` over the run's last share ``cooldown``: warmup, stable,
decay (Hägele et al. 2024; MiniCPM's WSD). The run is its planned updates or its time budget
(``train.max_minutes``), whichever it spends faster (:func:`run_spent`), so a run cut short by the clock
still lands at the low value (budget-aware decay, Li et al. 2020).

Adding a shape: write its options (a :class:`ScheduleConfig` dataclass whose ``shape`` field is a
one-value ``Literal``) and its class (a :class:`Shape` built from ``(options, run)``), then
``register_shape("mine", MineConfig, Mine)``. ``train.schedules.<name>: {shape: mine, ...}`` then moves
any target with it, and if its options have a ``scale``, ``train.scheduler: {kind: mine, ...}`` the
learning rate (``train.lr`` the scale; :class:`asr.training.schedules.SchedulerConfig` reads its other
options as ``train.scheduler``'s keys); the loop does not change.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_right
from dataclasses import dataclass, field, fields
from typing import Callable, Literal

from asr.config import ConfigError


@dataclass(frozen=True)
class RunPlan:
    """What a shape may need to know of the run it moves a value in."""

    total_updates: int | None = None  # the updates the run plans (train.max_steps, or max_epochs of them)
    d_model: int | None = None        # the model width noam scales by (None: the model has none)
    warmup_steps: int = 0             # the learning rate's warmup (vshape turns at its end by default)
    # the share of the run the update after ``step`` completed ones uses, 0 to 1 (run_spent: the planned
    # updates or the clock, whichever is further on); None: the planned updates alone
    spent: Callable[[int], float] | None = None
    # which way a validation metric improves (asr.training.metrics.higher_is_better); None: lower is better
    higher_is_better: Callable[[str], bool] | None = None


class Shape(ABC):
    """A value asked for once per optimiser update."""

    @abstractmethod
    def value(self, step: int) -> float:
        """The value for the update made after ``step`` completed ones."""

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        """Hear the validation ``metrics`` after ``step`` updates; return a line for the log when the
        shape changes course because of them (None otherwise)."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class ScheduleConfig:
    """``train.schedules.<name>``: a shape and its options. Each shape's options subclass this with a
    ``shape`` field; reading one from a recipe picks the subclass its ``shape`` names (``points`` when it
    names none), so an old recipe's ``{points: [...]}`` reads as it always did."""

    @classmethod
    def config_variant(cls, data: dict, path: str) -> type:
        """The options class ``data`` is read as (:func:`asr.config.from_dict` asks)."""
        if cls is not ScheduleConfig:
            return cls
        return shape_config_class(data.get("shape", "points"), path)

    def extremes(self) -> tuple[float, float] | None:
        """The lowest and the highest value the shape can take (None: not known before the run)."""
        return None


# ---------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class ShapeEntry:
    config_class: type[ScheduleConfig]
    shape_class: type[Shape]


_SHAPES: dict[str, ShapeEntry] = {}


def register_shape(name: str, config_class: type[ScheduleConfig], shape_class: type[Shape]) -> None:
    """Make ``{shape: name, ...}`` build ``shape_class(config_class(...), run)``."""
    if name in _SHAPES:
        raise ValueError(f"schedule shape {name!r} is registered already")
    declared = {f.name: f.default for f in fields(config_class)}.get("shape")
    if declared != name:
        raise ValueError(f"{config_class.__name__}.shape must default to {name!r}, got {declared!r}")
    _SHAPES[name] = ShapeEntry(config_class, shape_class)


def check_plateau_options(options) -> None:
    """Refuse plateau settings out of range (``train.scheduler``'s and a ``plateau`` shape's alike)."""
    if options.plateau_patience < 1:
        raise ValueError(f"plateau_patience must be >= 1, got {options.plateau_patience}")
    if options.plateau_threshold < 0:
        raise ValueError(f"plateau_threshold must be >= 0, got {options.plateau_threshold}")
    if not 0.0 < options.decay_factor < 1.0:
        raise ValueError(f"decay_factor must be in (0, 1), got {options.decay_factor}")
    if not 0.0 < options.min_factor <= 1.0:
        raise ValueError(f"min_factor must be in (0, 1], got {options.min_factor}")


def shape_names() -> list[str]:
    return sorted(_SHAPES)


def shape_config_class(name: object, path: str = "") -> type[ScheduleConfig]:
    """The options class of shape ``name``; a :class:`ConfigError` naming ``path``'s ``shape`` otherwise."""
    if name not in _SHAPES:
        key = f"{path}.shape" if path else "shape"
        raise ConfigError(f"{key}: {name!r} is not one of {', '.join(shape_names())}")
    return _SHAPES[name].config_class


def build_shape(config: ScheduleConfig, run: RunPlan | None = None) -> Shape:
    """The shape ``config`` describes, in ``run``."""
    return _SHAPES[config.shape].shape_class(config, run or RunPlan())


# ---------------------------------------------------------------------------- points


@dataclass
class PointsConfig(ScheduleConfig):
    """``[update, value]`` points, held or linearly interpolated."""

    points: list[list[float]] = field(default_factory=list)  # [update, value] pairs, updates increasing
    interpolation: Literal["hold", "linear"] = "hold"        # hold each value until the next point, or move linearly
    shape: Literal["points"] = "points"

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

    def extremes(self) -> tuple[float, float]:
        values = [value for _, value in self.points]
        return min(values), max(values)


class Points(Shape):
    """:class:`PointsConfig`'s points, held or linearly interpolated. A pure function of the step."""

    def __init__(self, config: PointsConfig, run: RunPlan | None = None):
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


# ---------------------------------------------------------------------------- scaled factors


def _check_options(config) -> None:
    """The checks the options of the scaled shapes share, each on the fields the shape has."""
    if not math.isfinite(config.scale):
        raise ValueError(f"scale must be a finite number, got {config.scale}")
    warmup = getattr(config, "warmup_steps", None)
    least = 0 if config.shape in ("cosine", "vshape") else 1
    if warmup is not None and warmup < least:
        raise ValueError(f"warmup_steps must be >= {least} for the {config.shape!r} shape, got {warmup}")
    if not 0.0 <= getattr(config, "final_factor", 0.0) <= 1.0:
        raise ValueError(f"final_factor must be within [0, 1], got {config.final_factor}")
    if not 0.0 <= getattr(config, "cooldown", 0.0) < 1.0:
        raise ValueError(f"cooldown must be within [0, 1), got {config.cooldown}")


def _extremes(config, low: float) -> tuple[float, float]:
    """``scale`` times a factor between ``low`` and 1."""
    return tuple(sorted((config.scale * low, config.scale)))


class Scaled(Shape):
    """``scale`` times :meth:`factor`, times :meth:`decay` (a plateau's), times the run's cooldown where
    the options have one. The product is formed in that order, so each shape's value is bit for bit the
    one the learning-rate multipliers of earlier versions gave."""

    def __init__(self, config, run: RunPlan):
        self.scale = config.scale
        self.cooldown = getattr(config, "cooldown", 0.0)
        self.final_factor = getattr(config, "final_factor", 0.0)
        self.spent = run.spent
        if self.cooldown and self.spent is None:
            if run.total_updates is None:
                raise ValueError("a cooldown needs the run's planned updates or its clock")
            self.spent = run_spent(run.total_updates)

    @abstractmethod
    def factor(self, step: int) -> float:
        """The factor for the update after ``step`` completed ones."""

    def decay(self) -> float:
        return 1.0

    def value(self, step: int) -> float:
        cooldown = cooldown_factor(self.spent(step), self.cooldown, self.final_factor) if self.cooldown else 1.0
        return self.scale * self.factor(step) * self.decay() * cooldown


@dataclass
class NoamConfig(ScheduleConfig):
    warmup_steps: int = 25000  # the update with the peak value
    scale: float = 1.0         # Noam's constant k (train.lr for the learning rate)
    shape: Literal["noam"] = "noam"

    def __post_init__(self) -> None:
        _check_options(self)


class Noam(Scaled):
    def __init__(self, config: NoamConfig, run: RunPlan):
        super().__init__(config, run)
        if run.d_model is None:
            raise ValueError("the noam shape needs the model's d_model (a Transformer setting)")
        if run.d_model < 1:
            raise ValueError(f"d_model must be >= 1, got {run.d_model}")
        self.d_model, self.warmup_steps = run.d_model, config.warmup_steps

    def factor(self, step: int) -> float:
        s = step + 1
        return self.d_model**-0.5 * min(s**-0.5, s * self.warmup_steps**-1.5)


@dataclass
class InverseSqrtConfig(ScheduleConfig):
    warmup_steps: int = 25000  # the update with the peak value, scale
    scale: float = 1.0         # the peak (train.lr for the learning rate)
    shape: Literal["inverse_sqrt"] = "inverse_sqrt"

    def __post_init__(self) -> None:
        _check_options(self)

    def extremes(self) -> tuple[float, float]:
        return _extremes(self, 0.0)


class InverseSqrt(Scaled):
    def __init__(self, config: InverseSqrtConfig, run: RunPlan):
        super().__init__(config, run)
        self.warmup_steps = config.warmup_steps

    def factor(self, step: int) -> float:
        s = step + 1
        return min(s / self.warmup_steps, (self.warmup_steps / s) ** 0.5)


@dataclass
class LinearWarmupConfig(ScheduleConfig):
    warmup_steps: int = 25000  # updates to reach scale
    scale: float = 1.0         # the value after the warmup (train.lr for the learning rate)
    cooldown: float = 0.0      # the run's last share over which the value falls linearly to final_factor (0: none)
    final_factor: float = 0.0  # the share of scale left at the end of a cooldown
    shape: Literal["linear_warmup"] = "linear_warmup"

    def __post_init__(self) -> None:
        _check_options(self)

    def extremes(self) -> tuple[float, float]:
        return _extremes(self, 0.0)


class LinearWarmup(Scaled):
    def __init__(self, config: LinearWarmupConfig, run: RunPlan):
        super().__init__(config, run)
        self.warmup_steps = config.warmup_steps

    def factor(self, step: int) -> float:
        return min((step + 1) / self.warmup_steps, 1.0)


@dataclass
class CosineConfig(ScheduleConfig):
    warmup_steps: int = 0      # updates of linear warmup to scale (0: none, the cosine starts at scale)
    scale: float = 1.0         # the value at the end of the warmup (train.lr for the learning rate)
    final_factor: float = 0.0  # the share of scale reached at the run's last planned update
    shape: Literal["cosine"] = "cosine"

    def __post_init__(self) -> None:
        _check_options(self)

    def extremes(self) -> tuple[float, float]:
        return _extremes(self, 0.0 if self.warmup_steps else self.final_factor)


class Cosine(Scaled):
    def __init__(self, config: CosineConfig, run: RunPlan):
        super().__init__(config, run)
        if run.total_updates is None:
            raise ValueError("the cosine shape needs the run's planned number of updates")
        if run.total_updates <= config.warmup_steps:
            raise ConfigError(
                f"the cosine shape needs more updates than its warmup_steps ({config.warmup_steps}); "
                f"the run plans {run.total_updates} (train.max_epochs, train.max_steps)"
            )
        self.warmup_steps, self.total_updates = config.warmup_steps, run.total_updates

    def factor(self, step: int) -> float:
        s, warmup, final = step + 1, self.warmup_steps, self.final_factor
        if s <= warmup:
            return s / warmup
        done = min((s - warmup) / (self.total_updates - warmup), 1.0)
        return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * done))


@dataclass
class ConstantConfig(ScheduleConfig):
    scale: float = 1.0         # the value (train.lr for the learning rate)
    cooldown: float = 0.0      # the run's last share over which the value falls linearly to final_factor (0: none)
    final_factor: float = 0.0  # the share of scale left at the end of a cooldown
    shape: Literal["constant"] = "constant"

    def __post_init__(self) -> None:
        _check_options(self)

    def extremes(self) -> tuple[float, float]:
        return _extremes(self, self.final_factor if self.cooldown else 1.0)


class Constant(Scaled):
    def factor(self, step: int) -> float:
        return 1.0


@dataclass
class PlateauConfig(ScheduleConfig):
    warmup_steps: int = 25000  # updates to reach scale; no decay before their end
    scale: float = 1.0         # the value after the warmup (train.lr for the learning rate)
    cooldown: float = 0.0      # the run's last share over which the value falls linearly to final_factor (0: none)
    final_factor: float = 0.0  # the share of scale left at the end of a cooldown
    # the validation metric watched (any registered name, asr.training.metrics), how many validations
    # without a relative improvement above the threshold make a plateau, what each plateau multiplies
    # the value by, and the lowest share of scale it may reach
    plateau_metric: str = "valid_loss"
    plateau_patience: int = 1
    plateau_threshold: float = 0.0
    decay_factor: float = 0.5
    min_factor: float = 0.01
    shape: Literal["plateau"] = "plateau"

    def __post_init__(self) -> None:
        _check_options(self)
        check_plateau_options(self)
        from asr.training.metrics import check_metric_name  # torch: imported once a plateau is read

        try:
            check_metric_name(self.plateau_metric, "plateau_metric")
        except ConfigError as err:  # a ValueError, which asr.config.from_dict prefixes with the section
            raise ValueError(str(err)) from None

    def extremes(self) -> tuple[float, float]:
        return _extremes(self, 0.0)


class Plateau(LinearWarmup):
    """A linear warmup, then a value multiplied by ``decay_factor`` each time ``plateau_metric`` has failed
    to improve by more than ``plateau_threshold`` (relative) for ``plateau_patience`` validations in a row,
    down to ``min_factor``. Its state (the decays so far, the best value, the validations without
    improvement) is saved with the run."""

    def __init__(self, config: PlateauConfig, run: RunPlan):
        super().__init__(config, run)
        self.config = config
        self._higher_is_better = run.higher_is_better or (lambda name: False)
        self.decays = 0
        self.best: float | None = None
        self.without_improvement = 0

    def decay(self) -> float:
        config = self.config
        return max(config.decay_factor**self.decays, config.min_factor) if self.decays else 1.0

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        config = self.config
        if config.plateau_metric not in metrics:
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

        return (f"x{config.decay_factor} (now {self.value(step):.3g}): {config.plateau_metric} "
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


@dataclass
class VShapeConfig(ScheduleConfig):
    scale: float = 1.0                # the value at the first update and again at the run's last (the peak)
    warmup_steps: int | None = None   # the update where it reaches 0 (None: the learning rate's warmup)
    shape: Literal["vshape"] = "vshape"

    def __post_init__(self) -> None:
        _check_options(self)

    def extremes(self) -> tuple[float, float]:
        return _extremes(self, 0.0)


class VShape(Scaled):
    def __init__(self, config: VShapeConfig, run: RunPlan):
        super().__init__(config, run)
        if run.total_updates is None:
            raise ValueError("the vshape shape needs the run's planned number of updates")
        self.warmup_steps = run.warmup_steps if config.warmup_steps is None else config.warmup_steps
        self.total_updates = run.total_updates

    def factor(self, step: int) -> float:
        warmup = self.warmup_steps
        if step < warmup:
            return 1.0 - step / warmup
        return min(1.0, (step - warmup) / max(self.total_updates - warmup, 1))


# ---------------------------------------------------------------------------- the run's share, the cooldown


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


register_shape("points", PointsConfig, Points)
register_shape("noam", NoamConfig, Noam)
register_shape("inverse_sqrt", InverseSqrtConfig, InverseSqrt)
register_shape("linear_warmup", LinearWarmupConfig, LinearWarmup)
register_shape("cosine", CosineConfig, Cosine)
register_shape("constant", ConstantConfig, Constant)
register_shape("plateau", PlateauConfig, Plateau)
register_shape("vshape", VShapeConfig, VShape)


def scaled_shapes() -> list[str]:
    """The shapes with a ``scale`` (which a caller's peak sets): those a model's default schedule may name."""
    return [name for name in shape_names() if "scale" in {f.name for f in fields(shape_config_class(name))}]


def check_scaled_shape(name: object, key: str, advice: str = "") -> None:
    """Refuse, in one line naming ``key``, a shape name that is no shape with a scale, or one whose options
    have no defaults to run at (``advice``: where to give it with its options instead)."""
    shapes = scaled_shapes()
    if name not in shapes:
        raise ConfigError(f"{key}: {name!r} is not one of {', '.join(shapes)} (the schedule shapes with a scale)")
    try:
        shape_config_class(name)()
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{key}: the {name!r} shape does not run at its default options ({err})"
                          + (f"; {advice}" if advice else "")) from None
