"""Speech synthesis with SVOX Pico, the demo corpus' second synthesiser (:mod:`asr.data.demo`).

eSpeak NG builds its voices from rules and formants; Pico's two English
voices (``en-US``, ``en-GB``) are statistical parametric voices trained on
recordings of real speakers, so their spectra come from a human voice. The
engine and its voice files come from the ``ttspico`` package
(``pip install ttspico``, Apache-2.0, compiled on install), which returns
16-bit samples at 16 kHz.

An engine carries state from one text to the next (the same text twice in a
row does not give the same samples), but a fresh engine given the same
sequence of texts always does. :class:`Speaker` therefore creates its engines
when it is created: one :class:`Speaker` per corpus, fed in a fixed order,
makes the same corpus every time.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

import numpy as np

VOICES = ("en-US", "en-GB")
SAMPLE_RATE = 16000
RATE_LIMITS = (20, 500)  # speaking rate, percent of the voice's own, as the engine clamps it
PITCH_LIMITS = (50, 200)  # pitch, percent of the voice's own
_INSTALL_HINT = "pip install ttspico"


class PicoError(RuntimeError):
    """SVOX Pico is missing, or does not have a voice."""


@dataclass(frozen=True)
class PicoRequest:
    """One text for :meth:`Speaker.speak`: which voice, how fast and how high (percent of the voice's own)."""

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


class Speaker:
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
