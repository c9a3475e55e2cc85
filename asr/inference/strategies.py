"""Test-time strategies: how a recogniser meets the utterances of a speaker it has never heard.

A strategy takes a recogniser (:class:`~asr.inference.interface.RecogniserProtocol`, which
:class:`~asr.inference.recogniser.Recogniser` implements) and a list of
utterances (one speaker's, when ``per_speaker``) and returns a
:class:`SpeakerResult`. :func:`transcribe_speakers` runs one over a whole
corpus, speaker by speaker, and gathers the results.

- :class:`PlainDecoding`: decode as is.
- :class:`VTLNSearch`: test-time VTLN. The speaker's utterances are decoded
  under every candidate warp of the mel filters, and the speaker keeps the warp
  under which the model is most sure of its own transcripts: the highest mean
  log-probability of the hypotheses it found (``(1 - ctc_weight) * log p_att +
  ctc_weight * log p_ctc``, ``<eos>`` included). No transcript is read: this is
  Kaldi's maximum-likelihood warp search with the recogniser's own score in
  place of the GMM likelihood. It costs one decoding per candidate.
- :class:`asr.inference.adaptation.SelfTraining`: fine-tune on the speaker's
  own transcripts and decode again; its first pass is another strategy (plain
  decoding or VTLN), so strategies chain.

Adding a strategy: a class with ``per_speaker`` and ``run(recogniser,
utterances, options, batch_size) -> SpeakerResult``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from asr.data.report import Skip
from asr.data.utterance import Utterance
from asr.decoding import DecodingOptions
from asr.inference.interface import RecogniserProtocol
from features.filterbank import check_mel_filters


@dataclass
class SpeakerResult:
    """What a strategy found for a list of utterances, aligned with it.

    texts:       the transcripts; None where the audio failed where it was read.
    skipped:     position -> why that utterance has no transcript.
    warp:        the mel warp decoded at (chosen by VTLN; 1.0 for adaptation without it); None: no warp.
    warp_scores: candidate warp -> the mean score of its transcripts (VTLN).
    rounds:      transcripts before adaptation and after each round (self-training).
    counts:      what a strategy left out or skipped along the way, by name.
    """

    texts: list[str | None]
    skipped: dict[int, Skip] = field(default_factory=dict)
    warp: float | None = None
    warp_scores: dict[float, float] = field(default_factory=dict)
    rounds: list[list[str | None]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


class Strategy(Protocol):
    per_speaker: bool  # True: run() gets one speaker's utterances at a time

    def run(
        self, recogniser: RecogniserProtocol, utterances: list[Utterance], options: DecodingOptions, batch_size: int
    ) -> SpeakerResult: ...


class PlainDecoding:
    """Decode every utterance as it is (no warp, the models as trained)."""

    per_speaker = False

    def run(self, recogniser, utterances, options, batch_size) -> SpeakerResult:
        found = recogniser.decode(utterances, options, batch_size=batch_size)
        return SpeakerResult(found.texts, found.skipped)


@dataclass(frozen=True)
class VTLNSearch:
    """Test-time VTLN over ``warps`` (module docstring); the choice is per speaker."""

    warps: tuple[float, ...]
    per_speaker = True

    def run(self, recogniser, utterances, options, batch_size) -> SpeakerResult:
        check_mel_filters(recogniser.pipeline.config, list(self.warps))
        best, scores, skipped = None, {}, {}
        # Nearest to no warp first, so that a tie keeps the smaller change.
        for warp in sorted(set(self.warps), key=lambda w: (abs(w - 1.0), w)):
            found = recogniser.decode(utterances, options, warp=warp, score=True, batch_size=batch_size)
            skipped.update(found.skipped)
            read = [score for score in found.scores if score is not None]
            scores[warp] = sum(read) / len(read) if read else float("-inf")
            if best is None or scores[warp] > scores[best[0]]:
                best = (warp, found.texts)
        return SpeakerResult(best[1], skipped, warp=best[0], warp_scores=dict(sorted(scores.items())))


@dataclass
class CorpusResult:
    """A strategy's results over a whole corpus, aligned with its utterances."""

    texts: list[str | None]
    skipped: list[Skip]                                     # in utterance order
    warps: dict[str, float] = field(default_factory=dict)  # speaker -> warp (VTLN)
    warp_scores: dict[str, dict[float, float]] = field(default_factory=dict)
    rounds: list[list[str | None]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def transcribe_speakers(
    recogniser: RecogniserProtocol,
    utterances: list[Utterance],
    strategy: Strategy,
    options: DecodingOptions = DecodingOptions(),
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> CorpusResult:
    """Run ``strategy`` on ``utterances`` (speaker by speaker when it works per speaker, by
    ``Utterance.speaker``; each speaker starts from the recogniser as given).

    ``progress``, when given (a progress bar's ``update``), is told how many utterances each run of
    the strategy has just finished: a speaker's, or for a strategy that takes utterances one by one
    (not ``per_speaker``), a batch's, as the batches it decodes are the same either way."""
    groups: dict[str, list[int]] = defaultdict(list)
    if strategy.per_speaker:
        for i, utt in enumerate(utterances):
            groups[utt.speaker].append(i)
    elif progress is not None:
        groups = {f"batch {start}": list(range(start, min(start + batch_size, len(utterances))))
                  for start in range(0, len(utterances), batch_size)}
    else:
        groups = {"": list(range(len(utterances)))}
    texts: list[str | None] = [None] * len(utterances)
    skipped: dict[int, Skip] = {}
    result = CorpusResult(texts, [])
    for speaker, indices in groups.items():
        found = strategy.run(recogniser, [utterances[i] for i in indices], options, batch_size)
        for position, i in enumerate(indices):
            texts[i] = found.texts[position]
        skipped.update({indices[position]: skip for position, skip in found.skipped.items()})
        if found.warp is not None:
            result.warps[speaker] = found.warp
            result.warp_scores[speaker] = found.warp_scores
        if found.rounds:
            if not result.rounds:
                result.rounds = [[None] * len(utterances) for _ in found.rounds]
            for round_texts, found_texts in zip(result.rounds, found.rounds):
                for position, i in enumerate(indices):
                    round_texts[i] = found_texts[position]
        result.counts.update(found.counts)
        if progress is not None:
            progress(len(indices))
    result.skipped = [skipped[i] for i in sorted(skipped)]
    return result

