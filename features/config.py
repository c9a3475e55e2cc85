"""Feature extraction options (the ``features:`` section of a recipe).

Both dataclasses check their values on construction and raise ``ValueError``
naming the offending field; ``asr.config.from_dict`` turns that into a
``ConfigError`` carrying the dotted key (``features.num_ceps``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FEATURE_KINDS = ("fbank", "mfcc")
MVN_MODES = ("none", "utterance", "global")
COMPUTE_ON = ("auto", "loader", "device")


@dataclass
class SpecAugmentConfig:
    """SpecAugment (Park et al. 2019), applied in training only, after MVN."""

    enabled: bool = False         # masks training utterances (the share: train.schedules.spec_augment)
    freq_masks: int = 2           # number of frequency masks per utterance
    freq_mask_width: int = 27     # maximum width F (bins), LibriSpeech "LD" policy
    time_masks: int = 2           # number of time masks per utterance
    time_mask_width: int = 40     # maximum width T (frames)
    time_mask_ratio: float = 0.2  # a time mask never covers more than this fraction of the utterance
    time_warp: int = 0            # maximum warp W in frames; 0 disables time warping

    def __post_init__(self) -> None:
        for name in ("freq_masks", "freq_mask_width", "time_masks", "time_mask_width", "time_warp"):
            if getattr(self, name) < 0:
                raise ValueError(f"spec_augment.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.time_mask_ratio <= 1.0:
            raise ValueError(f"spec_augment.time_mask_ratio must be in [0, 1], got {self.time_mask_ratio}")


def _check_range(name: str, values: list[float], low: float, high: float) -> None:
    """``values`` must be ``[a, b]`` with ``low <= a <= b <= high``; ``name`` is named in the error."""
    if not (len(values) == 2 and low <= values[0] <= values[1] <= high):
        raise ValueError(f"{name} must be [low, high] with {low:g} <= low <= high <= {high:g}, got {values}")


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclass
class ReverbConfig:
    """Training-only room simulation: the utterance as a microphone in a simulated room would pick it up.

    A bank of ``rooms`` room impulse responses is simulated once per process with
    pyroomacoustics (shoebox rooms, image-source method); each augmented utterance is
    convolved with one drawn from the bank. See :mod:`features.augment`.
    """

    probability: float = 0.0  # share of training utterances reverberated; 0 disables
    rooms: int = 100          # size of the bank; each room has its own size, RT60 and positions
    rt60: list[float] = field(default_factory=lambda: [0.1, 0.6])  # seconds, uniform per room
    distance_m: list[float] = field(default_factory=lambda: [0.3, 2.0])  # talker to microphone, uniform per room

    def __post_init__(self) -> None:
        _check_probability("augment.reverb.probability", self.probability)
        if self.rooms < 1:
            raise ValueError(f"augment.reverb.rooms must be >= 1, got {self.rooms}")
        _check_range("augment.reverb.rt60", self.rt60, 0.05, 2.0)
        _check_range("augment.reverb.distance_m", self.distance_m, 0.1, 5.0)


@dataclass
class MicrophoneConfig:
    """Training-only microphone colouring: a high-pass (small capsules and their housing lose the bass)
    and ``bands`` peaking filters of random centre and gain (resonances of a cheap capsule and its case)."""

    probability: float = 0.0  # share of training utterances coloured; 0 disables
    highpass_hz: list[float] = field(default_factory=lambda: [50.0, 400.0])  # uniform per utterance
    bands: int = 2                # peaking filters per utterance
    gain_db: list[float] = field(default_factory=lambda: [-10.0, 10.0])  # per band, uniform

    def __post_init__(self) -> None:
        _check_probability("augment.microphone.probability", self.probability)
        _check_range("augment.microphone.highpass_hz", self.highpass_hz, 1.0, 2000.0)
        if self.bands < 0:
            raise ValueError(f"augment.microphone.bands must be >= 0, got {self.bands}")
        _check_range("augment.microphone.gain_db", self.gain_db, -30.0, 30.0)


@dataclass
class NoiseConfig:
    """Training-only additive noise at a random signal-to-noise ratio and spectral colour."""

    probability: float = 0.0  # share of training utterances with noise added; 0 disables
    # dB, uniform per utterance; the signal power is the whole utterance's mean power (silences included)
    snr_db: list[float] = field(default_factory=lambda: [5.0, 30.0])
    # noise power spectrum ~ 1 / f^colour, colour uniform in this range: 0 white, 1 pink, 2 brown
    colour: list[float] = field(default_factory=lambda: [0.0, 2.0])

    def __post_init__(self) -> None:
        _check_probability("augment.noise.probability", self.probability)
        _check_range("augment.noise.snr_db", self.snr_db, -20.0, 100.0)
        _check_range("augment.noise.colour", self.colour, 0.0, 3.0)


@dataclass
class BandLimitConfig:
    """Training-only band limiting: audio recorded or stored at a low rate has nothing above half that rate.

    A band-limited utterance either passes through ``narrow_rate`` (resampled down and back, exactly
    what an 8 kHz recording played at 16 kHz went through) or through a low-pass filter with a cutoff
    uniform in ``cutoff_hz`` (an 8th-order Butterworth, applied forward and backward so nothing moves in time).
    """

    probability: float = 0.0   # share of training utterances band-limited; 0 disables
    narrow_share: float = 0.5  # of those, the share resampled through narrow_rate; the rest low-passed
    narrow_rate: int = 8000    # Hz
    cutoff_hz: list[float] = field(default_factory=lambda: [3000.0, 7000.0])  # low-pass cutoff, uniform in this range

    def __post_init__(self) -> None:
        _check_probability("augment.band_limit.probability", self.probability)
        _check_probability("augment.band_limit.narrow_share", self.narrow_share)
        if self.narrow_rate < 1000:
            raise ValueError(f"augment.band_limit.narrow_rate must be >= 1000 Hz, got {self.narrow_rate}")
        _check_range("augment.band_limit.cutoff_hz", self.cutoff_hz, 100.0, 48000.0)


@dataclass
class AugmentConfig:
    """Training-only waveform augmentation, applied in this order after speed perturbation:
    room (reverb), noise, microphone, band limit. All off by default. See :mod:`features.augment`."""

    reverb: ReverbConfig = field(default_factory=ReverbConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    microphone: MicrophoneConfig = field(default_factory=MicrophoneConfig)
    band_limit: BandLimitConfig = field(default_factory=BandLimitConfig)

    @property
    def enabled(self) -> bool:
        return any(part.probability > 0 for part in (self.reverb, self.noise, self.microphone, self.band_limit))


@dataclass
class FeatureConfig:
    """How audio becomes a (T, D) feature matrix; one code path for training and inference."""

    kind: Literal["fbank", "mfcc"] = "fbank"  # log mel filterbank energies, or MFCCs computed from them
    sample_rate: int = 16000       # audio at another rate is resampled to this
    num_mel_bins: int = 80         # mel filters for fbank (and the filterbank under MFCC)
    num_ceps: int = 13             # MFCC coefficients: 13 or 40
    frame_length_ms: float = 25.0  # analysis window
    frame_shift_ms: float = 10.0   # 10 ms shift -> 100 frames per second
    deltas: bool = False           # append delta and delta-delta (triples the dimension)
    dither: float = 0.0            # Gaussian dither in int16 units (Kaldi's 1.0 = one LSB) in training; 0 disables
    # Dither outside training too (validation, evaluation, transcription), as Kaldi does: the same
    # amount, the noise seeded by the audio's own samples, so a recording always gives the same
    # features. Without it, near-silent audio (digital silence, an 8 kHz recording's empty upper band)
    # falls far below the dithered floor every training utterance had.
    dither_inference: bool = False
    # Training-only speed perturbation (Ko et al. 2015, as Kaldi/ESPnet do it): each utterance is
    # resampled by a factor drawn from this list, which changes tempo and pitch together
    # (0.9 = 10% slower and lower). [] disables; [0.9, 1.0, 1.1] is the usual choice.
    speed_perturb: list[float] = field(default_factory=list)
    # Training-only vocal tract length perturbation (VTLP, Jaitly & Hinton 2013): the mel filters
    # of each utterance are placed by Kaldi's piecewise-linear VTLN warp with a factor drawn
    # uniformly from this [low, high] range. Unlike speed perturbation it keeps tempo and duration
    # and moves only the spectral envelope. [] disables; [0.9, 1.1] is the paper's range.
    vtlp: list[float] = field(default_factory=list)
    mvn: Literal["none", "utterance", "global"] = "none"  # mean-variance normalisation (docs/normalization.md)
    spec_augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    # Training-only waveform augmentation (rooms, noise, microphones, band limits), after speed perturbation.
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # Where training and validation compute the features. "loader": DataLoader workers compute them
    # per utterance on CPU. "device": workers only read the audio (decode, downmix, resample, and the
    # waveform-level augmentation: speed perturbation, rooms, noise, microphones, band limits, dither)
    # and draw every random number of the utterance from its own (seed, epoch, index) generator;
    # fbank/MFCC, VTLP's warped filters, deltas, MVN and SpecAugment then run batched on the model's
    # device in the training process. Why: a GPU consumes speech several times faster than a few CPU
    # cores can turn it into features (docs/benchmarks.md, "Data loading"). Both are the same code
    # (features.pipeline), so they give the same features within float rounding. "auto": "device"
    # when training on CUDA, "loader" otherwise; the run's config.yaml records what it resolved to.
    # Inference (asr.evaluate, asr.transcribe) always computes features per utterance on CPU.
    compute_on: Literal["auto", "loader", "device"] = "auto"

    def __post_init__(self) -> None:
        if self.kind not in FEATURE_KINDS:
            raise ValueError(f"kind must be one of {FEATURE_KINDS}, got {self.kind!r}")
        if self.mvn not in MVN_MODES:
            raise ValueError(f"mvn must be one of {MVN_MODES}, got {self.mvn!r}")
        if self.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {self.sample_rate}")
        if self.num_mel_bins < 1:
            raise ValueError(f"num_mel_bins must be >= 1, got {self.num_mel_bins}")
        if self.kind == "mfcc" and not 1 <= self.num_ceps <= self.num_mel_bins:
            # The DCT keeps the first num_ceps of num_mel_bins coefficients.
            raise ValueError(f"num_ceps must be in [1, num_mel_bins={self.num_mel_bins}], got {self.num_ceps}")
        if self.frame_length_ms <= 0 or self.frame_shift_ms <= 0:
            raise ValueError(
                "frame_length_ms and frame_shift_ms must be positive, "
                f"got {self.frame_length_ms}, {self.frame_shift_ms}"
            )
        if self.dither < 0:
            raise ValueError(f"dither must be >= 0, got {self.dither}")
        if self.compute_on not in COMPUTE_ON:
            raise ValueError(f"compute_on must be one of {COMPUTE_ON}, got {self.compute_on!r}")
        if not isinstance(self.dither_inference, bool):
            raise ValueError(f"dither_inference must be true or false, got {self.dither_inference!r}")
        for factor in self.speed_perturb:
            if not 0.5 <= factor <= 2.0:
                raise ValueError(f"speed_perturb factors must be in [0.5, 2.0], got {factor}")
        if self.vtlp and not (len(self.vtlp) == 2 and 0.7 <= self.vtlp[0] <= self.vtlp[1] <= 1.3):
            raise ValueError(f"vtlp must be [] or [low, high] with 0.7 <= low <= high <= 1.3, got {self.vtlp}")

    @property
    def base_dim(self) -> int:
        """Coefficients per frame before deltas: mel bins for fbank, cepstra for MFCC."""
        return self.num_mel_bins if self.kind == "fbank" else self.num_ceps

    @property
    def feature_dim(self) -> int:
        """D of the (T, D) features the pipeline emits (deltas triple it)."""
        return self.base_dim * (3 if self.deltas else 1)


def resolve_compute_on(compute_on: str, device_type: str) -> Literal["loader", "device"]:
    """``features.compute_on`` for a run training on ``device_type`` (``"cuda"``, ``"cpu"``, ...):
    ``auto`` is ``device`` on CUDA, where the GPU would otherwise wait for the loader's CPU cores,
    and ``loader`` elsewhere, where the device is the CPU the workers would run on anyway."""
    if compute_on not in COMPUTE_ON:
        raise ValueError(f"features.compute_on must be one of {COMPUTE_ON}, got {compute_on!r}")
    if compute_on == "auto":
        return "device" if device_type == "cuda" else "loader"
    return compute_on
