"""A trained model ready to transcribe, rebuilt from one checkpoint file.

The checkpoint carries the config, the tokenizer and the feature pipeline
(with its global MVN statistics), so nothing else is needed. Features are
computed by :class:`features.pipeline.FeaturePipeline` exactly as in training
(``train=False``: no dither, no SpecAugment).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from asr.checkpoint import CheckpointError, load_checkpoint
from asr.config import ConfigError
from asr.data.batching import collate
from asr.data.dataset import load_utterance_audio
from asr.data.tokenizer import Tokenizer, tokenizer_from_state_dict
from asr.data.utterance import Utterance
from asr.decoding import decode
from asr.experiment import ExperimentConfig, build_model, experiment_config_from_dict
from features.audio import AudioError
from features.pipeline import FeaturePipeline


@dataclass
class Recogniser:
    """A model in eval mode with the tokenizer and feature pipeline it was trained with."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    pipeline: FeaturePipeline
    config: ExperimentConfig
    device: torch.device

    @torch.no_grad()
    def transcribe_features(self, features: list[torch.Tensor], beam_size: int = 1, **options) -> list[str]:
        """Decode a list of ``(T, D)`` feature matrices as one padded batch; one transcript each.

        ``options`` go to :func:`asr.decoding.decode` (``ctc_weight``,
        ``length_penalty``, ``max_len_ratio``, ...). Each utterance is encoded and
        searched under its own length mask, so batching changes results only
        by float rounding.
        """
        if not features:
            return []
        batch = collate(
            [{"id": str(i), "features": f, "tokens": torch.zeros(0, dtype=torch.long)} for i, f in enumerate(features)]
        ).to(self.device)
        hyps = decode(self.model, batch.features, batch.feature_lengths, beam_size=beam_size, **options)
        return [self.tokenizer.decode(h) for h in hyps]

    def transcribe_files(
        self, paths: list[str | Path], beam_size: int = 1, batch_size: int = 16, **options
    ) -> list[str]:
        """Transcribe audio files (any sample rate, wav or flac), ``batch_size`` at a time."""
        return self._in_batches(paths, self.pipeline.from_file, beam_size, batch_size, **options)

    def transcribe_utterances(
        self, utterances: list[Utterance], beam_size: int = 1, batch_size: int = 16, **options
    ) -> list[str]:
        """Transcribe corpus utterances (files or in-memory audio), ``batch_size`` at a time."""
        return self._in_batches(utterances, self._utterance_features, beam_size, batch_size, **options)

    def _utterance_features(self, utt: Utterance) -> torch.Tensor:
        waveform, rate = load_utterance_audio(utt)
        try:
            return self.pipeline.from_waveform(waveform, rate)
        except AudioError as err:
            raise AudioError(f"{utt.source} (utterance {utt.id}): {err}") from err

    def _in_batches(self, items: list, featurise, beam_size: int, batch_size: int, **options) -> list[str]:
        """``featurise`` each item and decode ``batch_size`` of them at a time; one transcript per item."""
        texts: list[str] = []
        for start in range(0, len(items), batch_size):
            chunk = [featurise(item) for item in items[start : start + batch_size]]
            texts += self.transcribe_features(chunk, beam_size=beam_size, **options)
        return texts

def load_recogniser(checkpoint: str | Path, device: str = "cpu") -> Recogniser:
    """Rebuild model, tokenizer and feature pipeline from ``checkpoint`` (eval mode, on ``device``)."""
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
