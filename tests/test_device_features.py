"""Features on the model's device (``features.compute_on: device``): DataLoader items carry prepared audio,
and the features of a whole padded batch are computed at once where the model is. They must equal, item by
item, the features the loader path computes per utterance, with the same random draws, on real speech."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import PROJECT_ROOT, prepare_tiny_demo, subprocess_env, tiny_run

from asr.checkpoints.io import load_checkpoint
from asr.cli.train import main
from asr.config import ConfigError
from asr.data.batching import collate, with_features
from asr.data.dataset import SpeechDataset, compute_global_stats
from asr.data.librispeech import read_subset
from asr.data.padding import padded_frames
from asr.data.tokenizer import CharTokenizer
from asr.experiment import load_experiment_config
from features.config import FeatureConfig, SpecAugmentConfig, resolve_compute_on
from features.pipeline import FeaturePipeline

SPEC = SpecAugmentConfig(enabled=True, time_warp=5, freq_mask_width=15, time_mask_width=30)
CONFIGS = {
    # the LibriSpeech recipes' features
    "fbank-global-mvn": FeatureConfig(mvn="global", dither=1.0, spec_augment=SPEC),
    # per-row statistics, per-row clamped deltas and per-row warped mel filters
    "fbank-utterance-mvn-deltas-vtlp": FeatureConfig(
        num_mel_bins=40, mvn="utterance", dither=1.0, deltas=True, vtlp=[0.9, 1.1], spec_augment=SPEC
    ),
    # SpecAugment filled with each utterance's own mean; speed perturbation stays in the loader
    "mfcc-no-mvn-speed": FeatureConfig(
        kind="mfcc", num_mel_bins=40, num_ceps=13, mvn="none", dither=1.0, speed_perturb=[0.9, 1.0, 1.1],
        spec_augment=SPEC,
    ),
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="module")
def mini(librivox_mini, tmp_path_factory):
    """Five utterances of real read speech, 2-10 s: a batch of different lengths."""
    return read_subset(librivox_mini, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(mini):
    return CharTokenizer.train(u.text for u in mini)


def pipeline_for(name: str, mini) -> FeaturePipeline:
    pipeline = FeaturePipeline(CONFIGS[name])
    if pipeline.config.mvn == "global":
        compute_global_stats(mini, pipeline)
    return pipeline


def datasets(mini, pipeline, tokenizer, train: bool, epoch: int = 3):
    sets = [SpeechDataset(mini, pipeline, tokenizer, train=train, seed=11, compute_on=where) for where in ("loader", "device")]
    for dataset in sets:
        dataset.set_epoch(epoch)
    return sets


def assert_rows_equal_items(batch, items, atol: float = 2e-5):
    """atol relative to each utterance's largest feature magnitude."""
    lengths = [item["features"].shape[0] for item in items]
    assert len(set(lengths)) > 1  # really a padded batch
    assert batch.feature_lengths.tolist() == lengths
    assert batch.features.shape == (len(items), max(lengths), items[0]["features"].shape[1])
    for row, item in enumerate(items):
        scale = item["features"].abs().max()
        torch.testing.assert_close(batch.features[row, : lengths[row]].cpu(), item["features"], rtol=1e-5, atol=atol * scale)
        assert not batch.features[row, lengths[row] :].any()  # padding is zero, as in collate


