"""Check a corpus before a long run: read every file once, as training would, and report what would be skipped.

    python -m asr.check recipes/librispeech100.yaml data.root=/data     # every split of a recipe
    python -m asr.check /data/LibriSpeech/dev-clean /data/LibriSpeech/test-other   # LibriSpeech-layout folders
    python -m asr.check data/kaldi/dev data/manifests/timit_supervisions_DEV.jsonl.gz # Kaldi dir, lhotse manifest

Each split of a recipe (or each folder or manifest, read in the form its path
shows, :mod:`asr.data.sources`, with the default features) is read, filtered and decoded in full exactly as
training would do it; :mod:`asr.data.validation` says what that checks.

Decoding runs in ``--jobs`` worker processes with a progress bar. The report
(counts by reason and every message, which names the file and line) is
printed and written as JSON to ``--out`` (default: ``data_check.json`` in the
recipe's ``exp_dir``; for folders and manifests, in ``exp/check_<their names>``,
e.g. ``exp/check_dev-clean+test-other/data_check.json``), with what was checked
(``checked``) and the command. A report of another check there (other folders, another recipe
or overrides) is refused before anything is read, unless ``--overwrite``; the same
check again replaces its own. The corpus itself
is never written to. Exit status: 0 when nothing would be skipped, 1 when
something would, 2 for a usage error, a folder or manifest that is missing or
lists no utterance, a file that is not data (named, as training and evaluation name it), or, with
``data.strict=true``, the first problem, named, each one line ``error: ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from asr.cli.errors import one_line
from asr.cli.outputs import add_overwrite_argument, refusal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.check", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "sources", nargs="+",
        help="a recipe YAML with key=value overrides, or LibriSpeech-layout folders, Kaldi data directories, lhotse manifests",
    )
    parser.add_argument("--jobs", type=int, default=2, help="worker processes decoding audio (0 = in this process)")
    parser.add_argument("--out", type=Path, help="where to write the JSON report (default: data_check.json in the "
                        "recipe's exp_dir, or in exp/check_<folder names> for folders and manifests)")
    add_overwrite_argument(parser, "the report of another check")
    args = parser.parse_args(argv)
    if args.jobs < 0:
        return error(f"--jobs must be >= 0, got {args.jobs}")
    # imported once the arguments are parsed: --help needs none of it (torch and the data readers)
    from asr.config import ConfigError
    from asr.data.corpus import check_demo_prepared
    from asr.data.demo import prepare_command
    from asr.data.report import DataError
    from asr.data.validation import check_folders, check_splits
    from asr.experiment import load_experiment_config
    from asr.writing import WriteError, atomic_write

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    first = Path(args.sources[0])
    recipe = first.suffix in (".yaml", ".yml")
    if recipe:
        checked = {"recipe": os.path.abspath(first), "overrides": args.sources[1:]}
    else:
        checked = {"sources": [os.path.abspath(source) for source in args.sources]}
    try:
        if recipe:
            config = load_experiment_config(args.sources[0], args.sources[1:])
            out = args.out or Path(config.exp_dir) / "data_check.json"
            if not args.overwrite and (clash := clash_with(out, checked)):
                return error(refusal(out, f"the report of another check ({clash})", out_given=args.out is not None))
            check_demo_prepared(config.data, prepare_command(args.sources[0], args.sources[1:]))
            reports = check_splits(config.data, config.features, args.jobs)
        else:
            out = args.out or default_out(args.sources)
            if not args.overwrite and (clash := clash_with(out, checked)):
                return error(refusal(out, f"the report of another check ({clash})", out_given=args.out is not None))
            reports = check_folders(args.sources, args.jobs)
    except (ConfigError, DataError) as err:
        return error(err)
    total = sum(len(r) for r in reports.values())
    for name, report in reports.items():
        print(f"{name}: {report.summary()}")
    record = {"checked": checked, "command": ["python", "-m", "asr.check", *(sys.argv[1:] if argv is None else argv)],
              "reports": {name: report.as_dict() for name, report in reports.items()}}
    try:
        atomic_write(out, json.dumps(record, indent=2) + "\n")
    except WriteError as err:  # a full disk, a denied write: one line naming the file, no partial file
        return error(err)
    print(f"{total} utterance(s) would be skipped; report in {out}")
    return 1 if total else 0


def default_out(sources: list[str]) -> Path:
    """``exp/check_<names>/data_check.json``: the folders' or manifests' names joined by ``+``."""
    names = [Path(os.path.abspath(s)).name.removesuffix(".gz").removesuffix(".jsonl") for s in sources]
    return Path("exp") / f"check_{'+'.join(dict.fromkeys(names))}" / "data_check.json"


def error(message: object) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return 2


def clash_with(out: Path, checked: dict) -> str | None:
    """Why ``out`` holds the report of another check (one of something other than ``checked``, or a file
    that is not a check's report), or None: it does not exist, or it holds this one's, which a new run replaces."""
    if not out.exists():
        return None
    try:
        previous = json.loads(out.read_text()).get("checked")
    except (OSError, ValueError, AttributeError) as err:
        previous, why = None, f"it cannot be read as a check's report: {err}"
    else:
        why = "it is not the report of a check with what was checked recorded" if previous is None else (
            f"it checked {json.dumps(previous)}, here {json.dumps(checked)}")
    if previous == checked:
        return None
    return why


if __name__ == "__main__":
    sys.exit(main())
