"""Feature extraction, importable on its own: audio I/O, fbank/MFCC, deltas, MVN, SpecAugment."""

from features.config import FeatureConfig, SpecAugmentConfig

__all__ = ["FeatureConfig", "SpecAugmentConfig"]
