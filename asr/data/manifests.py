"""Reader for lhotse manifests (``*.jsonl`` or ``*.jsonl.gz``): a CutSet, or a RecordingSet with its SupervisionSet.

lhotse (https://github.com/lhotse-speech/lhotse) prepares more than 80 corpora
into these, e.g. ``lhotse prepare timit TIMIT/ data/manifests`` or
``lhotse prepare commonvoice ...``. Give either

- a CutSet manifest (``*cuts*.jsonl.gz``): every supervision of every cut is an
  utterance; or
- either file of a recording/supervision pair named as lhotse's recipes name
  them, ``<corpus>_recordings_<part>.jsonl.gz`` beside
  ``<corpus>_supervisions_<part>.jsonl.gz``: each supervision is an utterance.

An utterance is its supervision's span of its recording (``start``,
``duration``), read alone, never the whole recording. Its id is the
supervision's id, its text the supervision's text (through
:func:`asr.data.text.normalize_text`), its speaker the supervision's speaker
(else the recording's id). A supervision on one channel of a multi-channel
recording reads that channel (its neighbours may hold other talkers); one on
every channel reads them all and down-mixes them, as for any file.

Each line is parsed here and turned into a lhotse object by lhotse itself
(:func:`lhotse.serialization.deserialize_item`), so that a line that is not
JSON costs that line alone; lhotse's own ``load_manifest`` would also open
``pipe:`` paths by running them. Audio sources are read only from files:
a ``command`` source (a shell command) is never run, and ``url`` and
``memory`` sources are not fetched; their utterances are skipped with a
message naming the recording. So are recordings with audio transforms other
than resampling (speed or volume perturbation: augment with
``features.augment`` instead), mixed cuts, and cuts without a recording.
Resampling is left to the feature pipeline, which resamples every file to
``features.sample_rate``.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from lhotse import Recording, SupervisionSegment
from lhotse.cut import Cut, MixedCut
from lhotse.serialization import deserialize_item

from asr.data import report as reasons
from asr.data.kaldi import MAX_OVERSHOOT
from asr.data.report import DataError, SkipReport
from asr.data.text import normalize_text, text_lines
from asr.data.utterance import AudioSegment, Utterance

MANIFEST_SUFFIXES = (".jsonl", ".jsonl.gz")


def is_manifest(path: str | Path) -> bool:
    """A ``*.jsonl`` or ``*.jsonl.gz`` file name."""
    return str(path).endswith(MANIFEST_SUFFIXES)


def read_manifest(path: str | Path, report: SkipReport | None = None) -> list[Utterance]:
    """The utterances of a lhotse manifest, in manifest order (module docstring).

    A missing file, or a recording/supervision manifest whose partner file is
    missing, raises :class:`DataError` naming it; problems with single lines
    and utterances go into ``report`` with the file and line or the id.
    """
    report = SkipReport() if report is None else report
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"lhotse manifest not found: {path}")
    items = _read_items(path, report)
    if not items:
        return []
    first = items[0][1]
    if isinstance(first, Cut):
        return _from_cuts(_of_kind(items, Cut, report), report)
    if isinstance(first, (Recording, SupervisionSegment)):
        named = "recordings" if isinstance(first, Recording) else "supervisions"
        other = "supervisions" if named == "recordings" else "recordings"
        partner = path.with_name(_swap(path.name, named, other))
        if partner == path or not partner.is_file():
            raise DataError(
                f"{path} holds lhotse {named}; their {other} are expected beside it in "
                f"{partner if partner != path else f'a file named like it with {other!r} for {named!r}'}, "
                "which does not exist (or give a CutSet: lhotse cut simple -r RECORDINGS -s SUPERVISIONS cuts.jsonl.gz)"
            )
        partner_items = _read_items(partner, report)
        recordings, supervisions = (items, partner_items) if named == "recordings" else (partner_items, items)
        return _from_pair(_of_kind(recordings, Recording, report), _of_kind(supervisions, SupervisionSegment, report), report)
    report.skip(reasons.UNSUPPORTED_AUDIO, f"{items[0][0]}: a lhotse {type(first).__name__} manifest has no transcripts")
    return []


def _swap(name: str, old: str, new: str) -> str:
    """``name`` with its last ``old`` replaced by ``new`` (``name`` itself when it has none)."""
    head, found, tail = name.rpartition(old)
    return head + new + tail if found else name


def _read_items(path: Path, report: SkipReport) -> list[tuple[str, object]]:
    """``("<path>:<line>", lhotse object)`` for each line that parses; each other line is reported."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        report.skip(reasons.MALFORMED_LINE, f"{path}: cannot read it as a gzip-compressed lhotse manifest: {err}")
        return []
    items = []
    for line_no, raw in enumerate(text_lines(data), start=1):
        where = f"{path}:{line_no}"
        if not raw.strip():
            continue
        try:
            fields = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            report.skip(reasons.MALFORMED_LINE, f"{where}: not a JSON line ({err})")
            continue
        if not isinstance(fields, dict):
            report.skip(reasons.MALFORMED_LINE, f"{where}: not a JSON object")
            continue
        try:
            items.append((where, deserialize_item(fields)))
        except (TypeError, KeyError, ValueError, AttributeError) as err:
            report.skip(reasons.MALFORMED_LINE, f"{where}: not a lhotse manifest item ({type(err).__name__}: {err})")
    return items


