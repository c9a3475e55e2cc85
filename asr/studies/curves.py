"""Learning curves read from TensorBoard event files: load, tabulate and plot them.

The trainer logs every scalar, ``train/*`` and ``valid/*`` alike, against the
optimizer step, the epochs done as the scalar ``epoch``, and WER, CER and the
other shares in percent (:mod:`asr.training.reporting`). Event files of the
older layout, which have no ``epoch`` scalar, logged ``valid/*`` at x = the
epoch's number with the optimizer steps as ``valid/step``, and the shares as
fractions: :func:`run_curves` puts those on the step axis and in percent too
(and makes their ``epoch`` curve), so old and new runs compare on one axis in
one unit. Only a run older still, without ``valid/step``, keeps its validation
on the epoch axis, and its curves say so (:attr:`Curve.axis`).

A run that was resumed logs some steps twice; for each step the value
written last counts, so the curve is the one the resumed run actually
followed. ``python -m asr.compare`` (:mod:`asr.cli.compare`) is the command line.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

EVENT_GLOB = "events.out.tfevents.*"
EPOCH_TAG = "epoch"  # the epochs done, at the optimizer step; its absence marks the older layout
STEP_AXIS, EPOCH_AXIS = "optimizer step", "epoch"
# The older layout's tags logged at x = the epoch's number (with the optimizer steps in valid/step),
# and those of them it logged as fractions (today's layout: percent).
_OLD_PER_EPOCH = ("valid/", "train/skipped_utterances")
_OLD_FRACTIONS = ("valid/wer", "valid/cer", "valid/ctc_cer", "valid/attention_at_end")
# The trainer's tags in percent: its metrics that are shares (asr.training.metrics, ``percent``).
PERCENT_TAGS = _OLD_FRACTIONS


def tag_label(tag: str) -> str:
    """A tag as an axis or column names it, with its unit: ``valid/wer (%)``."""
    return f"{tag} (%)" if tag in PERCENT_TAGS else tag
LOWER_IS_BETTER = ("loss", "wer", "cer", "ppl", "perplexity", "error")
HIGHER_IS_BETTER = ("acc", "accuracy", "bleu")


class CompareError(ValueError):
    """A run folder or tag that cannot be compared; the message names the run."""


@dataclass
class Curve:
    """One tag of one run: steps ascending, each step once."""

    run: str
    tag: str
    steps: list[int]
    values: list[float]
    axis: str = STEP_AXIS  # what ``steps`` count: optimizer steps, or (a very old run's validation) epochs

    @property
    def final(self) -> float:
        return self.values[-1]

    def best(self) -> tuple[float, int] | None:
        """(best value, its step), or None when the tag has no better direction (e.g. a learning rate)."""
        direction = better_direction(self.tag)
        if direction is None:
            return None
        finite = [(v, s) for v, s in zip(self.values, self.steps) if math.isfinite(v)]
        if not finite:
            return None
        pick = min if direction == "min" else max
        # Ties go to the earliest step: the point where the run first got there.
        return pick(finite, key=lambda vs: (vs[0] if direction == "min" else -vs[0], vs[1]))


def better_direction(tag: str) -> str | None:
    """``"min"`` for losses and error rates, ``"max"`` for accuracies, None otherwise."""
    name = tag.rsplit("/", 1)[-1].lower()
    if any(word in name for word in LOWER_IS_BETTER):
        return "min"
    if any(word in name for word in HIGHER_IS_BETTER):
        return "max"
    return None


def read_scalars(exp_dir: str | Path) -> dict[str, list[tuple[float, int, float]]]:
    """All scalar tags under ``exp_dir``: tag -> [(wall_time, step, value), ...].

    Every folder holding event files is read with TensorBoard's
    ``EventAccumulator`` (which itself drops the events a restart orphaned).
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        raise CompareError(f"experiment folder not found: {exp_dir}")
    folders = sorted({p.parent for p in exp_dir.rglob(EVENT_GLOB) if p.is_file()})
    if not folders:
        raise CompareError(f"no TensorBoard event files ({EVENT_GLOB}) under {exp_dir}")
    # Its directory watcher logs each event file it moves to at INFO, under a command's own INFO logging.
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    scalars: dict[str, list[tuple[float, int, float]]] = {}
    for folder in folders:
        # size_guidance 0 keeps every point; the default samples long curves down to 10,000.
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.wall_time, e.step, e.value) for e in acc.Scalars(tag))
    return scalars


def curve_from_events(run: str, tag: str, events: list[tuple[float, int, float]]) -> Curve:
    """Sort by step; when a step was logged more than once, the latest write wins."""
    by_step: dict[int, float] = {}
    for _, step, value in sorted(events, key=lambda e: e[0]):
        by_step[step] = value
    steps = sorted(by_step)
    return Curve(run, tag, steps, [by_step[s] for s in steps])


