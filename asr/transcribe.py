"""``python -m asr.transcribe``: an alias of :mod:`asr.cli.transcribe`."""

import sys

from asr.cli.transcribe import main

if __name__ == "__main__":
    sys.exit(main())
