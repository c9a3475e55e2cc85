"""Speech synthesis with eSpeak NG, for the synthetic demo corpus (:mod:`asr.synthesis.demo`).

The library and its voice data come from the ``espeakng-loader`` package
(``pip install espeakng-loader``); no system eSpeak is needed. It is driven
through ``ctypes`` in synchronous mode: :func:`synthesize` returns the whole
waveform of one text.

A voice is ``"<language>+<variant>"``, e.g. ``"en-us+m3"``: the language
sets the pronunciation rules and accent (``en``, ``en-us``, ``en-gb-x-rp``,
``en-gb-scotland``, ``en-029``, ...), the variant (``m1``-``m8``,
``f1``-``f5``, ``klatt``, ...; see :func:`available_variants`) the pitch,
formants and voice quality.

eSpeak is a process-wide singleton: it is initialised once, on first use,
and its random generator (which some voices use for noise, e.g. breathy
ones, and which eSpeak seeds from the clock) is then given a fixed seed. Its output still depends
on state carried over from earlier calls (the random generator, the phase of
the voicing source and of its pitch "flutter"), so the same call can give a
waveform that differs slightly from the previous one's.
:func:`synthesize_many` therefore runs a list of requests in a fresh process,
where the same list always gives the same samples.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import struct
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from asr.synthesis import workers

_INSTALL_HINT = "pip install espeakng-loader"

# Constants of espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # without it a failed initialisation calls exit() and takes Python down with it
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE, _PITCH, _RANGE, _WORDGAP = 1, 3, 4, 7

SAMPLE_RATE = 22050  # what eSpeak NG synthesises at (its workers report it; see Espeak.speak)
RATE_LIMITS = (80, 450)  # words per minute that eSpeak accepts
PITCH_LIMITS = (0, 100)  # espeakPITCH and espeakRANGE: 50 is the voice's own setting

_Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class EspeakError(RuntimeError):
    """eSpeak NG is missing, failed to initialise, or rejected a voice or a text."""


class UnknownVoiceError(EspeakError):
    """A voice whose language or variant eSpeak NG does not have."""


@dataclass(frozen=True)
class SynthesisRequest:
    """The arguments of one :func:`synthesize` call."""

    text: str
    voice: str
    rate: int
    pitch: int
    pitch_range: int = 50
    word_gap: int = 0


def _espeakng_loader():
    try:
        import espeakng_loader
    except ImportError as err:
        raise EspeakError(
            f"eSpeak NG is not installed: the espeakng-loader package is missing ({_INSTALL_HINT})"
        ) from err
    return espeakng_loader


def version() -> str:
    """The installed ``espeakng-loader`` version (it brings the library and its voices), or ``"missing"``."""
    try:
        return importlib.metadata.version("espeakng-loader")
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def data_path() -> Path:
    """The ``espeak-ng-data`` folder shipped with ``espeakng-loader``."""
    try:
        return Path(_espeakng_loader().get_data_path())
    except RuntimeError as err:  # the package raises RuntimeError when its data folder is missing
        raise EspeakError(f"eSpeak NG data not found ({err}); reinstall it: {_INSTALL_HINT}") from err


def available_variants() -> list[str]:
    """Names of the voice variants (the part after ``+``), sorted; read from the data folder, no synthesis."""
    folder = data_path() / "voices" / "!v"
    if not folder.is_dir():
        raise EspeakError(f"eSpeak NG voice variants folder not found: {folder} ({_INSTALL_HINT})")
    return sorted(p.name for p in folder.iterdir() if p.is_file())


class _Engine:
    """The loaded library, its sample rate and the callback that collects samples.

    The callback object must stay referenced as long as the library may call
    it, hence an attribute of an object that lives for the whole process.
    """

    def __init__(self) -> None:
        loader = _espeakng_loader()
        library = loader.get_library_path()
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as err:
            raise EspeakError(f"cannot load the eSpeak NG library {library}: {err} ({_INSTALL_HINT})") from err
        lib = self.lib
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_Callback]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        data = data_path()
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, str(data).encode(), _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise EspeakError(f"eSpeak NG failed to initialise with data folder {data} ({_INSTALL_HINT})")
        self.sample_rate = int(rate)
        # eSpeak seeds the random generator some voices draw noise from with the clock when it
        # initialises; a fixed seed makes a fresh process give the same samples every time.
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_ng_SetRandSeed(0)
        self.chunks: list[np.ndarray] = []
        self.callback = _Callback(self._collect)
        lib.espeak_SetSynthCallback(self.callback)
        self.variants = set(available_variants())
        self.lock = threading.Lock()  # one synthesis at a time: the library and self.chunks are shared

    def _collect(self, samples, count, events) -> int:
        if samples and count > 0:
            self.chunks.append(np.ctypeslib.as_array(samples, shape=(count,)).copy())
        return 0  # 0 = continue synthesis

    def set_voice(self, voice: str) -> None:
        """Select ``voice``; caller holds the lock."""
        language, plus, variant = voice.partition("+")
        if not language:
            raise UnknownVoiceError(
                f"eSpeak voice {voice!r} has no language (expected '<language>+<variant>', e.g. 'en-us+m3')"
            )
        # eSpeak silently falls back to the plain language for an unknown variant, so check it here.
        if plus and variant not in self.variants:
            raise UnknownVoiceError(
                f"unknown eSpeak voice variant {variant!r} in voice {voice!r} "
                f"(known variants: {', '.join(sorted(self.variants))})"
            )
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise UnknownVoiceError(f"unknown eSpeak voice {voice!r}: language {language!r} not found")

    def synthesize(self, request: SynthesisRequest) -> np.ndarray:
        """``request`` spoken, as int16 samples ``(N,)`` at :attr:`sample_rate`."""
        _check_request(request)
        encoded = request.text.encode("utf-8")
        with self.lock:
            self.set_voice(request.voice)
            for parameter, value in (
                (_RATE, request.rate),
                (_PITCH, request.pitch),
                (_RANGE, request.pitch_range),
                (_WORDGAP, request.word_gap),
            ):
                self.lib.espeak_SetParameter(parameter, value, 0)  # 0 = absolute value, not relative
            self.chunks = []
            status = self.lib.espeak_Synth(encoded, len(encoded) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            self.lib.espeak_Synchronize()
            chunks, self.chunks = self.chunks, []
        if status != 0:
            raise EspeakError(f"eSpeak failed (status {status}) to speak {request.text!r} with voice {request.voice!r}")
        if not chunks:
            raise EspeakError(f"eSpeak produced no audio for {request.text!r} with voice {request.voice!r}")
        return np.concatenate(chunks)


def _check_request(request: SynthesisRequest) -> None:
    if not request.text.strip():
        raise ValueError(f"nothing to speak: empty text for voice {request.voice!r}")
    for name, value, (low, high) in (
        ("rate", request.rate, RATE_LIMITS),
        ("pitch", request.pitch, PITCH_LIMITS),
        ("pitch_range", request.pitch_range, PITCH_LIMITS),
        ("word_gap", request.word_gap, (0, 1000)),
    ):
        if not low <= value <= high:
            raise ValueError(f"eSpeak {name} must be in [{low}, {high}], got {value} (text {request.text!r})")


_engine: _Engine | None = None
_engine_lock = threading.Lock()


def _get_engine() -> _Engine:
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = _Engine()
        return _engine


def sample_rate() -> int:
    """The rate eSpeak NG synthesises at (22050 Hz), initialising it if needed."""
    return _get_engine().sample_rate


def check_voice(voice: str) -> None:
    """Raise :class:`UnknownVoiceError` naming ``voice`` unless eSpeak knows its language and variant."""
    engine = _get_engine()
    with engine.lock:
        engine.set_voice(voice)


def synthesize(
    text: str, voice: str, rate: int, pitch: int, pitch_range: int = 50, word_gap: int = 0
) -> tuple[np.ndarray, int]:
    """``text`` spoken by ``voice``: ``(waveform (N,) float32 in [-1, 1], sample_rate)``.

    rate:        words per minute, 80-450 (eSpeak's default is 175).
    pitch:       0-100, 50 = the voice's own base pitch.
    pitch_range: 0-100, how far the pitch moves with intonation; 0 = monotone, 50 = the voice's own.
    word_gap:    extra pause between words, in units of 10 ms.
    An unknown voice or a text eSpeak rejects raises :class:`EspeakError` naming them; an empty
    text or a parameter out of range raises :class:`ValueError`.
    The samples can differ slightly from call to call (see the module docstring).
    """
    engine = _get_engine()
    samples = engine.synthesize(SynthesisRequest(text, voice, rate, pitch, pitch_range, word_gap))
    return samples.astype(np.float32) / np.float32(32768), engine.sample_rate


def synthesize_many(requests: Sequence[SynthesisRequest]) -> Iterator[tuple[np.ndarray, int]]:
    """Each request spoken, in order, by a fresh eSpeak process: the same list always gives the same samples.

    Yields ``(waveform (N,) float32 in [-1, 1], sample_rate)`` per request as
    soon as it is ready, so synthesis runs in parallel with the caller's work
    on the previous ones, and the pipe's buffer bounds the memory used. A
    request eSpeak rejects ends the iteration with :class:`EspeakError`
    carrying the worker's message. Closing the iterator early stops the worker.
    """
    worker = workers.start("from asr.synthesis.espeak import _serve; _serve()", json.dumps([asdict(r) for r in requests]).encode())
    try:
        try:
            (rate,) = struct.unpack("<I", workers.read_exact(worker.process.stdout, 4))
            for _ in range(len(requests)):
                samples = workers.read_array(worker.process.stdout, "<i2")
                yield samples.astype(np.float32) / np.float32(32768), rate
        except workers.WorkerStopped:
            message = worker.last_message()  # waits for it to end
            raise EspeakError(
                f"eSpeak worker stopped early (exit status {worker.process.returncode}): {message}"
            ) from None
        worker.process.wait()
    finally:
        worker.close()  # stops it if the caller closed the iterator early


class Espeak:
    """eSpeak NG behind :class:`asr.synthesis.engines.Synthesiser`: :func:`synthesize_many` without the rates."""

    name = "espeak"
    request_type = SynthesisRequest
    sample_rate = SAMPLE_RATE
    install_hint = _INSTALL_HINT

    def check(self) -> None:
        _espeakng_loader()
        data_path()

    def speak(self, requests: Sequence[SynthesisRequest]) -> Iterator[np.ndarray]:
        """Each request spoken, in order, by one fresh eSpeak process (see :func:`synthesize_many`)."""
        spoken = synthesize_many(requests)
        try:
            for samples, rate in spoken:
                if rate != SAMPLE_RATE:  # a future eSpeak release at another rate must not go unnoticed
                    raise EspeakError(f"eSpeak NG synthesised at {rate} Hz, expected {SAMPLE_RATE} Hz")
                yield samples
        finally:
            spoken.close()


def _serve() -> None:
    """Worker side of :func:`synthesize_many`: requests as JSON on stdin, length-prefixed int16 on stdout."""
    out = sys.stdout.buffer
    try:
        requests = [SynthesisRequest(**r) for r in json.loads(sys.stdin.buffer.read())]
        engine = _get_engine()
        out.write(struct.pack("<I", engine.sample_rate))
        for request in requests:
            workers.write_array(out, engine.synthesize(request).astype("<i2"))
        out.flush()
    except (EspeakError, ValueError) as err:
        print(err, file=sys.stderr)
        sys.exit(1)
