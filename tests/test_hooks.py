"""Hooks (asr.training.hooks): a toy hook registered from outside the package sees the loop's events in
order with their step numbers, and a run stopped and resumed shows its hooks (the recorder here, and the
run's own reporting to TensorBoard, which is one) the same losses, bit for bit, as one run straight."""

import signal

import pytest
import torch
from helpers import tiny_run

from asr.experiment import load_experiment_config
from asr.run import build_trainer
from asr.studies.curves import read_scalars
from asr.training.hooks import Hook
from asr.training.signals import TrainingStopped

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_demo_corpus")]  # every test here trains


class Recorder(Hook):
    """Every event, as (name, numbers), and each update's loss."""

    def __init__(self):
        self.events: list[tuple] = []
        self.losses: dict[int, float] = {}

    def on_update(self, trainer, update):
        assert trainer.progress.step == update.step
        self.events.append(("update", update.epoch, update.step))
        self.losses[update.step] = update.loss

    def on_validation(self, trainer, validated):
        self.events.append(("validation", validated.epoch, validated.step, validated.at_epoch_end))

    def on_epoch_end(self, trainer, epoch):
        assert "valid_loss" in epoch.metrics
        self.events.append(("epoch end", epoch.epoch, epoch.step))

    def on_run_end(self, trainer, end):
        self.events.append(("run end", end.why, end.step, end.epochs_done))

    def close(self, trainer):
        self.events.append(("close",))


def _config(tmp_path, *extra):
    recipe, *overrides = tiny_run(tmp_path, *extra)
    return load_experiment_config(recipe, overrides)


def test_a_hook_from_outside_sees_every_event_in_order_with_its_step(tmp_path):
    """Two epochs of 5 updates, validated every 3 updates besides the epochs' ends."""
    recorder = Recorder()
    config = _config(tmp_path, "train.max_epochs=2", "train.valid_every_steps=3")
    build_trainer(config, hooks=[recorder]).fit()
    updates = lambda epoch, steps: [("update", epoch, s) for s in steps]  # noqa: E731
    assert recorder.events == [
        *updates(1, [1, 2, 3]), ("validation", 1, 3, False), *updates(1, [4, 5]), ("validation", 1, 5, True),
        ("epoch end", 1, 5),
        *updates(2, [6]), ("validation", 2, 6, False), *updates(2, [7, 8, 9]), ("validation", 2, 9, False),
        *updates(2, [10]), ("validation", 2, 10, True), ("epoch end", 2, 10),
        ("run end", "train.max_epochs=2", 10, 2.0), ("close",),
    ]


class StopAfter(Hook):
    """Sends the process SIGTERM after update ``step``, as a scheduler's preemption would: the loop stops
    at the next step boundary with last.pt written."""

    def __init__(self, step: int):
        self.step = step

    def on_update(self, trainer, update):
        if update.step == self.step:
            signal.raise_signal(signal.SIGTERM)


def test_a_run_stopped_and_resumed_shows_its_hooks_the_same_losses_as_one_run_straight(tmp_path):
    extra = ("train.max_epochs=2", "train.log_every_steps=1", "model.listener.dropout=0.2")  # dropout draws
    straight = Recorder()
    build_trainer(_config(tmp_path / "straight", *extra), hooks=[straight]).fit()
    first, second = Recorder(), Recorder()
    config = _config(tmp_path / "stopped", *extra)
    with pytest.raises(TrainingStopped):
        build_trainer(config, hooks=[first, StopAfter(3)]).fit()  # mid-epoch: the first epoch has 5 updates
    assert sorted(first.losses) == [1, 2, 3] and first.events[-1] == ("close",)
    build_trainer(config, resume=True, hooks=[second]).fit()
    assert sorted(second.losses) == list(range(4, 11))
    assert {**first.losses, **second.losses} == straight.losses  # bit for bit
    # the run's own reporting is a hook too: its TensorBoard curve of the loss is the straight run's
    curves = {name: read_scalars(tmp_path / name / "exp")["train/loss"] for name in ("straight", "stopped")}
    assert [(step, value) for _, step, value in curves["stopped"]] == [(step, value) for _, step, value in curves["straight"]]
    assert torch.tensor([v for _, _, v in curves["straight"]]).isfinite().all()


class Rates(Hook):
    """Each update's learning rate and loss."""

    def __init__(self):
        self.updates: dict[int, tuple[float, float]] = {}

    def on_update(self, trainer, update):
        self.updates[update.step] = (update.values["lr"], update.loss)


def test_the_plateau_rule_is_a_hook_and_a_resumed_run_moves_the_rate_as_one_run_straight(tmp_path):
    """The plateau rule (a bootstrap of the rehearsal recipes) watches the validations as a hook
    (asr.training.schedules.WatchedSchedules): with a threshold no epoch meets, every validation after the
    first halves the rate; a run stopped inside its second epoch and resumed makes the same rates and
    losses, bit for bit, as one run straight, and logs the same halvings."""
    extra = ("train.max_epochs=4", "train.scheduler.kind=plateau", "train.scheduler.warmup_steps=1",
             "train.scheduler.plateau_threshold=0.99", "train.scheduler.plateau_patience=1",
             "train.scheduler.decay_factor=0.5", "model.listener.dropout=0.2")
    from asr.training.schedules import WatchedSchedules

    straight = Rates()
    trainer = build_trainer(_config(tmp_path / "straight", *extra), hooks=[straight])
    assert sum(isinstance(hook, WatchedSchedules) for hook in trainer.hooks) == 1  # the rule is one hook
    trainer.fit()
    rates = [rate for rate, _ in straight.updates.values()]
    assert len(set(rates)) >= 3 and rates == sorted(rates, reverse=True)  # it fell, epoch by epoch
    first, second = Rates(), Rates()
    config = _config(tmp_path / "stopped", *extra)
    with pytest.raises(TrainingStopped):
        build_trainer(config, hooks=[first, StopAfter(8)]).fit()  # inside the second epoch, after one halving
    build_trainer(config, resume=True, hooks=[second]).fit()
    assert {**first.updates, **second.updates} == straight.updates  # bit for bit
    logs = {name: [line.split(" ", 1)[1] for line in (tmp_path / name / "exp" / "train.log").read_text().splitlines()
                   if "learning rate x" in line] for name in ("straight", "stopped")}
    assert logs["straight"] and logs["stopped"] == logs["straight"]
