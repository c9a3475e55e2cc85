"""``python -m asr.checkpoint``: an alias of :mod:`asr.cli.checkpoint` (the checkpoint code is in :mod:`asr.checkpoints.io`)."""

import sys

from asr.cli.checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
