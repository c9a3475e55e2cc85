"""Transcribe audio files with a trained checkpoint.

    python -m asr.transcribe exp/fsdd_las/last.pt a.wav b.flac [--beam 4]

Prints one ``<path>\\t<transcript>`` line per file, in the order given. Any
sample rate works (audio is resampled to the model's rate); wav and flac are
read with soundfile. A file that cannot be read is reported on stderr by name,
the others are still transcribed, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import sys

from asr.checkpoint import CheckpointError
from asr.inference import load_recogniser
from features.audio import AudioError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.transcribe", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("audio", nargs="+")
    parser.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    try:
        recogniser = load_recogniser(args.checkpoint, args.device)
    except CheckpointError as err:
        parser.error(str(err))
    failed = 0
    for path in args.audio:
        try:
            features = recogniser.pipeline.from_file(path)
        except AudioError as err:
            print(f"error: {err}", file=sys.stderr)
            failed += 1
            continue
        (text,) = recogniser.transcribe_features([features], beam_size=args.beam)
        print(f"{path}\t{text}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
