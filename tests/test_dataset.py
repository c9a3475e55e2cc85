"""SpeechDataset, prepare_utterances, the data loader and the data config, on real speech."""

import dataclasses
import logging
import shutil
from pathlib import Path

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.data import report as reasons
from asr.data.batching import Batch
from asr.data.config import DataConfig
from asr.data.corpus import load_split
from asr.data.batching import BucketBatchSampler
from asr.data.dataset import SpeechDataset, compute_global_stats, prepare_utterances
from asr.data.fsdd import build_connected_digits, read_fsdd
from asr.data.librispeech import read_subset
from asr.data.report import DataError
from asr.data.tokenizer import CharTokenizer
from asr.data.utterance import Utterance
from asr.synthesis.demo import prepare_corpus
from asr.training.data import make_loader
from features.config import FeatureConfig, SpecAugmentConfig
from features.pipeline import FeaturePipeline


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Manifests of read-only folders go to a per-test cache, never to the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="module")
def mini(librivox_mini, tmp_path_factory) -> list[Utterance]:
    return read_subset(librivox_mini, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(mini) -> CharTokenizer:
    return CharTokenizer.train(u.text for u in mini)


@pytest.fixture(scope="module")
def augmenting_pipeline(mini) -> FeaturePipeline:
    """Global MVN, dither and SpecAugment: everything that must be on in training and off in evaluation."""
    config = FeatureConfig(mvn="global", dither=1.0, spec_augment=SpecAugmentConfig(enabled=True, time_warp=5))
    pipeline = FeaturePipeline(config)
    compute_global_stats(mini, pipeline)
    return pipeline


def test_eval_features_are_the_inference_features(mini, tokenizer, augmenting_pipeline):
    dataset = SpeechDataset(mini, augmenting_pipeline, tokenizer, train=False)
    # a fresh pipeline rebuilt from its state, as transcribe does from a checkpoint
    inference = FeaturePipeline.from_state_dict(augmenting_pipeline.state_dict())
    for index in (0, 3):
        item = dataset[index]
        assert item["id"] == mini[index].id
        assert torch.equal(item["features"], inference.from_file(mini[index].audio))
        assert item["features"].shape[1] == 80
        assert item["tokens"].dtype == torch.long
        assert tokenizer.decode(item["tokens"].tolist()) == mini[index].text


def test_train_draws_depend_only_on_seed_epoch_and_index(mini, tokenizer, augmenting_pipeline):
    dataset = SpeechDataset(mini[:2], augmenting_pipeline, tokenizer, train=True, seed=11)
    first = dataset[1]["features"]
    assert torch.equal(first, dataset[1]["features"])
    assert not torch.equal(first, augmenting_pipeline.from_file(mini[1].audio))  # augmented
    assert torch.equal(first, SpeechDataset(mini[:2], augmenting_pipeline, tokenizer, True, seed=11)[1]["features"])
    assert not torch.equal(first, SpeechDataset(mini[:2], augmenting_pipeline, tokenizer, True, seed=12)[1]["features"])
    dataset.set_epoch(1)
    assert not torch.equal(first, dataset[1]["features"])
    twice = SpeechDataset([mini[1], dataclasses.replace(mini[1], id="again")], augmenting_pipeline, tokenizer, True)
    assert not torch.equal(twice[0]["features"], twice[1]["features"])  # each index draws its own


@pytest.mark.slow  # starts worker processes
def test_loader_batches_are_the_same_with_several_workers(mini, tokenizer, augmenting_pipeline):
    config = DataConfig(max_frames_per_batch=1500, seed=4)
    batches = {}
    for workers in (0, 2):
        dataset = SpeechDataset(mini, augmenting_pipeline, tokenizer, train=True, seed=config.seed)
        sampler = BucketBatchSampler(dataset.num_frames(), config.max_frames_per_batch, shuffle=True, seed=config.seed)
        sampler.set_epoch(2)
        dataset.set_epoch(2)
        batches[workers] = list(make_loader(list(sampler), dataset, workers, config.seed, pin_memory=False))
    assert len(batches[0]) > 1
    for a, b in zip(batches[0], batches[2], strict=True):
        assert a.ids == b.ids and torch.equal(a.features, b.features) and torch.equal(a.tokens, b.tokens)


def test_loader_covers_every_utterance_with_correct_lengths(mini, tokenizer):
    pipeline = FeaturePipeline(FeatureConfig())
    dataset = SpeechDataset(mini, pipeline, tokenizer)
    sampler = BucketBatchSampler(dataset.num_frames(), 1500, shuffle=False)
    loader = make_loader(sampler, dataset, workers=0, seed=0, pin_memory=False)
    seen = []
    for batch in loader:
        assert isinstance(batch, Batch) and batch.features.shape[2] == 80
        for row, utt_id in enumerate(batch.ids):
            index = [u.id for u in mini].index(utt_id)
            item = dataset[index]
            assert batch.feature_lengths[row] == item["features"].shape[0]
            assert batch.token_lengths[row] == len(mini[index].text)
            # the duration-based estimate the sampler budgets with is close to the real frame count
            assert abs(dataset.num_frames()[index] - item["features"].shape[0]) <= 1
        seen.extend(batch.ids)
    assert sorted(seen) == sorted(u.id for u in mini)


def test_in_memory_connected_digits_go_through_from_waveform(fsdd_recordings):
    recordings = read_fsdd(fsdd_recordings, speakers=["george"], take_range=[5, 6])
    utterances = build_connected_digits(recordings, 2, digits_per_utterance=[3, 3], seed=0)
    pipeline = FeaturePipeline(FeatureConfig())
    tokenizer = CharTokenizer.train(u.text for u in utterances)
    dataset = SpeechDataset(utterances, pipeline, tokenizer)
    for index, utt in enumerate(utterances):
        features = dataset[index]["features"]
        assert torch.equal(features, pipeline.from_waveform(utt.audio.waveform, utt.audio.sample_rate))
        assert abs(features.shape[0] - 100 * utt.duration) <= 3  # 8 kHz resampled, still 100 frames/s
        assert abs(dataset.num_frames()[index] - features.shape[0]) <= 1


def test_dataset_errors_name_the_utterance(mini, tmp_path):
    pipeline = FeaturePipeline(FeatureConfig())
    narrow = CharTokenizer.train(["HE WAS"])
    with pytest.raises(DataError, match=mini[1].id):
        SpeechDataset(mini, pipeline, narrow)[1]
    garbage = tmp_path / "9999-1-0009.flac"
    garbage.write_bytes(b"fLaC but not really")
    broken = dataclasses.replace(mini[0], id="9999-1-0009", audio=garbage)
    # Audio that fails where it is read is a skip naming the file (an error in strict mode).
    item = SpeechDataset([broken], pipeline, CharTokenizer.train([mini[0].text]))[0]
    assert item["id"] == "9999-1-0009" and "9999-1-0009.flac" in item["skip"].message
    assert item["skip"].reason == reasons.UNDECODABLE_AUDIO
    with pytest.raises(DataError, match="9999-1-0009.flac"):
        SpeechDataset([broken], pipeline, CharTokenizer.train([mini[0].text]), strict=True)[0]


@pytest.fixture
def troubled(librivox_mini, tmp_path) -> list[Utterance]:
    """librivox_mini with an empty transcript line, read through the reader, plus a repeated id."""
    copy = Path(shutil.copytree(librivox_mini, tmp_path / "test-mini"))
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    trans = copy / "9999" / "1" / "9999-1.trans.txt"
    text = trans.read_text()
    trans.write_text(text.replace("9999-1-0004 HE MIGHT EVEN HAVE BEEN MADE AMIABLE HIMSELF", "9999-1-0004"))
    utterances = read_subset(copy)
    return utterances + [utterances[1]]


def test_prepare_skips_each_problem_with_a_reason_naming_the_file(troubled, caplog):
    # 0000 is 7.1 s long, 0001 is the shortest; the tokenizer never saw a 'Y' (only in 0001: "YOUNG")
    durations = sorted(u.duration for u in troubled)
    config = DataConfig(max_duration=7.0, min_duration=durations[1] - 0.01)
    tokenizer = CharTokenizer.train(t.replace("Y", "") for t in (u.text for u in troubled))
    with caplog.at_level(logging.WARNING, logger="asr.data.report"):
        kept, report = prepare_utterances(troubled, config, tokenizer, name="train")
    assert report.counts() == {
        reasons.TOO_LONG: 1, reasons.EMPTY_TRANSCRIPT: 1, reasons.UNKNOWN_CHARACTERS: 1, reasons.DUPLICATE_ID: 1
    }
    assert [u.id for u in kept] == ["9999-1-0002", "9999-1-0003"]
    assert "9999-1-0000.flac" in report.messages(reasons.TOO_LONG)[0]
    assert "9999-1-0004.flac" in report.messages(reasons.EMPTY_TRANSCRIPT)[0]
    assert "'Y'" in report.messages(reasons.UNKNOWN_CHARACTERS)[0]
    assert "9999-1-0001.flac" in report.messages(reasons.UNKNOWN_CHARACTERS)[0]
    assert "skipped 4 utterance(s)" in caplog.text and reasons.TOO_LONG in caplog.text
    with pytest.raises(DataError, match="9999-1-0001.flac.*'Y'"):
        prepare_utterances(troubled[1:2], dataclasses.replace(config, strict=True), tokenizer)

    too_short = DataConfig(min_duration=durations[0] + 0.01)
    kept, report = prepare_utterances(troubled[:4], too_short)
    assert report.counts() == {reasons.TOO_SHORT: 1} and "9999-1-0001.flac" in report.messages(reasons.TOO_SHORT)[0]
    kept, report = prepare_utterances(troubled[:4], config, limit_duration=False)  # e.g. a test set
    assert len(kept) == 4 and not report


@pytest.mark.parametrize("first_problem, config", [
    ("9999-1-0000.flac", DataConfig(max_duration=7.0, strict=True)),
    ("9999-1-0004.flac", DataConfig(strict=True)),
])
def test_prepare_in_strict_mode_raises_on_the_first_problem(troubled, first_problem, config):
    with pytest.raises(DataError, match=first_problem.replace(".", r"\.")):
        prepare_utterances(troubled, config)


def test_data_config_from_recipe_and_load_split(shared_data, tmp_path):
    recipe = {
        "root": str(shared_data),
        "train": ["fsdd_connected/LibriSpeech/fsdd-dev"],
        "dev": "librivox_mini/LibriSpeech/test-mini",
        "fsdd": "fsdd/recordings",
        "digits": {"speakers": ["jackson"], "take_range": [5, 9], "utterances": 4},
        "cache_dir": str(tmp_path / "cache"),
    }
    config = from_dict(DataConfig, recipe, "data")
    train, report = load_split(config, "train")
    assert len(train) == 200 + 4 and not report
    assert sum(u.in_memory for u in train) == 4
    dev, _ = load_split(config, "dev")
    assert len(dev) == 5
    assert load_split(config, "test")[0] == []  # no test subsets configured

    with pytest.raises(ConfigError, match="data.digits.speaker"):
        from_dict(DataConfig, {"digits": {"speaker": ["jackson"]}}, "data")
    with pytest.raises(ConfigError, match="take_range"):
        from_dict(DataConfig, {"digits": {"take_range": [9, 5]}}, "data")
    with pytest.raises(ConfigError, match="held_out_speaker"):
        from_dict(DataConfig, {"digits": {"speakers": ["george"], "held_out_speaker": "george"}}, "data")
    with pytest.raises(ConfigError, match="max_duration"):
        from_dict(DataConfig, {"min_duration": 5, "max_duration": 1}, "data")
    with pytest.raises(ConfigError, match="data.tokenizer"):
        from_dict(DataConfig, {"tokenizer": "wordpiece"}, "data")
    with pytest.raises(DataError, match="no-such-subset"):
        load_split(from_dict(DataConfig, {"root": str(tmp_path), "test": ["no-such-subset"]}), "test")


@pytest.mark.slow  # starts worker processes
def test_the_demo_corpus_is_prepared_once_and_read_as_three_splits(tmp_path):
    demo = {"enabled": True, "train_utterances": 6, "dev_utterances": 2, "test_utterances": 3}
    config = from_dict(DataConfig, {"demo": demo, "cache_dir": str(tmp_path)}, "data")
    prepare_corpus(config.demo, tmp_path)  # python -m asr.synth_demo does this
    train, dev, test = (load_split(config, split)[0] for split in ("train", "dev", "test"))
    assert (len(train), len(dev), len(test)) == (6, 2, 3)
    assert not {u.speaker for u in test} & {u.speaker for u in train + dev}  # held-out voices
    flac = sorted(tmp_path.glob("demo/*/LibriSpeech/train/*/*/*.flac"))
    assert len(flac) == 6
    stamp = flac[0].stat().st_mtime_ns
    assert [u.text for u in load_split(config, "train")[0]] == [u.text for u in train]
    assert flac[0].stat().st_mtime_ns == stamp  # reading writes nothing
