"""Skips: every utterance left out of a corpus is recorded with a reason, never dropped silently.

Readers and :func:`asr.data.dataset.prepare_utterances` call
:meth:`SkipReport.skip` for each problem they find. The message names the
file (and line, for transcript problems). With ``strict=True`` (the
``data.strict`` recipe key) the first problem raises :class:`DataError`
instead, for users who would rather fix the corpus than lose utterances.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from features.audio import AudioError, MissingAudioError, NonFiniteAudioError, ShortAudioError, TruncatedAudioError

logger = logging.getLogger(__name__)

# The reasons, in one place, so the summary groups them consistently.
UNREADABLE_AUDIO = "unreadable audio"         # the header cannot be read (garbage bytes, unsupported format)
EMPTY_AUDIO = "empty audio"                   # zero-length file, or a header with zero samples
UNDECODABLE_AUDIO = AudioError.reason         # the header reads but the samples do not (a truncated FLAC)
NONFINITE_AUDIO = NonFiniteAudioError.reason  # NaN or infinite samples
SHORT_AUDIO = ShortAudioError.reason          # fewer samples than one analysis window
TRUNCATED_AUDIO = TruncatedAudioError.reason  # a WAV header promises more samples than the file holds (training)
MISSING_AUDIO = "transcript without audio"    # a trans.txt line whose audio file does not exist
MISSING_TRANSCRIPT = "audio without transcript"
MALFORMED_TRANSCRIPT = "malformed transcript line"  # e.g. a line that is not valid UTF-8
EMPTY_TRANSCRIPT = "empty transcript"         # empty after normalisation
UNKNOWN_CHARACTERS = "unknown characters"     # characters the tokenizer cannot encode
TOO_LONG = "longer than max_duration"
TOO_SHORT = "shorter than min_duration"
DUPLICATE_ID = "duplicate utterance id"
BAD_FILENAME = "unexpected file name"
# Kaldi data directories and lhotse manifests (asr.data.kaldi, asr.data.manifests)
MISSING_AUDIO_FILE = MissingAudioError.reason  # wav.scp or a manifest names a file that does not exist
MALFORMED_LINE = "malformed line"              # a wav.scp/segments/utt2spk line or a manifest line that does not parse
SEGMENT_PAST_END = "segment past the end of its recording"
COMMAND_AUDIO = "audio read through a command"  # a wav.scp pipeline or lhotse source not recognised; never run
UNSUPPORTED_AUDIO = "unsupported audio source"  # e.g. a lhotse recording with speed perturbation, a mixed cut


class DataError(ValueError):
    """A corpus problem that stops loading: a missing or empty folder, or any skip in strict mode."""


@dataclass
class Skip:
    reason: str    # one of the constants above
    message: str   # names the file (and line) and says what is wrong

    def as_dict(self) -> dict:
        return {"reason": self.reason, "message": self.message}


@dataclass
class SkipReport:
    """The utterances left out while loading, grouped by reason.

    strict: raise :class:`DataError` on the first problem instead of recording it.
    """

    strict: bool = False
    skips: list[Skip] = field(default_factory=list)

    def skip(self, reason: str, message: str) -> None:
        """Record one left-out utterance (or raise in strict mode). ``message`` names the file."""
        if self.strict:
            raise DataError(f"{message} [{reason}; data.strict is true]")
        self.skips.append(Skip(reason, message))
        logger.debug("skipped: %s [%s]", message, reason)

    def add(self, skip: Skip) -> None:
        """Record a skip found elsewhere (in a DataLoader worker, say); raises in strict mode like :meth:`skip`."""
        self.skip(skip.reason, skip.message)

    def counts(self) -> Counter:
        """reason -> number of skipped utterances."""
        return Counter(s.reason for s in self.skips)

    def counts_text(self) -> str:
        """``"3 (2 non-finite samples, 1 audio that fails to decode)"``, or ``"0"``."""
        if not self.skips:
            return "0"
        return f"{len(self.skips)} (" + ", ".join(f"{n} {reason}" for reason, n in self.counts().most_common()) + ")"

    def as_dict(self) -> dict:
        """For ``wer.json`` and the checker's report: counts by reason and every message."""
        return {"count": len(self.skips), "by_reason": dict(self.counts().most_common()),
                "skipped": [s.as_dict() for s in self.skips]}

    def messages(self, reason: str) -> list[str]:
        return [s.message for s in self.skips if s.reason == reason]

    def __len__(self) -> int:
        return len(self.skips)

    def summary(self, examples: int = 3) -> str:
        """A few lines: the count per reason and the first ``examples`` messages of each."""
        if not self.skips:
            return "no utterances skipped"
        lines = [f"skipped {len(self.skips)} utterance(s):"]
        for reason, count in self.counts().most_common():
            lines.append(f"  {count:6d}  {reason}")
            msgs = self.messages(reason)
            lines.extend(f"          e.g. {m}" for m in msgs[:examples])
            if len(msgs) > examples:
                lines.append(f"          ... and {len(msgs) - examples} more")
        return "\n".join(lines)

    def log(self, what: str = "data") -> None:
        """Log the summary: a warning when anything was skipped, so it shows in every training log."""
        if self.skips:
            logger.warning("%s: %s", what, self.summary())
        else:
            logger.info("%s: no utterances skipped", what)