def _of_kind(items: list[tuple[str, object]], kind: type, report: SkipReport) -> list[tuple[str, object]]:
    """The items of ``kind``; any other is reported (a manifest holds one kind)."""
    kept = []
    for where, item in items:
        if isinstance(item, kind):
            kept.append((where, item))
        else:
            report.skip(reasons.MALFORMED_LINE, f"{where}: a {type(item).__name__} among {kind.__name__} items")
    return kept


def _from_pair(recordings: list, supervisions: list, report: SkipReport) -> list[Utterance]:
    by_id = {}
    for where, recording in recordings:
        if recording.id in by_id:
            report.skip(reasons.DUPLICATE_ID, f"{where}: recording id {recording.id} already used at {by_id[recording.id][0]}")
        else:
            by_id[recording.id] = (where, recording)
    files: dict[Path, bool] = {}
    utterances, used = [], set()
    for where, sup in supervisions:
        if sup.recording_id not in by_id:
            report.skip(reasons.MISSING_AUDIO, f"{where}: supervision {sup.id} of recording {sup.recording_id}, "
                        "which is not in the recordings manifest")
            continue
        used.add(sup.recording_id)
        utterance = _utterance(where, sup, by_id[sup.recording_id][1], 0.0, files, report)
        if utterance is not None:
            utterances.append(utterance)
    for rec_id, (where, _) in by_id.items():
        if rec_id not in used:
            report.skip(reasons.MISSING_TRANSCRIPT, f"{where}: recording {rec_id} has no supervision")
    return utterances


def _from_cuts(cuts: list, report: SkipReport) -> list[Utterance]:
    files: dict[Path, bool] = {}
    utterances = []
    for where, cut in cuts:
        if isinstance(cut, MixedCut) or getattr(cut, "recording", None) is None:
            what = "a mixed cut" if isinstance(cut, MixedCut) else "a cut without a recording (features only?)"
            report.skip(reasons.UNSUPPORTED_AUDIO, f"{where}: cut {cut.id} is {what}; only cuts of one recording are read")
            continue
        if not cut.supervisions:
            report.skip(reasons.MISSING_TRANSCRIPT, f"{where}: cut {cut.id} has no supervision")
            continue
        for sup in cut.supervisions:  # supervision times are relative to the cut
            utterance = _utterance(where, sup, cut.recording, cut.start, files, report)
            if utterance is not None:
                utterances.append(utterance)
    return utterances


def _utterance(
    where: str, sup: SupervisionSegment, recording: Recording, offset: float, files: dict[Path, bool], report: SkipReport
) -> Utterance | None:
    """The utterance of supervision ``sup`` (at ``offset`` + its start in ``recording``), or None, reported."""
    name = f"{where}: supervision {sup.id} (recording {recording.id})"
    transforms = [type(t).__name__ for t in recording.transforms or []]
    if any(t != "Resample" for t in transforms):
        report.skip(reasons.UNSUPPORTED_AUDIO, f"{name}: audio transforms {transforms} are not applied here")
        return None
    wanted = sup.channel if isinstance(sup.channel, list) else [sup.channel]
    sources = [s for s in recording.sources if set(wanted) & set(s.channels)]
    if len(sources) != 1 or not set(wanted) <= set(sources[0].channels):
        report.skip(reasons.UNSUPPORTED_AUDIO, f"{name}: channels {wanted} are not all in one audio source")
        return None
    source = sources[0]
    if source.type != "file":
        reason = reasons.COMMAND_AUDIO if source.type == "command" else reasons.UNSUPPORTED_AUDIO
        never = "a command is never run" if source.type == "command" else "only files are read"
        report.skip(reason, f"{name}: audio source of type {source.type!r} ({never}): {source.source!r}")
        return None
    path = Path(source.source).expanduser()
    if path not in files:
        files[path] = path.is_file()
    if not files[path]:
        report.skip(reasons.MISSING_AUDIO_FILE, f"{name}: audio file not found: {path}")
        return None
    start, end = offset + sup.start, offset + sup.end
    if start < 0 or end <= start:
        report.skip(reasons.MALFORMED_LINE, f"{name}: spans {start:.2f}-{end:.2f} s, not a span of the recording")
        return None
    if start >= recording.duration or end > recording.duration + MAX_OVERSHOOT:
        report.skip(reasons.SEGMENT_PAST_END,
                    f"{name}: spans {start:.2f}-{end:.2f} s but the recording lasts {recording.duration:.2f} s")
        return None
    end = min(end, recording.duration)
    if sorted(wanted) == sorted(source.channels):
        channel = None  # every channel of the file: all read, down-mixed by the feature pipeline
    elif len(wanted) == 1:
        channel = source.channels.index(wanted[0])  # its index in the file
    else:
        report.skip(reasons.UNSUPPORTED_AUDIO, f"{name}: channels {wanted} of a file with channels {source.channels}")
        return None
    speaker = sup.speaker or recording.id
    return Utterance(sup.id, AudioSegment(path, start, end, channel), normalize_text(sup.text or ""), end - start, speaker)
