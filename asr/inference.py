"""A trained model ready to transcribe, rebuilt from one checkpoint file (or several, as an ensemble).

The checkpoint carries the config, the tokenizer and the feature pipeline
(with its global MVN statistics), so nothing else is needed. Features are
computed by :class:`features.pipeline.FeaturePipeline` exactly as in training
(``train=False``: no dither, no SpecAugment).

Two ways to meet a speaker the model has never heard, both optional:

- **Ensemble.** :func:`load_recogniser` given several checkpoints decodes with
  the mean of their next-token distributions (:class:`asr.models.ensemble.Ensemble`).
  They must share the tokenizer and the feature pipeline (the same recipe
  trained with different seeds, say).
- **Test-time VTLN** (``warps`` of :meth:`Recogniser.transcribe_utterances`).
  Each speaker's utterances are decoded under every candidate warp of the mel
  filters, and the speaker keeps the warp under which the model is most sure of
  its own transcripts: the highest mean log-probability of the hypotheses it
  found (``(1 - ctc_weight) * log p_att + ctc_weight * log p_ctc``, ``<eos>``
  included). No transcript is read: this is Kaldi's maximum-likelihood VTLN
  warp search with the recogniser's own score in place of the GMM likelihood.
  It costs one decoding per candidate warp.
"""

from __future__ import annotations

import argparse
import functools
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from asr.checkpoint import CheckpointError, load_checkpoint
from asr.config import ConfigError
from asr.data.batching import collate
from asr.data.dataset import audio_skip, utterance_features
from asr.data.report import Skip, SkipReport
from asr.data.tokenizer import Tokenizer, tokenizer_from_state_dict
from asr.data.utterance import Utterance
from asr.decoding import ctc_best_path, search, sequence_log_probs
from asr.experiment import ExperimentConfig, build_model, experiment_config_from_dict
from asr.models.ensemble import Ensemble
from features.audio import AudioError, NonFiniteAudioError
from features.filterbank import check_mel_filters
from features.pipeline import FeaturePipeline


