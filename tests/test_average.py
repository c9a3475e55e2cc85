"""asr.average: checkpoint selection by epoch and by stored metric, the element-wise mean, errors."""

import pytest
import torch
from torch import nn

from asr.checkpoints.averaging import average_checkpoints, select_checkpoints
from asr.cli.average import main
from asr.checkpoints.io import FORMAT_VERSION, CheckpointError, load_checkpoint, save_checkpoint
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline


def _model_state(seed: int, batches_seen: int) -> dict:
    """A tiny model with a weight, a bias, float buffers (running stats) and an integer counter."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    model[1].running_mean.normal_()
    model[1].running_var.uniform_(0.5, 2.0)
    model[1].num_batches_tracked.fill_(batches_seen)
    return model.state_dict()


def _write(path, epoch: int, metric: float | None = None, model: dict | None = None, hidden: int = 4,
           higher_is_better: bool | None = None, tokenizer: dict | None = None, features: FeatureConfig | None = None):
    """A checkpoint in the trainer's layout; its config names the epoch so we can tell whose it is (the
    tokenizer and the features are one run's: the same in every epoch unless given)."""
    payload = {
        "config": {"exp_dir": str(path.parent), "model": {"type": "las", "speller": {"hidden_size": hidden}},
                   "written_at": f"epoch{epoch}"},
        "model": model if model is not None else _model_state(epoch, batches_seen=100 * (epoch + 1)),
        "tokenizer": tokenizer or {"type": "char", "symbols": list("abc ")},
        "features": FeaturePipeline(features or FeatureConfig(num_mel_bins=10)).state_dict(),
        "training": {"metric": metric, "metric_name": "valid_loss", "epoch": epoch, "optimizer": {"state": "big"}},
    }
    if higher_is_better is not None:  # older checkpoints do not say; their metric was lower-is-better
        payload["training"]["higher_is_better"] = higher_is_better
    save_checkpoint(path, payload)
    return payload


def test_last_n_is_the_elementwise_mean_of_the_newest_epochs(tmp_path):
    # Epochs 2, 9 and 10: by number the last two are 9 and 10 (a string sort would give 2 and 9).
    written = {e: _write(tmp_path / f"epoch{e}.pt", e) for e in (2, 9, 10)}
    (tmp_path / "epoch10_copy.pt").write_bytes(b"not ours")  # another name is ignored, not parsed
    assert main([str(tmp_path), "--last", "2"]) == 0
    averaged = load_checkpoint(tmp_path / "avg_last2.pt")
    for name, tensor in averaged["model"].items():
        if tensor.is_floating_point():
            expected = (written[9]["model"][name] + written[10]["model"][name]) / 2
            torch.testing.assert_close(tensor, expected, rtol=0, atol=1e-7)
    # The integer counter is the newest one's, not a mean (which would be 1050).
    assert averaged["model"]["1.num_batches_tracked"].item() == 1100
    assert averaged["model"]["1.num_batches_tracked"].dtype == torch.long
    # Config, tokenizer and features come from the newest checkpoint; no optimizer state.
    assert averaged["tokenizer"] == written[10]["tokenizer"]
    assert averaged["features"] == written[10]["features"]
    assert averaged["config"] == written[10]["config"]
    assert "optimizer" not in averaged["training"]
    assert averaged["training"]["averaged_from"] == [str(tmp_path / "epoch9.pt"), str(tmp_path / "epoch10.pt")]
    assert averaged["format_version"] == FORMAT_VERSION  # written through save_checkpoint


def test_average_of_three_matches_stack_mean(tmp_path):
    paths = []
    for e in range(3):
        _write(tmp_path / f"epoch{e}.pt", e)
        paths.append(tmp_path / f"epoch{e}.pt")
    averaged = average_checkpoints(paths)["model"]
    states = [load_checkpoint(p)["model"] for p in paths]
    torch.testing.assert_close(averaged["0.weight"], torch.stack([s["0.weight"] for s in states]).mean(0))
    torch.testing.assert_close(averaged["1.running_var"], torch.stack([s["1.running_var"] for s in states]).mean(0))
    # Averaging is not a no-op: the result differs from every input.
    assert all(not torch.equal(averaged["0.weight"], s["0.weight"]) for s in states)


def test_best_n_follows_the_direction_the_checkpoints_record(tmp_path):
    for epoch, spearman in {0: 0.2, 1: 0.9, 2: 0.5}.items():
        _write(tmp_path / f"best_epoch{epoch}.pt", epoch, metric=spearman, higher_is_better=True)
    assert select_checkpoints(tmp_path, best=2) == [tmp_path / "best_epoch1.pt", tmp_path / "best_epoch2.pt"]


def test_best_n_ranks_by_the_stored_metric_not_the_epoch(tmp_path):
    metrics = {0: 3.0, 1: 1.0, 2: 2.0, 3: 2.5}
    written = {e: _write(tmp_path / f"best_epoch{e}.pt", e, metric=m) for e, m in metrics.items()}
    _write(tmp_path / "epoch3.pt", 3)  # epoch checkpoints play no part in --best
    assert select_checkpoints(tmp_path, best=2) == [tmp_path / "best_epoch1.pt", tmp_path / "best_epoch2.pt"]
    out = tmp_path / "sub" / "avg.pt"
    assert main([str(tmp_path), "--best", "2", "--out", str(out)]) == 0
    averaged = load_checkpoint(out)
    expected = (written[1]["model"]["0.bias"] + written[2]["model"]["0.bias"]) / 2
    torch.testing.assert_close(averaged["model"]["0.bias"], expected)
    assert averaged["config"] == written[2]["config"]  # the newer of the two chosen
    assert averaged["model"]["1.num_batches_tracked"].item() == 300


