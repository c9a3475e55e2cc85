"""One small interface over the speech synthesisers that make the toolkit's synthetic corpora.

Three synthesisers speak the demo corpus (:mod:`asr.synthesis.demo`) and the
LibriSpeech-shaped rehearsal corpus (:mod:`asr.synthesis.librispeech`):

    ``espeak``  eSpeak NG, rule and formant voices   (:mod:`asr.synthesis.espeak`, 22050 Hz)
    ``pico``    SVOX Pico, two English voices         (:mod:`asr.synthesis.pico`, 16000 Hz)
    ``piper``   Piper, a neural (VITS) voice          (:mod:`asr.synthesis.piper`, 22050 Hz)

Each is a :class:`Synthesiser`: its own frozen request dataclass (text,
voice and that synthesiser's own knobs: eSpeak's words per minute, Pico's
percentages, Piper's length scale), a ``sample_rate``, and :meth:`speak`,
which speaks a list of requests *in order*, in worker processes, with a
synthesiser freshly started for the call. None of the three gives the same
samples for the same text twice in one process (each carries state from one
text to the next), but each gives the same samples for the same *list*: a
corpus that hands each synthesiser a fixed list (the demo: one list per
synthesiser for the whole corpus; the rehearsal corpus: one list per
chapter) is the same corpus every time, however many processes make it.

:data:`SYNTHESISERS` maps a name to its class; :func:`for_request` finds the
synthesiser of a request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from asr.synthesis import espeak, pico, piper


@runtime_checkable
class Spoken(Protocol):
    """What :meth:`Synthesiser.speak` returns: the waveforms in request order, and a way to stop early."""

    def __iter__(self) -> Iterator[np.ndarray]: ...

    def __next__(self) -> np.ndarray: ...

    def close(self) -> None:
        """Stops the worker processes still running (the caller stopped reading early, or failed)."""


@runtime_checkable
class Synthesiser(Protocol):
    """A speech synthesiser behind one contract (see the module docstring)."""

    name: str  # the registry name: "espeak", "pico", "piper"
    request_type: type  # the frozen dataclass :meth:`speak` takes
    sample_rate: int  # Hz of every waveform :meth:`speak` yields
    install_hint: str  # the pip command that installs what it needs

    def check(self) -> None:
        """Raises this synthesiser's error, naming :attr:`install_hint`, if its packages are missing."""

    def speak(self, requests: Sequence) -> Spoken:
        """Each request spoken, in order, as float32 ``(N,)`` samples in [-1, 1] at :attr:`sample_rate`.

        A freshly started synthesiser speaks the list, in worker processes
        that start at once and work ahead of the caller, so the same list
        always gives the same samples. A request the synthesiser rejects ends
        the iteration with its error, carrying the worker's message.
        """


SYNTHESISERS: dict[str, type] = {
    espeak.Espeak.name: espeak.Espeak,
    pico.Pico.name: pico.Pico,
    piper.Piper.name: piper.Piper,
}


def get(name: str, **options) -> Synthesiser:
    """The synthesiser registered as ``name``; :class:`ValueError` naming the known ones otherwise."""
    if name not in SYNTHESISERS:
        raise ValueError(f"unknown synthesiser {name!r}; known: {', '.join(SYNTHESISERS)}")
    return SYNTHESISERS[name](**options)


def for_request(request) -> str:
    """The name of the synthesiser whose request type ``request`` is."""
    for name, synthesiser in SYNTHESISERS.items():
        if isinstance(request, synthesiser.request_type):
            return name
    raise TypeError(f"no synthesiser takes a {type(request).__name__}")
