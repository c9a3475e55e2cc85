"""Check a corpus before a long run: read every file once, as training would, and report what would be skipped.

For a recipe, each split (train, dev, test) is read as training reads it
(:func:`asr.data.corpus.load_split`), its utterances are filtered as training
filters them (:func:`asr.data.dataset.prepare_utterances`: empty transcripts,
characters the tokenizer trained on the training transcripts does not know,
durations outside ``data.min_duration``/``data.max_duration`` for the training
split), and then every remaining utterance's audio is decoded in full and
turned into features: what the scan of file headers cannot find (a FLAC cut
in the middle, NaN samples, audio shorter than one frame) shows up here. A
folder (LibriSpeech layout or Kaldi data directory) or lhotse manifest is read
with :func:`asr.data.sources.read_source` and the default features.
The corpus itself is never written to. ``python -m asr.check``
(:mod:`asr.cli.check`) is the command line.
"""

from __future__ import annotations

import logging
from pathlib import Path

from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from asr.data import report as reasons
from asr.data.corpus import build_tokenizer, load_split
from asr.data.dataset import audio_skip, prepare_utterances, utterance_features
from asr.data.report import Skip, SkipReport
from asr.data.sources import read_source
from asr.data.config import DataConfig
from asr.data.utterance import SPLITS, Utterance
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


def check_splits(data: DataConfig, features: FeatureConfig, jobs: int) -> dict[str, SkipReport]:
    """Every split of a recipe's ``data`` section: what training would skip, by split."""
    pipeline = FeaturePipeline(features)
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
    """Data folders or manifests (:func:`asr.data.sources.read_source`), each with the default features and no tokenizer."""
    pipeline = FeaturePipeline(FeatureConfig())
    reports: dict[str, SkipReport] = {}
    for folder in folders:
        report = SkipReport()
        utterances = read_source(folder, report)
        usable = [u for u in utterances if u.text]
        for utt in utterances:
            if not utt.text:
                report.skip(reasons.EMPTY_TRANSCRIPT, f"{utt.source} (utterance {utt.id}): empty transcript")
        decode_all(usable, pipeline, report, jobs, Path(folder).name)
        reports[folder] = report
    return reports
