"""A trained model ready to transcribe, rebuilt from one checkpoint file (or several, as an ensemble).

The checkpoint carries the config, the tokenizer and the feature pipeline
(with its global MVN statistics), so nothing else is needed. Features are
computed by :class:`features.pipeline.FeaturePipeline` exactly as in training
(``train=False``: no dither, no SpecAugment), optionally under a fixed VTLN
warp of the mel filters.

Several checkpoints decode as one :class:`asr.models.ensemble.Ensemble` (the
mean of their next-token distributions). They must share the tokenizer and the
feature pipeline (the same recipe trained with different seeds, say).

With ``prune=``, each model is pruned to some of its layers as it is loaded
(LayerDrop pruning, :mod:`asr.models.pruning`); the recogniser records what was
kept in ``pruned``.

What a researcher types, and ``python -m asr.transcribe`` runs (the same code,
:func:`transcribe_audio`)::

    from asr import Recogniser
    recogniser = Recogniser.load("exp/fsdd_las/avg_last5.pt")
    texts = recogniser.transcribe(["a.wav", "b.flac"], beam=4)

:meth:`Recogniser.decode` is the layer below: utterances in, a :class:`Transcription`
(with scores and skips) out, under one :class:`~asr.decoding.DecodingOptions`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asr.checkpoints.io import CheckpointError, load_checkpoint
from asr.config import ConfigError
from asr.data.batching import collate
from asr.data.dataset import audio_skip, utterance_features
from asr.data.tokenizer import Tokenizer, tokenizer_from_state_dict
from asr.data.utterance import InMemoryAudio, Utterance
from asr.decoding import DecodingOptions, ctc_best_path, search, sequence_log_probs
from asr.experiment import ExperimentConfig, experiment_config_from_dict
from asr.inference.interface import AudioInput, Transcription
from asr.inference.segmentation import recording_pieces
from asr.inference.settings import DecodeSettings, settings_from_options
from asr.inference.strategies import CorpusResult, transcribe_speakers
from asr.models.ensemble import Ensemble
from asr.models.pruning import LayerPruning, PrunedModel, count_parameters, parse_pruning, prune_model
from asr.models.registry import build_model
from features.audio import AudioError
from features.pipeline import FeaturePipeline

logger = logging.getLogger(__name__)


SPEAKER = "files"  # what the recordings of one transcribe call are taken as, for VTLN and adaptation


@dataclass(frozen=True)
class Recogniser:
    """A model in eval mode with the tokenizer and feature pipeline it was trained with (what the strategies
    below it see of one: :class:`~asr.inference.interface.RecogniserProtocol`)."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    pipeline: FeaturePipeline
    config: ExperimentConfig  # the first checkpoint's, for an ensemble
    device: torch.device
    pruned: tuple[PrunedModel, ...] = ()  # per member, what LayerDrop pruning kept; empty: not pruned
    # The longest and the mean utterance (seconds) the model was trained on (the shortest such among an
    # ensemble's members): longer recordings are decoded by default in pieces of at most the mean, as
    # many words as the decoder has emitted in most of its training (docs/studies/long_recordings.md).
    # None: not known (longest: decoded whole; mean: pieces of the longest).
    trained_seconds: float | None = None
    typical_seconds: float | None = None

    @property
    def parameters(self) -> int:
        """Parameters of the model(s) decoding, after any pruning."""
        return count_parameters(self.model)

    def members(self) -> list[torch.nn.Module]:
        """The models decoding together (one, or an ensemble's members)."""
        return list(self.model.models) if isinstance(self.model, Ensemble) else [self.model]

    def with_models(self, models: list[torch.nn.Module]) -> Recogniser:
        """This recogniser (tokenizer, features, config) decoding with ``models`` instead."""
        model = Ensemble(models) if len(models) > 1 else models[0]
        return Recogniser(
            model.eval(), self.tokenizer, self.pipeline, self.config, self.device, self.pruned,
            self.trained_seconds, self.typical_seconds,
        )

    def long_form(self, options: DecodingOptions) -> tuple[float, float] | None:
        """``(longest decoded whole, longest piece)`` in seconds under ``options``, or None when every
        recording is decoded whole: ``segment_seconds`` for both when given (0: None), else the longest
        and the mean utterance the model was trained on."""
        if options.segment_seconds is not None:
            return (options.segment_seconds, options.segment_seconds) if options.segment_seconds else None
        if self.trained_seconds is None:
            return None
        return self.trained_seconds, min(self.typical_seconds or self.trained_seconds, self.trained_seconds)

    @classmethod
    def load(cls, checkpoint: str | Path | Sequence[str | Path], device: str = "cpu",
             prune: LayerPruning | str | Sequence[str] | None = None) -> Recogniser:
        """The recogniser of ``checkpoint`` (several: one ensemble of them) on ``device``: :func:`load_recogniser`.
        ``prune`` keeps some layers of a model trained with LayerDrop, as ``--prune-layers`` does
        (``"every_other"``, ``"enc:0,2 dec:0"``, or a :class:`LayerPruning`)."""
        if isinstance(prune, (str, list, tuple)):
            prune = parse_pruning(prune.split() if isinstance(prune, str) else list(prune))
        paths = [checkpoint] if isinstance(checkpoint, (str, Path)) else list(checkpoint)
        return load_recogniser(paths[0] if len(paths) == 1 else paths, device, prune)

    def transcribe(self, audio: AudioInput | Sequence[AudioInput], **options) -> list[str]:
        """The transcript of each recording in ``audio`` (one, or a list), in order.

        ``options`` are ``asr.transcribe``'s decoding options, named as on its command line with
        underscores: ``beam=4``, ``ctc_weight=0.3``, ``segment_seconds=2.5``, ``vtln_warps="0.8:1.2:0.05"``,
        ``adapt_rounds=3``, ``batch_size=8``, ``decode_config="decode.yaml"`` ...
        (:data:`asr.inference.settings.OPTIONS`); a bad one is a ValueError naming it. With VTLN or
        adaptation the recordings are taken as one speaker's. A recording that cannot be used (missing,
        damaged, NaN samples, too short) raises :class:`~features.audio.AudioError` naming it, after
        the others were decoded."""
        settings = settings_from_options(options)
        if settings.prune_layers is not None:
            raise ValueError("prune_layers: a model is pruned where it is loaded: Recogniser.load(checkpoint, prune=...)")
        settings.check_for(self, "this model")
        single = isinstance(audio, (str, Path, np.ndarray, torch.Tensor, tuple, Utterance))
        result = transcribe_audio(self, [audio] if single else list(audio), settings)
        if result.skipped:
            first = result.skipped[0]
            more = f" (and {len(result.skipped) - 1} more)" if len(result.skipped) > 1 else ""
            raise AudioError(f"{first.message}{more}")
        return result.texts

    def utterances(self, audio: Sequence[AudioInput]) -> list[Utterance]:
        """``audio`` (:data:`AudioInput` items) as the utterances of one speaker, :data:`SPEAKER`: a path
        under its own name with the duration its header gives (0 where it cannot be read: decoding says
        why); an array ``audio[i]`` at the model's sample rate, or a ``(samples, rate)`` pair."""
        found = []
        for index, item in enumerate(audio):
            if isinstance(item, Utterance):
                found.append(item)
            elif isinstance(item, (str, Path)):
                found.append(Utterance(str(item), Path(item), "", _duration(Path(item)), SPEAKER))
            else:
                samples, rate = item if isinstance(item, tuple) else (item, self.pipeline.config.sample_rate)
                waveform = torch.as_tensor(np.asarray(samples, dtype=np.float32))
                if waveform.dim() == 1:
                    waveform = waveform.unsqueeze(0)  # (N,) -> (1, N): channels first, as load_audio gives
                if waveform.dim() != 2:
                    raise ValueError(f"audio[{index}]: samples must be (N,) or (channels, N), got {tuple(waveform.shape)}")
                found.append(Utterance(f"audio[{index}]", InMemoryAudio(waveform, int(rate)), "",
                                       waveform.shape[-1] / int(rate), SPEAKER))
        return found

    def features(self, utterance: Utterance, warp: float | None = None) -> torch.Tensor:
        """``(T, D)`` features of one utterance as the model expects them (an :class:`AudioError` names the file)."""
        return utterance_features(utterance, self.pipeline, warp=warp)

    @torch.no_grad()
    def decode(
        self,
        utterances: list[Utterance],
        options: DecodingOptions = DecodingOptions(),
        warp: float | None = None,
        score: bool = False,
        batch_size: int = 16,
    ) -> Transcription:
        """Decode ``utterances`` ``batch_size`` at a time, at mel warp ``warp`` (None: no warp).

        An utterance whose audio fails where it is read (damaged past its header,
        NaN samples, too short) costs nothing else: its transcript is None.
        Each utterance is encoded and searched under its own length mask, so
        batching changes results only by float rounding. One longer than
        :meth:`long_form` allows is decoded in pieces cut at pauses (:meth:`_transcribe_long`).
        """
        result = Transcription([], [] if score else None)
        long_form = self.long_form(options)
        for start in range(0, len(utterances), batch_size):
            readable: dict[int, torch.Tensor] = {}
            decoded: dict[int, tuple[str, float | None]] = {}
            for index in range(start, min(start + batch_size, len(utterances))):
                utterance = utterances[index]
                try:
                    if long_form is not None and utterance.duration > long_form[0]:
                        decoded[index] = self._transcribe_long(utterance, options, warp, score, batch_size, long_form)
                    else:
                        readable[index] = self.features(utterance, warp)
                except AudioError as err:
                    result.skipped[index] = audio_skip(err)
            texts, scores = self._decode(list(readable.values()), options, score)
            decoded.update(zip(readable, zip(texts, scores)))
            for index in range(start, min(start + batch_size, len(utterances))):
                text, logp = decoded.get(index, (None, None))
                result.texts.append(text)
                if score:
                    result.scores.append(logp)
        return result

    def _transcribe_long(
        self, utterance: Utterance, options: DecodingOptions, warp: float | None, score: bool, batch_size: int,
        long_form: tuple[float, float],
    ) -> tuple[str, float | None]:
        """One recording longer than ``long_form[0]``, decoded in pieces of at most ``long_form[1]`` cut at pauses
        (:mod:`asr.inference.segmentation`), ``batch_size`` pieces at a time, each read alone: memory
        stays that of one batch of pieces, whatever the length. The transcript is the pieces' joined
        with a space, the score their sum. An :class:`AudioError` names the utterance."""
        texts: list[str] = []
        total, count = 0.0, 0
        batch: list[torch.Tensor] = []

        def flush() -> None:
            nonlocal total
            found, scores = self._decode(batch, options, score)
            texts.extend(found)
            total += sum(scores) if score else 0.0
            batch.clear()

        try:
            for waveform, rate in recording_pieces(utterance.audio, long_form[1]):
                batch.append(self.pipeline.from_waveform(waveform, rate, warp=warp))
                count += 1
                if len(batch) == batch_size:
                    flush()
        except AudioError as err:
            raise type(err)(f"{utterance.id}: {err}") from err
        if batch:
            flush()
        logger.info(
            "%s: %.1f s, longer than %.1f s, decoded in %d pieces of at most %.1f s cut at pauses%s", utterance.id,
            utterance.duration, long_form[0], count, long_form[1],
            "" if count else " (no speech found)",
        )
        if options.segment_seconds is None and self.typical_seconds is None:
            logger.warning(
                "the checkpoint does not record its training utterances' lengths (written before 2026-11-24): "
                "pieces of up to data.max_duration may hold more words than the decoder learnt to emit; "
                "--segment-seconds with the mean training utterance is more accurate (docs/studies/long_recordings.md)"
            )
        return " ".join(text for text in texts if text), total if score else None

    @torch.no_grad()
    def transcribe_features(self, features: list[torch.Tensor], options: DecodingOptions = DecodingOptions()) -> list[str]:
        """Decode a list of ``(T, D)`` feature matrices as one padded batch; one transcript each."""
        return self._decode(features, options, score=False)[0]

    @torch.no_grad()
    def ctc_best_paths(self, utterances: list[Utterance], warp: float | None = None, batch_size: int = 16) -> list[str]:
        """The CTC head's best-path transcript of each utterance (:func:`asr.decoding.ctc_best_path`)."""
        texts: list[str] = []
        for start in range(0, len(utterances), batch_size):
            encoder = self._encode([self.features(u, warp) for u in utterances[start : start + batch_size]])
            texts += [self.tokenizer.decode(path) for path in ctc_best_path(encoder, self.model.pad_id)]
        return texts

    def _decode(self, features: list[torch.Tensor], options: DecodingOptions, score: bool):
        """Transcripts of a batch and the model's log-probability of each (a list of None without ``score``)."""
        if not features:
            return [], []
        encoder = self._encode(features)
        hyps = search(self.model, encoder, options)
        texts = [self.tokenizer.decode(hyp) for hyp in hyps]
        if not score:
            return texts, [None] * len(texts)
        return texts, sequence_log_probs(self.model, encoder, hyps, options.ctc_weight).tolist()

    def _encode(self, features: list[torch.Tensor]):
        """The encoder output of ``(T, D)`` feature matrices padded into one batch."""
        batch = collate(
            [{"id": str(i), "features": f, "tokens": torch.zeros(0, dtype=torch.long)} for i, f in enumerate(features)]
        ).to(self.device)
        return self.model.encode(batch.features, batch.feature_lengths)


