"""asr.writing and the checkpoint writer on a full disk and a denied write: one error naming the
file, nothing partial left, the previous file intact. On a real full file system (a small tmpfs,
when the test may mount one) and with the failure injected into the lowest write call."""

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from helpers import FailingFile

import asr.checkpoints.io
from asr.checkpoints.io import load_checkpoint, save_checkpoint
from asr.writing import WriteError, atomic_write, os_error_in


def _payload(value: float) -> dict:
    return {"config": {"exp_dir": "x"}, "model": {"w": torch.full((64, 64), value)}, "training": None}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture
def full_disk(tmp_path):
    """A 512 KiB tmpfs holding ``before.txt`` and ``old.pt``, then filled to the last byte.
    Needs root (or CAP_SYS_ADMIN); skipped where mounting is not allowed."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        (mount / "before.txt").write_text("the first version\n")
        save_checkpoint(mount / "old.pt", _payload(1.0))
        with open(mount / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as err:
                assert err.errno == errno.ENOSPC
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_file_system_gives_one_error_naming_the_checkpoint_and_keeps_the_old_one(full_disk):
    target = full_disk / "old.pt"
    with pytest.raises(WriteError) as caught:
        save_checkpoint(target, _payload(2.0))
    assert caught.value.errno == errno.ENOSPC
    assert str(caught.value) == f"{target}: No space left on device"
    assert torch.equal(load_checkpoint(target)["model"]["w"], torch.full((64, 64), 1.0))
    assert _leftovers(full_disk) == []


def test_a_full_file_system_keeps_a_text_file_whole(full_disk):
    target = full_disk / "before.txt"
    with pytest.raises(WriteError, match=f"^{target}: No space left on device$"):
        atomic_write(target, "x" * 100_000)
    assert target.read_text() == "the first version\n"
    with pytest.raises(WriteError, match="No space left"):
        atomic_write(full_disk / "new.txt", "y" * 100_000)
    assert not (full_disk / "new.txt").exists() and _leftovers(full_disk) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_the_no_space_behind_torch_saves_runtime_error_is_found():
    # torch.save into a file object reports a failed write as "RuntimeError: [enforce fail at
    # inline_container.cc] unexpected pos"; the OSError it was raised while handling says why.
    f = open("/dev/full", "wb")
    with pytest.raises(RuntimeError) as caught:
        torch.save({"w": torch.zeros(100_000)}, f)
    try:
        f.close()  # flushes what is left in the buffer: No space again
    except OSError:
        pass
    cause = os_error_in(caught.value)
    assert cause is not None and cause.errno == errno.ENOSPC


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EDQUOT])
def test_an_injected_write_error_names_the_checkpoint_and_leaves_nothing_partial(tmp_path, monkeypatch, code):
    target = tmp_path / "last.pt"
    save_checkpoint(target, _payload(1.0))
    real_fdopen = os.fdopen
    monkeypatch.setattr(asr.checkpoints.io.os, "fdopen", lambda fd, mode: FailingFile(real_fdopen(fd, mode), code, 5000))
    with pytest.raises(WriteError) as caught:
        save_checkpoint(target, _payload(2.0))
    assert caught.value.errno == code and str(caught.value) == f"{target}: {os.strerror(code)}"
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(target)["model"]["w"], torch.full((64, 64), 1.0))
    assert _leftovers(tmp_path) == []


def test_permission_denied_on_the_folder_names_the_file(tmp_path, monkeypatch):
    # Tests run as root, where chmod denies nothing: the refusal is injected where the file is created.
    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(asr.checkpoints.io.tempfile, "mkstemp", denied)
    with pytest.raises(WriteError, match=f"^{tmp_path / 'epoch3.pt'}: Permission denied$"):
        save_checkpoint(tmp_path / "epoch3.pt", _payload(1.0))
    with pytest.raises(WriteError, match=f"^{tmp_path / 'config.yaml'}: Permission denied$"):
        atomic_write(tmp_path / "config.yaml", "a: 1\n")
    assert list(tmp_path.iterdir()) == []


def test_a_file_written_atomically_gets_the_mode_open_would_give_it(tmp_path):
    previous = os.umask(0o027)
    try:
        atomic_write(tmp_path / "config.yaml", "a: 1\n")
        save_checkpoint(tmp_path / "last.pt", _payload(1.0))
    finally:
        os.umask(previous)
    for name in ("config.yaml", "last.pt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o640, name  # not mkstemp's 0600