@dataclass
class Recogniser:
    """A model in eval mode with the tokenizer and feature pipeline it was trained with."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    pipeline: FeaturePipeline
    config: ExperimentConfig  # the first checkpoint's, for an ensemble
    device: torch.device
    # Set by transcribe_utterances with warps: speaker -> the warp chosen, and the mean score of each warp.
    chosen_warps: dict[str, float] = field(default_factory=dict)
    warp_scores: dict[str, dict[float, float]] = field(default_factory=dict)

    @torch.no_grad()
    def transcribe_features(self, features: list[torch.Tensor], beam_size: int = 1, **options) -> list[str]:
        """Decode a list of ``(T, D)`` feature matrices as one padded batch; one transcript each.

        ``options`` go to :func:`asr.decoding.decode` (``ctc_weight``,
        ``length_penalty``, ``max_len_ratio``, ...). Each utterance is encoded and
        searched under its own length mask, so batching changes results only
        by float rounding.
        """
        texts, _ = self._decode(features, beam_size, score=False, **options)
        return texts

    @torch.no_grad()
    def _decode(
        self, features: list[torch.Tensor], beam_size: int, score: bool, **options
    ) -> tuple[list[str], list[float] | None]:
        """Transcripts of a batch and, with ``score``, the model's log-probability of each (module docstring)."""
        if not features:
            return [], ([] if score else None)
        encoder = self._encode(features)
        hyps = search(self.model, encoder, beam_size=beam_size, **options)
        texts = [self.tokenizer.decode(h) for h in hyps]
        if not score:
            return texts, None
        scores = sequence_log_probs(self.model, encoder, hyps, ctc_weight=options.get("ctc_weight", 0.0))
        return texts, scores.tolist()

    @torch.no_grad()
    def ctc_transcribe_utterances(
        self, utterances: list[Utterance], batch_size: int = 16, warp: float | None = None
    ) -> list[str] | None:
        """The CTC head's best-path transcript of each utterance (:func:`asr.decoding.ctc_best_path`),
        at mel warp ``warp``; None when the model has no CTC head."""
        texts: list[str] = []
        for start in range(0, len(utterances), batch_size):
            encoder = self._encode([self._utterance_features(u, warp) for u in utterances[start : start + batch_size]])
            if encoder.ctc_log_probs is None:
                return None
            texts += [self.tokenizer.decode(path) for path in ctc_best_path(encoder, self.model.pad_id)]
        return texts

    def _encode(self, features: list[torch.Tensor]):
        """The encoder output of ``(T, D)`` feature matrices padded into one batch."""
        batch = collate(
            [{"id": str(i), "features": f, "tokens": torch.zeros(0, dtype=torch.long)} for i, f in enumerate(features)]
        ).to(self.device)
        return self.model.encode(batch.features, batch.feature_lengths)

    def transcribe_files(
        self,
        paths: list[str | Path],
        beam_size: int = 1,
        batch_size: int = 16,
        warps: list[float] | None = None,
        speaker: str = "files",
        report: SkipReport | None = None,
        **options,
    ) -> list[str | None]:
        """Transcribe audio files (any sample rate, wav or flac), ``batch_size`` at a time.

        With ``warps`` (test-time VTLN), the files are taken as one speaker's,
        named ``speaker`` in :attr:`chosen_warps`. A file whose audio fails to
        read gets None and is recorded in ``report`` (see :meth:`transcribe_utterances`).
        """
        speakers = [speaker] * len(paths)
        return self._transcribe(paths, speakers, self._file_features, beam_size, batch_size, warps, report, **options)

    def transcribe_utterances(
        self,
        utterances: list[Utterance],
        beam_size: int = 1,
        batch_size: int = 16,
        warps: list[float] | None = None,
        report: SkipReport | None = None,
        **options,
    ) -> list[str | None]:
        """Transcribe corpus utterances (files or in-memory audio), ``batch_size`` at a time.

        ``warps``: candidate VTLN factors for test-time VTLN (module docstring),
        chosen per ``Utterance.speaker``; the choices are left in
        :attr:`chosen_warps` and the mean score of every candidate in
        :attr:`warp_scores`. ``None`` decodes without a warp.
        An utterance whose audio fails where it is read (damaged past its
        header, NaN samples, too short) costs nothing else: its transcript is
        None, and it is recorded once in ``report`` (a :class:`DataError` if the
        report is strict).
        """
        speakers = [u.speaker for u in utterances]
        return self._transcribe(
            utterances, speakers, self._utterance_features, beam_size, batch_size, warps, report, **options
        )

    def _transcribe(
        self, items: list, speakers: list[str], featurise, beam_size: int, batch_size: int, warps, report, **options
    ) -> list[str | None]:
        """Transcripts of ``items`` (``featurise(item, warp)`` gives features; None where it fails),
        with test-time VTLN per speaker when ``warps`` lists candidates."""
        failed: dict[int, Skip] = {}
        texts = self._transcribe_all(items, speakers, featurise, beam_size, batch_size, warps, failed, **options)
        if report is not None:
            for index in sorted(failed):
                report.add(failed[index])
        return texts

    def _transcribe_all(
        self, items, speakers, featurise, beam_size, batch_size, warps, failed: dict[int, Skip], **options
    ) -> list[str | None]:
        if not warps:
            texts, _ = self._in_batches(items, featurise, beam_size, batch_size, False, failed, **options)
            return texts
        check_mel_filters(self.pipeline.config, warps)
        by_speaker: dict[str, list[int]] = defaultdict(list)
        for i, speaker in enumerate(speakers):
            by_speaker[speaker].append(i)
        texts: list[str | None] = [None] * len(items)
        for speaker, indices in by_speaker.items():
            own = [items[i] for i in indices]
            best = None
            scores = {}
            # Nearest to no warp first, so that a tie keeps the smaller change.
            for warp in sorted(set(warps), key=lambda w: (abs(w - 1.0), w)):
                warped = functools.partial(featurise, warp=warp)
                own_failed: dict[int, Skip] = {}
                found, logp = self._in_batches(own, warped, beam_size, batch_size, True, own_failed, **options)
                failed.update({indices[i]: skip for i, skip in own_failed.items()})
                read = [score for score in logp if score is not None]
                scores[warp] = sum(read) / len(read) if read else float("-inf")
                if best is None or scores[warp] > scores[best[0]]:
                    best = (warp, found)
            self.chosen_warps[speaker] = best[0]
            self.warp_scores[speaker] = dict(sorted(scores.items()))
            for i, text in zip(indices, best[1]):
                texts[i] = text
        return texts

    def _file_features(self, path: str | Path, warp: float | None = None) -> torch.Tensor:
        features = self.pipeline.from_file(path, warp=warp)
        if not bool(torch.isfinite(features).all()):
            raise NonFiniteAudioError(f"{path}: the features hold NaN or infinite values")
        return features

    def _utterance_features(self, utt: Utterance, warp: float | None = None) -> torch.Tensor:
        return utterance_features(utt, self.pipeline, warp=warp)

    def _in_batches(
        self, items: list, featurise, beam_size: int, batch_size: int, score: bool, failed: dict[int, Skip], **options
    ) -> tuple[list[str | None], list[float | None]]:
        """``featurise`` each item and decode ``batch_size`` of them at a time: a transcript per item,
        and with ``score`` its log-probability (else the list is empty). An item whose features
        cannot be made gets None for both and its :class:`Skip` in ``failed`` (by index)."""
        texts: list[str | None] = []
        scores: list[float | None] = []
        for start in range(0, len(items), batch_size):
            chunk: dict[int, torch.Tensor] = {}
            for index in range(start, min(start + batch_size, len(items))):
                try:
                    chunk[index] = featurise(items[index])
                except AudioError as err:
                    failed[index] = audio_skip(err)
            found, logp = self._decode(list(chunk.values()), beam_size, score, **options)
            decoded = dict(zip(chunk, zip(found, logp or [None] * len(found))))
            for index in range(start, min(start + batch_size, len(items))):
                text, logp_one = decoded.get(index, (None, None))
                texts.append(text)
                if score:
                    scores.append(logp_one)
        return texts, scores


