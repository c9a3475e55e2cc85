"""Schedules: everything that moves while a run trains, each a shape (:mod:`asr.training.shapes`).

Every scheduled value is a :class:`~asr.training.shapes.Shape`, asked once per optimiser update for its
value given the number of updates already made (``step``: 0 for the first), told the validation metrics
at the end of each epoch (a rate that decays on a plateau listens), and saved into ``last.pt`` with the
run, as a PyTorch LR scheduler is. The trainer holds them in one :class:`ScheduleSet` and never names a
quantity itself: a new thing that changes during training is a new schedule target, and a new way for it
to change is a new shape, not a new branch in the loop.

Targets, each set in the recipe (``train.schedules.<name>``), with what drives them:

=======================  =========================================================================
``lr``                   the optimiser's learning rate: ``train.scheduler``'s shape (``kind``, any shape
                         with a scale) with ``train.lr`` as its scale and the shape's options beside
                         ``kind`` (:class:`SchedulerConfig`; its ``plateau`` kind observes validation)
``ctc_weight``           the CTC share of the loss (a model target; the model needs its CTC head,
                         so ``model.ctc_weight`` must be above 0)
``label_smoothing``      of the attention loss (model target)
``sampling_probability`` LAS's scheduled sampling (model target)
``attention_prior``      LAS: the strength of a soft diagonal prior on the attention energies in
                         teacher forcing (model target; wav2letter's SoftPretrainWindow)
``listener_layers``      LAS: how many listener layers run, the rest bypassed (model target; rounded
                         to a whole layer, at most ``model.listener.num_layers``; Zeyer et al. 2018)
``drophead_encoder``,    the Transformer's DropHead rate in each stack (model targets): by default
``drophead_decoder``     ``model.drophead_schedule``'s shape scaled by the stack's ``drophead``
``spec_augment``         the share of training utterances SpecAugment masks (data target; 1 = all,
                         what ``features.spec_augment.enabled`` alone gives)
``max_duration``         the longest training utterance, in seconds, a batch may hold (data target):
                         batches with a longer one are left out of the epoch (a length curriculum)
=======================  =========================================================================

A schedule in the recipe names its shape and that shape's options; without ``shape`` it is a list of
``[update, value]`` points::

    train:
      schedules:
        ctc_weight: {points: [[0, 0.5], [4000, 0.5], [6000, 0.3]], interpolation: linear}
        spec_augment: {points: [[0, 0], [2000, 1]]}    # off, then on from update 2000
        max_duration: {points: [[0, 8], [1500, 1e9]]}  # utterances of at most 8 s until update 1500
        label_smoothing: {shape: cosine, scale: 0.1}   # from 0.1 down to 0 at the run's last update

Before the first point the value is the first point's, after the last the last's; between two
points it holds the earlier one (``interpolation: hold``, the default) or moves linearly
(``linear``). Model targets without a schedule keep the model config's value (but for a model's own
defaults, DropHead's); ``spec_augment`` is 1 and ``max_duration`` unbounded.

Data targets are evaluated where a batch is planned, not where it is trained (:mod:`asr.training.plan`):
an epoch's batches are planned when it starts, each with the update it is expected to serve, so that
its worker can prepare it ahead of time and a resumed run plans the same batches again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Callable, ClassVar

from asr.config import ConfigError, from_dict
from asr.training.hooks import Hook, Validated
from asr.training.shapes import (
    PointsConfig,
    RunPlan,
    ScheduleConfig,
    Shape,
    build_shape,
    run_spent,
    shape_config_class,
    shape_names,
)

# A shape in a file of its own registers itself (register_shape at its end) when imported here, one line each.

logger = logging.getLogger("asr.train")

MODEL_TARGETS = ("ctc_weight", "label_smoothing", "sampling_probability", "attention_prior", "listener_layers",
                 "drophead_encoder", "drophead_decoder")
DATA_TARGETS = ("spec_augment", "max_duration")
TARGETS = MODEL_TARGETS + DATA_TARGETS

# The values a target may take: (low, high, whether high itself is allowed).
_RANGES = {
    "ctc_weight": (0.0, 1.0, True),  # 1.0: a CTC-only phase (the decoder idle); the last value must be below
    "label_smoothing": (0.0, 1.0, False),
    "sampling_probability": (0.0, 1.0, True),
    "attention_prior": (0.0, math.inf, False),
    "listener_layers": (1.0, math.inf, False),
    "drophead_encoder": (0.0, 1.0, False),
    "drophead_decoder": (0.0, 1.0, False),
    "spec_augment": (0.0, 1.0, True),
    "max_duration": (0.0, math.inf, True),
}

# How the log names a target whose shape changes course (a plateau): "learning rate x0.5 (now ...)"
_LOG_NAMES = {"lr": "learning rate"}


@dataclass
class SchedulerConfig:
    """``train.scheduler``: how the learning rate moves over the updates, a shape of
    :mod:`asr.training.shapes` (``kind``) whose scale is ``train.lr``, with that shape's options beside it::

        scheduler: {kind: plateau, warmup_steps: 200, plateau_metric: valid_ctc_cer, cooldown: 0.2}

    Reading one (:func:`asr.config.from_dict`, or ``SchedulerConfig(kind=..., **options)``) gives an
    instance of the class :func:`learning_rate_options` derives from the shape's options: its keys are
    ``kind`` and the shape's own, less ``shape`` and ``scale``, and the shape's checks refuse their values.
    So every shape of the registry that has a scale is a kind, one registered from outside included, and a
    key the kind does not take is an error naming it (but for what older runs wrote: :meth:`config_data`)."""

    # how the rate moves over the updates: any shape of asr.training.shapes with a scale (noam, inverse_sqrt,
    # linear_warmup, cosine, constant, plateau, vshape, or one registered from outside), train.lr its scale
    kind: str = "noam"

    def __new__(cls, *args, **kwargs):
        if cls is SchedulerConfig:  # the options of the kind named: SchedulerConfig(kind="cosine", ...)
            cls = learning_rate_options(args[0] if args else kwargs.get("kind", SchedulerConfig.kind))
        return super().__new__(cls)

    def __reduce__(self):
        # a derived class is not a module attribute pickle could name: rebuild it from the kind and options
        return _scheduler_config, ({f.name: getattr(self, f.name) for f in fields(self)},)

    @classmethod
    def config_variant(cls, data: dict, path: str) -> type:
        """The options class ``data`` is read as (:func:`asr.config.from_dict` asks): its ``kind``'s."""
        if cls is not SchedulerConfig:
            return cls
        return learning_rate_options(data.get("kind", SchedulerConfig.kind), path)

    @classmethod
    def config_data(cls, data: dict, path: str) -> dict:
        """``data`` as this kind reads it (:func:`asr.config.from_dict` asks): a key it does not take is an
        error naming the key and the kind, unless it is null (how an override removes a recipe's key when it
        switches ``kind``) or, for a kind of the versions before the kinds were shapes, one of the keys every
        kind had then. Their runs wrote all of those keys into config.yaml, and a variant may switch ``kind``
        by one override and leave the recipe's plateau settings behind (recipes/variants/rehearsal_las_*.yaml):
        those versions ignored such keys, so they are left out, but for a cooldown other than 0, which they
        refused on a kind without one."""
        own = {f.name for f in fields(cls)}
        kept = {}
        for key, value in data.items():
            if key in own:
                kept[key] = value
            elif value is None or (cls.kind in _EARLIER_KINDS and key in _EARLIER_KEYS
                                   and not (key == "cooldown" and value)):
                continue
            else:
                cooling = ", ".join(k for k in learning_rate_kinds() if "cooldown" in _field_names(shape_config_class(k)))
                why = f"; the kinds with a cooldown: {cooling}" if key == "cooldown" else ""
                raise ConfigError(f"unknown config key '{f'{path}.{key}' if path else key}' for the learning-rate "
                                  f"kind {cls.kind!r} (its keys: {', '.join(sorted(own))}){why}")
        return kept


