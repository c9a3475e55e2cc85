"""One training run per ``exp_dir``: the lock file ``exp_dir/train.lock``.

``asr.train`` takes the lock before it writes anything into the folder (under
``torchrun``, rank 0 takes it for the whole job: the folder is one run's, whatever the
node) and removes it when it ends, normally, with an error or on a stop signal.
The file is JSON naming the holder::

    {"pid": 4242, "host": "node17", "started": "2026-11-24T09:30:00+00:00", "command": "python -m asr.train ..."}

A second ``asr.train`` into the folder refuses with an error naming the holder. A lock
left by a process that is gone (``kill -9``, a crashed node) is *stale*: when it names
this host and its PID is no longer alive, it is taken over with a warning. A lock
from another host cannot be checked from here; the error says to remove the file
once that run is known to be over. (Host names must tell apart the machines that
share the folder: two machines both called ``localhost`` would take each other's lock
for their own.) Readers (``asr.average``, ``asr.evaluate``) never
look at the lock: they read a folder in use.

Taking the lock is an exclusive create (``O_CREAT | O_EXCL``), atomic on local file
systems and on NFSv3+. Taking over a stale lock removes it and creates a new one;
two runs starting in the same instant over the same stale lock could both win, a
window of microseconds that this does not close.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

from asr.writing import WriteError

logger = logging.getLogger("asr.train")

LOCK_NAME = "train.lock"


class RunLockError(RuntimeError):
    """The experiment folder is in use by another run; the message names it."""


class RunLock:
    """The lock on one ``exp_dir``; :meth:`acquire` it, :meth:`release` it (idempotent).

    ``name``, ``holder`` and ``option`` let another folder be held the same way (a study's ``--out`` holds
    ``study.lock``: :mod:`asr.studies`): the lock file's name, what holds it and the option that chooses
    another folder, for the error."""

    def __init__(self, exp_dir: str | Path, name: str = LOCK_NAME, holder: str = "run", option: str = "exp_dir"):
        self.path = Path(exp_dir) / name
        self.held = False
        self._mine: dict | None = None
        self._holder, self._option = holder, option

    def acquire(self) -> None:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            # as typed ("python -m asr.train ..."); sys.argv would name the module's file
            "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        }
        for attempt in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_lock(self.path)
                if attempt == 0 and holder is not None and is_stale(holder):
                    logger.warning("taking over the stale lock %s: the %s that held it (%s) is no longer alive",
                                   self.path, self._holder, describe(holder))
                    if read_lock(self.path) == holder:  # nobody took it over in the meantime
                        self.path.unlink(missing_ok=True)
                    continue
                if holder is None:
                    raise RunLockError(
                        f"{self.path.parent} is in use: {self.path} exists but cannot be read; "
                        f"if no {self._holder} uses this folder, remove {self.path}"
                    ) from None
                raise RunLockError(
                    f"{self.path.parent} is in use by another {self._holder}: {describe(holder)}. "
                    f"Wait for it to end or choose another {self._option}; if that {self._holder} is over, "
                    f"remove {self.path}"
                ) from None
            except OSError as err:
                raise WriteError(self.path, err) from None
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(info) + "\n")
            except OSError as err:  # a full disk: no half-written lock is left to block the next run
                self.path.unlink(missing_ok=True)
                raise WriteError(self.path, err) from None
            self.held, self._mine = True, info
            return

    def release(self) -> None:
        """Remove the lock if this process still holds it (never another run's)."""
        if not self.held:
            return
        self.held = False
        if read_lock(self.path) == self._mine:
            self.path.unlink(missing_ok=True)


def read_lock(path: Path) -> dict | None:
    """The holder a lock file names, or None when it is missing or unreadable."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def describe(holder: dict) -> str:
    return (
        f"PID {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}, "
        f"command: {holder.get('command')}"
    )


def is_stale(holder: dict) -> bool:
    """True when the holder ran on this host and its PID is no longer alive."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False
