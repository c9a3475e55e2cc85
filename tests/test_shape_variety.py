"""benchmarks/shape_variety.py: the batches it draws are shaped as asr.train's are, and it times a model that
trains through both passes under each backend it can pin."""

import sys

import pytest
import torch
from helpers import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import shape_variety  # noqa: E402

TINY = ["model.d_model=32", "model.heads=2", "model.encoder.num_layers=1", "model.decoder.num_layers=1",
        "model.encoder.ff_dim=64", "model.decoder.ff_dim=64"]


@pytest.mark.parametrize("multiple", [1, 64])
def test_each_batch_fills_the_frame_budget_at_its_own_length_padded_to_the_multiple(multiple):
    shapes = shape_variety.batch_shapes(50, 60000, 2.0, 17.0, multiple)
    assert len(shapes) == 50
    for utterances, length, padded in shapes:
        assert 200 <= length <= 1700 and length <= padded < length + multiple and padded % multiple == 0
        assert utterances == 60000 // padded  # as many as the budget holds, as the bucketing sampler does
    if multiple == 1:
        assert len({p for _, _, p in shapes}) > 40  # nearly every batch a new shape
    else:
        assert len({p for _, _, p in shapes}) <= 23  # (1700 - 200) / 64 + 1 at most
    assert shape_variety.batch_shapes(50, 60000, 2.0, 17.0, multiple) == shapes  # the same draw every time


def test_the_padding_is_zero_and_the_lengths_say_what_is_valid():
    features, lengths, tokens, token_lengths = shape_variety.make_batch(3, 150, 192, 80, 300, 6.0, torch.device("cpu"))
    assert features.shape == (3, 192, 80) and lengths.tolist() == [150] * 3
    assert features[:, 150:].abs().sum() == 0 and features[:, :150].abs().sum() > 0
    assert tokens.shape == (3, 9) and token_lengths.tolist() == [9] * 3 and tokens.min() >= 3


def test_both_passes_train_under_each_cpu_backend_and_the_report_names_them(capsys):
    rows = shape_variety.main(["--device", "cpu", "--steps", "2", "--frames", "400", "--min-seconds", "1",
                               "--max-seconds", "1.5", "--threads", "1", *TINY])
    assert [row["backend"] for row in rows] == ["default", "math"]
    for row in rows:
        assert "error" not in row, row
        assert len(row["first"]) == len(row["again"]) == 2 and all(t > 0 for t in row["first"] + row["again"])
    printed = capsys.readouterr().out
    assert "2 distinct padded lengths" in printed and "first / again" in printed
    # a backend CPU cannot run is reported, not fatal
    (row,) = shape_variety.main(["--device", "cpu", "--steps", "1", "--frames", "400", "--min-seconds", "1",
                                 "--max-seconds", "1", "--threads", "1", "--backends", "cudnn", *TINY])
    assert "error" in row and "not usable here" in capsys.readouterr().out
