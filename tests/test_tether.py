"""asr.studies.tether: a study's processes end with it, even when it is killed with SIGKILL.

The whole study killed mid-run, and the same command resuming it, is in tests/test_study.py."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import process_ended, subprocess_env

from asr.studies import tether

pytestmark = pytest.mark.skipif(not tether.available(), reason="PR_SET_PDEATHSIG is Linux's; elsewhere a "
                                "study killed with SIGKILL leaves its runs to be stopped by hand")


def _study_like_parent(child_code: str, then: str) -> tuple[subprocess.Popen, int]:
    """A parent that plays the study: a worker thread starts a tethered ``python -c child_code``, prints its
    PID and runs ``then`` (a line of that thread's code); the main thread waits for the thread, then sleeps."""
    parent_code = ("import os, subprocess, sys, threading, time\n"
                   "from asr.studies.tether import tethered\n"
                   "def start():\n"
                   f"    p = subprocess.Popen(tethered([sys.executable, '-c', {child_code!r}]), start_new_session=True)\n"
                   "    print(p.pid, flush=True)\n"
                   f"    {then}\n"
                   "t = threading.Thread(target=start)\n"
                   "t.start()\n"
                   "t.join()\n"
                   "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env())
    return parent, int(parent.stdout.readline())


def test_a_tethered_child_is_sent_the_death_signal_when_its_parent_is_killed_with_sigkill(tmp_path):
    """issue 81: kill -9 of asr.study left its asr.train children training, orphaned."""
    # the child records the signal that stops it
    child_code = ("import signal, sys, time, pathlib\n"
                  "def stop(signum, frame):\n"
                  f"    pathlib.Path({str(tmp_path / 'stopped')!r}).write_text(signal.Signals(signum).name)\n"
                  "    sys.exit(75)\n"
                  "signal.signal(signal.SIGUSR2, stop)\n"
                  f"pathlib.Path({str(tmp_path / 'ready')!r}).touch()\n"
                  "time.sleep(60)\n")
    parent, child = _study_like_parent(child_code, then="p.wait()")  # as the study's worker threads do
    try:
        deadline = time.monotonic() + 60
        # the child makes its request, then becomes the program (exec keeps the PID): no wrapper stays between
        while not (tmp_path / "ready").exists():  # its handler is set
            assert time.monotonic() < deadline and not process_ended(child)
            time.sleep(0.02)
        assert "time.sleep(60)" in Path(f"/proc/{child}/cmdline").read_text()
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert process_ended(child, within=5.0), "the child outlived its parent's SIGKILL"
    finally:
        parent.kill()
        if not process_ended(child):
            os.kill(child, signal.SIGKILL)  # a failed test leaves nothing running
    assert (tmp_path / "stopped").read_text() == "SIGUSR2"  # stopped through its handler (asr.training.signals)


def test_a_child_whose_parent_died_before_it_was_tethered_does_not_run(tmp_path):
    """The parent may die between the fork and the request; the check after it starts nothing then."""
    made = tmp_path / "made"
    not_my_parent = 1
    done = subprocess.run([sys.executable, "-m", "asr.studies.tether", str(not_my_parent), "touch", str(made)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signal.SIGUSR2 and not made.exists()
    done = subprocess.run([sys.executable, "-m", "asr.studies.tether", str(os.getpid()), "touch", str(made)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and made.exists()  # its own parent: the program runs


def test_the_kernel_sends_the_death_signal_again_for_each_thread_the_orphan_is_handed_to(tmp_path):
    """Why the death signal is not SIGTERM (a second SIGTERM stops asr.train at once): the thread that started
    the child ends first, so the child goes to the parent's main thread (one signal), then the whole parent
    is killed (a second). A study killed with SIGKILL gives two when its threads end in that order; a run
    counts them once (tests/test_signals.py)."""
    counts = tmp_path / "counts"
    child_code = ("import signal, time, pathlib\n"
                  "n = [0]\n"
                  "def count(signum, frame):\n"
                  "    n[0] += 1\n"
                  f"    pathlib.Path({str(counts)!r}).write_text(str(n[0]))\n"
                  "signal.signal(signal.SIGUSR2, count)\n"
                  f"pathlib.Path({str(tmp_path / 'ready')!r}).touch()\n"
                  "end = time.monotonic() + 60\n"
                  "while n[0] < 2 and time.monotonic() < end:\n"
                  "    time.sleep(0.02)\n")
    ready = str(tmp_path / "ready")
    # the thread that started the child returns once the child is ready; the parent's main thread lives on
    parent, child = _study_like_parent(child_code, then=f"while not os.path.exists({ready!r}): time.sleep(0.02)")
    try:
        deadline = time.monotonic() + 60
        while not (counts.exists() and counts.read_text() == "1"):  # its starting thread ended
            assert time.monotonic() < deadline and not process_ended(child)
            time.sleep(0.02)
        assert parent.poll() is None  # the parent itself is alive
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert process_ended(child, within=10.0)
    finally:
        parent.kill()
        if not process_ended(child):
            os.kill(child, signal.SIGKILL)
    assert counts.read_text() == "2"


def test_a_tethered_command_is_the_same_program_with_its_arguments():
    command = ["python", "-m", "asr.train", "recipe.yaml", "exp_dir=a b"]
    assert tether.tethered(command) == [sys.executable, "-m", "asr.studies.tether", str(os.getpid()), *command]
