"""One run per exp_dir: the lock file, a second run refused with the holder named, a stale lock
taken over, readers unaffected; and ``--resume`` anywhere among asr.train's arguments."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from helpers import TRANSFORMER_RECIPE as RECIPE  # no demo corpus to prepare: these runs never start

from asr.checkpoints.io import save_checkpoint
from asr.cli.average import main as average_main
from asr.cli.train import build_parser
from asr.cli.train import main as train_main
from asr.training.runlock import LOCK_NAME, RunLock, RunLockError


def _dead_pid() -> int:
    """A PID no process has: the highest free one (no process is started to find it)."""
    pid_max = Path("/proc/sys/kernel/pid_max")
    pid = int(pid_max.read_text()) - 1 if pid_max.exists() else 99_999
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_the_lock_names_its_holder_and_a_second_run_is_refused(tmp_path):
    first = RunLock(tmp_path)
    first.acquire()
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    assert holder["started"] and "python" in holder["command"]
    with pytest.raises(RunLockError) as refused:
        RunLock(tmp_path).acquire()
    message = str(refused.value)
    assert f"PID {os.getpid()} on host {socket.gethostname()}" in message and str(tmp_path / LOCK_NAME) in message
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    again = RunLock(tmp_path)
    again.acquire()  # free again
    again.release()


def test_release_never_removes_another_runs_lock(tmp_path):
    mine = RunLock(tmp_path)
    mine.acquire()
    other = {"pid": 1, "host": "elsewhere", "started": "then", "command": "python -m asr.train x"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(other))  # e.g. removed by hand and taken by another run
    mine.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text()) == other


def test_a_stale_lock_on_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
    dead = _dead_pid()
    stale = {"pid": dead, "host": socket.gethostname(), "started": "yesterday", "command": "python -m asr.train x"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    lock = RunLock(tmp_path)
    lock.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert "stale lock" in caplog.text and f"PID {dead}" in caplog.text
    lock.release()


@pytest.mark.parametrize("holder, said", [({}, "the run that held it"),
                                          ({"holder": "asr.study", "option": "--out"}, "the asr.study that held it")])
def test_the_stale_lock_warning_names_what_held_it_a_run_or_a_study(tmp_path, caplog, holder, said):
    """asr.train's train.lock and asr.study's study.lock (asr.studies.grid) share the lock: the warning on
    taking one over says whose it was, not "its run" for a study."""
    name, command = ("study.lock", "python -m asr.study x") if holder else (LOCK_NAME, "python -m asr.train x")
    dead = _dead_pid()
    (tmp_path / name).write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "started": "yesterday",
                                             "command": command}))
    lock = RunLock(tmp_path, name, **holder)
    lock.acquire()
    (warning,) = [r.getMessage() for r in caplog.records if "stale lock" in r.getMessage()]
    assert warning == (f"taking over the stale lock {tmp_path / name}: {said} (PID {dead} on host "
                       f"{socket.gethostname()}, started yesterday, command: {command}) is no longer alive")
    lock.release()


@pytest.mark.parametrize("holder", [{"host": "another-node"}, {}])
def test_a_lock_of_a_live_process_or_another_host_is_not_taken_over(tmp_path, holder):
    # another host: its PID cannot be checked from here, even one that is not alive here
    info = {"pid": _dead_pid() if holder else os.getppid(), "host": socket.gethostname(), "started": "now",
            "command": "python -m asr.train x", **holder}
    (tmp_path / LOCK_NAME).write_text(json.dumps(info))
    with pytest.raises(RunLockError, match=f"PID {info['pid']} on host {info['host']}"):
        RunLock(tmp_path).acquire()


def test_asr_train_refuses_a_folder_in_use_before_writing_into_it(tmp_path, capsys):
    exp = tmp_path / "exp"
    holder = RunLock(exp)
    exp.mkdir()
    holder.acquire()
    assert train_main([str(RECIPE), f"exp_dir={exp}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"PID {os.getpid()}" in err and "in use by another run" in err
    assert sorted(p.name for p in exp.iterdir()) == [LOCK_NAME]  # no train.log, no config.yaml
    holder.release()


def test_asr_average_reads_a_folder_in_use(tmp_path):
    for epoch in (0, 1):
        save_checkpoint(tmp_path / f"epoch{epoch}.pt", {
            "config": {"exp_dir": str(tmp_path)}, "model": {"w": torch.full((2,), float(epoch))},
            "tokenizer": {}, "features": {}, "training": {"epoch": epoch},
        })
    lock = RunLock(tmp_path)
    lock.acquire()
    assert average_main([str(tmp_path), "--last", "2"]) == 0
    assert (tmp_path / "avg_last2.pt").is_file() and (tmp_path / LOCK_NAME).is_file()
    lock.release()


@pytest.mark.parametrize("argv", [
    ["r.yaml", "--resume", "a=1", "b.c=2"],
    ["r.yaml", "a=1", "--resume", "b.c=2"],
    ["r.yaml", "a=1", "b.c=2", "--resume"],
    ["--resume", "r.yaml", "a=1", "b.c=2"],
])
def test_resume_may_come_anywhere_among_the_arguments(argv):
    args = build_parser().parse_intermixed_args(argv)
    assert args.resume and args.recipe == "r.yaml" and args.overrides == ["a=1", "b.c=2"]
    assert not build_parser().parse_intermixed_args(["r.yaml", "a=1"]).resume


def test_an_exp_dir_that_cannot_be_made_is_one_error_naming_it(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    exp = tmp_path / "a_file" / "exp"
    assert train_main([str(RECIPE), f"exp_dir={exp}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {exp}: Not a directory\n"
