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


@dataclass
class SpecAugmentConfig:
    """SpecAugment (Park et al. 2019), applied in training only, after MVN."""

    enabled: bool = False
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


@dataclass
class FeatureConfig:
    """How audio becomes a (T, D) feature matrix; one code path for training and inference."""

    kind: Literal["fbank", "mfcc"] = "fbank"
    sample_rate: int = 16000       # audio at another rate is resampled to this
    num_mel_bins: int = 80         # mel filters for fbank (and the filterbank under MFCC)
    num_ceps: int = 13             # MFCC coefficients: 13 or 40
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0   # 10 ms shift -> 100 frames per second
    deltas: bool = False           # append delta and delta-delta (triples the dimension)
    dither: float = 0.0            # training-only Gaussian dither in int16 units (Kaldi's 1.0 = one LSB); 0 disables
    # Training-only speed perturbation (Ko et al. 2015, as Kaldi/ESPnet do it): each utterance is
    # resampled by a factor drawn from this list, which changes tempo and pitch together
    # (0.9 = 10% slower and lower). [] disables; [0.9, 1.0, 1.1] is the usual choice.
    speed_perturb: list[float] = field(default_factory=list)
    # Training-only vocal tract length perturbation (VTLP, Jaitly & Hinton 2013): the mel filters
    # of each utterance are placed by Kaldi's piecewise-linear VTLN warp with a factor drawn
    # uniformly from this [low, high] range. Unlike speed perturbation it keeps tempo and duration
    # and moves only the spectral envelope. [] disables; [0.9, 1.1] is the paper's range.
    vtlp: list[float] = field(default_factory=list)
    mvn: Literal["none", "utterance", "global"] = "none"
    spec_augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)

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
