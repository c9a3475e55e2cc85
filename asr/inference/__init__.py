"""Inference: a recogniser rebuilt from checkpoints, test-time strategies, and the settings that pick them.

    recogniser = load_recogniser("exp/fsdd_las/avg_last5.pt")
    settings = DecodeSettings(DecodingOptions(beam_size=4, ctc_weight=0.3), vtln_warps=(0.9, 1.0, 1.1))
    result = transcribe_speakers(recogniser, utterances, settings.strategy(), settings.decoding)
"""

from asr.inference.adaptation import AdaptationSettings, SelfTraining
from asr.inference.recogniser import Recogniser, Transcription, load_recogniser
from asr.inference.settings import DecodeSettings, load_settings, parse_warps, settings_from_dict, settings_tag
from asr.inference.strategies import CorpusResult, PlainDecoding, SpeakerResult, Strategy, VTLNSearch, transcribe_speakers

__all__ = [
    "AdaptationSettings", "CorpusResult", "DecodeSettings", "PlainDecoding", "Recogniser", "SelfTraining",
    "SpeakerResult", "Strategy", "Transcription", "VTLNSearch", "load_recogniser", "load_settings", "parse_warps",
    "settings_from_dict", "settings_tag", "transcribe_speakers",
]