def test_nonfinite_metric_ranks_last(tmp_path):
    _write(tmp_path / "best_epoch0.pt", 0, metric=float("nan"))
    _write(tmp_path / "best_epoch1.pt", 1, metric=5.0)
    assert select_checkpoints(tmp_path, best=1) == [tmp_path / "best_epoch1.pt"]


@pytest.mark.parametrize(
    "files, argv, message",
    [
        ([], ["--last", "3"], "found 0 epoch"),
        (["epoch0.pt", "epoch1.pt"], ["--last", "3"], "asked for the last 3 checkpoints but found 2"),
        (["epoch0.pt", "epoch1.pt"], ["--best", "1"], "found 0 best_epoch"),
        (["epoch0.pt"], ["--last", "0"], "at least 1"),
    ],
)
def test_too_few_checkpoints_is_a_clear_error(tmp_path, capsys, files, argv, message):
    for name in files:
        _write(tmp_path / name, int(name.removesuffix(".pt").removeprefix("epoch")))
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("avg_*.pt"))


def test_missing_folder_and_missing_metric_name_the_path(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nope"), "--last", "1"])
    assert f"experiment folder not found: {tmp_path / 'nope'}" in capsys.readouterr().err
    _write(tmp_path / "best_epoch4.pt", 4, metric=None)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--best", "1"])
    assert f"{tmp_path / 'best_epoch4.pt'} has no validation metric" in capsys.readouterr().err


def test_checkpoints_of_different_models_are_not_averaged(tmp_path, capsys):
    _write(tmp_path / "epoch0.pt", 0, hidden=8)
    _write(tmp_path / "epoch1.pt", 1)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--last", "2"])
    assert f"{tmp_path / 'epoch0.pt'} has another model config" in capsys.readouterr().err
    wide = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5)).state_dict()
    _write(tmp_path / "epoch0.pt", 0, model=wide)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--last", "2"])
    err = capsys.readouterr().err
    assert "0.weight has shape (5, 3)" in err and str(tmp_path / "epoch0.pt") in err


@pytest.mark.parametrize("newest, message", [
    ({"tokenizer": {"type": "char", "symbols": list("abd ")}}, "their tokenizers differ (two char tokenizers with other pieces"),
    ({"tokenizer": {"type": "bpe", "model": b"x"}}, "their tokenizers differ (char against bpe)"),
    ({"features": FeatureConfig(kind="mfcc", num_mel_bins=10, num_ceps=10)}, "features.kind: fbank against mfcc"),
])
def test_checkpoints_whose_tokenizer_or_front_end_differ_are_not_averaged(tmp_path, capsys, newest, message):
    """Same shapes, other meanings: issue 81 averaged two runs' epochs where 13 of 48 token ids agreed."""
    _write(tmp_path / "epoch1.pt", 1)
    _write(tmp_path / "epoch2.pt", 2, **newest)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--last", "2"])
    err = capsys.readouterr().err
    assert f"{tmp_path / 'epoch1.pt'} and {tmp_path / 'epoch2.pt'} cannot be averaged: " in err and message in err
    assert not (tmp_path / "avg_last2.pt").exists()


def test_other_global_statistics_are_refused_and_other_augmentation_is_not(tmp_path):
    from dataclasses import replace

    from asr.checkpoints.averaging import front_end_difference
    from features.mvn import GlobalStats

    one, other = (FeaturePipeline(FeatureConfig(num_mel_bins=4, mvn="global")) for _ in range(2))
    for pipeline, shift in ((one, 0.0), (other, 1.0)):
        pipeline.stats = GlobalStats(4)
        pipeline.stats.update(torch.arange(12.0).reshape(3, 4) + shift)
    state = {"tokenizer": {"type": "char", "symbols": ["a"]}}
    assert front_end_difference({**state, "features": one.state_dict()}, {**state, "features": other.state_dict()}) \
        == "their global MVN statistics differ (features normalised with other means and variances)"
    augmented = FeaturePipeline(replace(one.config, speed_perturb=[1.0], dither=0.0))
    augmented.stats = one.stats
    assert front_end_difference({**state, "features": one.state_dict()}, {**state, "features": augmented.state_dict()}) is None


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_checkpoint_is_named_as_damaged_and_never_sent_to_the_converter(tmp_path, damage):
    path = tmp_path / "epoch0.pt"
    _write(path, 0, metric=1.0)
    data = path.read_bytes()
    path.write_bytes(b"\x80\x02garbage" * 10 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "asr.checkpoint convert" not in str(err.value)


@pytest.mark.parametrize("given, what", [
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "a WAV audio file"),
    (b"fLaC\x00\x00\x00\x22", "a FLAC audio file"),
    (b"07:01:02 INFO asr.train: epoch 1: valid loss 1.2\n", "a text file"),
])
def test_a_file_that_is_not_a_checkpoint_is_named_for_what_it_is(tmp_path, given, what):
    path = tmp_path / "given.pt"
    path.write_bytes(given)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(err.value) == (f"{path} is not a checkpoint: it is {what} (a checkpoint is a .pt file written by "
                              "asr.train or asr.average)")
    # a run folder names its last.pt
    _write(tmp_path / "last.pt", 1, metric=1.0)
    with pytest.raises(CheckpointError, match=f"{tmp_path} is a folder, not a checkpoint; its checkpoint is "):
        load_checkpoint(tmp_path)


def test_an_empty_checkpoint_says_it_is_empty(tmp_path):
    """issue 81: it gave 'cannot read checkpoint e.pt: ' with nothing after the colon."""
    (tmp_path / "e.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"e\.pt is empty \(0 bytes\): not a checkpoint"):
        load_checkpoint(tmp_path / "e.pt")
