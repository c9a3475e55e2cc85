"""Synthesiser worker processes: starting one, and the arrays they send back.

The synthesisers (:mod:`asr.synthesis.espeak`, :mod:`asr.synthesis.pico`, :mod:`asr.synthesis.piper`;
see :mod:`asr.synthesis.engines`) run in worker processes that read one JSON job from stdin and write each
waveform to stdout as a little-endian uint32 sample count followed by the
samples. This module is both ends of that pipe.
"""

from __future__ import annotations

import os
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np


class WorkerStopped(Exception):
    """A worker's output ended before all samples arrived."""


@dataclass
class Worker:
    """A started worker process and the file its stderr goes to."""

    process: subprocess.Popen
    errors: IO[bytes]

    def last_message(self) -> str:
        """Waits for the process to end; the last line it wrote to stderr, or ``"no message"``."""
        self.process.wait()
        self.errors.seek(0)
        lines = self.errors.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no message"

    def close(self) -> None:
        """Stops the process if it still runs (the caller stopped early, or it failed) and frees its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()
        self.errors.close()


def start(entry: str, job: bytes) -> Worker:
    """Starts ``python -c entry`` with ``job`` on its stdin (closed after it).

    The worker must read all of stdin before writing anything, so this cannot
    deadlock. It imports this very package, also when it runs from a checkout
    that is not installed.
    """
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty worker cannot block on it
    process = subprocess.Popen(
        [sys.executable, "-c", entry], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, env=env
    )
    try:
        process.stdin.write(job)
        process.stdin.close()
    except BrokenPipeError:
        pass  # it ended at once; reading its output says why
    return Worker(process, errors)


def read_exact(stream: IO[bytes], size: int) -> bytes:
    """``size`` bytes from ``stream``; :class:`WorkerStopped` if it ends first."""
    data = stream.read(size)
    if len(data) < size:
        raise WorkerStopped
    return data


def read_array(stream: IO[bytes], dtype: str) -> np.ndarray:
    """One array as :func:`write_array` wrote it (``dtype`` little-endian, e.g. ``"<i2"``)."""
    (count,) = struct.unpack("<I", read_exact(stream, 4))
    return np.frombuffer(read_exact(stream, np.dtype(dtype).itemsize * count), dtype=dtype)


def write_array(out: IO[bytes], samples: np.ndarray) -> None:
    """Worker side: the sample count, then the samples as they are (make them little-endian first)."""
    out.write(struct.pack("<I", samples.size))
    out.write(samples.tobytes())


class ReadAhead:
    """A worker's arrays read on a thread as soon as it writes them, kept in order until :meth:`next` takes them.

    A pipe holds only 64 KiB, less than one second of audio: a worker whose
    reader is busy with another worker's output would stop after its first
    waveform and wait. Read ahead, the workers run side by side; the arrays
    waiting in memory are those the worker is ahead of its reader.
    """

    def __init__(self, worker: Worker, dtype: str) -> None:
        self._arrays: queue.SimpleQueue[np.ndarray | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._read, args=(worker.process.stdout, dtype), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes], dtype: str) -> None:
        try:
            while True:
                self._arrays.put(read_array(stream, dtype))
        except (WorkerStopped, OSError, ValueError):  # the output ended, or Worker.close closed it
            self._arrays.put(None)

    def next(self) -> np.ndarray:
        """The next array; :class:`WorkerStopped` once the output has ended."""
        array = self._arrays.get()
        if array is None:
            self._arrays.put(None)  # and stays ended
            raise WorkerStopped
        return array

    def join(self) -> None:
        """Waits for the reading thread to end (it ends with the worker's output)."""
        self._thread.join()
