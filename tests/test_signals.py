"""The stop signals: the first only asks (the trainer stops at the next step boundary), a second
stops at once, and a checkpoint being written then is abandoned with the previous one intact.
The whole graceful stop of a training run is in tests/test_train.py."""

import os
import signal

import pytest
import torch

import asr.checkpoints.io
from asr.checkpoints.io import load_checkpoint, save_checkpoint
from asr.training.signals import PARENT_DIED, STOP_SIGNALS, StopNow, StopSignals


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_the_first_signal_asks_and_the_second_stops_at_once(signum):
    before = signal.getsignal(signum)
    with StopSignals() as stop:
        os.kill(os.getpid(), signum)
        assert stop.received == signum and stop.name == signal.Signals(signum).name
        with pytest.raises(StopNow) as now:
            os.kill(os.getpid(), signum)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        assert now.value.exit_code == 128 + signum
    assert signal.getsignal(signum) is before


def _deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    for _ in range(1000):  # the handler runs between bytecodes
        pass


def test_the_parents_death_stops_once_however_often_the_kernel_repeats_it():
    # asr.studies.tether: the kernel sends it once per thread of the dead study the orphan passes through
    with StopSignals() as stop:
        _deliver(PARENT_DIED)
        assert stop.received == PARENT_DIED
        _deliver(PARENT_DIED)
        _deliver(PARENT_DIED)  # no StopNow: the run finishes its step and writes last.pt
        with pytest.raises(StopNow):  # a person's SIGTERM still stops it at once
            _deliver(signal.SIGTERM)
    with StopSignals() as stop:  # after another stop signal, it does not escalate either
        _deliver(signal.SIGTERM)
        _deliver(PARENT_DIED)
        assert stop.received == signal.SIGTERM


def test_a_second_signal_during_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "last.pt"
    old = {"config": {}, "model": {"w": torch.zeros(256, 256)}}
    save_checkpoint(target, old)
    real_save = torch.save
    written = []

    def save_then_signal(payload, f):
        f.write(b"PK\x03\x04 the first bytes of a zip archive")  # a partial file, as a save cut short leaves
        written.append(f.name)
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal, mid-save
        real_save(payload, f)

    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == signal.SIGTERM
        monkeypatch.setattr(asr.checkpoints.io.torch, "save", save_then_signal)
        with pytest.raises(StopNow):
            save_checkpoint(target, {"config": {}, "model": {"w": torch.ones(256, 256)}})
    monkeypatch.undo()
    assert written and not os.path.exists(written[0])  # the temporary file is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    assert torch.equal(load_checkpoint(target)["model"]["w"], torch.zeros(256, 256))


def _handler_in_worker(index: int) -> str:
    return str(signal.getsignal(signal.SIGTERM))


@pytest.mark.slow  # starts a DataLoader worker
def test_dataloader_workers_leave_the_stop_to_the_main_process():
    # A terminal's Ctrl-C and SLURM signal every process of the job: a worker ended by the
    # signal would fail the loader before the trainer could stop cleanly.
    from asr.training.signals import ignore_stop_signals

    loader = torch.utils.data.DataLoader(
        _Handlers(), batch_size=None, num_workers=1, worker_init_fn=ignore_stop_signals
    )
    assert list(loader) == [str(signal.SIG_IGN)]


class _Handlers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> str:
        return _handler_in_worker(index)
