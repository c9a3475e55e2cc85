"""Transcribe audio files with a trained checkpoint.

    python -m asr.transcribe exp/fsdd_las/last.pt a.wav b.flac [--beam 4]
    python -m asr.transcribe exp/a/avg_last5.pt --with exp/b/avg_last5.pt --vtln-warps 0.8:1.2:0.05 one_speaker/*.wav
    python -m asr.transcribe exp/a/avg_last5.pt --vtln-warps 0.8:1.2:0.05 --adapt-rounds 3 one_speaker/*.wav

Prints one ``<path>\\t<transcript>`` line per file, in the order given.
``--with`` adds checkpoints decoded together with the first as an ensemble;
``--vtln-warps`` takes the files as one speaker's and chooses their test-time
VTLN warp by the model's own score (see :mod:`asr.inference`), printed on
stderr; ``--adapt-rounds N`` also takes them as one speaker's and adapts
the models to it without transcripts before the final decoding (see
:mod:`asr.adapt`). Any
sample rate works (audio is resampled to the model's rate); wav and flac are
read with soundfile. A file that cannot be used (unreadable, damaged past its
header, NaN samples, too short) is reported on stderr by name and reason, the
others are still transcribed, a count by reason ends the output, and the exit
status is 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.adapt import AdaptationSettings, adapt_and_transcribe
from asr.checkpoint import CheckpointError
from asr.data.dataset import audio_skip
from asr.data.report import SkipReport
from asr.data.utterance import Utterance
from asr.inference import load_recogniser, warp_list
from features.audio import AudioError, load_audio
from features.filterbank import check_mel_filters

SPEAKER = "files"  # what the files are taken as in VTLN and adaptation: one speaker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.transcribe", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("audio", nargs="+")
    parser.add_argument(
        "--with", dest="others", action="append", default=[], metavar="CHECKPOINT",
        help="another checkpoint to decode with as an ensemble (repeat for more)",
    )
    parser.add_argument(
        "--vtln-warps", type=warp_list,
        help="test-time VTLN over these warps (0.9,1.0,1.1 or LOW:HIGH:STEP); the files are one speaker's",
    )
    parser.add_argument(
        "--adapt-rounds", type=int, default=0,
        help="adapt to the speaker of the files (asr.adapt: fine-tune on their own transcripts, decode again), "
        "this many rounds (0 = off)",
    )
    parser.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    parser.add_argument("--ctc-weight", type=float, default=0.0, help="CTC prefix score weight in beam search")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    if args.beam < 1:
        parser.error(f"--beam must be at least 1, got {args.beam}")
    settings = None
    if args.adapt_rounds:
        try:
            settings = AdaptationSettings(rounds=args.adapt_rounds)
        except ValueError as err:
            parser.error(f"--adapt-rounds: {err}")
    try:
        recogniser = load_recogniser([args.checkpoint, *args.others] if args.others else args.checkpoint, args.device)
    except CheckpointError as err:
        parser.error(str(err))
    if args.vtln_warps:
        try:
            check_mel_filters(recogniser.pipeline.config, args.vtln_warps)
        except ValueError as err:
            parser.error(f"--vtln-warps: {err}")
    if args.ctc_weight > 0 and getattr(recogniser.config.model, "ctc_weight", 0.0) == 0:
        parser.error(f"--ctc-weight {args.ctc_weight}: {args.checkpoint} was trained without a CTC head")
    report = SkipReport()
    if args.vtln_warps or settings:
        _transcribe_one_speaker(recogniser, args, settings, report)
    else:
        for path in args.audio:
            # One file at a time: output appears as it is ready, and one bad file costs nothing else.
            (text,) = recogniser.transcribe_files([path], beam_size=args.beam, report=report, ctc_weight=args.ctc_weight)
            if text is None:
                _print_skip(report.skips[-1])
            else:
                print(f"{path}\t{text}", flush=True)
    if report:
        print(f"{report.counts_text()} of {len(args.audio)} files skipped", file=sys.stderr)
    return 1 if report else 0


def _print_skip(skip) -> None:
    print(f"error: {skip.message} [{skip.reason}]", file=sys.stderr)


def _transcribe_one_speaker(recogniser, args, settings: AdaptationSettings | None, report: SkipReport) -> None:
    """All files at once, as one speaker's: under the warp chosen for them together and, with
    ``settings``, by the models adapted to them. Files that cannot be used are named and left out."""
    usable = []
    for path in args.audio:
        try:
            waveform, rate = load_audio(path)
            recogniser.pipeline.from_waveform(waveform, rate)  # too short for the features is an error here
        except AudioError as err:
            report.add(audio_skip(err))
            _print_skip(report.skips[-1])
        else:
            usable.append(Utterance(path, Path(path), "", waveform.shape[-1] / rate, SPEAKER))
    if usable:
        options = dict(beam_size=args.beam, warps=args.vtln_warps, ctc_weight=args.ctc_weight)
        if settings:
            adapted = adapt_and_transcribe(recogniser, usable, settings, **options)
            texts, warp = adapted.texts, adapted.warps[SPEAKER]
        else:
            texts = recogniser.transcribe_utterances(usable, **options)
            warp = recogniser.chosen_warps[SPEAKER]
        for utt, text in zip(usable, texts):
            print(f"{utt.id}\t{text}", flush=True)
        done = [f"VTLN warp {warp:g}"] if args.vtln_warps else []
        done += [f"adapted in {settings.rounds} round{'s' if settings.rounds > 1 else ''}"] if settings else []
        print(f"{', '.join(done)} for these {len(usable)} files", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
