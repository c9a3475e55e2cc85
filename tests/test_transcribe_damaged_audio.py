"""``python -m asr.transcribe`` on a WAV file cut short, as a user runs it: a process of its own.

The reader's side (one warning per file, the training set skipping it by name) is in
tests/test_bad_data.py; here the whole command: the warning reaches the user's terminal, naming the
file, and the file still gets its transcript line."""

import subprocess
import sys

import pytest
import torch
from helpers import SHARED_DATA, require_shared_data, subprocess_env

from asr.checkpoints.io import save_checkpoint
from asr.data.tokenizer import CharTokenizer
from asr.experiment import ExperimentConfig, experiment_config_to_dict
from asr.models.attention import AttentionConfig
from asr.models.las import LASConfig
from asr.models.listener import ListenerConfig
from asr.models.registry import build_model
from asr.models.speller import SpellerConfig
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline

pytestmark = pytest.mark.slow  # starts a process that loads torch


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained tiny LAS in the trainer's checkpoint format, for 8 kHz digits (its transcripts are
    noise; what is tested is which files get one)."""
    features = FeatureConfig(kind="fbank", num_mel_bins=23, sample_rate=8000)
    pipeline = FeaturePipeline(features)
    tokenizer = CharTokenizer.train(["ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE"])
    model_config = LASConfig(
        listener=ListenerConfig(hidden_size=8, num_layers=2, pyramid_layers=1),
        attention=AttentionConfig(type="content", dim=8),
        speller=SpellerConfig(embedding_dim=8, hidden_size=8, num_layers=1),
    )
    torch.manual_seed(0)
    model = build_model(model_config, pipeline.feature_dim, tokenizer)
    path = tmp_path_factory.mktemp("model") / "model.pt"
    config = ExperimentConfig(exp_dir="unused", features=features, model=model_config)
    save_checkpoint(path, {"config": experiment_config_to_dict(config), "model": model.state_dict(),
                           "tokenizer": tokenizer.state_dict(), "features": pipeline.state_dict()})
    return path


def test_a_truncated_wav_is_transcribed_with_a_warning_naming_it(checkpoint, tmp_path):
    """issue 81: a WAV whose header promises more samples than the file holds was decoded without a word."""
    source = require_shared_data(SHARED_DATA / "fsdd" / "recordings") / "0_george_0.wav"
    whole = tmp_path / "whole.wav"
    whole.write_bytes(source.read_bytes())
    cut = tmp_path / "cut.wav"
    cut.write_bytes(source.read_bytes()[: source.stat().st_size * 2 // 3])  # a copy that stopped early
    done = subprocess.run([sys.executable, "-m", "asr.transcribe", str(checkpoint), str(whole), str(cut)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # both files transcribed, in the order given: the cut one decoded from what is there
    assert [line.split("\t")[0] for line in done.stdout.splitlines()] == [str(whole), str(cut)]
    warnings = [line for line in done.stderr.splitlines() if "truncated" in line]
    assert len(warnings) == 1, done.stderr  # the cut file only, named once
    assert f"audio file {cut} is truncated: its header promises" in warnings[0]
    assert warnings[0].startswith("WARNING ") and "decoding what is there" in warnings[0]
    assert "Traceback" not in done.stderr and str(whole) not in done.stderr
