"""Which reader a data path is for, decided from the path alone, in one place.

Every entry point that takes data (a recipe's ``data.train``/``dev``/``test``,
``asr.evaluate --data``, ``asr.check``, ``asr.study``) reads it with
:func:`read_source`. The rule:

- a folder holding ``wav.scp`` and ``text``: a Kaldi data directory (:mod:`asr.data.kaldi`);
- a ``*.jsonl`` or ``*.jsonl.gz`` file: a lhotse manifest, a CutSet or either
  file of a recordings/supervisions pair (:mod:`asr.data.manifests`);
- anything else: a LibriSpeech-layout subset folder (:mod:`asr.data.librispeech`).

A source that lists no utterance at all (an empty manifest, a Kaldi directory
with empty files, a folder with no transcript line) is a :class:`DataError`
naming it, the same for every entry point: a recipe or command pointing at it
has most likely named the wrong file. One whose utterances are all skipped is
not: its skips say what is wrong with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from asr.data.kaldi import is_kaldi_dir, read_kaldi_dir
from asr.data.librispeech import read_subset
from asr.data.manifests import is_manifest, read_manifest
from asr.data.report import DataError, SkipReport
from asr.data.utterance import Utterance

SourceForm = Literal["kaldi", "lhotse", "librispeech"]


def source_form(path: str | Path) -> SourceForm:
    """The form of the data at ``path`` (module docstring)."""
    if is_kaldi_dir(path):
        return "kaldi"
    if is_manifest(path):
        return "lhotse"
    return "librispeech"


def read_source(
    path: str | Path, report: SkipReport | None = None, cache_dir: str | Path | None = None, jobs: int = 1
) -> list[Utterance]:
    """The utterances at ``path``, read by the reader its form calls for.

    ``cache_dir`` is where the LibriSpeech reader keeps its duration manifests, whose headers it
    reads in ``jobs`` processes (0: one per core; see :func:`asr.data.librispeech.read_subset`).
    Kaldi directories and lhotse manifests need none: durations come from ``segments``, one header
    per recording, or the manifest.
    """
    report = SkipReport() if report is None else report
    form = source_form(path)
    if form == "librispeech" and Path(path).is_file():
        raise DataError(not_a_corpus(path))
    skipped_before = len(report)
    if form == "kaldi":
        utterances = read_kaldi_dir(path, report)
    elif form == "lhotse":
        utterances = read_manifest(path, report)
    else:
        utterances = read_subset(path, report, cache_dir, jobs)
    if not utterances and len(report) == skipped_before:
        raise DataError(f"{path}: {_FORM_NAMES[form]} lists no utterances (it is empty)")
    return utterances


def not_a_corpus(path: str | Path) -> str:
    """Why the file at ``path``, which is neither a lhotse manifest nor a folder, cannot be data: it says what
    the file is (audio, text, ...), what data paths are, and for audio, the command that transcribes it."""
    from asr.checkpointing import not_a_checkpoint

    what = not_a_checkpoint(path) or ("a checkpoint" if Path(path).suffix == ".pt" else "a file")
    message = (f"{path} is {what}, not a corpus: data is a LibriSpeech-layout folder, a Kaldi data directory "
               "or a lhotse manifest (*.jsonl, *.jsonl.gz)")
    if "audio" in what:
        message += f"; to transcribe one file: python -m asr.transcribe --checkpoint CHECKPOINT {path}"
    return message


_FORM_NAMES = {"kaldi": "this Kaldi data directory", "lhotse": "this lhotse manifest",
               "librispeech": "this LibriSpeech-layout folder"}


def read_sources(
    paths: Iterable[str | Path], report: SkipReport | None = None, cache_dir: str | Path | None = None,
    jobs: int = 1,
) -> list[Utterance]:
    """The utterances of several sources, concatenated (each read with :func:`read_source`)."""
    report = SkipReport() if report is None else report
    return [utterance for path in paths for utterance in read_source(path, report, cache_dir, jobs)]
