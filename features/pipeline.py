"""The one place where audio becomes features, for training and for inference alike.

    load -> downmix -> resample -> (if train: speed perturbation, rooms, noise, microphone, band limit,
         dither) -> fbank | MFCC -> deltas -> MVN -> (SpecAugment if train)

(with ``config.dither_inference``, dither outside training too, seeded by the audio itself)

Training, evaluation and ``transcribe`` all call :meth:`FeaturePipeline.from_waveform`
(or :meth:`~FeaturePipeline.from_file`, which is ``load_audio`` + ``from_waveform``);
``train`` switches on exactly the stochastic steps and nothing else, so the
features a model is evaluated on cannot drift from those it was trained on.
The checkpoint stores :meth:`FeaturePipeline.state_dict` (config + MVN
statistics), and :meth:`FeaturePipeline.from_state_dict` rebuilds the same
pipeline at inference time.

Two stages, so that the second can run batched on the model's device:

- :meth:`FeaturePipeline.prepare` (one utterance, CPU, where the audio is read): everything up to
  the samples the frames are cut from (downmix, resample, waveform augmentation, dither) and every
  random draw of the utterance (VTLP's warp, SpecAugment's warp and masks), in the order the
  generator has always been drawn from -> :class:`PreparedAudio`;
- :meth:`FeaturePipeline.features` (a padded :class:`AudioBatch`, wherever its tensors are):
  fbank | MFCC -> deltas -> MVN -> SpecAugment with those draws, each utterance over its own frames.

:meth:`~FeaturePipeline.from_waveform` is the two on a batch of one, so features computed per
utterance in a DataLoader worker and features computed for a batch on the GPU are the same code
(``features.compute_on``; :func:`features.config.resolve_compute_on`).

Output: ``(T, D)`` float32, T = 1 + (N - window) // shift frames of the
resampled waveform (100 per second with the default 10 ms shift),
D = :attr:`FeaturePipeline.feature_dim`.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from features.audio import AudioError, check_finite, load_audio, resample, to_mono
from features.augment import augment_waveform, room_impulse_responses
from features.config import FeatureConfig
from features.deltas import add_deltas_batch
from features.filterbank import INT16_SCALE, add_dither, base_features_batch, check_frame, check_mel_filters, num_frames
from features.frames import valid_frames
from features.mvn import GlobalStats, apply_mvn
from features.specaugment import SpecAugmentDraws, apply_batch, draw


@dataclass
class PreparedAudio:
    """One utterance made ready for :meth:`FeaturePipeline.features`, by :meth:`FeaturePipeline.prepare`."""

    samples: Tensor           # (N,) float32: mono at config.sample_rate, augmented, in int16 units, dithered
    num_frames: int           # feature frames the samples give (snip_edges)
    warp: float = 1.0         # VTLN factor of the mel filters (VTLP's draw, a test-time warp, or 1.0)
    spec_augment: SpecAugmentDraws | None = None  # the utterance's SpecAugment draws; None: not augmented


@dataclass
class AudioBatch:
    """Prepared utterances padded into one batch, from which :meth:`FeaturePipeline.features` computes
    the features of all of them at once (on the device the tensors are on).

    samples: (B, N) float32, zero after each row's length; lengths: (B,) long, samples per row;
    num_frames: (B,) long, feature frames per row; warps and spec_augment: one per row
    (spec_augment None when no row is augmented).
    """

    samples: Tensor
    lengths: Tensor
    num_frames: Tensor
    warps: list[float]
    spec_augment: list[SpecAugmentDraws] | None = None

    @classmethod
    def pad(cls, items: Sequence[PreparedAudio]) -> AudioBatch:
        if not items:
            raise ValueError("cannot pad an empty list of utterances")
        lengths = torch.tensor([item.samples.shape[0] for item in items], dtype=torch.long)
        samples = torch.zeros(len(items), int(lengths.max()), dtype=torch.float32)
        for row, item in enumerate(items):
            samples[row, : lengths[row]] = item.samples
        draws = [item.spec_augment for item in items]
        if any(d is None for d in draws) and not all(d is None for d in draws):
            raise ValueError("either every utterance of a batch has SpecAugment draws or none has")
        return cls(
            samples, lengths, torch.tensor([item.num_frames for item in items], dtype=torch.long),
            [item.warp for item in items], None if draws[0] is None else draws,
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> AudioBatch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> AudioBatch:
        return self._map(lambda t: t.pin_memory())

    def _map(self, move) -> AudioBatch:
        return AudioBatch(move(self.samples), move(self.lengths), move(self.num_frames), self.warps, self.spec_augment)

    def __len__(self) -> int:
        return len(self.warps)


class FeaturePipeline:
    """Audio -> normalised ``(T, D)`` features, configured by a :class:`FeatureConfig`.

    ``stats`` are the global MVN statistics (needed only for ``mvn: global``);
    they can also be set later (``pipeline.stats = ...``; training accumulates them
    with :func:`asr.data.dataset.compute_global_stats`).
    """

    def __init__(self, config: FeatureConfig, stats: GlobalStats | None = None):
        check_mel_filters(config)
        self.config = config
        self._stats: GlobalStats | None = None
        self.stats = stats

    @property
    def feature_dim(self) -> int:
        """D of the output features: mel bins (fbank) or cepstra (MFCC), times 3 with deltas."""
        return self.config.feature_dim

    @property
    def stats(self) -> GlobalStats | None:
        return self._stats

    @stats.setter
    def stats(self, stats: GlobalStats | None) -> None:
        if stats is not None and stats.dim != self.feature_dim:
            raise ValueError(
                f"global MVN statistics have dimension {stats.dim}, but these features have {self.feature_dim} "
                f"(kind={self.config.kind}, deltas={self.config.deltas}): were they computed with another config?"
            )
        self._stats = stats

    def from_waveform(
        self,
        waveform: Tensor,
        sample_rate: int,
        train: bool = False,
        generator: torch.Generator | None = None,
        warp: float | None = None,
        spec_augment: float = 1.0,
    ) -> Tensor:
        """``waveform (C, N)`` or ``(N,)``, float in [-1, 1] -> features ``(T, D)`` float32.

        ``train=True`` adds speed perturbation (if ``config.speed_perturb`` lists
        factors), the waveform augmentation of ``config.augment`` (rooms, noise,
        microphone, band limit; :mod:`features.augment`), dither (if ``config.dither > 0``),
        VTLP (if ``config.vtlp`` gives a range) and SpecAugment (if enabled),
        all drawn from ``generator``; ``train=False`` is deterministic: it dithers only with
        ``config.dither_inference``, with noise seeded by the waveform's samples (see
        :func:`audio_seeded_generator`), so the same audio always gives the same features.
        ``warp`` fixes the mel filters' VTLN factor instead (test-time VTLN, see
        :meth:`asr.inference.Recogniser.transcribe_utterances`); ``None`` means VTLP's draw
        in training and no warp (1.0) otherwise.
        """
        prepared = self.prepare(waveform, sample_rate, train=train, generator=generator, warp=warp,
                                spec_augment=spec_augment)
        return self.features(AudioBatch.pad([prepared]))[0][0]

    def from_file(
        self,
        path: str | Path,
        train: bool = False,
        generator: torch.Generator | None = None,
        warp: float | None = None,
    ) -> Tensor:
        """Features ``(T, D)`` of an audio file; exactly ``from_waveform(*load_audio(path), ...)``."""
        waveform, sample_rate = load_audio(path)
        try:
            return self.from_waveform(waveform, sample_rate, train=train, generator=generator, warp=warp)
        except AudioError as err:
            raise AudioError(f"{path}: {err}") from err

    def prepare_training(self) -> None:
        """Build what training-time augmentation needs once, in this process: the room bank of
        ``config.augment.reverb`` (seconds of simulation). Call it before DataLoader workers are
        forked, so they inherit it instead of each simulating the rooms again."""
        if self.config.augment.reverb.probability > 0:
            room_impulse_responses(self.config.sample_rate, self.config.augment.reverb)

    def raw_features(self, waveform: Tensor, sample_rate: int) -> Tensor:
        """Features ``(T, D)`` before MVN and SpecAugment, without dither: what global stats are accumulated on."""
        prepared = self.prepare(waveform, sample_rate, inference_dither=False)
        return self.features(AudioBatch.pad([prepared]), raw=True)[0][0]

    def prepare(
        self,
        waveform: Tensor,
        sample_rate: int,
        train: bool = False,
        generator: torch.Generator | None = None,
        warp: float | None = None,
        inference_dither: bool = True,
        spec_augment: float = 1.0,
    ) -> PreparedAudio:
        """The first stage of :meth:`from_waveform` (same arguments): downmix -> resample -> (speed
        perturbation, augmentation, VTLP's draw, dither) -> samples in int16 units, and SpecAugment's
        draws for the frames they will give. Outside training, dither only if ``inference_dither`` and
        the config asks. Everything random about the utterance is drawn here, from ``generator``.
        ``spec_augment``: the chance that SpecAugment (when enabled) masks this utterance, as the
        ``spec_augment`` schedule sets it (:mod:`asr.training.schedules`); below 1 it costs one draw.
        """
        if not torch.is_floating_point(waveform):
            raise AudioError(f"expected a float waveform in [-1, 1], got dtype {waveform.dtype}")
        check_finite(waveform, "waveform")
        rate = self.config.sample_rate
        mono = resample(to_mono(waveform), sample_rate, rate)
        if train and self.config.speed_perturb:
            mono = speed_perturb(mono, rate, self.config.speed_perturb, generator)
        if train and self.config.augment.enabled:
            mono = augment_waveform(mono, rate, self.config.augment, generator)
        dither = self.config.dither if train else 0.0
        if not train and inference_dither and self.config.dither_inference and self.config.dither > 0:
            dither, generator = self.config.dither, audio_seeded_generator(mono)
        if warp is None:
            warp = vtlp_factor(self.config.vtlp, generator) if train and self.config.vtlp else 1.0
        check_frame(mono, self.config)
        samples = add_dither(mono.float() * INT16_SCALE, dither, generator)
        frames = num_frames(samples.shape[0], self.config)
        draws = None
        if train and self.config.spec_augment.enabled and spec_augment > 0.0:
            if spec_augment >= 1.0 or float(torch.rand((), generator=generator)) < spec_augment:
                draws = draw(frames, self.feature_dim, self.config.spec_augment, generator)
        return PreparedAudio(samples, frames, warp, draws)

    def features(self, batch: AudioBatch, raw: bool = False) -> tuple[Tensor, Tensor]:
        """The second stage: ``batch`` -> ``(features (B, T, D) float32, lengths (B,) long)``, computed where
        ``batch``'s tensors are, with zeros after each row's length (the layout of
        :class:`asr.data.batching.Batch`). fbank | MFCC -> deltas -> MVN -> SpecAugment (with the draws
        ``prepare`` made); ``raw``: stop before MVN and SpecAugment. Padded frames take part in nothing.
        """
        lengths = batch.num_frames.to(batch.samples.device)
        # float32 even when called under autocast: bf16 mel energies would lose what dither adds
        with torch.autocast(device_type=batch.samples.device.type, enabled=False):
            return self._features(batch, lengths, raw)

    def _features(self, batch: AudioBatch, lengths: Tensor, raw: bool) -> tuple[Tensor, Tensor]:
        feats = base_features_batch(batch.samples, self.config, batch.warps)
        if self.config.deltas:
            feats = add_deltas_batch(feats, lengths)
        if not raw:
            feats = apply_mvn(feats, self.config.mvn, self.stats, lengths)
            if batch.spec_augment is not None:
                # After MVN, 0 is the mean; without MVN fill with the utterance mean (see features.specaugment).
                fill = "mean" if self.config.mvn == "none" else "zero"
                feats = apply_batch(feats, lengths, batch.spec_augment, fill=fill)
        return feats.masked_fill(~valid_frames(lengths, feats.shape[1])[..., None], 0.0), lengths

    def state_dict(self) -> dict:
        """``{"config": plain dict, "stats": GlobalStats state or None}``, for the model checkpoint."""
        return {
            "config": dataclasses.asdict(self.config),
            "stats": None if self.stats is None else self.stats.state_dict(),
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> FeaturePipeline:
        """Rebuild the pipeline a checkpoint was trained with (inverse of :meth:`state_dict`)."""
        if not isinstance(state, dict) or "config" not in state:
            raise ValueError("feature pipeline state must be a dict with a 'config' entry")
        config = _config_from_plain(state["config"])
        stats = state.get("stats")
        return cls(config, None if stats is None else GlobalStats.from_state_dict(stats))


def audio_seeded_generator(waveform: Tensor) -> torch.Generator:
    """A generator seeded by the CRC-32 of ``waveform``'s float32 samples: the same audio, the same noise,
    whatever else is decoded with it and in whatever order, and the global RNG left alone."""
    samples = waveform.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return torch.Generator().manual_seed(zlib.crc32(samples))


def speed_perturb(
    waveform: Tensor, sample_rate: int, factors: list[float], generator: torch.Generator | None = None
) -> Tensor:
    """``waveform (N,)`` played ``factor`` times as fast, ``factor`` drawn uniformly from ``factors``.

    Kaldi's speed perturbation: read the samples as if recorded at
    ``factor * sample_rate`` and resample to ``sample_rate``. Tempo and pitch
    change together; the result has about ``N / factor`` samples.
    """
    index = int(torch.randint(len(factors), (1,), generator=generator))
    factor = factors[index]
    if factor == 1.0:
        return waveform
    return resample(waveform, round(sample_rate * factor), sample_rate)


def vtlp_factor(bounds: list[float], generator: torch.Generator | None = None) -> float:
    """A VTLP warp factor drawn uniformly from ``bounds = [low, high]``."""
    low, high = bounds
    return low + (high - low) * float(torch.rand((), generator=generator))


def _config_from_plain(data: dict) -> FeatureConfig:
    # Keys missing from an older checkpoint take today's defaults; unknown keys are an error.
    return _dataclass_from_plain(FeatureConfig, data, "features")


def _dataclass_from_plain(cls: type, data: dict, prefix: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown feature config key '{prefix}.{unknown[0]}' in checkpoint")
    values = {}
    for name, value in data.items():
        nested = fields[name].default_factory if fields[name].default_factory is not dataclasses.MISSING else None
        if isinstance(nested, type) and dataclasses.is_dataclass(nested):
            value = _dataclass_from_plain(nested, value or {}, f"{prefix}.{name}")
        values[name] = value
    return cls(**values)
