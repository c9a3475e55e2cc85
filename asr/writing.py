"""Writing a run's files so that a full disk or a denied write ends in one clear error naming the file.

Every file the toolkit writes whole (checkpoints through :func:`asr.checkpoints.io.save_checkpoint`,
``config.yaml``, evaluation outputs) is written to a temporary file in the same folder and
renamed over its target, so a failed write leaves the previous version in place and no partial
file behind. The :class:`WriteError` it raises carries the path and the system's reason;
the command-line entry points print it as one line, ``error: <path>: No space left on device``.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


class WriteError(OSError):
    """A file could not be written (no space, permission denied, read-only file system, ...).

    An :class:`OSError` with the failed call's ``errno``; ``str()`` is ``"<path>: <reason>"``.
    """

    def __init__(self, path: str | Path, cause: OSError):
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        return f"{self.path}: {self.strerror}"


def os_error_in(err: BaseException) -> OSError | None:
    """The :class:`OSError` behind ``err``: itself, or one it was raised from or while handling.

    ``torch.save`` into a file object turns the ``OSError`` of a failed write into a
    ``RuntimeError("[enforce fail at inline_container.cc] unexpected pos ...")``
    raised while handling it; this finds the real reason.
    """
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


@contextmanager
def writing(path: str | Path):
    """Turn an :class:`OSError` (or an error caused by one) raised inside into a :class:`WriteError` naming ``path``."""
    try:
        yield
    except WriteError:
        raise
    except Exception as err:
        interrupt = _interrupt_in(err)
        if interrupt is not None:  # e.g. a second stop signal during torch.save: it, not the error it caused
            raise interrupt from None
        cause = os_error_in(err)
        if cause is None:
            raise
        raise WriteError(path, cause) from None


def _interrupt_in(err: BaseException) -> BaseException | None:
    """A KeyboardInterrupt-like exception (not an Exception) that ``err`` was raised while handling."""
    seen = set()
    while err is not None and id(err) not in seen:
        if not isinstance(err, Exception):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    On any failure the temporary file is removed and ``path`` keeps its previous content (or
    stays absent); an ``OSError`` becomes a :class:`WriteError` naming ``path``.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, default_mode())  # mkstemp's 0600 would hide the file from the group
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
            raise


def default_mode() -> int:
    """The mode ``open()`` gives a new file: 0666 less the process's umask."""
    umask = os.umask(0o022)  # reading the umask means setting it; put back at once
    os.umask(umask)
    return 0o666 & ~umask