# The single train.scheduler of earlier versions: its kinds, and the keys each of them had.
_EARLIER_KINDS = ("noam", "inverse_sqrt", "linear_warmup", "cosine", "constant", "plateau")
_EARLIER_KEYS = ("warmup_steps", "final_factor", "cooldown", "plateau_metric", "plateau_patience",
                 "plateau_threshold", "decay_factor", "min_factor")

# The options class of each shape as the learning rate reads it, by the shape's options class.
_LEARNING_RATE_OPTIONS: dict[type, type] = {}


def _field_names(config_class: type) -> set[str]:
    return {f.name for f in fields(config_class)}


def _scheduler_config(options: dict) -> SchedulerConfig:
    return SchedulerConfig(**options)


def learning_rate_kinds() -> list[str]:
    """The shapes ``train.scheduler.kind`` may name: those with a ``scale``, which ``train.lr`` sets."""
    return [name for name in shape_names() if "scale" in _field_names(shape_config_class(name))]


def learning_rate_options(kind: object, path: str = "") -> type[SchedulerConfig]:
    """The class ``train.scheduler`` of ``kind`` is read as, derived from the shape's options class
    (``options``): a subclass of it and of :class:`SchedulerConfig` whose fields are ``kind`` and the
    shape's own, where ``shape`` is the kind and ``scale`` is not a key (class attributes: the shape's own
    checks see them, ``train.lr`` is applied by :func:`learning_rate_shape`). ``--show-config`` finds each
    key's comment in the shape's class."""
    kinds = learning_rate_kinds()
    if kind not in kinds:
        raise ConfigError(f"{f'{path}.kind' if path else 'kind'}: {kind!r} is not one of {', '.join(kinds)} "
                          "(the schedule shapes with a scale, which train.lr sets)")
    options = shape_config_class(kind)
    derived = _LEARNING_RATE_OPTIONS.get(options)
    if derived is None:
        if "kind" in _field_names(options):
            raise ValueError(f"{options.__name__} has a field 'kind', the key train.scheduler names its shape by")
        name = options.__name__.removesuffix("Config") + "LearningRate"
        derived = make_dataclass(
            name,
            [("kind", str, field(default=kind)), ("shape", ClassVar[str], kind), ("scale", ClassVar[float], 1.0)],
            # the options' class first: kind, then its keys, in config.yaml and --show-config
            bases=(options, SchedulerConfig),
            namespace={"__module__": __name__,
                       "__doc__": f"``train.scheduler`` of kind {kind!r}: {options.__name__} less shape and scale."},
        )
        _LEARNING_RATE_OPTIONS[options] = derived
    return derived


