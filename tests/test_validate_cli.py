"""``python -m asr.validate``: the trainer's validation of a checkpoint, again, at any batch budget."""

import json

import pytest
from helpers import tiny_transformer_run

from asr.cli.train import main as train
from asr.cli.validate import main as validate
from asr.studies.curves import read_scalars


@pytest.fixture(scope="module")
def conformer_run(tmp_path_factory):
    """A tiny Conformer with BatchNorm in its convolution module, trained one epoch on real digits."""
    tmp_path = tmp_path_factory.mktemp("validate")
    args = tiny_transformer_run(tmp_path, "model.encoder.kind=conformer", "model.encoder.conv_kernel=5",
                                "model.encoder.conv_norm=batchnorm", "train.max_epochs=1", "train.device=cpu",
                                "train.valid_beam_size=3", "train.valid_ctc_weight=0.5")
    assert train(args) == 0
    return tmp_path / "exp"


@pytest.mark.slow  # trains a tiny Conformer first (once for the module)
def test_the_recipes_batch_gives_the_figures_of_the_trainers_last_validation(conformer_run, tmp_path, capsys):
    out = tmp_path / "validation.json"
    assert validate(["--checkpoint", str(conformer_run / "last.pt"), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    (row,) = record["results"]
    logged = {tag.removeprefix("valid/"): events for tag, events in read_scalars(conformer_run).items()
              if tag.startswith("valid/")}
    compared = 0
    for name, value in row["metrics"].items():
        short = name.removeprefix("valid_")
        last = max(logged[short], key=lambda event: event[1])[2]  # the value at the run's last validation
        assert value == pytest.approx(last, rel=1e-5, abs=1e-5), name
        compared += 1
    assert {"valid_loss", "valid_wer", "valid_cer", "valid_ctc_cer", "valid_batchnorm_gap"} <= row["metrics"].keys()
    assert compared == len(row["metrics"])
    assert row["decoded"] == 4  # the recipe's train.valid_max_utterances, as TINY_TRANSFORMER sets it
    printed = capsys.readouterr().out
    assert "(the recipe's)" in printed and "batchnorm_gap" in printed


@pytest.mark.slow
def test_a_folder_given_with_data_reads_as_the_recipes_dev_split_of_the_same_folder(conformer_run, tmp_path):
    rows = {}
    for where in (["--split", "dev"], ["--data", str(conformer_run.parent / "valid")]):
        out = tmp_path / f"{where[0][2:]}.json"
        assert validate(["--checkpoint", str(conformer_run / "last.pt"), "--decode", "2", *where, "--out", str(out)]) == 0
        record = json.loads(out.read_text())
        rows[where[0]] = record["results"][0]
        expected = f"the dev split of {conformer_run / 'last.pt'}" if where[0] == "--split" else where[1]
        assert record["data"] == expected
    assert rows["--data"] == rows["--split"]


@pytest.mark.slow
def test_only_batchnorms_gap_moves_with_the_batch_budget(conformer_run, tmp_path):
    # In evaluation mode an utterance's loss and CTC path do not depend on the batch it is padded in;
    # training-mode BatchNorm's statistics do, so the gap differs from one budget to the next.
    out = tmp_path / "budgets.json"
    assert validate(["--checkpoint", str(conformer_run / "last.pt"), "--decode", "0",
                     "--max-frames-per-batch", "300", "1200", "4800", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["max_frames_per_batch"] for r in rows] == [300, 1200, 4800]
    assert rows[0]["batches"] > rows[1]["batches"] > rows[2]["batches"]
    assert all(r["decoded"] == 0 and "valid_wer" not in r["metrics"] for r in rows)
    for row in rows[1:]:
        assert row["utterances"] == rows[0]["utterances"]
        assert row["metrics"]["valid_loss"] == pytest.approx(rows[0]["metrics"]["valid_loss"], rel=1e-4)
        assert row["metrics"]["valid_ctc_cer"] == pytest.approx(rows[0]["metrics"]["valid_ctc_cer"], abs=1e-6)
    gaps = [r["metrics"]["valid_batchnorm_gap"] for r in rows]
    assert all(gap > 0 for gap in gaps)
    assert len({round(gap, 6) for gap in gaps}) == 3, gaps


def test_a_missing_checkpoint_and_a_bad_budget_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        validate(["--checkpoint", str(tmp_path / "nowhere.pt")])
    assert "checkpoint not found" in capsys.readouterr().err
    (tmp_path / "x.pt").write_bytes(b"")
    with pytest.raises(SystemExit):
        validate(["--checkpoint", str(tmp_path / "x.pt"), "--max-frames-per-batch", "0"])
    assert "--max-frames-per-batch must be positive" in capsys.readouterr().err


def test_an_out_file_of_another_validation_is_refused_unless_overwrite(tmp_path, capsys):
    """The rule of asr.evaluate's folders: another validation's results are not replaced silently."""
    (tmp_path / "x.pt").write_bytes(b"")
    out = tmp_path / "dev.json"
    earlier = json.dumps({"checkpoint": str(tmp_path / "other.pt"), "data": "the dev split of other.pt", "results": []})
    out.write_text(earlier)
    with pytest.raises(SystemExit) as stop:
        validate(["--checkpoint", str(tmp_path / "x.pt"), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err
    assert err.startswith(f"error: {out} holds the results of another validation (checkpoint") and "--overwrite" in err
    assert out.read_text() == earlier
    with pytest.raises(SystemExit):  # --overwrite passes that check: the empty file is then refused as a checkpoint
        validate(["--checkpoint", str(tmp_path / "x.pt"), "--out", str(out), "--overwrite"])
    assert "holds the results" not in capsys.readouterr().err


@pytest.mark.slow
def test_statistics_re_estimated_from_the_validation_batch_itself_leave_no_gap(conformer_run):
    # Training-mode BatchNorm normalises each batch by its own statistics; running statistics estimated
    # from that very batch (every layer's, in training mode, in one pass) are the same numbers, but for
    # the unbiased variance's count / (count - 1): the gap falls from its trained value to about nothing.
    import torch

    from asr.inference.batchnorm import evaluation_dataset
    from asr.data.batching import collate
    from asr.data.sources import read_source
    from asr.inference import load_recogniser
    from asr.models.norms import recompute_batch_statistics
    from asr.training.validation import validate as run_validation
    from asr.training.validation import validation_options

    recogniser = load_recogniser(conformer_run / "last.pt")
    utterances = read_source(conformer_run.parent / "valid")
    dataset = evaluation_dataset(recogniser, utterances)
    everything = [list(range(len(dataset)))]
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=everything, collate_fn=collate)

    def gap():
        options = validation_options(recogniser.config.train, recogniser.model)
        return run_validation(recogniser.model, loader, recogniser.tokenizer, recogniser.device, options,
                              0).metrics["valid_batchnorm_gap"]

    before = gap()
    batch = next(iter(loader))
    assert recompute_batch_statistics(recogniser.model, [(batch.features, batch.feature_lengths)]) == 1
    after = gap()
    assert before > 0.05
    assert after < 0.01 * before, (before, after)
    assert not recogniser.model.training


@pytest.mark.slow
def test_recompute_batchnorm_re_estimates_from_the_training_split_and_leaves_the_checkpoint_alone(conformer_run, tmp_path):
    checkpoint = conformer_run / "last.pt"
    before = checkpoint.read_bytes()
    plain, recomputed = tmp_path / "plain.json", tmp_path / "recomputed.json"
    assert validate(["--checkpoint", str(checkpoint), "--decode", "0", "--out", str(plain)]) == 0
    assert validate(["--checkpoint", str(checkpoint), "--decode", "0", "--recompute-batchnorm", "2",
                     "--out", str(recomputed)]) == 0
    record = json.loads(recomputed.read_text())
    assert record["batchnorm_recomputed"]["batches"] == 2
    assert record["batchnorm_recomputed"]["utterances"] >= 2
    assert json.loads(plain.read_text())["batchnorm_recomputed"] is None
    a, b = (json.loads(f.read_text())["results"][0]["metrics"] for f in (plain, recomputed))
    assert a["valid_loss"] != pytest.approx(b["valid_loss"], rel=1e-6)  # evaluation reads the new statistics
    assert a["valid_batchnorm_gap"] != pytest.approx(b["valid_batchnorm_gap"], rel=1e-6)
    assert checkpoint.read_bytes() == before


@pytest.mark.slow
def test_an_average_with_recomputed_batchnorm_holds_what_asr_validate_re_estimates(conformer_run, tmp_path, capsys):
    import torch

    from asr.checkpoints.io import load_checkpoint
    from asr.cli.average import main as average

    plain, recomputed = tmp_path / "plain.pt", tmp_path / "recomputed.pt"
    assert average([str(conformer_run), "--last", "1", "--out", str(plain)]) == 0
    assert average([str(conformer_run), "--last", "1", "--out", str(recomputed), "--recompute-batchnorm", "2"]) == 0
    assert "re-estimated from 2 batches" in capsys.readouterr().out
    a, b = load_checkpoint(plain), load_checkpoint(recomputed)
    statistics = [name for name in a["model"] if name.endswith((".running_mean", ".running_var"))]
    assert statistics and all(not torch.equal(a["model"][n], b["model"][n]) for n in statistics)
    assert all(torch.equal(a["model"][n], b["model"][n]) for n in a["model"]
               if not n.endswith((".running_mean", ".running_var", ".num_batches_tracked")))
    assert b["training"]["batchnorm_recomputed"]["batches"] == 2
    # The written statistics are those asr.validate re-estimates in memory from the same batches: validating
    # the file as it is gives what validating the plain average with --recompute-batchnorm 2 gives.
    in_memory, written = tmp_path / "in_memory.json", tmp_path / "written.json"
    assert validate(["--checkpoint", str(plain), "--decode", "0", "--recompute-batchnorm", "2",
                     "--out", str(in_memory)]) == 0
    assert validate(["--checkpoint", str(recomputed), "--decode", "0", "--out", str(written)]) == 0
    x, y = (json.loads(f.read_text())["results"][0]["metrics"] for f in (in_memory, written))
    assert x.keys() == y.keys() and all(x[k] == pytest.approx(y[k], rel=1e-6, abs=1e-9) for k in x)
    members = tmp_path / "members.json"  # and not what the members' mean statistics give
    assert validate(["--checkpoint", str(plain), "--decode", "0", "--out", str(members)]) == 0
    assert json.loads(members.read_text())["results"][0]["metrics"]["valid_loss"] != pytest.approx(y["valid_loss"], rel=1e-6)
