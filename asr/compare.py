"""Draw the learning curves of several runs over each other, and tabulate them.

    python -m asr.compare exp/las_ln exp/las_noln --tag valid/loss --out ln_vs_noln.png
    python -m asr.compare exp/pre exp/post --tag valid/wer --tag train/loss --labels pre-norm post-norm

Reads the TensorBoard event files the trainer writes (every
``events.out.tfevents.*`` under each experiment folder, at any depth), plots
one line per run for each ``--tag`` (one panel per tag) into ``--out`` and
prints a markdown table of each run's final and best value, which is also
written next to the image (``FILE.md``).

The trainer logs ``train/*`` tags per optimizer step and ``valid/*`` tags per
epoch, which is what the x axis says. A run that was resumed logs some steps
twice; for each step the value written last counts, so the curve is the one
the resumed run actually followed.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

EVENT_GLOB = "events.out.tfevents.*"
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


def step_meaning(tag: str) -> str:
    """The x-axis label: what the trainer uses as the step of this tag."""
    if tag.startswith("train/"):
        return "optimizer step"
    if tag.startswith("valid/"):
        return "epoch"
    return "step"


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


def load_curves(exp_dirs: list[Path], labels: list[str], tags: list[str]) -> dict[str, list[Curve]]:
    """tag -> one :class:`Curve` per run (in the order given). A missing tag names the run and its tags."""
    curves: dict[str, list[Curve]] = {tag: [] for tag in tags}
    for exp_dir, label in zip(exp_dirs, labels):
        scalars = read_scalars(exp_dir)
        for tag in tags:
            if not scalars.get(tag):
                have = ", ".join(sorted(scalars)) or "none"
                raise CompareError(f"run {label} ({exp_dir}) has no scalar tag '{tag}'; its tags are: {have}")
            curves[tag].append(curve_from_events(label, tag, scalars[tag]))
    return curves


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def markdown_table(curves: dict[str, list[Curve]]) -> str:
    """One table per tag: run, points, final value (and its step), best value (and its step)."""
    sections = []
    for tag, runs in curves.items():
        unit = step_meaning(tag)
        direction = better_direction(tag)
        best_header = f"best ({direction})" if direction else "best"
        lines = [
            f"### {tag}",
            "",
            f"| run | points | final | final at {unit} | {best_header} | best at {unit} |",
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


def plot(curves: dict[str, list[Curve]], out: Path, smoothing: float = 0.0, zoom: bool = False) -> None:
    """One panel per tag, one line per run; written as a PNG to ``out``.

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
        ax.set_xlabel(step_meaning(tag))
        ax.set_ylabel(tag)
        notes = ([f"smoothed {smoothing:g}"] if smoothing > 0 else []) + (["y axis fits points 2+"] if zoomed else [])
        ax.set_title(tag + (f" ({', '.join(notes)})" if notes else ""))
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("exp_dirs", nargs="+", type=Path, metavar="EXP_DIR", help="experiment folders to compare")
    parser.add_argument(
        "--tag", action="append", dest="tags", metavar="TAG",
        help="scalar tag to plot (repeat for several panels; default valid/loss)",
    )
    parser.add_argument("--out", type=Path, default=None, metavar="FILE.png", help="image to write (default compare_<tag>.png)")
    parser.add_argument("--labels", nargs="+", default=None, help="one legend label per EXP_DIR (default: folder names)")
    parser.add_argument("--smooth", type=float, default=0.0, help="EMA weight in [0, 1) for the plotted lines only (default 0)")
    parser.add_argument("--zoom", action="store_true", help="fit the y axis to every curve's points after its first")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    tags = args.tags or ["valid/loss"]
    if args.labels is not None and len(args.labels) != len(args.exp_dirs):
        parser.error(f"--labels: got {len(args.labels)} labels for {len(args.exp_dirs)} experiment folders")
    if not 0.0 <= args.smooth < 1.0:
        parser.error(f"--smooth must be in [0, 1), got {args.smooth}")
    labels = args.labels or _default_labels(args.exp_dirs)
    out = args.out or Path("compare_" + "_".join(t.replace("/", "_") for t in tags) + ".png")
    if out.suffix.lower() != ".png":
        parser.error(f"--out must name a .png file, got {out}")
    try:
        curves = load_curves(args.exp_dirs, labels, tags)
    except CompareError as err:
        parser.error(str(err))
    table = markdown_table(curves)
    plot(curves, out, args.smooth, args.zoom)
    table_path = out.with_suffix(".md")
    table_path.write_text(table)
    sys.stdout.write(table)
    print(f"wrote {out} and {table_path}")
    return 0


def _default_labels(exp_dirs: list[Path]) -> list[str]:
    names = [p.resolve().name for p in exp_dirs]
    # Folder names are the natural labels unless two runs share one (exp/a/run1, exp/b/run1).
    return names if len(set(names)) == len(names) else [str(p) for p in exp_dirs]


if __name__ == "__main__":
    sys.exit(main())
