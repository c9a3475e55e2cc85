"""Reader for corpora in LibriSpeech layout.

A subset folder looks like::

    <subset>/<speaker>/<chapter>/<speaker>-<chapter>-<n>.flac
    <subset>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt   # "<id> <TRANSCRIPT>" per line

Any subset (``train-clean-100``, ``dev-other``, the toolkit's own
``fsdd-dev``, ...) can be read, and several subsets are concatenated.

Durations come from the audio headers (no decoding) and are cached in a
manifest, so the second run over a large subset does not open every file
again. The manifest lives in the cache folder (``data.cache_dir``, default
``$XDG_CACHE_HOME/lnasr`` or ``~/.cache/lnasr``), under a name derived from the
subset's absolute path: the toolkit never writes into a corpus folder, which
is often shared or read-only. Each entry keeps the file's size and
modification time; a file whose size or mtime changed is read again, so the
cache never serves a stale duration. The manifest carries a checksum and the
subset it was made for (:mod:`asr.data.cache`): one that does not verify, or
holds a duration that is not a positive number, is ignored with a warning
and every header is read again. A cache that cannot be written costs only a
rescan next time. The headers that must be read are read in ``jobs``
processes (``data.prepare_jobs``) with a progress bar.

Transcript files are decoded line by line, so one line that is not UTF-8
loses that line alone (reported with its file and line number).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from asr.data import report as reasons
from asr.data.audio import UnusableAudio, header_duration
from asr.data.cache import Entry, cache_folder, load_entry, write_entry
from asr.data.cache import default_cache_dir  # noqa: F401  (imported from here by asr.data.corpus)
from asr.data.parallel import map_chunks, processes_used
from asr.data.report import DataError, SkipReport
from asr.data.text import normalize_text, text_lines
from asr.data.utterance import Utterance

logger = logging.getLogger(__name__)

AUDIO_SUFFIXES = (".flac", ".wav")
TRANSCRIPT_SUFFIX = ".trans.txt"
_MANIFEST_HEADER = "# lnasr duration manifest v1\tpath relative to the subset\tsize bytes\tmtime ns\tseconds"
_HEADERS_PER_CHUNK = 200  # header reads per task handed to a process: 143 tasks for train-clean-100


def read_librispeech(
    subsets: Iterable[str | Path],
    report: SkipReport | None = None,
    cache_dir: str | Path | None = None,
    jobs: int = 1,
) -> list[Utterance]:
    """Read and concatenate several LibriSpeech-layout subset folders (see :func:`read_subset`)."""
    report = SkipReport() if report is None else report
    utterances: list[Utterance] = []
    for subset in subsets:
        utterances.extend(read_subset(subset, report, cache_dir, jobs))
    return utterances


def read_subset(
    subset: str | Path, report: SkipReport | None = None, cache_dir: str | Path | None = None, jobs: int = 1
) -> list[Utterance]:
    """All utterances of one subset folder, in transcript-file order.

    A missing folder, or one with no ``*.trans.txt`` in it, raises
    :class:`DataError` naming it: a recipe pointing at the wrong place is not
    something to skip. Problems with single utterances (an unreadable or
    empty audio file, a transcript line without audio, audio without a
    transcript line, a repeated id) are recorded in ``report`` with a message
    naming the file, or raise in strict mode. Transcripts are passed through
    :func:`normalize_text`; an empty one is kept here and left to
    :func:`asr.data.dataset.prepare_utterances` to report.

    jobs: processes reading the audio headers the manifest does not have
          (1 = this process, 0 = one per core). The result does not depend on it.
    """
    report = SkipReport() if report is None else report
    subset = Path(subset).expanduser()
    if not subset.is_dir():
        raise DataError(f"LibriSpeech subset folder not found: {subset}")
    transcript_files, audio_by_dir = _scan(subset, report)
    if not transcript_files:
        found = sum(len(files) for files in audio_by_dir.values())
        raise DataError(
            f"no transcripts (*{TRANSCRIPT_SUFFIX}) under {subset} ({found} audio files found); "
            "expected LibriSpeech layout <subset>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt"
        )

    manifest = DurationManifest(subset, cache_dir)
    # Every audio file's duration up front, so the headers can be read in parallel; the loop below
    # then meets the files (and reports their problems) in the same order as a serial reader.
    manifest.prefetch([audio for folder in sorted(audio_by_dir) for audio in audio_by_dir[folder].values()], jobs)
    utterances: list[Utterance] = []
    seen: dict[str, str] = {}
    used_audio: set[Path] = set()
    for trans_file in transcript_files:
        audio_here = audio_by_dir.get(trans_file.parent, {})
        for line_no, utt_id, text in _read_transcript(trans_file, report):
            where = f"{trans_file}:{line_no}"
            if utt_id in seen:
                report.skip(reasons.DUPLICATE_ID, f"{where}: utterance id {utt_id} already used at {seen[utt_id]}")
                continue
            seen[utt_id] = where
            audio = audio_here.get(utt_id)
            if audio is None:
                expected = trans_file.parent / f"{utt_id}{AUDIO_SUFFIXES[0]}"
                report.skip(reasons.MISSING_AUDIO, f"{where}: transcript line for {utt_id} but no audio {expected}")
                continue
            used_audio.add(audio)
            try:
                duration = manifest.duration(audio)
            except UnusableAudio as err:
                report.skip(err.reason, err.message)
                continue
            speaker = utt_id.split("-", 1)[0]
            utterances.append(Utterance(utt_id, audio, normalize_text(text), duration, speaker))
    for folder in sorted(audio_by_dir):
        for utt_id, audio in sorted(audio_by_dir[folder].items()):
            if audio not in used_audio:
                report.skip(
                    reasons.MISSING_TRANSCRIPT,
                    f"{audio}: audio file without a transcript line (no line '{utt_id} ...' in a "
                    f"*{TRANSCRIPT_SUFFIX} in {folder})",
                )
    manifest.save()
    return utterances


def _scan(subset: Path, report: SkipReport) -> tuple[list[Path], dict[Path, dict[str, Path]]]:
    """Transcript files (sorted) and audio files grouped by folder then id, found by walking ``subset``.

    Of two audio files with one id (``x.flac`` and ``x.wav``) the first in
    :data:`AUDIO_SUFFIXES` order is used and the other reported.
    """
    transcript_files: list[Path] = []
    audio_by_dir: dict[Path, dict[str, Path]] = {}
    for dirpath, dirnames, filenames in os.walk(subset, followlinks=True):
        dirnames.sort()
        folder = Path(dirpath)
        for name in sorted(filenames):
            if name.endswith(TRANSCRIPT_SUFFIX):
                transcript_files.append(folder / name)
            elif name.endswith(AUDIO_SUFFIXES):
                stem = name.rsplit(".", 1)[0]
                here = audio_by_dir.setdefault(folder, {})
                if stem not in here:
                    here[stem] = folder / name
                    continue
                first, second = sorted([here[stem], folder / name], key=lambda p: AUDIO_SUFFIXES.index(p.suffix))
                here[stem] = first
                message = f"{second}: a second audio file of utterance {stem}; using {first.name}"
                report.skip(reasons.DUPLICATE_ID, message)
    return transcript_files, audio_by_dir


def _read_transcript(path: Path, report: SkipReport) -> list[tuple[int, str, str]]:
    """(line number, utterance id, raw text) for each non-blank line of a ``*.trans.txt``.

    Lines are decoded one by one, so a line that is not valid UTF-8 costs that
    line alone: it is reported with its file and line number, the others are kept.
    """
    try:
        raw_lines = text_lines(path.read_bytes())
    except OSError as err:
        report.skip(reasons.MALFORMED_TRANSCRIPT, f"{path}: cannot read transcript file: {err}")
        return []
    entries = []
    for line_no, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            report.skip(reasons.MALFORMED_TRANSCRIPT, f"{path}:{line_no}: line is not valid UTF-8 ({err.reason} at byte {err.start})")
            continue
        if not line.strip():
            continue
        parts = line.strip().split(maxsplit=1)
        entries.append((line_no, parts[0], parts[1] if len(parts) > 1 else ""))
    return entries


def manifest_path(subset: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where the duration manifest of ``subset`` is kept: in ``cache_dir`` (default
    :func:`default_cache_dir`), under a name made from the subset's absolute path."""
    subset = Path(subset).expanduser().resolve()
    key = hashlib.sha1(str(subset).encode()).hexdigest()[:16]
    return cache_folder(cache_dir, "manifests") / f"{subset.name}-{key}.tsv"


