"""Speech synthesis with SVOX Pico, the demo corpus' second synthesiser (:mod:`asr.synthesis.demo`).

eSpeak NG builds its voices from rules and formants; Pico's two English
voices (``en-US``, ``en-GB``) are statistical parametric voices trained on
recordings of real speakers, so their spectra come from a human voice. The
engine and its voice files come from the ``ttspico`` package
(``pip install ttspico``, Apache-2.0, compiled on install), which returns
16-bit samples at 16 kHz.

An engine carries state from one text to the next (the same text twice in a
row does not give the same samples), but a fresh engine given the same
sequence of texts always does. :class:`PicoVoices` therefore creates its engines
when it is created: one :class:`PicoVoices` per corpus, fed in a fixed order,
makes the same corpus every time. :func:`speak_many` (and :class:`Pico`, its
:class:`asr.synthesis.engines.Synthesiser`) speaks a list of requests with such
a fresh :class:`PicoVoices` in a worker process, beside the caller's work.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from asr.synthesis import workers

VOICES = ("en-US", "en-GB")
SAMPLE_RATE = 16000
RATE_LIMITS = (20, 500)  # speaking rate, percent of the voice's own, as the engine clamps it
PITCH_LIMITS = (50, 200)  # pitch, percent of the voice's own
_INSTALL_HINT = "pip install ttspico"


class PicoError(RuntimeError):
    """SVOX Pico is missing, or does not have a voice."""


@dataclass(frozen=True)
class PicoRequest:
    """One text for :meth:`PicoVoices.speak`: which voice, how fast and how high (percent of the voice's own)."""

    text: str
    voice: str
    rate: int = 100
    pitch: int = 100


def check_voice(voice: str) -> None:
    """Raise :class:`PicoError` for a voice Pico does not have (the names are case-sensitive)."""
    if voice not in VOICES:
        raise PicoError(f"SVOX Pico has no voice {voice!r}; its English voices are {', '.join(VOICES)}")


def _ttspico():
    try:
        import ttspico
    except ImportError as err:
        raise PicoError(f"SVOX Pico is not installed ({err}); install it with: {_INSTALL_HINT}") from err
    return ttspico


def version() -> str:
    """The installed ``ttspico`` version, or ``"missing"``."""
    try:
        return importlib.metadata.version("ttspico")
    except importlib.metadata.PackageNotFoundError:
        return "missing"


class PicoVoices:
    """Fresh Pico engines for ``voices``; :meth:`speak` turns a request into float32 samples in [-1, 1]."""

    def __init__(self, voices: list[str]) -> None:
        ttspico = _ttspico()
        self._engines = {}
        for voice in voices:
            check_voice(voice)
            try:
                self._engines[voice] = ttspico.TtsEngine(voice)
            except RuntimeError as err:
                raise PicoError(f"SVOX Pico could not load its {voice} voice: {err}") from err

    def speak(self, request: PicoRequest) -> np.ndarray:
        for name, value, (low, high) in (("rate", request.rate, RATE_LIMITS), ("pitch", request.pitch, PITCH_LIMITS)):
            if not low <= value <= high:
                raise ValueError(f"Pico {name} must be in [{low}, {high}] percent, got {value}")
        engine = self._engines[request.voice]
        engine.rate = request.rate
        engine.pitch = request.pitch
        pcm = engine.speak(request.text)
        if not pcm:
            raise PicoError(f"SVOX Pico ({request.voice}) returned no audio for {request.text!r}")
        return np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768


def speak_many(requests: Sequence[PicoRequest]) -> Iterator[np.ndarray]:
    """Each request spoken, in order, by one fresh :class:`PicoVoices` in a worker process: float32 at 16 kHz.

    The worker starts at once and speaks ahead of the caller (read on a
    thread, so a full pipe never stops it). The same list always gives the
    same samples, the same as a fresh :class:`PicoVoices` in this process gives.
    A request Pico rejects ends the iteration with :class:`PicoError` carrying
    the worker's message; closing the iterator early stops the worker.
    """
    voices = sorted({request.voice for request in requests})
    for voice in voices:
        check_voice(voice)
    job = json.dumps({"voices": voices, "requests": [asdict(r) for r in requests]}).encode()
    worker = workers.start("from asr.synthesis.pico import _serve; _serve()", job) if requests else None
    return _Spoken(worker, len(requests))


class _Spoken(Iterator[np.ndarray]):
    """The worker's waveforms in order; an iterator rather than a generator so that :meth:`close`
    stops the worker also when nothing was read yet."""

    def __init__(self, worker: workers.Worker | None, count: int) -> None:
        self._worker = worker
        self._reader = workers.ReadAhead(worker, "<i2") if worker else None
        self._left = count

    def __next__(self) -> np.ndarray:
        if self._left == 0:
            self.close()
            raise StopIteration
        try:
            samples = self._reader.next()
        except workers.WorkerStopped:
            message = self._worker.last_message()  # waits for it to end
            self.close()
            status = self._worker.process.returncode
            raise PicoError(f"Pico worker stopped early (exit status {status}): {message}") from None
        self._left -= 1
        return samples.astype(np.float32) / np.float32(32768)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._reader.join()


def _serve() -> None:
    """Worker side of :func:`speak_many`: a job as JSON on stdin, length-prefixed int16 on stdout."""
    out = sys.stdout.buffer
    try:
        job = json.loads(sys.stdin.buffer.read())
        voices = PicoVoices(job["voices"])
        for request in job["requests"]:
            samples = voices.speak(PicoRequest(**request))
            # speak() divided the engine's int16 by 32768: multiplying back is exact
            workers.write_array(out, np.round(samples * 32768).astype("<i2"))
        out.flush()
    except (PicoError, ValueError) as err:
        print(err, file=sys.stderr)
        sys.exit(1)


class Pico:
    """SVOX Pico behind :class:`asr.synthesis.engines.Synthesiser` (:func:`speak_many`)."""

    name = "pico"
    request_type = PicoRequest
    sample_rate = SAMPLE_RATE
    install_hint = _INSTALL_HINT

    def check(self) -> None:
        _ttspico()

    def speak(self, requests: Sequence[PicoRequest]) -> Iterator[np.ndarray]:
        return speak_many(requests)
