"""End-to-end speech recognition research toolkit.

Audio -> ``features`` (fbank/MFCC, MVN, SpecAugment) -> ``asr.data`` (corpora,
tokenisers, batching) -> ``asr.models`` (LN-LSTM, LAS, Transformer) ->
entry points ``asr.train``, ``asr.evaluate``, ``asr.transcribe``, ``asr.compare``.
"""
