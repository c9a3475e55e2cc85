"""End-to-end speech recognition research toolkit.

Audio -> ``features`` (fbank/MFCC, MVN, SpecAugment) -> ``asr.data`` (corpora,
tokenisers, batching) -> ``asr.models`` (LN-LSTM, LAS, Transformer) ->
entry points ``asr.train``, ``asr.evaluate``, ``asr.transcribe``, ``asr.compare``.

From Python::

    from asr import Recogniser
    recogniser = Recogniser.load("exp/fsdd_las/avg_last5.pt")
    texts = recogniser.transcribe(["a.wav", "b.flac"], beam=4)
"""

from importlib import import_module

# Imported when first used: every command imports this package, and its --help must not wait for torch.
_WHERE = {"Recogniser": "asr.inference.recogniser", "load_recogniser": "asr.inference.recogniser"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'asr' has no attribute {name!r}")
