"""Which reader a data path is for, decided from the path alone, in one place.

Every entry point that takes data (a recipe's ``data.train``/``dev``/``test``,
``asr.evaluate --data``, ``asr.check``, ``asr.study``) reads it with
:func:`read_source`. The rule:

- a folder holding ``wav.scp`` and ``text``: a Kaldi data directory (:mod:`asr.data.kaldi`);
- a ``*.jsonl`` or ``*.jsonl.gz`` file: a lhotse manifest, a CutSet or either
  file of a recordings/supervisions pair (:mod:`asr.data.manifests`);
- any other folder: a LibriSpeech-layout subset folder (:mod:`asr.data.librispeech`);
  a file that is none of these is not data, and the error says what it is.

The forms are the rows of :data:`FORMS`, asked in order: a new corpus form is one
reader module (durations from :func:`asr.data.audio.header_duration`) and one row.

A source that lists no utterance at all (an empty manifest, a Kaldi directory
with empty files, a folder with no transcript line) is a :class:`DataError`
naming it, the same for every entry point: a recipe or command pointing at it
has most likely named the wrong file. One whose utterances are all skipped is
not: its skips say what is wrong with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from asr.data.kaldi import is_kaldi_dir, read_kaldi_dir
from asr.data.librispeech import read_subset
from asr.data.manifests import is_manifest, read_manifest
from asr.data.report import DataError, SkipReport
from asr.data.utterance import Utterance


@dataclass(frozen=True)
class CorpusForm:
    """One form data can take: how its path is recognised, and the reader that reads it."""

    name: str  # what source_form answers: "kaldi"
    described: str  # how a message names a source of this form: "this Kaldi data directory"
    recognises: Callable[[Path], bool]  # from the path alone (a name, a file's presence), never the content
    # (path, report, cache_dir, jobs) -> its utterances; cache_dir and jobs are for readers that cache
    # what they read (durations) and spread it over processes (0: one per core); others ignore them
    read: Callable[[Path, SkipReport, str | Path | None, int], list[Utterance]]


# Asked in order: the first form that recognises a path reads it. LibriSpeech layout, which any
# folder may have, is last; a file that no form recognises is not data (not_a_corpus).
FORMS: list[CorpusForm] = [
    CorpusForm("kaldi", "this Kaldi data directory", is_kaldi_dir,
               lambda path, report, cache_dir, jobs: read_kaldi_dir(path, report)),
    CorpusForm("lhotse", "this lhotse manifest", is_manifest,
               lambda path, report, cache_dir, jobs: read_manifest(path, report)),
    CorpusForm("librispeech", "this LibriSpeech-layout folder", lambda path: not path.is_file(), read_subset),
]


def corpus_form(path: str | Path) -> CorpusForm:
    """The form of the data at ``path`` (the first row of :data:`FORMS` that recognises it); a
    :class:`DataError` saying what the file is when ``path`` is a file no form recognises."""
    path = Path(path)
    for form in FORMS:
        if form.recognises(path):
            return form
    raise DataError(not_a_corpus(path))


def source_form(path: str | Path) -> str:
    """The name of the form of the data at ``path`` (module docstring): ``kaldi``, ``lhotse``, ``librispeech``."""
    return corpus_form(path).name


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
    form = corpus_form(path)
    skipped_before = len(report)
    utterances = form.read(Path(path), report, cache_dir, jobs)
    if not utterances and len(report) == skipped_before:
        raise DataError(f"{path}: {form.described} lists no utterances (it is empty)")
    return utterances


def not_a_corpus(path: str | Path) -> str:
    """Why the file at ``path``, which is neither a lhotse manifest nor a folder, cannot be data: it says what
    the file is (audio, text, ...), what data paths are, and for audio, the command that transcribes it."""
    from asr.checkpoints.io import not_a_checkpoint

    what = not_a_checkpoint(path) or ("a checkpoint" if Path(path).suffix == ".pt" else "a file")
    message = (f"{path} is {what}, not a corpus: data is a LibriSpeech-layout folder, a Kaldi data directory "
               "or a lhotse manifest (*.jsonl, *.jsonl.gz)")
    if "audio" in what:
        message += f"; to transcribe one file: python -m asr.transcribe --checkpoint CHECKPOINT {path}"
    return message


def read_sources(
    paths: Iterable[str | Path], report: SkipReport | None = None, cache_dir: str | Path | None = None,
    jobs: int = 1,
) -> list[Utterance]:
    """The utterances of several sources, concatenated (each read with :func:`read_source`)."""
    report = SkipReport() if report is None else report
    return [utterance for path in paths for utterance in read_source(path, report, cache_dir, jobs)]
