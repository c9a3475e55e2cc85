"""``python -m asr.check``: an alias of :mod:`asr.cli.check` (the checks are :mod:`asr.data.validation`)."""

import sys

from asr.cli.check import main

if __name__ == "__main__":
    sys.exit(main())
