"""``python -m asr.train``: an alias of :mod:`asr.cli.train` (the training code is in :mod:`asr.training`)."""

import sys

from asr.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
