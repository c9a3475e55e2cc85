"""Transcribe audio files with a trained checkpoint.

    python -m asr.transcribe --checkpoint exp/fsdd_las/last.pt a.wav b.flac [--beam 4]
    python -m asr.transcribe --checkpoint exp/a/avg_last5.pt exp/b/avg_last5.pt --vtln-warps 0.8:1.2:0.05 one_speaker/*.wav
    python -m asr.transcribe --checkpoint exp/a/avg_last5.pt --vtln-warps 0.8:1.2:0.05 --adapt-rounds 3 one_speaker/*.wav

Prints one ``<path>\\t<transcript>`` line per file, in the order given.
Several checkpoints are decoded together as an ensemble; the checkpoints end
at the first audio file (or give the audio files first). The same code runs
from Python: ``Recogniser.load(checkpoint).transcribe(files, beam=4)``
(:mod:`asr.inference.recogniser`).
The search and test-time options are those of ``asr.evaluate``
(:mod:`asr.cli.options`); with test-time VTLN or speaker adaptation the files
are taken as one speaker's, and the warp chosen for them is printed on stderr.
Any sample rate works (audio is resampled to the model's rate); wav and flac
are read with soundfile. A file that cannot be used (unreadable, damaged past
its header, NaN samples, too short) is reported on stderr by name and reason,
the others are still transcribed, a count by reason ends the output, and the
exit status is 1 (2 when no file could be transcribed). A recording longer than the longest utterance the model was
trained on is decoded in pieces cut at pauses, and stderr says so
(``--segment-seconds`` sets the length, 0 decodes every file whole). With ``--prune-layers`` (LayerDrop pruning) the layers kept
and the parameters of each model are printed on stderr; give the option after
the audio files (or end its values with ``--``), since it takes several words.

What it was given is checked before any model is loaded: audio where a checkpoint belongs, a run
folder (its ``last.pt`` is suggested), a text file, or a checkpoint among the audio files is one
error line saying so, exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from asr.cli.errors import fail
from asr.cli.options import add_decode_arguments, decode_settings

if TYPE_CHECKING:
    from asr.data.report import Skip, SkipReport
    from asr.inference import DecodeSettings, Recogniser

# The modules that import torch and soundfile are imported where they are used, so that --help (and a
# usage error) answer at once.

# What a missing file is taken for when its bytes cannot say (asr.checkpoints.io.not_a_checkpoint does for one that exists).
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".sph", ".m4a", ".aiff", ".au")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.transcribe", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", nargs="+", action="extend", default=[], metavar="CHECKPOINT",
        help="a checkpoint written by asr.train or asr.average; several are decoded as an ensemble",
    )
    parser.add_argument("audio", nargs="*", metavar="AUDIO", help="audio files (any sample rate)")
    # The older spellings, kept for the commands already written: a first positional checkpoint when
    # --checkpoint is not given, and --with for each further member of an ensemble.
    parser.add_argument("--with", dest="others", action="append", default=[], help=argparse.SUPPRESS)
    add_decode_arguments(parser)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--verbose", action="store_true",
        help="print which code computes the model here (LN-LSTM backends, C++ build flags, CUDA graphs)",
    )
    return parser


def checkpoints_and_audio(given: list[str], positional: list[str], others: list[str]) -> tuple[list[str], list[str]]:
    """(checkpoints, audio files) from ``--checkpoint``'s values (which end at the first audio file: the rest
    is audio), the positional arguments (with no ``--checkpoint``, the first is the checkpoint) and ``--with``."""
    # at least one: audio given as the only checkpoint is named for what it is (argument_problems)
    split = next((i for i, path in enumerate(given) if i > 0 and _is_audio(path)), len(given))
    checkpoints, audio = given[:split], given[split:] + positional
    if not given and positional:
        checkpoints, audio = positional[:1], positional[1:]
    return checkpoints + others, audio


def _is_audio(path: str) -> bool:
    from asr.checkpoints.io import not_a_checkpoint

    if Path(path).is_file():
        return "audio" in (not_a_checkpoint(path) or "")
    return Path(path).suffix.lower() in AUDIO_SUFFIXES


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    checkpoints, audio = checkpoints_and_audio(args.checkpoint, args.audio, args.others)
    if not checkpoints:
        parser.error("give the model: --checkpoint CHECKPOINT [CHECKPOINT ...] AUDIO [AUDIO ...]")
    if not audio:
        parser.error("no audio files given: --checkpoint CHECKPOINT [CHECKPOINT ...] AUDIO [AUDIO ...]")
    for problem in argument_problems(checkpoints, audio):
        fail(problem)
    settings = decode_settings(args)
    from asr.checkpoints.io import CheckpointError
    from asr.data.report import SkipReport
    from asr.inference import PlainDecoding, load_recogniser
    from asr.models import runtime

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("asr.inference.recogniser").setLevel(logging.INFO)  # says when a recording is cut in pieces
    try:
        recogniser = load_recogniser(checkpoints if len(checkpoints) > 1 else checkpoints[0], args.device,
                                     prune=settings.prune_layers)
        settings.check_for(recogniser, checkpoints[0])
    except (CheckpointError, ValueError) as err:
        fail(err)
    for checkpoint, pruned in zip(checkpoints, recogniser.pruned):
        print(f"model {checkpoint} {pruned.describe()}", file=sys.stderr)
    if args.verbose:
        for line in runtime.lines(runtime.describe(recogniser.model, args.device)):
            print(line, file=sys.stderr)
    report = SkipReport()
    if isinstance(settings.strategy(), PlainDecoding):
        for path in audio:  # one file at a time: output appears as it is ready
            _transcribe(recogniser, [path], settings, report)
    else:
        _transcribe(recogniser, audio, settings, report)
    if report:
        print(f"{report.counts_text()} of {len(audio)} files skipped", file=sys.stderr)
    # Nothing transcribed is an input error, like every other command's (2); some files skipped among
    # transcribed ones is a partial result (1), whose output is still worth reading.
    if report and len(report) >= len(audio):
        return 2
    return 1 if report else 0


def argument_problems(checkpoints: list[str], audio: list[str]) -> list[str]:
    """What is wrong with the paths given, before anything is loaded: a checkpoint argument that is
    audio, a folder or text, or an audio argument that is a checkpoint (first problem first)."""
    from asr.checkpoints.io import not_a_checkpoint

    problems = []
    for path in checkpoints:
        what = not_a_checkpoint(path) if Path(path).exists() else None
        if what == "a folder":
            last = Path(path) / "last.pt"
            hint = f"did you mean {last}?" if last.is_file() else "it holds no last.pt"
            problems.append(f"{path} is a run folder, not a checkpoint; {hint}")
        elif what is not None and "audio" in what:
            problems.append(f"{path} is {what}, not a checkpoint: the checkpoint comes first "
                            "(python -m asr.transcribe --checkpoint CHECKPOINT AUDIO [AUDIO ...])")
        elif what is not None:
            problems.append(f"{path} is not a checkpoint: it is {what} (a .pt file written by asr.train or asr.average)")
    for path in audio:
        if Path(path).is_file() and not_a_checkpoint(path) is None and Path(path).suffix == ".pt":
            problems.append(f"{path} is a checkpoint, not audio: give the checkpoints first, "
                            "--checkpoint CHECKPOINT [CHECKPOINT ...] AUDIO [AUDIO ...]")
    return problems


def _transcribe(recogniser: Recogniser, audio: list[str], settings: DecodeSettings, report: SkipReport) -> None:
    """Print each file's transcript, or its error on stderr; with a strategy, what it chose."""
    from asr.inference import transcribe_audio
    from asr.inference.recogniser import SPEAKER

    result = transcribe_audio(recogniser, audio, settings)
    for skip in result.skipped:
        report.add(skip)
        _print_skip(skip)
    for path, text in zip(audio, result.texts):
        if text is not None:
            print(f"{path}\t{text}", flush=True)
    done = [f"VTLN warp {result.warps[SPEAKER]:g}"] if SPEAKER in result.warps else []
    if settings.adaptation:
        rounds = settings.adaptation.rounds
        done.append(f"adapted in {rounds} round{'s' if rounds > 1 else ''}")
    if done:
        readable = sum(text is not None for text in result.texts)
        print(f"{', '.join(done)} for these {readable} files", file=sys.stderr)


def _print_skip(skip: Skip) -> None:
    print(f"error: {skip.message} [{skip.reason}]", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