def warmup_updates(config: SchedulerConfig) -> int:
    """The updates over which ``config`` warms the learning rate up: its ``warmup_steps`` (0 for a kind
    without one, ``constant``, or one that leaves it unset)."""
    return getattr(config, "warmup_steps", None) or 0


def learning_rate_shape(config: SchedulerConfig, lr: float) -> ScheduleConfig:
    """``train.scheduler`` as the options of its shape, scaled by ``train.lr``."""
    options = shape_config_class(config.kind, "train.scheduler")
    return options(scale=lr, **{f.name: getattr(config, f.name) for f in fields(config) if f.name != "kind"})


def learning_rate(lr: float, config: SchedulerConfig, run: RunPlan | None = None) -> Shape:
    """The learning rate of ``train.lr`` and ``train.scheduler`` in ``run``."""
    return build_shape(learning_rate_shape(config, lr), run)


def build_scheduler(optimizer, config: SchedulerConfig, d_model: int | None = None,
                    total_updates: int | None = None):
    """A ``LambdaLR`` of ``train.scheduler``'s shape at scale 1 (with its cooldown over ``total_updates``),
    for loops of their own such as tests; the trainer asks :func:`run_schedules` instead, which also
    knows the run's clock and the validations."""
    from torch.optim.lr_scheduler import LambdaLR  # torch only here: reading a recipe needs none

    return LambdaLR(optimizer, learning_rate(1.0, config, RunPlan(total_updates=total_updates, d_model=d_model)).value)


def check_schedule_target(name: str) -> None:
    """Refuse a ``train.schedules`` entry that names no target."""
    if name not in TARGETS:
        raise ConfigError(f"train.schedules.{name}: no such schedule target (known: {', '.join(TARGETS)})")


def check_schedule_values(name: str, config: ScheduleConfig) -> None:
    """Refuse values outside ``name``'s range, naming ``train.schedules.<name>``: each point's, or the
    extremes a shape says it reaches."""
    check_schedule_target(name)
    low, high, high_allowed = _RANGES[name]
    bracket = "]" if high_allowed else ")"

    def within(value: float) -> bool:
        return low <= value < high or (high_allowed and value == high)

    if isinstance(config, PointsConfig):
        for update, value in config.points:
            if not within(value):
                raise ConfigError(
                    f"train.schedules.{name}: value {value} at update {update} is outside [{low}, {high}{bracket}"
                )
        if name == "ctc_weight" and config.points[-1][1] >= 1.0:
            raise ConfigError(
                f"train.schedules.ctc_weight: the last value is {config.points[-1][1]}: a weight of 1.0 leaves the "
                "attention decoder idle (a CTC-only phase), so the schedule must end below it"
            )
        return
    extremes = config.extremes()
    if extremes is not None and not all(within(value) for value in extremes):
        raise ConfigError(f"train.schedules.{name}: the {config.shape} shape goes from {extremes[0]} to "
                          f"{extremes[1]}, outside [{low}, {high}{bracket}")