@pytest.mark.parametrize("train", [True, False], ids=["train", "valid"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_device_features_equal_the_loader_features_item_by_item(mini, tokenizer, name, train):
    pipeline = pipeline_for(name, mini)
    loader_set, device_set = datasets(mini, pipeline, tokenizer, train)
    items = [loader_set[i] for i in range(len(mini))]
    audio_items = [device_set[i] for i in range(len(mini))]
    assert all("audio" in item and "features" not in item for item in audio_items)
    batch = collate(audio_items)
    assert batch.features is None
    assert batch.feature_lengths.tolist() == [item["features"].shape[0] for item in items]  # known before
    featured = with_features(batch, pipeline)
    assert_rows_equal_items(featured, items)
    assert featured.ids == [item["id"] for item in items]
    assert torch.equal(featured.tokens, collate(items).tokens)


@pytest.mark.parametrize("pad_to", [64, [300, 700, 1100]], ids=["multiple", "buckets"])
def test_padded_batches_get_the_same_padded_features_on_either_path(mini, tokenizer, pad_to):
    """data.pad_frames_to: the loader pads the features, the device path pads them once computed; both
    to padded_frames(longest), zeros after every row's length."""
    pipeline = pipeline_for(sorted(CONFIGS)[0], mini)
    loader_set, device_set = datasets(mini, pipeline, tokenizer, train=True)
    items = [loader_set[i] for i in range(len(mini))]
    padded = collate(items, pad_frames_to=pad_to)
    featured = with_features(collate([device_set[i] for i in range(len(mini))], pad_frames_to=pad_to), pipeline)
    longest = max(item["features"].shape[0] for item in items)
    assert padded.frames == featured.frames == padded_frames(longest, pad_to) > longest
    assert padded.features.shape == featured.features.shape == (len(items), padded.frames, items[0]["features"].shape[1])
    for row, item in enumerate(items):
        length = item["features"].shape[0]
        scale = item["features"].abs().max()
        torch.testing.assert_close(featured.features[row, :length], padded.features[row, :length], rtol=1e-5, atol=2e-5 * scale)
        assert not featured.features[row, length:].any() and not padded.features[row, length:].any()


def test_the_draws_are_the_items_own_whatever_batch_it_is_in(mini, tokenizer):
    """An item's features do not depend on its neighbours: the draws come from its own (seed, epoch, index)."""
    pipeline = pipeline_for("fbank-utterance-mvn-deltas-vtlp", mini)
    _, device_set = datasets(mini, pipeline, tokenizer, train=True)
    whole = with_features(collate([device_set[i] for i in range(len(mini))]), pipeline)
    pair = with_features(collate([device_set[3], device_set[1]]), pipeline)
    for row, index in enumerate((3, 1)):
        length = int(whole.feature_lengths[index])
        torch.testing.assert_close(pair.features[row, :length], whole.features[index, :length], rtol=1e-5, atol=1e-4)
    device_set.set_epoch(4)
    other_epoch = with_features(collate([device_set[3]]), pipeline)
    assert not torch.allclose(other_epoch.features[0], pair.features[0, : other_epoch.features.shape[1]])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_padded_samples_leak_into_nothing(mini, tokenizer, name):
    """Whatever the padding holds, no valid frame changes: not the MVN statistics, not the deltas at a
    row's end, not SpecAugment's warp or its mean fill."""
    pipeline = pipeline_for(name, mini)
    _, device_set = datasets(mini, pipeline, tokenizer, train=True)
    batch = collate([device_set[i] for i in range(len(mini))])
    clean = with_features(batch, pipeline)
    loud = batch.audio.samples.clone()
    for row, length in enumerate(batch.audio.lengths.tolist()):
        loud[row, length:] = 20000.0 * torch.randn(loud.shape[1] - length, generator=torch.Generator().manual_seed(row))
    batch.audio.samples = loud
    noisy = with_features(batch, pipeline)
    for row, length in enumerate(clean.feature_lengths.tolist()):
        torch.testing.assert_close(noisy.features[row, :length], clean.features[row, :length], rtol=1e-6, atol=1e-5)
        assert not noisy.features[row, length:].any()


def test_compute_on_auto_is_device_on_cuda_and_loader_elsewhere(tmp_path):
    assert resolve_compute_on("auto", "cuda") == "device"
    assert resolve_compute_on("auto", "cpu") == "loader"
    assert resolve_compute_on("device", "cpu") == "device"
    assert resolve_compute_on("loader", "cuda") == "loader"
    with pytest.raises(ConfigError, match="features.compute_on"):
        load_experiment_config(Path(tiny_run(tmp_path)[0]), ["features.compute_on=gpu"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_features_on_cuda_equal_the_loader_features(mini, tokenizer, name):
    pipeline = pipeline_for(name, mini)
    loader_set, device_set = datasets(mini, pipeline, tokenizer, train=True)
    items = [loader_set[i] for i in range(len(mini))]
    batch = with_features(collate([device_set[i] for i in range(len(mini))]).to("cuda"), pipeline)
    assert batch.features.device.type == "cuda"
    # cuFFT sums in another order than the CPU's FFT: the power of a quiet bin differs in its last bits,
    # and the log (fbank) magnifies that; the difference seen on a GPU is in docs/benchmarks.md ("On an H200
    # again"), and this allows four times it
    assert_rows_equal_items(batch, items, atol=2e-4)


@pytest.mark.slow
def test_training_with_features_on_the_device_is_training_with_features_in_the_loader(tmp_path):
    """The same run (an epoch, then validation) with each path ends with the same weights, to float
    rounding; each run's config.yaml and train.log say where its features were computed."""
    prepare_tiny_demo()  # in this test's private cache
    runs = {}
    for where in ("auto", "device"):
        folder = tmp_path / where
        folder.mkdir()
        args = tiny_run(folder, "train.max_epochs=1", "features.mvn=global",
                        f"features.compute_on={where}")
        assert main(args) == 0
        runs[where] = folder / "exp"
    resolved = {where: yaml.safe_load((exp / "config.yaml").read_text())["features"]["compute_on"]
                for where, exp in runs.items()}
    assert resolved == {"auto": "loader", "device": "device"}  # auto on CPU: the loader
    assert "features computed on the device (features.compute_on=device" in (runs["device"] / "train.log").read_text()
    loader, device = (load_checkpoint(runs[w] / "last.pt") for w in ("auto", "device"))
    assert loader["training"]["progress"]["step"] == device["training"]["progress"]["step"] > 2
    metrics = [load_checkpoint(runs[w] / "epoch1.pt")["training"]["metric"] for w in ("auto", "device")]
    assert metrics[0] == pytest.approx(metrics[1], rel=1e-4)  # validation on the same features
    for key, weights in loader["model"].items():
        torch.testing.assert_close(device["model"][key], weights, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.slow
def test_a_resumed_run_with_features_on_the_device_ends_as_the_uninterrupted_run(tmp_path):
    """Stopped after two updates and resumed, the run sees the same batches with the same draws."""
    prepare_tiny_demo()  # in this test's private cache
    ends = {}
    for name in ("whole", "resumed"):
        folder = tmp_path / name
        folder.mkdir()
        args = tiny_run(folder, "train.max_epochs=1", "features.compute_on=device")
        if name == "resumed":
            assert main([*args, "train.max_steps=2"]) == 0
            args = [*args, "--resume"]
        assert main(args) == 0
        ends[name] = load_checkpoint(folder / "exp" / "last.pt")
    assert ends["whole"]["training"]["progress"]["step"] == ends["resumed"]["training"]["progress"]["step"] > 2
    for key, weights in ends["whole"]["model"].items():
        torch.testing.assert_close(ends["resumed"]["model"][key], weights, rtol=0, atol=0, msg=key)


@pytest.mark.slow
def test_the_data_loading_benchmark_measures_both_paths_of_both_recipes(shared_data, tmp_path):
    """benchmarks/data_loading.py on a tiny tiled corpus: each recipe, each path, both measures."""
    command = [
        sys.executable, str(PROJECT_ROOT / "benchmarks" / "data_loading.py"), "--shared-data", str(shared_data),
        "--tile", "4", "--workers", "1", "--steps", "1", "--warmup", "1", "--threads", "1",
        "data.max_frames_per_batch=2000", "data.bpe_vocab_size=40",
        "--las", "model.listener.hidden_size=16", "--las", "model.attention.dim=16",
        "--las", "model.speller.hidden_size=16", "--las", "model.speller.embedding_dim=16",
        "--transformer", "model.d_model=32", "--transformer", "model.encoder.num_layers=1",
        "--transformer", "model.decoder.num_layers=1", "--transformer", "model.encoder.ff_dim=32",
        "--transformer", "model.decoder.ff_dim=32",
    ]
    env = dict(subprocess_env(), XDG_CACHE_HOME=str(tmp_path / "cache"))
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if "audio-s of features per CPU-s" in line]
    assert [line.split(":")[0].strip() for line in lines] == [
        "features on the loader", "features on the device", "features on the loader", "features on the device"
    ]
    assert all("loader wait" in line and "% of step time" in line for line in lines)
    # one timed step against the 2 batches one worker keeps ready: flagged, for each recipe and path
    assert result.stdout.count("not judged") == 4, result.stdout
    assert "librispeech100.yaml (las" in result.stdout and "librispeech100_transformer.yaml (transformer" in result.stdout
