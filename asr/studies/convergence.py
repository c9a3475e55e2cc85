"""How fast a run converged, read from its validation curves, and the mean ± std of that over seeds.

The trainer validates once per epoch (and every ``train.valid_every_steps``
updates) and logs ``valid/loss``, ``valid/wer``, ``valid/minutes`` (wall-clock
minutes of the run so far) and ``epoch`` (epochs done) at the optimizer step
it has reached (:mod:`asr.training.reporting`; runs
of the older layout are put on the same axis by :func:`asr.studies.curves.run_curves`).
From those, per run (:func:`measure`):

- **steps to target**: the optimizer steps (and minutes, and epochs) at the
  first validation whose loss is at most ``--target-loss`` (WER at most
  ``--target-wer``; any other validation metric at least or at most a value,
  as that metric improves: ``--target-metric valid_attention_spearman=0.9``);
  None when no validation got there ("not reached"). The true crossing lies
  somewhere since the validation before: the resolution is one epoch, or
  ``train.valid_every_steps`` updates where a run validates inside its epochs.
- **area under the validation-loss curve**: the trapezoid rule over optimizer
  steps from the first validation to the last, in loss x 1000 steps. Lower is
  better; it rewards getting low early, and compares runs with the same budget.
- **late fall**: how much the best validation loss so far fell over the last quarter of
  the run's optimizer steps, per 1000 steps. Near 0, the run has reached its plateau;
  well above 0, it was still learning when it stopped, and a longer run would do better.
  The best-so-far curve, not the raw one, so a noisy last validation cannot fake a plateau
  or a fall.
- best and final validation loss and WER (in percent, as the trainer logs it).

Over seeds (:func:`mean_std`, :func:`summarise_reached`): the mean and the
sample standard deviation (n - 1) of each measure; for steps to target, over
the seeds that reached it, with how many did. Runs from before the optimizer
steps were logged at all have epochs but no steps or minutes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from asr.studies.curves import EPOCH_AXIS, EPOCH_TAG, CompareError, run_curves


@dataclass(frozen=True)
class MetricTarget:
    """A value of a validation metric (as logged: shares in percent) to reach: at least ``value`` when
    higher is better, else at most."""

    name: str                # e.g. valid_attention_spearman, logged as valid/attention_spearman
    value: float
    higher_is_better: bool

    @property
    def label(self) -> str:
        return f"{self.name} {'>=' if self.higher_is_better else '<='} {self.value:g}"

    def met(self, value: float) -> bool:
        """Whether ``value`` gets there (NaN never does)."""
        return value >= self.value if self.higher_is_better else value <= self.value


@dataclass(frozen=True)
class Targets:
    """What counts as converged: a validation loss, a validation WER in percent and values of other
    validation metrics, each optional."""

    loss: float | None = None
    wer_percent: float | None = None
    metrics: tuple[MetricTarget, ...] = ()


@dataclass
class RunCurves:
    """One run's validation points, in order: one per epoch, and any inside an epoch (every
    ``train.valid_every_steps`` updates, or where ``train.max_steps`` stopped the run), whose epochs done
    are a fraction."""

    epochs: list[float]
    loss: list[float]
    wer: list[float] | None = None  # in percent
    steps: list[int] | None = None
    minutes: list[float] | None = None
    # other validation metrics by name, at the loss's points (NaN where one was not logged: a LAS's attention
    # measures during a CTC-only phase, say)
    metrics: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Reached:
    """Where a curve first got to its target: the epochs done (1 = after the first), and the optimizer
    steps and minutes at that validation when they were logged."""

    epoch: float
    step: int | None = None
    minutes: float | None = None


@dataclass(frozen=True)
class Convergence:
    epochs: float                     # epochs done at the last validation
    steps: int | None
    best_loss: float
    best_loss_epoch: float
    final_loss: float
    best_wer_percent: float | None
    final_wer_percent: float | None
    auc: float | None                 # area under valid/loss over optimizer steps, loss x 1000 steps
    loss_target: Reached | None       # None: not reached (or no target)
    wer_target: Reached | None
    late_fall: float | None = None    # best valid/loss fall over the last quarter of the steps, per 1k steps
    metric_targets: dict[str, Reached | None] = field(default_factory=dict)  # by MetricTarget.label


def metric_tag(name: str) -> str:
    """The TensorBoard tag a validation metric is logged under: ``valid_batchnorm_gap`` -> ``valid/batchnorm_gap``."""
    return "valid/" + name.removeprefix("valid_")


def read_run_curves(exp_dir: Path, label: str, curves: dict | None = None, metrics: tuple[str, ...] = ()) -> RunCurves:
    """The validation curves of the run in ``exp_dir`` (from ``curves``, its :func:`run_curves`, when the
    caller has read them already), with those of the validation metrics named in ``metrics``; ``valid/loss``
    must exist, the rest may not."""
    curves = run_curves(exp_dir, label) if curves is None else curves
    loss = curves.get("valid/loss")
    if loss is None:
        raise CompareError(f"run {label} ({exp_dir}) has no valid/loss curve")

    def aligned(tag: str) -> list[float] | None:
        """The tag's values at loss's points, or None when it is missing at any of them."""
        curve = curves.get(tag)
        if curve is None or curve.axis != loss.axis:
            return None
        at = dict(zip(curve.steps, curve.values))
        return [at[x] for x in loss.steps] if all(x in at for x in loss.steps) else None

    def partly(tag: str) -> list[float]:
        """The tag's values at loss's points, NaN where it has none."""
        curve = curves.get(tag)
        at = dict(zip(curve.steps, curve.values)) if curve is not None and curve.axis == loss.axis else {}
        return [at.get(x, math.nan) for x in loss.steps]

    found = {name: partly(metric_tag(name)) for name in metrics}
    if loss.axis == EPOCH_AXIS:  # a run from before the optimizer steps were logged
        return RunCurves(loss.steps, loss.values, aligned("valid/wer"), None, aligned("valid/minutes"), found)
    epochs = aligned(EPOCH_TAG) or [float(i) for i in range(1, len(loss.steps) + 1)]
    return RunCurves([int(e) if float(e).is_integer() else e for e in epochs], loss.values, aligned("valid/wer"),
                     loss.steps, aligned("valid/minutes"), found)


def up_to_step(curves: RunCurves, step: int, label: str) -> RunCurves | None:
    """``curves`` cut after the last validation at or before optimizer step ``step``: the run as it stood
    then. None when no validation came that early. A run whose validations are on the epoch axis only (one
    from before the optimizer steps were logged) cannot be cut by steps: :class:`CompareError`."""
    if curves.steps is None:
        raise CompareError(f"run {label} logged its validations by epoch only, without optimizer steps; "
                           "it cannot be read up to a step")
    keep = sum(1 for s in curves.steps if s <= step)  # the steps ascend

    def cut(values: list | None) -> list | None:
        return None if values is None else values[:keep]

    if keep == 0:
        return None
    return RunCurves(curves.epochs[:keep], curves.loss[:keep], cut(curves.wer), curves.steps[:keep],
                     cut(curves.minutes), {name: values[:keep] for name, values in curves.metrics.items()})


def first_reached(values: list[float], target: float) -> int | None:
    """Index of the first value at most ``target`` (NaN never is), or None."""
    return next((i for i, v in enumerate(values) if v <= target), None)


def area_under(xs: list[float], ys: list[float]) -> float:
    """Trapezoid rule over the points (xs ascending); 0 for fewer than two points, NaN if any y is."""
    return sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]))


def late_fall(steps: list[int], loss: list[float], share: float = 0.25) -> float | None:
    """How much the best loss so far fell over the last ``share`` of the steps, per 1000 steps:
    from the last validation at or before ``share`` of the run's span from its end, to the end.
    None with fewer than 4 validations or no finite loss before that point."""
    if len(steps) < 4:
        return None
    start = steps[-1] - share * (steps[-1] - steps[0])
    index = max(i for i, s in enumerate(steps) if s <= start)
    before = [v for v in loss[: index + 1] if math.isfinite(v)]
    if not before or steps[-1] == steps[index]:
        return None
    best_before, best_at_end = min(before), min(v for v in loss if math.isfinite(v))
    return (best_before - best_at_end) / ((steps[-1] - steps[index]) / 1000)


def _reached(curves: RunCurves, values: list[float] | None, target: float | MetricTarget | None) -> Reached | None:
    if target is None or values is None:
        index = None
    elif isinstance(target, MetricTarget):
        index = next((i for i, v in enumerate(values) if target.met(v)), None)
    else:
        index = first_reached(values, target)
    if index is None:
        return None
    step = curves.steps[index] if curves.steps else None
    minutes = curves.minutes[index] if curves.minutes else None
    return Reached(curves.epochs[index], step, minutes)


def measure(curves: RunCurves, targets: Targets) -> Convergence:
    """The convergence measures of one run (see the module docstring)."""
    finite = [(v, e) for v, e in zip(curves.loss, curves.epochs) if math.isfinite(v)]
    best_loss, best_epoch = min(finite, key=lambda ve: (ve[0], ve[1])) if finite else (math.nan, 0)
    # One validation has no area: None, not 0, so that it does not read as the best possible curve.
    auc = area_under([s / 1000 for s in curves.steps], curves.loss) if curves.steps and len(curves.steps) > 1 else None
    return Convergence(
        epochs=curves.epochs[-1],
        steps=curves.steps[-1] if curves.steps else None,
        best_loss=best_loss,
        best_loss_epoch=best_epoch,
        final_loss=curves.loss[-1],
        best_wer_percent=min(curves.wer) if curves.wer else None,
        final_wer_percent=curves.wer[-1] if curves.wer else None,
        auc=auc,
        loss_target=_reached(curves, curves.loss, targets.loss),
        wer_target=_reached(curves, curves.wer, targets.wer_percent),
        late_fall=late_fall(curves.steps, curves.loss) if curves.steps else None,
        metric_targets={t.label: _reached(curves, curves.metrics.get(t.name), t) for t in targets.metrics},
    )


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    if not values:
        raise ValueError("mean_std of no values")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def format_mean_std(values: list[float | None], digits: int = 4, scale: float = 1.0) -> str:
    """``"1.234 ± 0.056"`` (``digits`` significant), the value alone for one run, "n/a" for none;
    values that are None (not measured) are left out."""
    present = [v * scale for v in values if v is not None]
    if not present:
        return "n/a"
    mean, std = mean_std(present)
    return _significant(mean, digits) + ("" if std is None else f" ± {_significant(std, 2)}")


def _significant(value: float, digits: int) -> str:
    """``value`` rounded to ``digits`` significant digits, without an exponent below 1e6: 141 -> "140"."""
    return f"{float(f'{value:.{digits}g}'):g}"


def summarise_reached(reached: list[Reached | None], field: str) -> str:
    """Steps (``field="step"``), minutes or epochs to a target over seeds: the mean ± std of the
    runs that reached it and how many did, e.g. ``"1200 ± 85 (3/3)"``, ``"not reached (0/3)"``."""
    hits = [getattr(r, field) for r in reached if r is not None]
    count = f"({len(hits)}/{len(reached)})"
    if not hits:
        return f"not reached {count}"
    if any(h is None for h in hits):
        return f"n/a {count}"  # reached, but this run did not log steps or minutes
    # Steps and epochs as whole numbers (917, not 916.7); minutes to 3 significant digits.
    digits = 3 if field == "minutes" else max(len(str(round(abs(h)))) for h in hits)
    return f"{format_mean_std(hits, digits)} {count}"


def aggregate(measures: list[Convergence]) -> dict:
    """Numbers behind a seed table row: per measure its mean, sample std (None for one run) and
    count; per target, the same of the steps and minutes of the runs that reached it."""
    summary: dict = {"runs": len(measures)}
    for name in ("auc", "late_fall", "best_loss", "final_loss", "best_wer_percent", "final_wer_percent", "epochs", "steps"):
        values = [getattr(m, name) for m in measures if getattr(m, name) is not None]
        mean, std = mean_std(values) if values else (None, None)
        summary[name] = {"mean": mean, "std": std, "n": len(values)}
    for target in ("loss_target", "wer_target"):
        summary[target] = _aggregate_reached([getattr(m, target) for m in measures])
    labels = list(dict.fromkeys(label for m in measures for label in m.metric_targets))
    if labels:
        summary["metric_targets"] = {label: _aggregate_reached([m.metric_targets.get(label) for m in measures])
                                     for label in labels}
    return summary


def _aggregate_reached(reached: list[Reached | None]) -> dict:
    hits = [r for r in reached if r is not None]
    entry: dict = {"reached": len(hits)}
    for name in ("step", "minutes", "epoch"):
        values = [getattr(h, name) for h in hits if getattr(h, name) is not None]
        entry[name] = dict(zip(("mean", "std"), mean_std(values))) if values else None
    return entry


if __name__ == "__main__":  # a library module: say which command uses it rather than exit in silence
    from asr.console import not_a_command

    not_a_command("asr.studies.convergence", "asr.study")
