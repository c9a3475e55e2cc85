"""Synthetic speech corpora: the synthesisers, their text and the two corpora made with them.

    engines.py       the Synthesiser contract and its registry over
      espeak.py        eSpeak NG, rule and formant voices (22050 Hz)
      pico.py          SVOX Pico, two English voices trained on real speakers (16000 Hz)
      piper.py         Piper, a neural (VITS) voice of one real speaker (22050 Hz)
      workers.py       the worker processes they speak in
    books.py         public-domain text (the King James Bible, Shakespeare's plays)
    demo.py          the demo corpus a recipe's ``data.demo`` describes (python -m asr.synth_demo)
    librispeech.py   a corpus of LibriSpeech's shape, to rehearse its recipes (python -m asr.synth_librispeech)

Each corpus is written in LibriSpeech layout and read like any other by
:mod:`asr.data`, which never imports this package: reading a prepared corpus
needs its folder, not the synthesisers that made it.
"""
