"""``python -m asr.average``: an alias of :mod:`asr.cli.average` (averaging itself is :mod:`asr.checkpoints.averaging`)."""

import sys

from asr.cli.average import main

if __name__ == "__main__":
    sys.exit(main())
