"""Feature extraction, importable on its own: audio I/O, fbank/MFCC, deltas, MVN, SpecAugment.

Everything that turns audio into model input goes through :class:`FeaturePipeline`
(``features/pipeline.py``), for training and inference alike.
"""

from features.audio import AudioError, load_audio
from features.config import FeatureConfig, SpecAugmentConfig
from features.mvn import GlobalStats
from features.pipeline import FeaturePipeline

__all__ = ["AudioError", "FeatureConfig", "FeaturePipeline", "GlobalStats", "SpecAugmentConfig", "load_audio"]