def manifest_key(subset: str | Path) -> dict:
    """The key a duration manifest is made for and checked against (:mod:`asr.data.cache`): the
    subset's absolute path, in full (the file name holds 16 hex digits of its hash)."""
    return {"subset": str(Path(subset).expanduser().resolve())}


class DurationManifest:
    """Durations of a subset's audio files, cached by (size, mtime) so unchanged files are not reopened.

    Why size and mtime are enough: every tool that rewrites an audio file (an
    encoder, ``cp``, a download, ``sox``) gives it the current time as its
    mtime, kept to the nanosecond, and nearly always a new size. Only a
    replacement that restores the old mtime on purpose and has the very same
    size (``cp -p``/``rsync -a`` of another file of equal length) escapes it,
    as it escapes ``make`` and rsync's quick check. Hashing the content
    instead would read every byte of 6 GB on each start: the minutes this
    cache is there to save.
    """

    def __init__(self, subset: Path, cache_dir: str | Path | None = None):
        self.subset = subset
        self.path = manifest_path(subset, cache_dir)
        self.cached = self._load()
        self.current: dict[str, tuple[int, int, float]] = {}
        self.headers_read = 0  # how many files needed their header read this time
        # audio -> (size, mtime, seconds) or the problem, from :meth:`prefetch`
        self._prefetched: dict[Path, tuple[int, int, float] | UnusableAudio] = {}

    def prefetch(self, audios: Sequence[Path], jobs: int = 1) -> None:
        """Find the durations of all ``audios`` at once: each is stat'ed here, and the headers of files
        new to the manifest or changed since are read in ``jobs`` processes (see :func:`read_subset`).
        :meth:`duration` then answers from these results."""
        start = time.perf_counter()
        to_read: list[tuple[Path, int, int]] = []
        for audio in audios:
            try:
                size, mtime, seconds = self._cached_entry(audio)
            except UnusableAudio as err:
                self._prefetched[audio] = err
                continue
            if seconds is None:
                to_read.append((audio, size, mtime))
            else:
                self._prefetched[audio] = (size, mtime, seconds)
        chunks = map_chunks(
            _read_headers, [audio for audio, _, _ in to_read], jobs, _HEADERS_PER_CHUNK,
            desc=f"audio headers of {self.subset.name}",
        )
        results = [result for chunk in chunks for result in chunk]
        for (audio, size, mtime), result in zip(to_read, results):
            self._prefetched[audio] = UnusableAudio(*result) if isinstance(result, tuple) else (size, mtime, result)
        self.headers_read += len(to_read)
        elapsed = time.perf_counter() - start
        if to_read:
            processes = processes_used(jobs, len(to_read), _HEADERS_PER_CHUNK)
            logger.info(
                "%s: %d audio files: %d headers read in %.1f s (%d process%s, %.0f files/s), %d durations from %s",
                self.subset, len(audios), len(to_read), elapsed, processes, "es" if processes > 1 else "",
                len(to_read) / max(elapsed, 1e-9), len(audios) - len(to_read), self.path,
            )
        else:
            logger.info("%s: %d audio durations from %s in %.1f s", self.subset, len(audios), self.path, elapsed)

    def duration(self, audio: Path) -> float:
        """Seconds of audio in ``audio`` (from the cache when its size and mtime are unchanged)."""
        known = self._prefetched.pop(audio, None)
        if known is None:
            size, mtime, seconds = self._cached_entry(audio)
            if seconds is None:
                seconds = header_duration(audio)
                self.headers_read += 1
            known = (size, mtime, seconds)
        if isinstance(known, UnusableAudio):
            raise known
        self.current[self._key(audio)] = known
        return known[2]

    def save(self) -> None:
        """Write the manifest if anything changed; a failure only costs a rescan next time, so it is logged."""
        if self.current == self.cached:
            return
        lines = [_MANIFEST_HEADER] + [
            f"{key}\t{size}\t{mtime}\t{seconds!r}" for key, (size, mtime, seconds) in sorted(self.current.items())
        ]
        content = ("\n".join(lines) + "\n").encode("utf-8")
        write_entry(self.path, "manifests", manifest_key(self.subset), content, "duration manifest")

    def _key(self, audio: Path) -> str:
        return audio.relative_to(self.subset).as_posix()

    def _cached_entry(self, audio: Path) -> tuple[int, int, float | None]:
        """``(size, mtime_ns, seconds)`` of ``audio``, seconds None when the manifest has no valid entry;
        :class:`UnusableAudio` when it cannot be stat'ed or is empty."""
        try:
            st = audio.stat()
        except OSError as err:
            raise UnusableAudio(reasons.UNREADABLE_AUDIO, f"{audio}: cannot stat audio file: {err}") from err
        if st.st_size == 0:
            raise UnusableAudio(reasons.EMPTY_AUDIO, f"{audio}: zero-length audio file")
        entry = self.cached.get(self._key(audio))
        if entry is not None and entry[:2] == (st.st_size, st.st_mtime_ns):
            return st.st_size, st.st_mtime_ns, entry[2]
        return st.st_size, st.st_mtime_ns, None

    def _load(self) -> dict[str, tuple[int, int, float]]:
        entries = load_entry(
            self.path, "manifests", manifest_key(self.subset), _parse_manifest, "duration manifest",
            "reading the durations again",
        )
        return {} if entries is None else entries


def _parse_manifest(entry: Entry) -> dict[str, tuple[int, int, float]]:
    """``key -> (size, mtime_ns, seconds)`` of a verified manifest entry; ValueError where a line makes no sense."""
    lines = entry.content.decode("utf-8").split("\n")
    if lines[0] != _MANIFEST_HEADER:
        raise ValueError("not a duration manifest of this version (first line differs)")
    entries: dict[str, tuple[int, int, float]] = {}
    for line_no, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        key, size, mtime, seconds = line.rsplit("\t", 3)
        entries[key] = (int(size), int(mtime), float(seconds))
        if not (math.isfinite(entries[key][2]) and entries[key][2] > 0):
            raise ValueError(f"line {line_no}: duration {seconds} is not a positive number")
    return entries


def _read_headers(audios: list[Path]) -> list[float | tuple[str, str]]:
    """Seconds of each file, or ``(reason, message)`` where it cannot be used (run in a worker process)."""
    results: list[float | tuple[str, str]] = []
    for audio in audios:
        try:
            results.append(header_duration(audio))
        except UnusableAudio as err:
            results.append((err.reason, err.message))
    return results
