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
recipe's ``exp_dir``, or in the current folder for folders). The corpus itself
is never written to. Exit status: 0 when nothing would be skipped, 1 when
something would, 2 for a usage error, a folder or manifest that is missing or
lists no utterance (named, as training and evaluation name it), or, with
``data.strict=true``, the first problem, named.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.check", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "sources", nargs="+",
        help="a recipe YAML with key=value overrides, or LibriSpeech-layout folders, Kaldi data directories, lhotse manifests",
    )
    parser.add_argument("--jobs", type=int, default=2, help="worker processes decoding audio (0 = in this process)")
    parser.add_argument("--out", type=Path, help="where to write the JSON report")
    args = parser.parse_args(argv)
    if args.jobs < 0:
        parser.error(f"--jobs must be >= 0, got {args.jobs}")
    # imported once the arguments are parsed: --help needs none of it (torch and the data readers)
    from asr.config import ConfigError
    from asr.data.corpus import check_demo_prepared
    from asr.data.demo import prepare_command
    from asr.data.report import DataError
    from asr.data.validation import check_folders, check_splits
    from asr.experiment import load_experiment_config

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    first = Path(args.sources[0])
    try:
        if first.suffix in (".yaml", ".yml"):
            config = load_experiment_config(args.sources[0], args.sources[1:])
            check_demo_prepared(config.data, prepare_command(args.sources[0], args.sources[1:]))
            reports = check_splits(config.data, config.features, args.jobs)
            out = args.out or Path(config.exp_dir) / "data_check.json"
        else:
            reports = check_folders(args.sources, args.jobs)
            out = args.out or Path("data_check.json")
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    total = sum(len(r) for r in reports.values())
    for name, report in reports.items():
        print(f"{name}: {report.summary()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({name: report.as_dict() for name, report in reports.items()}, indent=2) + "\n")
    print(f"{total} utterance(s) would be skipped; report in {out}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
