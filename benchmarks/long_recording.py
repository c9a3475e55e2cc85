"""A long recording of FSDD digits decoded in pieces, against the same digits decoded one recording at a time.

    python benchmarks/long_recording.py exp/fsdd_las/avg_last5.pt                    # 400 digits, about 7.5 min
    python benchmarks/long_recording.py exp/fsdd_las/avg_last5.pt --fixed-windows 2.5   # the cutter before 2026-11-24
    python benchmarks/long_recording.py --write /tmp/hour.wav --minutes 60            # a recording for asr.transcribe
    /usr/bin/time -v python -m asr.transcribe exp/fsdd_las/avg_last5.pt /tmp/hour.wav    # peak memory and time

The recording (:func:`asr.data.fsdd.build_digit_recording`): ``--digits``
takes 0-4 of the four FSDD speakers (FSDD's test split; recipes/fsdd_las.yaml
trains on takes 5-49), drawn with ``--seed``, with 0.2-1.2 s pauses of low
noise between them. It is built in memory each time, never stored.

Prints the WER of the takes decoded one file at a time (the reference), the
WER of the recording decoded as ``asr.transcribe`` decodes it (pieces cut at
pauses, no longer than the model's longest training utterance or
``--segment-seconds``), and their ratio. Then, per piece, where the errors are:
every piece is compared with the digits whose energy it holds mostly, and
pieces are counted by kind: ``no speech`` (holds no digit), ``cuts a digit``
(a digit's energy is split between it and a neighbour: at least 5% on each
side), ``short`` (under 1 s), ``clean`` (none of these).

``--fixed-windows S`` decodes the pieces of the previous cutter instead: features
of the whole recording (one utterance MVN over it all), cut at the quietest
frame of each window until no piece is longer than S seconds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import soundfile
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asr.data.fsdd import build_digit_recording, read_fsdd  # noqa: E402
from asr.data.utterance import InMemoryAudio, Utterance  # noqa: E402
from asr.decoding import DecodingOptions  # noqa: E402
from asr.inference import load_recogniser  # noqa: E402
from asr.inference.segmentation import FRAME_SECONDS, cut_points, frame_levels, plan_pieces, read_piece  # noqa: E402
from asr.decoding.scoring import error_rates  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "fsdd" / "recordings"


def digit_recording(folder: Path, digits: int, seed: int):
    return build_digit_recording(read_fsdd(folder, take_range=[0, 4]), digits, seed=seed)


def per_piece_errors(recording, bounds: list[list[tuple[int, int]]], texts: list[str]) -> dict[str, list[int]]:
    """kind -> [pieces, reference words, S, D, I] over the pieces (each a list of spans in samples) and their
    transcripts."""
    energy = recording.waveform[0].pow(2)
    owner, split = [], set()
    for start, end in recording.spans:
        shares = [sum(float(energy[max(start, a) : min(end, b)].sum()) for a, b in spans) for spans in bounds]
        total = float(energy[start:end].sum())
        best = max(range(len(bounds)), key=lambda i: shares[i])
        owner.append(best)
        if shares[best] < 0.95 * total:
            split.update(i for i, share in enumerate(shares) if share > 0.05 * total)
    words = recording.text.split()
    kinds: dict[str, list[int]] = {}
    for index, (spans, text) in enumerate(zip(bounds, texts)):
        ref = " ".join(w for w, o in zip(words, owner) if o == index)
        if not ref:
            kind, counts = "no speech", [0, 0, 0, len(text.split())]
        else:
            short = sum(b - a for a, b in spans) < recording.sample_rate
            kind = "cuts a digit" if index in split else "short" if short else "clean"
            rates = error_rates([ref], [text])
            counts = [rates["ref_words"], rates["substitutions"], rates["deletions"], rates["insertions"]]
        row = kinds.setdefault(kind, [0, 0, 0, 0, 0])
        for i, value in enumerate([1, *counts]):
            row[i] += value
    return kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", nargs="?")
    parser.add_argument("--fsdd", type=Path, default=SHARED, help="FSDD recordings folder")
    parser.add_argument("--digits", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--ctc-weight", type=float, default=0.0)
    parser.add_argument("--segment-seconds", type=float, help="piece length (default: the model's longest utterance)")
    parser.add_argument("--fixed-windows", type=float, metavar="S", help="decode the previous cutter's pieces instead")
    parser.add_argument("--write", type=Path, help="write the recording to this .wav and stop")
    parser.add_argument("--minutes", type=float, help="with --write: as many digits as fill this long")
    args = parser.parse_args()
    digits = args.digits if args.minutes is None else round(args.minutes * 60 / 1.14)  # 1.14 s a digit and pause
    recording = digit_recording(args.fsdd, digits, args.seed)
    if args.write:
        soundfile.write(str(args.write), recording.waveform[0].numpy(), recording.sample_rate, subtype="PCM_16")
        print(f"{args.write}: {len(recording.takes)} digits, {recording.seconds / 60:.1f} min")
        return 0
    if not args.checkpoint:
        parser.error("a checkpoint is needed (or --write)")
    torch.set_grad_enabled(False)
    recogniser = load_recogniser(args.checkpoint)
    options = DecodingOptions(beam_size=args.beam, ctc_weight=args.ctc_weight, segment_seconds=args.segment_seconds)
    takes = sorted(set(recording.takes), key=lambda t: t.path)
    one_by_one = recogniser.decode(
        [Utterance(t.path.stem, t.path, "", 0.0, t.speaker) for t in takes], options, batch_size=32
    ).texts
    found = dict(zip(takes, one_by_one))
    single = error_rates([recording.text], [" ".join(found[t] for t in recording.takes)])
    longest, piece = recogniser.long_form(options)
    print(f"{len(recording.takes)} digits, {recording.seconds / 60:.1f} min; longest decoded whole {longest:.2f} s, "
          f"pieces of at most {piece:.2f} s")
    report("one recording at a time", single)

    audio = InMemoryAudio(recording.waveform, recording.sample_rate)
    rate = recording.sample_rate
    if args.fixed_windows:
        features = recogniser.pipeline.from_waveform(recording.waveform, rate)
        level = features[:, 0] if recogniser.pipeline.config.kind == "mfcc" else features.mean(1)
        cuts = cut_points(level, int(args.fixed_windows * 100), 21)
        frames = [0, *cuts, features.size(0)]
        pieces = [features[a:b] for a, b in zip(frames, frames[1:])]
        texts = [t for i in range(0, len(pieces), 32) for t in recogniser._decode(pieces[i : i + 32], options, False)[0]]
        bounds = [[(round(a * FRAME_SECONDS * rate), round(b * FRAME_SECONDS * rate))] for a, b in zip(frames, frames[1:])]
        what = f"the recording, fixed windows of {args.fixed_windows} s"
    else:
        plan = plan_pieces(frame_levels(recording.waveform, rate), piece)
        bounds = [[(round(a * FRAME_SECONDS * rate), round(b * FRAME_SECONDS * rate)) for a, b in p.spans] for p in plan]
        texts = [recogniser.decode([Utterance("piece", InMemoryAudio(*read_piece(audio, p)), "", 0.0, "x")],
                                       options).texts[0] for p in plan]
        whole = recogniser.decode([Utterance("long", audio, "", recording.seconds, "x")], options).texts[0]
        assert whole == " ".join(t for t in texts if t), "the recogniser decoded other pieces than planned"
        what = "the recording in pieces cut at pauses"
    long = error_rates([recording.text], [" ".join(t for t in texts if t)])
    report(what, long)
    print(f"ratio of WERs {long['wer'] / single['wer']:.2f}" if single["wer"] else "one at a time: no errors")
    print(f"{len(bounds)} pieces; errors by kind of piece (pieces, reference words, S, D, I):")
    for kind, row in sorted(per_piece_errors(recording, bounds, texts).items()):
        print(f"  {kind:13s} {row}")
    return 0


def report(what: str, rates: dict) -> None:
    print(f"{what}: WER {100 * rates['wer']:.2f}% (S={rates['substitutions']} D={rates['deletions']} "
          f"I={rates['insertions']} N={rates['ref_words']})")


if __name__ == "__main__":
    sys.exit(main())