def load_recogniser(checkpoint: str | Path | list[str | Path], device: str = "cpu") -> Recogniser:
    """Rebuild model, tokenizer and feature pipeline from ``checkpoint`` (eval mode, on ``device``).

    A list of several checkpoints gives one recogniser decoding with their
    :class:`~asr.models.ensemble.Ensemble`; they must have equal tokenizers and
    feature pipelines (config and MVN statistics), or :class:`CheckpointError`
    names the first that differs.
    """
    if isinstance(checkpoint, (str, Path)):
        return _load_one(checkpoint, device)
    if not checkpoint:
        raise CheckpointError("no checkpoint given")
    members = [_load_one(path, device) for path in checkpoint]
    first = members[0]
    for path, member in zip(checkpoint[1:], members[1:]):
        for what, mine, theirs in (
            ("tokenizer", member.tokenizer.state_dict(), first.tokenizer.state_dict()),
            ("feature pipeline", _inference_features(member.pipeline), _inference_features(first.pipeline)),
        ):
            if not _equal(mine, theirs):
                raise CheckpointError(
                    f"cannot decode {path} together with {checkpoint[0]}: their {what}s differ "
                    "(an ensemble's members must share the tokenizer and the features)"
                )
    if len(members) == 1:
        return first
    model = Ensemble([member.model for member in members]).eval()
    return Recogniser(model, first.tokenizer, first.pipeline, first.config, first.device)


# Feature settings used only in training: members may differ in them and still see the same features.
_TRAINING_ONLY_FEATURES = ("dither", "speed_perturb", "vtlp", "spec_augment")


def _inference_features(pipeline: FeaturePipeline) -> dict:
    state = pipeline.state_dict()
    config = {k: v for k, v in state["config"].items() if k not in _TRAINING_ONLY_FEATURES}
    return {**state, "config": config}


def _equal(a, b) -> bool:
    """Equality of nested dicts/lists that may hold tensors."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _load_one(checkpoint: str | Path, device: str) -> Recogniser:
    state = load_checkpoint(checkpoint)
    try:
        config = experiment_config_from_dict(state["config"])
        tokenizer = tokenizer_from_state_dict(state["tokenizer"])
        pipeline = FeaturePipeline.from_state_dict(state["features"])
        model = build_model(config.model, pipeline.feature_dim, tokenizer)
        model.load_state_dict(state["model"])
    except (ConfigError, ValueError, KeyError, RuntimeError) as err:
        # A checkpoint from another version of the code, or a hand-made one: say which file, on one line
        # (load_state_dict lists missing keys over several).
        detail = " ".join(str(err).split())
        raise CheckpointError(f"cannot rebuild a recogniser from {checkpoint}: {type(err).__name__}: {detail}") from err
    target = torch.device(device)
    return Recogniser(model.to(target).eval(), tokenizer, pipeline, config, target)


def warp_list(text: str) -> list[float]:
    """``--vtln-warps``: ``0.9,1.0,1.1`` or ``LOW:HIGH:STEP`` (both ends included) -> sorted warps."""
    try:
        if ":" in text:
            low, high, step = (float(x) for x in text.split(":"))
            if step <= 0 or high < low:
                raise ValueError
            count = round((high - low) / step) + 1
            warps = [round(low + i * step, 6) for i in range(count)]
        else:
            warps = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of warps or LOW:HIGH:STEP with LOW <= HIGH")
    bad = [w for w in warps if not 0.7 <= w <= 1.3]  # the bounds of features.vtlp
    if bad:
        raise argparse.ArgumentTypeError(f"warp {bad[0]:g} is outside [0.7, 1.3]")
    return sorted(set(warps))
