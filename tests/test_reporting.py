"""asr/training/reporting.py: what a run writes to TensorBoard and train.log, read back from the event
files; and asr/studies/curves.py reading event files of the older layout onto the same axis."""

import json
import logging

import pytest
from torch.utils.tensorboard import SummaryWriter

from asr.studies.curves import EPOCH_AXIS, read_scalars, run_curves
from asr.training.reporting import RunLog
from asr.training.state import Progress

STEPS_PER_EPOCH = 3


def _train(log: RunLog, progress: Progress, steps: int, metrics: dict[str, float]) -> None:
    """``steps`` updates of epochs of :data:`STEPS_PER_EPOCH`, with a validation at the end of each epoch
    and after the last step (as when train.max_steps stops a run inside an epoch)."""
    for step in range(1, steps + 1):
        done, in_epoch = divmod(step - 1, STEPS_PER_EPOCH)
        progress.step = step
        log.step(done + 1, step, 10.0 / step, 1.0, None, {"lr": 0.5}, done + (in_epoch + 1) / STEPS_PER_EPOCH)
        if step % STEPS_PER_EPOCH == 0 or step == steps:
            finished = step % STEPS_PER_EPOCH == 0
            epochs_done = step / STEPS_PER_EPOCH
            progress.seconds = 30.0 * step
            log.validation(done + 1, progress, {"valid_loss": 5.0 / step, **metrics}, [],
                           epochs_done if not finished else round(epochs_done))


def test_training_and_validation_share_the_optimizer_step_axis(tmp_path, caplog):
    log = RunLog(tmp_path, log_every_steps=2, main=True, last_step=5)
    progress = Progress()
    with caplog.at_level(logging.INFO, logger="asr.train"):
        _train(log, progress, 5, {})
    log.close()
    curves = run_curves(tmp_path, "run")
    # Logged: the first step, every second, and the last (train.max_steps), whatever log_every_steps says.
    assert curves["train/loss"].steps == [1, 2, 4, 5]
    # Validation at the optimizer step it follows: after epoch 1 (step 3) and where the run stopped (step 5).
    assert curves["valid/loss"].steps == [3, 5] and curves["valid/loss"].values == pytest.approx([5 / 3, 1.0])
    assert curves["valid/minutes"].steps == [3, 5] and curves["valid/minutes"].values == [1.5, 2.5]
    assert all(c.axis != EPOCH_AXIS for c in curves.values())
    # The epoch is its own scalar: epochs done, 1 at the end of epoch 1, fractions inside an epoch.
    epoch = dict(zip(curves["epoch"].steps, curves["epoch"].values))
    assert epoch == pytest.approx({1: 1 / 3, 2: 2 / 3, 3: 1.0, 4: 4 / 3, 5: 5 / 3})
    # Step 5 was logged by training and by validation: `epoch` once.
    assert [s for _, s, _ in read_scalars(tmp_path)["epoch"]].count(5) == 1
    assert "valid/step" not in curves  # the x axis is the step now
    # train.log numbers epochs from 1, as the checkpoints and the `epoch` scalar do.
    lines = [r.getMessage() for r in caplog.records]
    assert "epoch 1 step 1 loss 10.0000 lr 0.5" in lines
    assert any(line.startswith("epoch 1: valid loss 1.6667") for line in lines)
    assert any(line.startswith("step 5 (epoch 2, not finished): valid loss 1.0000") for line in lines)


def _old_layout(folder, valid_steps: list[int] | None) -> None:
    """Events as the trainer wrote them before every scalar was on the step axis: validation at x = the
    epoch's number, with valid/step beside it (``valid_steps``; None: a run older still, without it)."""
    writer = SummaryWriter(log_dir=str(folder / "tensorboard"))
    for step in range(1, 7):
        writer.add_scalar("train/loss", 6.0 - step, step)
    for epoch, loss in enumerate([3.0, 2.0], start=1):
        writer.add_scalar("valid/loss", loss, epoch)
        if valid_steps is not None:
            writer.add_scalar("valid/step", valid_steps[epoch - 1], epoch)
    writer.close()


