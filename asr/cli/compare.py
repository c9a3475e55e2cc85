"""Draw the learning curves of several runs over each other, and tabulate them.

    python -m asr.compare exp/las_ln exp/las_noln --tag valid/loss --out ln_vs_noln.png
    python -m asr.compare exp/pre exp/post --tag valid/wer --tag train/loss --labels pre-norm post-norm
    python -m asr.compare exp/las_ln exp/las_noln --diagnose --out why.png     # a LAS's convergence diagnostics

Reads the TensorBoard event files the trainer writes (every
``events.out.tfevents.*`` under each experiment folder, at any depth), plots
one line per run for each ``--tag`` (one panel per tag) into ``--out`` and
prints a markdown table of each run's final and best value, which is also
written next to the image (``FILE.md``). The image's title and the table say
which config keys differ between the runs, from each folder's ``config.yaml``.
A run that lacks a tag is left out of that panel with a warning (on stderr and
in the table), and a tag no run has is left out; only when nothing is left to
draw is it an error.

Every curve is drawn against the optimizer step, the axis the trainer logs
every scalar on (``epoch`` is a tag of its own); runs of older versions, which
logged validation per epoch, are put on it too (:mod:`asr.studies.curves`). A run
that was resumed logs some steps twice; for each step the value written last
counts, so the curve is the one the resumed run actually followed.

``--diagnose`` draws, instead of ``--tag`` panels, a LAS's convergence diagnostics
(:mod:`asr.studies.diagnosis`: the CTC head's CER, the attention's Spearman and share at the
end, the speller's loss with and without its context, the gradient norms per stack)
and prints a table of where each run aligned; ``--settings`` colours runs of one
setting (e.g. seeds) alike.

The table's file ends with a comment that records what was compared (the folders and the tags, or
``--diagnose``). An image or table at ``--out`` that another comparison wrote (or that does not say what it
compares) is refused before anything is read, unless ``--overwrite`` (:mod:`asr.cli.outputs`); the
same comparison again (labels, smoothing and zoom aside) replaces its own, so a comparison of runs
still training is drawn again by the same command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from asr.cli.errors import fail, one_line, what_file
from asr.cli.outputs import add_overwrite_argument, refuse_to_replace
from asr.studies.curves import CompareError, differing_settings, gather_curves, markdown_table, plot, settings_lines


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
    parser.add_argument(
        "--diagnose", action="store_true",
        help="draw a LAS's convergence diagnostics instead of --tag panels (asr.studies.diagnosis; default --out diagnosis.png)",
    )
    parser.add_argument(
        "--settings", nargs="+", default=None, metavar="NAME",
        help="with --diagnose: one setting per EXP_DIR; runs of one setting (e.g. its seeds) share a colour",
    )
    add_overwrite_argument(parser, "another comparison's image or table")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    tags = args.tags or ["valid/loss"]
    if args.labels is not None and len(args.labels) != len(args.exp_dirs):
        fail(f"--labels: got {len(args.labels)} labels for {len(args.exp_dirs)} experiment folders")
    if not 0.0 <= args.smooth < 1.0:
        fail(f"--smooth must be in [0, 1), got {args.smooth}")
    for folder in args.exp_dirs:
        if folder.is_file():
            fail(f"{folder} is {what_file(folder)}, not an experiment folder (asr.train's exp_dir)")
    labels = args.labels or _default_labels(args.exp_dirs)
    if args.settings is not None and (not args.diagnose or len(args.settings) != len(args.exp_dirs)):
        fail(f"--settings: give one per experiment folder ({len(args.exp_dirs)}), with --diagnose")
    if args.diagnose:
        out = args.out or Path("diagnosis.png")
        compared = comparison(args.exp_dirs, None)
    else:
        out = args.out or Path("compare_" + "_".join(t.replace("/", "_") for t in tags) + ".png")
        compared = comparison(args.exp_dirs, tags)
    if out.suffix.lower() != ".png":
        fail(f"--out must name a .png file, got {out}")
    if not args.overwrite and (clash := clash_with(out, compared)):
        refuse_to_replace(out, clash, out_given=args.out is not None, metavar="FILE.png")
    if args.diagnose:
        return diagnose(args.exp_dirs, labels, args.settings or labels, out, compared)
    try:
        curves, missing = gather_curves(args.exp_dirs, labels, tags)
    except CompareError as err:
        fail(err)
    for line in missing:
        print(f"warning: {line}; left out of that panel", file=sys.stderr)
    if not curves:
        fail(f"no run has any of the tags {', '.join(tags)}: " + "; ".join(missing))
    settings = settings_lines(*differing_settings(args.exp_dirs, labels), len(labels))
    table = markdown_table(curves, settings)
    if missing:
        table += "\nNot drawn:\n\n" + "".join(f"- {line}\n" for line in missing)
    plot(curves, out, args.smooth, args.zoom, settings)
    table_path = write_table(out, table, compared)
    sys.stdout.write(table)
    print(f"wrote {out} and {table_path}")
    return 0


# The table file's last line: what was compared, for the next asr.compare into the same --out.
RECORD_START, RECORD_END = "<!-- asr.compare: ", " -->"


def comparison(exp_dirs: list[Path], tags: list[str] | None) -> dict:
    """What a comparison compares (its record): the folders, and the tags or ``"diagnose"``."""
    return {"runs": [os.path.abspath(d) for d in exp_dirs], "tags": tags if tags is not None else "diagnose"}


def write_table(out: Path, table: str, compared: dict) -> Path:
    """The table beside the image (``out`` as .md), with the record of what was compared as its last line."""
    from asr.writing import WriteError, atomic_write

    path = out.with_suffix(".md")
    try:
        atomic_write(path, f"{table}\n{RECORD_START}{json.dumps(compared)}{RECORD_END}\n")
    except WriteError as err:
        fail(err)
    return path


def clash_with(out: Path, compared: dict) -> str | None:
    """What the image ``out`` or its table holds when another comparison than ``compared`` wrote them (or
    they do not say what they compare), or None: neither exists, or this same comparison wrote them."""
    table = out.with_suffix(".md")
    if not table.exists():
        return f"an image, without the table {table} to say what it compares" if out.exists() else None
    try:
        last = table.read_text(encoding="utf-8").rstrip("\n").rsplit("\n", 1)[-1]
        if not (last.startswith(RECORD_START) and last.endswith(RECORD_END)):
            raise ValueError("no record")
        previous = json.loads(last.removeprefix(RECORD_START).removesuffix(RECORD_END))
    except (OSError, UnicodeDecodeError, ValueError):
        return f"a table ({table}) that does not say what it compares"
    if previous == compared:
        return None
    differ = [f"{key} {json.dumps(previous.get(key))}, here {json.dumps(value)}"
              for key, value in compared.items() if previous.get(key) != value]
    return f"another comparison ({table.name} records {'; '.join(differ)})"


def diagnose(exp_dirs: list[Path], labels: list[str], settings: list[str], out: Path, compared: dict) -> int:
    """``--diagnose``: the diagnosis figure into ``out`` and its table beside it (``out`` as .md) and on stdout."""
    from asr.studies.diagnosis import diagnosis_figure, diagnosis_table, read_diagnosed

    try:
        runs = [read_diagnosed(d, label, setting) for d, label, setting in zip(exp_dirs, labels, settings)]
    except CompareError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    diagnosis_figure(runs, out)
    table = diagnosis_table(runs) + "\n"
    table_path = write_table(out, table, compared)
    sys.stdout.write(table)
    print(f"wrote {out} and {table_path}")
    return 0


def _default_labels(exp_dirs: list[Path]) -> list[str]:
    names = [p.resolve().name for p in exp_dirs]
    # Folder names are the natural labels unless two runs share one (exp/a/run1, exp/b/run1).
    return names if len(set(names)) == len(names) else [str(p) for p in exp_dirs]


if __name__ == "__main__":
    sys.exit(main())
