"""``python -m asr.evaluate``: an alias of :mod:`asr.cli.evaluate`."""

import sys

from asr.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