@dataclass
class ScheduleSet:
    """The run's schedules by target name, and where each value goes.

    ``model``: the model whose targets are set (an object with ``set_scheduled(name, value)``);
    ``optimizer``: whose param groups get ``lr``. Values are set in :meth:`apply`, once per update.
    """

    schedules: dict[str, Shape]
    model: object = None
    optimizer: object = None
    model_targets: tuple[str, ...] = ()

    def apply(self, step: int) -> dict[str, float]:
        """Set every schedule's value for the update after ``step`` completed ones; returns them by name."""
        values = {}
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
        lines = []
        for name, schedule in self.schedules.items():
            line = schedule.observe(step, metrics)
            if line is not None:
                lines.append(f"{_LOG_NAMES.get(name, name)} {line}")
        return lines

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


class WatchedSchedules(Hook):
    """The schedules that watch the validations (the plateau rule, a bootstrap of the rehearsal recipes):
    after each finished epoch's validation this hook hands its metrics to the run's schedule set, which
    moves the rate from the next update on. It keeps nothing of its own: what the rule remembers (its best,
    its patience left, its factor) is the schedule set's state, saved in every checkpoint after this event,
    so a resumed run goes on as one run straight does. Validations inside an epoch are not watched."""

    def on_validation(self, trainer, validated: Validated) -> None:
        if validated.at_epoch_end:
            for line in trainer.schedules.observe(validated.step, validated.metrics):
                logger.info(line)


def model_default_schedules(model) -> dict[str, ScheduleConfig]:
    """The schedules a model's own config asks for (``model.default_schedules()``, plain data as in
    ``train.schedules``: the Transformer's ``model.drophead_schedule``), read as shapes."""
    if not hasattr(model, "default_schedules"):
        return {}
    return {name: from_dict(ScheduleConfig, data, f"model's {name} schedule")
            for name, data in model.default_schedules().items()}


def build_schedules(configs: dict[str, ScheduleConfig], lr: Shape | None, model, optimizer,
                    run: RunPlan | None = None) -> ScheduleSet:
    """The run's :class:`ScheduleSet`: ``lr``, one schedule per ``train.schedules`` entry, and the
    model's own defaults (:func:`model_default_schedules`) for the targets the recipe leaves alone.

    Model targets must be ones the model offers (``model.scheduled()``, name -> the config's value);
    those it offers without a schedule are held at that value.
    """
    offered = dict(model.scheduled()) if hasattr(model, "scheduled") else {}
    schedules: dict[str, Shape] = {} if lr is None else {"lr": lr}
    for name, config in {**model_default_schedules(model), **configs}.items():
        check_schedule_values(name, config)
        if name in MODEL_TARGETS and name not in offered:
            known = ", ".join(offered) or "none"
            raise ConfigError(
                f"train.schedules.{name}: the model ({type(model).__name__}) has no '{name}' to schedule "
                f"(it offers: {known})"
            )
        schedules[name] = build_shape(config, run)
    return ScheduleSet(schedules, model=model, optimizer=optimizer,
                       model_targets=tuple(n for n in schedules if n in offered))


def run_schedules(train, model, optimizer, total_updates: int, d_model: int | None = None,
                  higher_is_better: Callable[[str], bool] | None = None,
                  minutes: Callable[[], float] | None = None) -> ScheduleSet:
    """A run's schedules from its ``train:`` section: the learning rate (``train.lr``,
    ``train.scheduler``), each of ``train.schedules`` and the model's own (DropHead's), in a run of
    ``total_updates`` planned updates whose model is ``d_model`` wide. ``minutes()``: the run's clock
    (minutes of training and validation so far), for a cooldown that ``train.max_minutes`` ends."""
    run = RunPlan(total_updates=total_updates, d_model=d_model, warmup_steps=warmup_updates(train.scheduler),
                  spent=run_spent(total_updates, train.max_minutes, minutes), higher_is_better=higher_is_better)
    return build_schedules(train.schedules, learning_rate(train.lr, train.scheduler, run), model, optimizer, run)
