"""``python -m asr.validate``: an alias of :mod:`asr.cli.validate`."""

import sys

from asr.cli.validate import main

if __name__ == "__main__":
    sys.exit(main())
