"""Train a tiny model on real FSDD audio, then evaluate, transcribe and average it
through the command-line entry points, as a user would."""

import json
from pathlib import Path

import pytest
import torch

from asr import average, evaluate, transcribe
from asr.checkpoint import load_checkpoint, save_checkpoint
from asr.inference import load_recogniser
from asr.train import main as train_main

from conftest import PROJECT_ROOT
from test_train import TINY, tiny_valid


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(experiment folder, validation folder) of a 3-epoch tiny LAS run."""
    tmp = tmp_path_factory.mktemp("trained")
    valid = tiny_valid(tmp)
    exp = tmp / "exp"
    args = [str(PROJECT_ROOT / "recipes" / "fsdd_las.yaml"), *TINY, f"exp_dir={exp}", f"data.valid=[{valid}]"]
    assert train_main(args + ["train.max_epochs=3", "train.keep_last=2"]) == 0
    return exp, valid


def test_evaluate_writes_consistent_reports(trained, capsys):
    exp, valid = trained
    out = exp / "eval"
    assert evaluate.main(["--checkpoint", str(exp / "last.pt"), "--data", str(valid), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "WER" in printed and "real-time factor" in printed
    result = json.loads((out / "wer.json").read_text())
    refs = (out / "ref.txt").read_text().splitlines()
    hyps = (out / "hyp.txt").read_text().splitlines()
    assert result["utterances"] == len(refs) == len(hyps) == 6
    assert [r.split()[0] for r in refs] == [h.split()[0] for h in hyps]
    s, d, i, n = (result[k] for k in ("substitutions", "deletions", "insertions", "ref_words"))
    assert result["wer"] == pytest.approx((s + d + i) / n)
    assert (out / "alignment.txt").read_text().count("REF") == 6
    # Beam search goes through the same path.
    assert evaluate.main(["--checkpoint", str(exp / "last.pt"), "--data", str(valid), "--out", str(out), "--beam", "3"]) == 0


def test_transcribe_any_rate_and_format_matches_the_recogniser(trained, capsys, fsdd_recordings, librivox_mini):
    exp, _ = trained
    files = [fsdd_recordings / "3_george_0.wav", next(librivox_mini.rglob("*.flac"))]
    assert transcribe.main([str(exp / "last.pt"), *map(str, files)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == list(map(str, files))
    expected = load_recogniser(exp / "last.pt").transcribe_files(files)
    assert [line.split("\t", 1)[1] for line in lines] == expected


def test_transcribe_reports_an_unreadable_file_and_goes_on(trained, tmp_path, capsys, fsdd_recordings):
    exp, _ = trained
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"not audio at all")
    good = fsdd_recordings / "5_jackson_1.wav"
    assert transcribe.main([str(exp / "last.pt"), str(bad), str(good)]) == 1
    captured = capsys.readouterr()
    assert str(bad) in captured.err
    assert captured.out.startswith(str(good))


def test_average_last_two_epochs_is_the_mean(trained):
    exp, _ = trained
    assert average.main([str(exp), "--last", "2"]) == 0
    averaged = load_checkpoint(exp / "avg_last2.pt")
    first, second = load_checkpoint(exp / "epoch1.pt"), load_checkpoint(exp / "epoch2.pt")
    for name, tensor in averaged["model"].items():
        if tensor.is_floating_point():
            torch.testing.assert_close(tensor, (first["model"][name] + second["model"][name]) / 2)
    assert averaged["tokenizer"] == second["tokenizer"]
    load_recogniser(exp / "avg_last2.pt")  # a usable, self-contained checkpoint


def test_average_best_uses_the_stored_metric(tmp_path):
    payload = {"config": {}, "tokenizer": {}, "features": {}}
    for epoch, metric in [(0, 3.0), (1, 1.0), (2, 2.0)]:
        model = {"w": torch.full((2,), float(epoch)), "count": torch.tensor(epoch)}
        save_checkpoint(tmp_path / f"best_epoch{epoch}.pt", {**payload, "model": model, "training": {"metric": metric}})
    assert average.main([str(tmp_path), "--best", "2"]) == 0
    averaged = load_checkpoint(tmp_path / "avg_best2.pt")["model"]
    torch.testing.assert_close(averaged["w"], torch.full((2,), 1.5))  # epochs 1 and 2
    assert averaged["count"] == 2  # integer buffers come from the newest, not averaged


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--checkpoint", "missing.pt", "--data", "."], "checkpoint not found"),
        (["--checkpoint", "LAST", "--data", "EMPTY"], "EMPTY"),
    ],
)
def test_evaluate_errors_are_one_line_and_exit_2(trained, tmp_path, capsys, argv, message):
    exp, _ = trained
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [a.replace("LAST", str(exp / "last.pt")).replace("EMPTY", str(empty)) for a in argv]
    message = message.replace("EMPTY", str(empty))
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_average_needs_enough_checkpoints(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        average.main([str(tmp_path), "--last", "3"])
    assert exit_info.value.code == 2 and "found 0" in capsys.readouterr().err
