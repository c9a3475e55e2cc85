"""``python -m asr.compare``: an alias of :mod:`asr.cli.compare` (the curves library is :mod:`asr.studies.curves`)."""

import sys

from asr.cli.compare import main

if __name__ == "__main__":
    sys.exit(main())