def transcribe_audio(recogniser: Recogniser, audio: list[AudioInput], settings: DecodeSettings,
                     progress: Callable[[int], None] | None = None) -> CorpusResult:
    """Recordings (files, arrays: :meth:`Recogniser.utterances`) transcribed as ``settings`` say, taken as
    one speaker's for VTLN and adaptation: what ``python -m asr.transcribe`` and
    :meth:`Recogniser.transcribe` both run."""
    return transcribe_speakers(recogniser, recogniser.utterances(audio), settings.strategy(), settings.decoding,
                               settings.batch_size, progress)


def _duration(path: Path) -> float:
    """Seconds of audio from the file's header (0 when it cannot be read: decoding will say why)."""
    import soundfile

    try:
        info = soundfile.info(str(path))
        return info.frames / info.samplerate
    except (RuntimeError, OSError, ValueError):
        return 0.0


def load_recogniser(
    checkpoint: str | Path | list[str | Path], device: str = "cpu", prune: LayerPruning | None = None
) -> Recogniser:
    """Rebuild model, tokenizer and feature pipeline from ``checkpoint`` (eval mode, on ``device``),
    each model pruned to the layers ``prune`` keeps (None: all; a ValueError says why it cannot be).

    A list of several checkpoints gives one recogniser decoding with their
    :class:`~asr.models.ensemble.Ensemble`; they must have equal tokenizers and
    feature pipelines (config and MVN statistics; training-only settings may
    differ), or :class:`CheckpointError` names the first that differs.
    """
    if isinstance(checkpoint, (str, Path)):
        return _load_one(checkpoint, device, prune)
    if not checkpoint:
        raise CheckpointError("no checkpoint given")
    members = [_load_one(path, device, prune) for path in checkpoint]
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
    pruned = tuple(record for member in members for record in member.pruned)
    longest = [member.trained_seconds for member in members if member.trained_seconds is not None]
    mean = [member.typical_seconds for member in members if member.typical_seconds is not None]
    return dataclasses.replace(
        first.with_models([member.model for member in members]), pruned=pruned,
        trained_seconds=min(longest, default=None), typical_seconds=min(mean, default=None),
    )


