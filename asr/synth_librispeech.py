"""``python -m asr.synth_librispeech``: an alias of :mod:`asr.cli.synth_librispeech` (the library is
:mod:`asr.synthesis.librispeech`)."""

import sys

from asr.cli.synth_librispeech import main

if __name__ == "__main__":
    sys.exit(main())