def run_curves(exp_dir: str | Path, label: str) -> dict[str, Curve]:
    """Every scalar tag of the run in ``exp_dir`` as a :class:`Curve`, on the optimizer-step axis
    whichever layout wrote it (see the module docstring)."""
    curves = {tag: curve_from_events(label, tag, events) for tag, events in read_scalars(exp_dir).items() if events}
    return curves if EPOCH_TAG in curves else _from_epoch_axis(curves, label)


def _from_epoch_axis(curves: dict[str, Curve], label: str) -> dict[str, Curve]:
    """The older layout: its per-epoch tags moved to the optimizer steps that ``valid/step`` gives
    for each epoch (without ``valid/step`` they stay on the epoch axis), its fractions put in
    percent, and the ``epoch`` curve made from ``valid/step``."""
    step_of: dict[int, int] = {}
    if "valid/step" in curves:
        step_of = {epoch: round(step) for epoch, step in zip(curves["valid/step"].steps, curves["valid/step"].values)}
    moved = {}
    for tag, curve in curves.items():
        if tag in _OLD_FRACTIONS:
            curve = Curve(label, tag, curve.steps, [100 * v for v in curve.values])
        if not tag.startswith(_OLD_PER_EPOCH):
            moved[tag] = curve
        elif step_of and all(epoch in step_of for epoch in curve.steps):
            by_step = {step_of[epoch]: value for epoch, value in zip(curve.steps, curve.values)}  # a later epoch wins
            moved[tag] = Curve(label, tag, sorted(by_step), [by_step[s] for s in sorted(by_step)])
        else:
            moved[tag] = Curve(label, tag, curve.steps, curve.values, EPOCH_AXIS)
    if step_of:
        epochs = {step: float(epoch) for epoch, step in sorted(step_of.items())}
        moved[EPOCH_TAG] = Curve(label, EPOCH_TAG, sorted(epochs), [epochs[s] for s in sorted(epochs)])
    return moved


def gather_curves(exp_dirs: list[Path], labels: list[str], tags: list[str]) -> tuple[dict[str, list[Curve]], list[str]]:
    """tag -> the :class:`Curve` of every run that has it (in the order given), and one line per tag a
    run lacks, naming the run and the tags it has. A tag no run has is left out."""
    curves: dict[str, list[Curve]] = {tag: [] for tag in tags}
    missing = []
    for exp_dir, label in zip(exp_dirs, labels):
        found = run_curves(exp_dir, label)
        for tag in tags:
            if tag in found:
                curves[tag].append(found[tag])
            else:
                have = ", ".join(sorted(found)) or "none"
                missing.append(f"run {label} ({exp_dir}) has no scalar tag '{tag}'; its tags are: {have}")
    return {tag: runs for tag, runs in curves.items() if runs}, missing


def load_curves(exp_dirs: list[Path], labels: list[str], tags: list[str]) -> dict[str, list[Curve]]:
    """tag -> one :class:`Curve` per run (in the order given). A missing tag names the run and its tags."""
    curves, missing = gather_curves(exp_dirs, labels, tags)
    if missing:
        raise CompareError(missing[0])
    return curves