def test_event_files_of_the_older_layout_are_read_on_the_step_axis(tmp_path):
    _old_layout(tmp_path / "old", valid_steps=[3, 6])
    curves = run_curves(tmp_path / "old", "old")
    assert (curves["valid/loss"].steps, curves["valid/loss"].values) == ([3, 6], [3.0, 2.0])
    assert curves["valid/loss"].axis == curves["train/loss"].axis != EPOCH_AXIS
    assert (curves["epoch"].steps, curves["epoch"].values) == ([3, 6], [1.0, 2.0])
    # Older still: no valid/step to place the validations, which stay on the epoch axis and say so.
    _old_layout(tmp_path / "older", valid_steps=None)
    older = run_curves(tmp_path / "older", "older")
    assert (older["valid/loss"].steps, older["valid/loss"].axis) == ([1, 2], EPOCH_AXIS)
    assert "epoch" not in older and older["train/loss"].axis != EPOCH_AXIS


def test_shares_are_logged_in_percent_and_the_readers_know_which(tmp_path, caplog):
    from asr.studies.curves import PERCENT_TAGS
    from asr.training.metrics import METRICS

    log = RunLog(tmp_path, log_every_steps=1, main=True)
    progress = Progress()
    with caplog.at_level(logging.INFO, logger="asr.train"):
        _train(log, progress, 3, {"valid_wer": 0.125, "valid_attention_spearman": 0.5})
    log.close()
    curves = run_curves(tmp_path, "run")
    # WER as a person reads it, in TensorBoard as in train.log; a correlation is no share.
    assert curves["valid/wer"].values == [12.5] and curves["valid/attention_spearman"].values == [0.5]
    assert any("WER 12.50%, attention_spearman 0.5000" in r.getMessage() for r in caplog.records)
    # asr.studies.curves names the unit of the tags the trainer logs in percent: every metric that is a share.
    assert set(PERCENT_TAGS) == {name.replace("valid_", "valid/") for name, cls in METRICS.items() if cls.percent}


def test_event_files_of_the_older_layout_have_their_fractions_read_in_percent(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path))
    writer.add_scalar("valid/wer", 0.25, 1)
    writer.add_scalar("valid/step", 10, 1)
    writer.add_scalar("valid/attention_spearman", 0.5, 1)
    writer.close()
    curves = run_curves(tmp_path, "old")
    assert (curves["valid/wer"].steps, curves["valid/wer"].values) == ([10], [25.0])
    assert curves["valid/attention_spearman"].values == [0.5]


