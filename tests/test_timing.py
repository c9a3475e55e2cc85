"""asr/training/timing.py: the wall time per update and the loader's share of it, and how the run log shows them."""

import logging
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from asr.studies.curves import run_curves
from asr.training.reporting import RunLog
from asr.training.timing import LoaderClock


class _FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_is_the_time_spent_inside_the_loader_and_the_interval_restarts_at_each_read():
    clock = _FakeClock()
    timer = LoaderClock(clock)

    def loader():
        for i in range(4):
            clock.now += 2.0  # the loader takes 2 s a batch
            yield i

    got = []
    for batch in timer.batches(loader()):
        got.append(batch)
        clock.now += 1.0  # the step takes 1 s a batch
        if batch % 2 == 1:  # two batches an update (accum_grad 2)
            timer.updated()
        if batch == 1:
            assert timer.read() == pytest.approx({"seconds_per_update": 6.0, "loader_wait": 4 / 6})
    assert got == [0, 1, 2, 3]
    # the second interval: 2 batches, the last wait (the one that found the loader empty) counted too
    assert timer.read() == pytest.approx({"seconds_per_update": 6.0, "loader_wait": 4 / 6})
    assert timer.read() == {}  # no update since: nothing to say
    clock.now += 5.0
    timer.restart()  # a validation's 5 s are left out
    timer.updated()
    clock.now += 1.0
    assert timer.read() == pytest.approx({"seconds_per_update": 1.0, "loader_wait": 0.0})


class _Slow(Dataset):
    def __init__(self, seconds: float):
        self.seconds = seconds

    def __len__(self):
        return 6

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.tensor([i])


@pytest.mark.parametrize("loader_s, step_s", [(0.1, 0.0), (0.0, 0.1)])
def test_a_slow_loader_shows_as_waiting_and_a_slow_step_does_not(loader_s, step_s):
    # wall-clock sleeps, so the bounds leave room for a busy machine's scheduling (the ideal shares are 1 and
    # 0; with 30 ms sleeps and bounds 0.8/0.2 it failed now and then in a full suite beside training runs)
    timer = LoaderClock()
    for _ in timer.batches(DataLoader(_Slow(loader_s), batch_size=1)):
        time.sleep(step_s)
        timer.updated()
    timing = timer.read()
    assert timing["seconds_per_update"] >= 0.1
    if loader_s:
        assert timing["loader_wait"] > 0.6
    else:
        assert timing["loader_wait"] < 0.4


def test_the_run_log_writes_the_timing_as_scalars_and_on_the_train_log_line(tmp_path, caplog):
    log = RunLog(tmp_path, log_every_steps=1, main=True)
    with caplog.at_level(logging.INFO, logger="asr.train"):
        log.step(1, 1, 2.0, 1.0, None, {"lr": 0.5}, 0.5, {"seconds_per_update": 0.75, "loader_wait": 0.625})
        log.step(1, 2, 1.0, 1.0, None, {"lr": 0.5}, 1.0)  # no timing: nothing drawn at step 2
    log.close()
    curves = run_curves(tmp_path, "run")
    assert curves["time/seconds_per_update"].steps == [1]
    assert curves["time/seconds_per_update"].values == pytest.approx([0.75])
    assert curves["time/loader_wait"].values == pytest.approx([0.625])
    lines = [r.getMessage() for r in caplog.records]
    assert "epoch 1 step 1 loss 2.0000 lr 0.5, 0.75 s/update, loader wait 62%" in lines
    assert "epoch 1 step 2 loss 1.0000 lr 0.5" in lines