# Feature settings used only in training: members may differ in them and still see the same features
# (dither too, unless dither_inference applies it outside training).
_TRAINING_ONLY_FEATURES = ("dither", "speed_perturb", "vtlp", "spec_augment", "augment")


def _inference_features(pipeline: FeaturePipeline) -> dict:
    state = pipeline.state_dict()
    training_only = set(_TRAINING_ONLY_FEATURES) - ({"dither"} if pipeline.config.dither_inference else set())
    config = {k: v for k, v in state["config"].items() if k not in training_only}
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


def _load_one(checkpoint: str | Path, device: str, prune: LayerPruning | None) -> Recogniser:
    return recogniser_from_payload(load_checkpoint(checkpoint), checkpoint, device, prune)


def recogniser_from_payload(state: dict, checkpoint: str | Path, device: str = "cpu",
                            prune: LayerPruning | None = None) -> Recogniser:
    """A recogniser from a checkpoint's payload already in memory (an average not yet written, say);
    ``checkpoint`` names it in errors."""
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
    pruned = (prune_model(model, prune, str(checkpoint)),) if prune is not None else ()
    target = torch.device(device)
    # Checkpoints from before 2026-11-24 do not record them: the recipe's limit on training utterances bounds both.
    longest = state.get("longest_utterance_seconds", config.data.max_duration)
    mean = state.get("mean_utterance_seconds")
    return Recogniser(model.to(target).eval(), tokenizer, pipeline, config, target, pruned, longest, mean)
