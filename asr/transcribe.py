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
    parser.add_argument("--ctc-weight", type=float, default=0.0, help="CTC prefix score weight in beam search")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    if args.beam < 1:
        parser.error(f"--beam must be at least 1, got {args.beam}")
    try:
        recogniser = load_recogniser(args.checkpoint, args.device)
    except CheckpointError as err:
        parser.error(str(err))
    if args.ctc_weight > 0 and getattr(recogniser.config.model, "ctc_weight", 0.0) == 0:
        parser.error(f"--ctc-weight {args.ctc_weight}: {args.checkpoint} was trained without a CTC head")
    failed = 0
    for path in args.audio:
        # One file at a time: output appears as it is ready, and one bad file costs nothing else.
        try:
            features = recogniser.pipeline.from_file(path)
            (text,) = recogniser.transcribe_features([features], beam_size=args.beam, ctc_weight=args.ctc_weight)
        except (AudioError, ValueError) as err:  # unreadable, empty, or too short for the model
            message = str(err) if path in str(err) else f"{path}: {err}"
            print(f"error: {message}", file=sys.stderr)
            failed += 1
            continue
        print(f"{path}\t{text}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