def run_settings(exp_dir: str | Path) -> dict | None:
    """The run's resolved config (its ``config.yaml``) as dotted keys, without its folder (``exp_dir``)
    and the ``runtime`` record; None when the folder has no readable ``config.yaml``."""
    import yaml

    from asr.config import flatten

    try:
        config = yaml.safe_load((Path(exp_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(config, dict):
        return None
    config.pop("history", None)  # the run's resumes (a list): a record, not a setting
    return {key: value for key, value in flatten(config).items() if key != "exp_dir" and not key.startswith("runtime.")}


def differing_settings(exp_dirs: list[Path], labels: list[str]) -> tuple[dict[str, dict[str, object]], list[str]]:
    """What tells the runs apart: key -> {run label: value} for every config key whose value is not the
    same in all runs (a key a run lacks counts as differing), and the labels of the runs without a
    ``config.yaml``, whose settings are unknown."""
    settings = {label: run_settings(exp_dir) for exp_dir, label in zip(exp_dirs, labels)}
    known = {label: found for label, found in settings.items() if found is not None}
    keys = sorted({key for found in known.values() for key in found})
    missing = object()
    differing = {}
    for key in keys:
        values = {label: found.get(key, missing) for label, found in known.items()}
        if len({repr(v) for v in values.values()}) > 1:
            differing[key] = {label: ("(not set)" if v is missing else v) for label, v in values.items()}
    return differing, [label for label, found in settings.items() if found is None]


# The longest value a settings line shows whole: a list of hundreds of voices would fill the screen and the
# plot's title; its beginning and length tell the runs apart as well, and config.yaml has it all.
LONGEST_VALUE = 60


def short_value(value: object, limit: int = LONGEST_VALUE) -> str:
    """``value`` as text, cut to ``limit`` characters with its length said when longer."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def settings_lines(differing: dict[str, dict[str, object]], unknown: list[str], runs: int) -> list[str]:
    """The differing settings as lines for a title and a report: ``model.layer_norm: both (ln), none (no-ln)``;
    a value longer than :data:`LONGEST_VALUE` characters is cut (:func:`short_value`)."""
    lines = [f"{key}: " + ", ".join(f"{short_value(value)} ({label})" for label, value in values.items())
             for key, values in differing.items()]
    if not lines and runs - len(unknown) > 1:
        lines.append("the runs' configs are the same (apart from exp_dir)")
    if unknown:
        lines.append(f"settings unknown (no config.yaml): {', '.join(unknown)}")
    return lines


def axis_label(runs: list[Curve]) -> str:
    """The x-axis of a panel: what its curves' steps count (the runs on each, should they differ)."""
    axes = {c.axis for c in runs}
    if len(axes) == 1:
        return axes.pop()
    return "; ".join(f"{axis}: {', '.join(c.run for c in runs if c.axis == axis)}" for axis in sorted(axes))


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def markdown_table(curves: dict[str, list[Curve]], settings: list[str] | None = None) -> str:
    """One table per tag: run, points, final value (and its step), best value (and its step); under a
    list of the ``settings`` that differ between the runs (:func:`settings_lines`), when given."""
    sections = []
    if settings:
        sections.append("Runs differ in:\n\n" + "\n".join(f"- {line}" for line in settings))
    for tag, runs in curves.items():
        unit = axis_label(runs)
        direction = better_direction(tag)
        percent = " %" if tag in PERCENT_TAGS else ""
        best_header = f"best{percent} ({direction})" if direction else f"best{percent}"
        lines = [
            f"### {tag}",
            "",
            f"| run | points | final{percent} | final at {unit} | {best_header} | best at {unit} |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for c in runs:
            best = c.best()
            best_cells = f"{_fmt(best[0])} | {best[1]}" if best else "n/a | n/a"
            lines.append(f"| {c.run} | {len(c.steps)} | {_fmt(c.final)} | {c.steps[-1]} | {best_cells} |")
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's exponential moving average, debiased so the first points are not pulled to 0."""
    if weight <= 0:
        return list(values)
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = weight * last + (1 - weight) * v
        norm = weight * norm + (1 - weight)
        out.append(last / norm)
    return out


def zoom_limits(runs: list[Curve], smoothing: float = 0.0) -> tuple[float, float] | None:
    """y-axis limits that fit every curve's finite (smoothed) points after its first, plus a 5% margin.

    None when no curve has a second finite point.
    """
    rest = [v for c in runs for v in smooth(c.values, smoothing)[1:] if math.isfinite(v)]
    if not rest:
        return None
    low, high = min(rest), max(rest)
    margin = 0.05 * (high - low) or 0.05 * abs(high) or 0.1
    return low - margin, high + margin


# Lines of differing settings a figure's title shows; the rest are counted (the .md lists them all).
TITLE_LINES = 4


def plot(curves: dict[str, list[Curve]], out: Path, smoothing: float = 0.0, zoom: bool = False,
         settings: list[str] | None = None) -> None:
    """One panel per tag, one line per run; written as a PNG to ``out``, titled with the ``settings``
    that differ between the runs (:func:`settings_lines`), when given.

    zoom: fit the y axis to the points after each curve's first, which (for a
          loss after one epoch) is often so much higher that it flattens
          every difference that matters; the title says when this is done.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display needed; must precede pyplot
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(curves), 1, figsize=(7, 3.6 * len(curves)), squeeze=False)
    for ax, (tag, runs) in zip(axes[:, 0], curves.items()):
        for c in runs:
            marker = "o" if len(c.steps) <= 50 else None  # per-epoch curves are short: show the points
            ax.plot(c.steps, smooth(c.values, smoothing), label=c.run, marker=marker, markersize=3)
        limits = zoom_limits(runs, smoothing) if zoom else None
        zoomed = limits is not None
        if zoomed:
            ax.set_ylim(*limits)
        ax.set_xlabel(axis_label(runs))
        ax.set_ylabel(tag_label(tag))
        notes = ([f"smoothed {smoothing:g}"] if smoothing > 0 else []) + (["y axis fits points 2+"] if zoomed else [])
        ax.set_title(tag + (f" ({', '.join(notes)})" if notes else ""))
        ax.grid(True, alpha=0.3)
    _legends(fig, axes[:, 0])
    if settings:
        shown = settings[:TITLE_LINES] + ([f"... and {len(settings) - TITLE_LINES} more"] if len(settings) > TITLE_LINES else [])
        fig.suptitle("\n".join(shown), fontsize="small")
    _write(fig, out)


@dataclass
class Band:
    """The mean curve of several runs of one setting and a band around it, point by point.

    Points are aligned by index (the i-th validation of every run) and cut to
    the shortest run; ``x`` is the mean of the runs' x at each point.
    ``low``/``high`` are mean -/+ one sample standard deviation (``spread="std"``,
    the mean alone for one run) or the minimum and maximum (``"minmax"``).
    """

    label: str
    x: list[float]
    mean: list[float]
    low: list[float]
    high: list[float]
    runs: int
    cut: bool  # some run had more points than the shortest


def band(label: str, xs: list[list[float]], ys: list[list[float]], spread: str = "std") -> Band:
    """The :class:`Band` of runs given as x and y lists (one pair per run)."""
    if spread not in ("std", "minmax"):
        raise ValueError(f"spread must be 'std' or 'minmax', got {spread!r}")
    if not ys or len(xs) != len(ys):
        raise ValueError(f"band {label!r}: need one x list per y list, got {len(xs)} and {len(ys)}")
    length = min(len(y) for y in ys)
    means, lows, highs, x = [], [], [], []
    for i in range(length):
        column = [y[i] for y in ys]
        mean = sum(column) / len(column)
        if spread == "minmax":
            low, high = min(column), max(column)
        else:
            std = math.sqrt(sum((v - mean) ** 2 for v in column) / (len(column) - 1)) if len(column) > 1 else 0.0
            low, high = mean - std, mean + std
        x.append(sum(xx[i] for xx in xs) / len(xs))
        means.append(mean)
        lows.append(low)
        highs.append(high)
    return Band(label, x, means, lows, highs, len(ys), any(len(y) > length for y in ys))


def plot_bands(panels: dict[str, list[Band]], out: Path, xlabel: str, spread: str = "std", zoom: bool = False) -> None:
    """One panel per tag, one mean line and shaded band per setting; written as a PNG to ``out``.

    zoom: fit the y axis to the band points after the first (as :func:`plot`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    what = "±1 std" if spread == "std" else "min-max"
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 3.6 * len(panels)), squeeze=False)
    for ax, (tag, bands) in zip(axes[:, 0], panels.items()):
        for b in bands:
            line = ax.plot(b.x, b.mean, marker="o", markersize=3, label=f"{b.label} (n={b.runs})")[0]
            ax.fill_between(b.x, b.low, b.high, color=line.get_color(), alpha=0.2, linewidth=0)
        points = [v for b in bands for v in b.low[1:] + b.high[1:] if math.isfinite(v)]
        if zoom and points:
            low, high = min(points), max(points)
            margin = 0.05 * (high - low) or 0.1
            ax.set_ylim(low - margin, high + margin)
        cut = " (cut to the shortest run)" if any(b.cut for b in bands) else ""
        ax.set_title(f"{tag}: mean over seeds, band {what}{cut}" + (", y axis fits points 2+" if zoom and points else ""))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(tag_label(tag))
        ax.grid(True, alpha=0.3)
    _legends(fig, axes[:, 0])
    _write(fig, out)


# More lines than this and a legend inside a panel hides the curves: one legend goes below the figure.
MAX_LEGEND_INSIDE = 4


def _legends(fig, axes) -> None:
    """A legend in each panel; or, when the panels plot the same lines in the same order (so the
    same colours) and have more than :data:`MAX_LEGEND_INSIDE` of them, one legend below all."""
    handles, labels = axes[0].get_legend_handles_labels()
    shared = all(ax.get_legend_handles_labels()[1] == labels for ax in axes)
    if not shared or len(labels) <= MAX_LEGEND_INSIDE:
        for ax in axes:
            ax.legend()
        return
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.0, 0.0), fontsize="small", frameon=False)


def _write(fig, out: Path) -> None:
    """Lay out ``fig``, write it to ``out`` (creating its folder) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()  # lays out the panels only; a figure legend keeps its place below them
    out.parent.mkdir(parents=True, exist_ok=True)
    # "tight" grows the image to hold a legend placed below the panels.
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":  # a library module: say which command draws curves rather than exit in silence
    from asr.console import not_a_command

    not_a_command("asr.studies.curves", "asr.compare")
