"""Inference: a recogniser rebuilt from checkpoints, test-time strategies, and the settings that pick them.

    texts = Recogniser.load("exp/fsdd_las/avg_last5.pt").transcribe(["a.wav", "b.flac"], beam=4)

or, a layer below, over a corpus's utterances:

    recogniser = load_recogniser("exp/fsdd_las/avg_last5.pt")
    settings = DecodeSettings(DecodingOptions(beam_size=4, ctc_weight=0.3), vtln_warps=(0.9, 1.0, 1.1))
    result = transcribe_speakers(recogniser, utterances, settings.strategy(), settings.decoding)

The names below are imported when first used, so that a command's ``--help`` (which reads
:mod:`asr.inference.config`) does not import torch.
"""

from importlib import import_module

_WHERE = {
    "AdaptationSettings": "config", "SelfTraining": "adaptation",
    "Recogniser": "recogniser", "Transcription": "interface", "load_recogniser": "recogniser",
    "DecodeSettings": "settings", "load_settings": "settings", "parse_warps": "settings",
    "settings_from_dict": "settings", "settings_tag": "settings",
    "CorpusResult": "strategies", "PlainDecoding": "strategies", "SpeakerResult": "strategies",
    "Strategy": "strategies", "VTLNSearch": "strategies", "transcribe_audio": "recogniser",
    "transcribe_speakers": "strategies", "settings_from_options": "settings",
    "AudioInput": "interface", "RecogniserProtocol": "interface",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"asr.inference.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'asr.inference' has no attribute {name!r}")
