"""``python -m asr.study``: an alias of :mod:`asr.cli.study` (the study library is :mod:`asr.studies.grid`)."""

import sys

from asr.cli.study import main

if __name__ == "__main__":
    sys.exit(main())
