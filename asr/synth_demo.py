"""``python -m asr.synth_demo``: an alias of :mod:`asr.cli.synth_demo` (the corpus itself is :mod:`asr.synthesis.demo`)."""

import sys

from asr.cli.synth_demo import main

if __name__ == "__main__":
    sys.exit(main())
