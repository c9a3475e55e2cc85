"""Transcribe audio files with a trained checkpoint.

    python -m asr.transcribe exp/fsdd_las/last.pt a.wav b.flac [--beam 4]
    python -m asr.transcribe exp/a/avg_last5.pt --with exp/b/avg_last5.pt --vtln-warps 0.8:1.2:0.05 one_speaker/*.wav
    python -m asr.transcribe exp/a/avg_last5.pt --vtln-warps 0.8:1.2:0.05 --adapt-rounds 3 one_speaker/*.wav

Prints one ``<path>\\t<transcript>`` line per file, in the order given.
``--with`` adds checkpoints decoded together with the first as an ensemble.
The search and test-time options are those of ``asr.evaluate``
(:mod:`asr.cli.options`); with test-time VTLN or speaker adaptation the files
are taken as one speaker's, and the warp chosen for them is printed on stderr.
Any sample rate works (audio is resampled to the model's rate); wav and flac
are read with soundfile. A file that cannot be used (unreadable, damaged past
its header, NaN samples, too short) is reported on stderr by name and reason,
the others are still transcribed, a count by reason ends the output, and the
exit status is 1. A recording longer than the longest utterance the model was
trained on is decoded in pieces cut at pauses, and stderr says so
(``--segment-seconds`` sets the length, 0 decodes every file whole). With ``--prune-layers`` (LayerDrop pruning) the layers kept
and the parameters of each model are printed on stderr; give the option after
the audio files (or end its values with ``--``), since it takes several words.

What it was given is checked before any model is loaded: audio where a checkpoint belongs (the
checkpoint comes first), a run folder (its ``last.pt`` is suggested), a text file, or a
checkpoint among the audio files is one error line saying so.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from asr.cli.options import add_decode_arguments, decode_settings

if TYPE_CHECKING:
    from asr.data.report import Skip, SkipReport
    from asr.data.utterance import Utterance
    from asr.inference import DecodeSettings, Recogniser

# The modules that import torch and soundfile are imported where they are used, so that --help (and a
# usage error) answer at once.

SPEAKER = "files"  # what the files are taken as in VTLN and adaptation: one speaker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.transcribe", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("audio", nargs="+")
    parser.add_argument(
        "--with", dest="others", action="append", default=[], metavar="CHECKPOINT",
        help="another checkpoint to decode with as an ensemble (repeat for more)",
    )
    add_decode_arguments(parser)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--verbose", action="store_true",
        help="print which code computes the model here (LN-LSTM backends, C++ build flags, CUDA graphs)",
    )
    args = parser.parse_args(argv)
    for problem in argument_problems(args.checkpoint, args.others, args.audio):
        parser.error(problem)
    settings = decode_settings(args, parser)
    from asr.checkpointing import CheckpointError
    from asr.data.report import SkipReport
    from asr.data.utterance import Utterance
    from asr.inference import PlainDecoding, load_recogniser
    from asr.models import runtime

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("asr.inference.recogniser").setLevel(logging.INFO)  # says when a recording is cut in pieces
    checkpoints = [args.checkpoint, *args.others]
    try:
        recogniser = load_recogniser(checkpoints if args.others else args.checkpoint, args.device, prune=settings.prune_layers)
        settings.check_for(recogniser, args.checkpoint)
    except (CheckpointError, ValueError) as err:
        parser.error(str(err))
    for checkpoint, pruned in zip(checkpoints, recogniser.pruned):
        print(f"model {checkpoint} {pruned.describe()}", file=sys.stderr)
    if args.verbose:
        for line in runtime.lines(runtime.describe(recogniser.model, args.device)):
            print(line, file=sys.stderr)
    utterances = [Utterance(path, Path(path), "", _duration(path), SPEAKER) for path in args.audio]
    report = SkipReport()
    if isinstance(settings.strategy(), PlainDecoding):
        for utt in utterances:  # one file at a time: output appears as it is ready
            _transcribe(recogniser, [utt], settings, report)
    else:
        _transcribe(recogniser, utterances, settings, report)
    if report:
        print(f"{report.counts_text()} of {len(args.audio)} files skipped", file=sys.stderr)
    return 1 if report else 0


def argument_problems(checkpoint: str, others: list[str], audio: list[str]) -> list[str]:
    """What is wrong with the paths given, before anything is loaded: a checkpoint argument that is
    audio, a folder or text, or an audio argument that is a checkpoint (first problem first)."""
    from asr.checkpointing import not_a_checkpoint

    problems = []
    for path in [checkpoint, *others]:
        what = not_a_checkpoint(path) if Path(path).exists() else None
        if what == "a folder":
            last = Path(path) / "last.pt"
            hint = f"did you mean {last}?" if last.is_file() else "it holds no last.pt"
            problems.append(f"{path} is a run folder, not a checkpoint; {hint}")
        elif what is not None and "audio" in what:
            problems.append(f"{path} is {what}, not a checkpoint: the checkpoint comes first "
                            "(python -m asr.transcribe CHECKPOINT AUDIO [AUDIO ...])")
        elif what is not None:
            problems.append(f"{path} is not a checkpoint: it is {what} (a .pt file written by asr.train or asr.average)")
    for path in audio:
        if Path(path).is_file() and not_a_checkpoint(path) is None and Path(path).suffix == ".pt":
            problems.append(f"{path} is a checkpoint, not audio: give one checkpoint first and others with --with")
    return problems


def _transcribe(recogniser: Recogniser, utterances: list[Utterance], settings: DecodeSettings, report: SkipReport) -> None:
    """Print each file's transcript, or its error on stderr; with a strategy, what it chose."""
    from asr.inference import transcribe_speakers

    result = transcribe_speakers(recogniser, utterances, settings.strategy(), settings.decoding, settings.batch_size)
    for skip in result.skipped:
        report.add(skip)
        _print_skip(skip)
    for utt, text in zip(utterances, result.texts):
        if text is not None:
            print(f"{utt.id}\t{text}", flush=True)
    done = [f"VTLN warp {result.warps[SPEAKER]:g}"] if SPEAKER in result.warps else []
    if settings.adaptation:
        rounds = settings.adaptation.rounds
        done.append(f"adapted in {rounds} round{'s' if rounds > 1 else ''}")
    if done:
        readable = sum(text is not None for text in result.texts)
        print(f"{', '.join(done)} for these {readable} files", file=sys.stderr)


def _print_skip(skip: Skip) -> None:
    print(f"error: {skip.message} [{skip.reason}]", file=sys.stderr)


def _duration(path: str) -> float:
    """Seconds of audio from the file's header (0 when it cannot be read: decoding will say why)."""
    import soundfile

    try:
        info = soundfile.info(path)
        return info.frames / info.samplerate
    except (RuntimeError, OSError, ValueError):
        return 0.0


if __name__ == "__main__":
    sys.exit(main())