def _tensor_summaries(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return events


def test_the_settings_go_beside_the_curves_and_the_run_is_named_after_its_folder(tmp_path):
    from tensorboard.plugins.hparams import metadata

    exp = tmp_path / "ln_both"
    exp.mkdir()
    log = RunLog(exp, log_every_steps=1, main=True)
    config = {"exp_dir": str(exp), "model": {"layer_norm": "both", "listener": {"num_layers": 3}},
              "train": {"max_steps": 30, "schedules": {}, "betas": [0.9, 0.98], "max_epochs": None, "amp": False,
                        "lr": 0.001}}
    log.settings(config, ["model.layer_norm=both", "train.max_steps=30"], "python -m asr.train r.yaml x=1")
    log.close()
    # The event file is in exp_dir itself: `tensorboard --logdir` above it calls the run "ln_both".
    assert list(exp.glob("events.out.tfevents.*")) and not (exp / "tensorboard").exists()
    events = _tensor_summaries(exp)
    start = metadata.parse_session_start_info_plugin_data(
        events.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
    hparams = {k: v.string_value or v.number_value or v.bool_value for k, v in start.hparams.items()}
    assert hparams["overrides"] == "model.layer_norm=both train.max_steps=30"
    assert hparams["model.layer_norm"] == "both" and hparams["model.listener.num_layers"] == 3
    assert hparams["train.betas"] == "[0.9, 0.98]" and hparams["train.max_epochs"] == "null"
    assert "exp_dir" not in hparams  # the run's name says it
    # Each keeps its type (issue 80): a boolean is TensorBoard's boolean, not the number 0.0; numbers are numbers.
    assert start.hparams["train.amp"].WhichOneof("kind") == "bool_value" and start.hparams["train.amp"].bool_value is False
    assert start.hparams["train.max_steps"].WhichOneof("kind") == "number_value"
    assert start.hparams["train.max_steps"].number_value == 30 and start.hparams["train.lr"].number_value == 0.001
    # TensorBoard has one kind of number, a double (DataType has no integer): an integer is stored exactly, and
    # what the toolkit itself writes of the run's settings keeps it an integer.
    assert start.hparams["model.listener.num_layers"].number_value.is_integer()
    from google.protobuf import json_format

    sent = json.loads(json_format.MessageToJson(start))["hparams"]  # what the hparams dashboard receives
    assert sent["train.amp"] is False and sent["train.max_steps"] == 30 and sent["train.lr"] == 0.001
    assert start.hparams["model.layer_norm"].WhichOneof("kind") == "string_value"
    # No experiment summary of its own: TensorBoard gathers every run's and lists the differing keys first.
    assert metadata.EXPERIMENT_TAG not in events.Tags()["tensors"]
    # and a chart of train/loss and valid/loss over each other (CUSTOM SCALARS)
    assert events.SummaryMetadata("custom_scalars__config__").plugin_data.plugin_name == "custom_scalars"
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "    model:\n      layer_norm: both\n" in text
    assert "      num_layers: 3\n" in text and "    max_steps: 30\n" in text and "amp: false\n" in text
    command = events.Tensors("command line/text_summary")[0].tensor_proto.string_val[0].decode()
    assert command.strip() == "python -m asr.train r.yaml x=1"


def test_a_run_begun_in_exp_dir_tensorboard_goes_on_writing_there(tmp_path):
    _old_layout(tmp_path, valid_steps=[3, 6])  # events in tmp_path/tensorboard, as older versions wrote them
    log = RunLog(tmp_path, log_every_steps=1, main=True)
    log.step(3, 7, 0.5, None, None, {}, 2.5)
    log.close()
    assert not list(tmp_path.glob("events.out.tfevents.*"))  # one run in TensorBoard, not two
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2


def test_the_end_summary_names_the_best_checkpoint_the_files_and_the_next_commands(tmp_path):
    from asr.training.reporting import end_summary

    for name in ("last.pt", "epoch3.pt", "epoch4.pt", "best_epoch3.pt", "epoch4_copy.pt"):
        (tmp_path / name).write_bytes(b"")
    progress = Progress(epoch=4, step=400, seconds=150.0, best=[(0.125, 3), (0.25, 4)])
    lines = end_summary(tmp_path, progress, "train.max_epochs=4", "valid_wer", {"valid_loss": 1.5, "valid_wer": 0.25}, 4)
    text = "\n".join(lines)
    assert lines[0] == "training finished (train.max_epochs=4) after 400 steps, 4 epochs, 2.5 min"
    assert f"best: epoch 3, valid_wer 12.50% ({tmp_path / 'best_epoch3.pt'})" in lines  # WER in percent
    assert "last validation, at step 400: valid loss 1.5000, WER 25.00%" in lines
    assert "epoch3.pt .. epoch4.pt, best_epoch*.pt (1)" in text and f"tensorboard --logdir {tmp_path.parent}" in text
    assert f"next: python -m asr.average {tmp_path} --last 2" in lines
    assert f"python -m asr.evaluate --checkpoint {tmp_path / 'avg_last2.pt'} --split dev" in text
    # Stopped by train.max_steps inside its first epoch: nothing ranked, no epoch kept; last.pt is the model.
    (tmp_path / "mid").mkdir()
    lines = end_summary(tmp_path / "mid", Progress(step=30, batch_in_epoch=30), "train.max_steps=30", "valid_loss",
                        {"valid_loss": 2.0}, 0.25)
    # as the log numbers epochs (from 1), not "0.25 epochs"
    assert lines[0].startswith("training finished (train.max_steps=30) after 30 steps, 25% into epoch 1, ")
    assert "best: no epoch ranked by valid_loss (train.best_metric) yet" in lines
    assert f"next: python -m asr.evaluate --checkpoint {tmp_path / 'mid' / 'last.pt'} --split dev" in "\n".join(lines)


def test_a_run_is_refused_before_it_writes_anything(tmp_path):
    from asr.training.resume import refusal

    assert refusal(tmp_path / "new", resume=False) is None
    assert "--resume: no checkpoint to resume from" in refusal(tmp_path / "new", resume=True)
    (tmp_path / "last.pt").write_bytes(b"")
    assert "already holds a run (last.pt); pass --resume" in refusal(tmp_path, resume=False)
    assert refusal(tmp_path, resume=True) is None


def test_epochs_are_told_as_the_log_numbers_them():
    from asr.training.reporting import epochs_text

    assert [epochs_text(e) for e in (1, 4.0, 0.377358, 2.999, 3.5)] == [
        "1 epoch", "4 epochs", "37% into epoch 1", "99% into epoch 3", "50% into epoch 4"]
