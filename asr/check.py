"""Check a corpus before a long run: read every file once, as training would, and report what would be skipped.

    python -m asr.check recipes/librispeech100.yaml data.root=/data     # every split of a recipe
    python -m asr.check /data/LibriSpeech/dev-clean /data/LibriSpeech/test-other   # LibriSpeech-layout folders

For a recipe, each split (train, dev, test) is read as training reads it
(:func:`asr.data.corpus.load_split`), its utterances are filtered as training
filters them (:func:`asr.data.dataset.prepare_utterances`: empty transcripts,
characters the tokenizer trained on the training transcripts does not know,
durations outside ``data.min_duration``/``data.max_duration`` for the training
split), and then every remaining utterance's audio is decoded in full and
turned into features: what the scan of file headers cannot find (a FLAC cut
in the middle, NaN samples, audio shorter than one frame) shows up here. A
folder is read as a LibriSpeech-layout subset with the default features.

Decoding runs in ``--jobs`` worker processes with a progress bar. The report
(counts by reason and every message, which names the file and line) is
printed and written as JSON to ``--out`` (default: ``data_check.json`` in the
recipe's ``exp_dir``, or in the current folder for folders). The corpus itself
is never written to. Exit status: 0 when nothing would be skipped, 1 when
something would, 2 for a usage error (or, with ``data.strict=true``, the first
problem, named).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from asr.config import ConfigError
from asr.data import report as reasons
from asr.data.config import SPLITS
from asr.data.corpus import build_tokenizer, load_split
from asr.data.dataset import audio_skip, prepare_utterances, utterance_features
from asr.data.librispeech import read_subset
from asr.data.report import DataError, Skip, SkipReport
from asr.data.utterance import Utterance
from asr.experiment import load_experiment_config
from features.audio import AudioError
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline


class _Decode(Dataset):
    """Item i: None when utterance i's audio decodes into finite features, else its :class:`Skip`."""

    def __init__(self, utterances: list[Utterance], pipeline: FeaturePipeline):
        self.utterances = utterances
        self.pipeline = pipeline

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, index: int) -> Skip | None:
        try:
            utterance_features(self.utterances[index], self.pipeline, raw=True)
        except AudioError as err:
            return audio_skip(err)
        return None


def decode_all(
    utterances: list[Utterance], pipeline: FeaturePipeline, report: SkipReport, jobs: int, name: str
) -> list[Utterance]:
    """The utterances whose audio decodes into finite features; the others go into ``report``."""
    loader = DataLoader(_Decode(utterances, pipeline), batch_size=None, num_workers=jobs)
    readable = []
    for utt, skip in zip(utterances, tqdm(loader, total=len(utterances), desc=f"decoding {name}", disable=None)):
        if skip is None:
            readable.append(utt)
        else:
            report.add(skip)
    return readable


def check_recipe(recipe: str, overrides: list[str], jobs: int) -> dict[str, SkipReport]:
    """Every split of ``recipe``: what training would skip, by split."""
    config = load_experiment_config(recipe, overrides)
    data = config.data
    pipeline = FeaturePipeline(config.features)
    reports: dict[str, SkipReport] = {}
    tokenizer = None
    for split in SPLITS:
        report = SkipReport(strict=data.strict)
        utterances, _ = load_split(data, split, report)
        if not utterances:
            continue
        if split == "train":
            # Trained on the training transcripts, as training does, so other splits' unknown characters show.
            tokenizer = build_tokenizer(data, [u.text for u in utterances if u.text])
        kept, _ = prepare_utterances(utterances, data, tokenizer, report, limit_duration=split == "train", name=split)
        readable = decode_all(kept, pipeline, report, jobs, split)
        logging.getLogger("asr.check").info("%s: %d of %d utterances usable", split, len(readable), len(utterances))
        reports[split] = report
    return reports


def check_folders(folders: list[str], jobs: int) -> dict[str, SkipReport]:
    """LibriSpeech-layout subset folders, each with the default features and no tokenizer."""
    pipeline = FeaturePipeline(FeatureConfig())
    reports: dict[str, SkipReport] = {}
    for folder in folders:
        report = SkipReport()
        utterances = read_subset(folder, report)
        usable = [u for u in utterances if u.text]
        for utt in utterances:
            if not utt.text:
                report.skip(reasons.EMPTY_TRANSCRIPT, f"{utt.source} (utterance {utt.id}): empty transcript")
        decode_all(usable, pipeline, report, jobs, Path(folder).name)
        reports[folder] = report
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", help="a recipe YAML with key=value overrides, or LibriSpeech-layout folders")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes decoding audio (0 = in this process)")
    parser.add_argument("--out", type=Path, help="where to write the JSON report")
    args = parser.parse_args(argv)
    if args.jobs < 0:
        parser.error(f"--jobs must be >= 0, got {args.jobs}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    first = Path(args.sources[0])
    try:
        if first.suffix in (".yaml", ".yml"):
            reports = check_recipe(args.sources[0], args.sources[1:], args.jobs)
            out = args.out or Path(load_experiment_config(args.sources[0], args.sources[1:]).exp_dir) / "data_check.json"
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
