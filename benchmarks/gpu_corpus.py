"""``python -m asr.synth_librispeech`` for a machine without Piper: Pico speaks Piper's training speakers.

    python benchmarks/gpu_corpus.py OUT [--hours H] [--jobs N] [--quiet]   # the arguments of asr.synth_librispeech

The GPU machine gets its Python packages as wheels carried beside the checkout, at most 64 MiB a call, and
Piper's (piper-tts, onnxruntime's share of it and the voice) do not fit. Without Piper installed, this makes
the corpus ``asr.synth_librispeech`` makes, except that its Piper speakers (``PIPER_SHARE`` of the training
speakers, at least one) are spoken by Pico's voices in turn, at Pico's middle rate and pitch. The dev and
test speakers (all eSpeak NG) and the books are unchanged; the plan follows each speaker's speaking rate, so
the former Piper speakers' chapters are cut into other utterances (a few more or fewer in all), and
an epoch's batch shapes are those of a corpus of the same shape, not the same ones.
Its README.txt lists the speakers as spoken. With Piper installed it changes nothing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

from asr.cli.synth_librispeech import main
from asr.synthesis import librispeech, pico

PICO_RATE = 96.0  # percent: the middle of the rates _speakers draws for Pico
PICO_PITCH = 100.0  # percent


def speakers_without_piper(options, counts):
    """``librispeech._speakers``, with each Piper speaker given to Pico's voices in turn."""
    speakers = []
    turn = 0
    for speaker in _drawn(options, counts):
        if speaker.synthesiser == "piper":
            voice = pico.VOICES[turn % len(pico.VOICES)]
            speaker = dataclasses.replace(speaker, synthesiser="pico", voice=voice, rate=PICO_RATE, pitch=PICO_PITCH)
            turn += 1
        speakers.append(speaker)
    return speakers


_drawn = librispeech._speakers
if importlib.util.find_spec("piper") is None:
    librispeech._speakers = speakers_without_piper

if __name__ == "__main__":
    sys.exit(main())
