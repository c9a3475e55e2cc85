"""Evaluate a checkpoint on a LibriSpeech-layout folder: WER, CER and what went wrong.

    python -m asr.evaluate --checkpoint exp/fsdd_las/last.pt --data ../shared/data/fsdd_connected/LibriSpeech/fsdd-dev
    python -m asr.evaluate --checkpoint exp/librispeech100/best_epoch30.pt --data /data/LibriSpeech/test-clean --beam 10

Writes into ``--out`` (default ``<checkpoint folder>/eval_<data folder name>``):
``hyp.txt`` and ``ref.txt`` (``<utterance id> <text>`` per line), ``alignment.txt``
(per-utterance word alignment with substitutions, deletions and insertions) and
``wer.json`` (``{"wer": ..., "cer": ..., "utterances": ...}`` plus the counts).
Prints the WER line and the real-time factor (decoding wall time / audio
duration). Scores use the text normalisation of :mod:`asr.metrics`. Every
utterance in the folder is scored (no duration limit); unreadable files are
reported by name and counted, not silently dropped.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from asr.checkpoint import CheckpointError
from asr.data.librispeech import read_subset
from asr.data.report import DataError, SkipReport
from asr.inference import load_recogniser
from asr.metrics import alignment_report, error_rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", required=True, help="a LibriSpeech-layout subset folder")
    parser.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy search)")
    parser.add_argument("--ctc-weight", type=float, default=0.0, help="CTC prefix score weight in beam search")
    parser.add_argument("--length-penalty", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", help="output folder (default: <checkpoint folder>/eval_<data folder name>)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    data = Path(args.data)
    out = Path(args.out) if args.out else Path(args.checkpoint).parent / f"eval_{data.name}"
    try:
        recogniser = load_recogniser(args.checkpoint, args.device)
        report = SkipReport()
        utterances = read_subset(data, report)
        report.log(str(data))
    except (CheckpointError, DataError) as err:
        parser.error(str(err))
    utterances = [u for u in utterances if u.text]
    if not utterances:
        parser.error(f"{data}: no usable utterances ({report.summary()})")
    # Similar lengths together: less padding, and beam search stops sooner.
    utterances.sort(key=lambda u: u.duration)

    options = {}
    if args.beam > 1:
        options = {"ctc_weight": args.ctc_weight, "length_penalty": args.length_penalty}
    start = time.perf_counter()
    hyps = recogniser.transcribe_files(
        [u.audio for u in utterances], beam_size=args.beam, batch_size=args.batch_size, **options
    )
    elapsed = time.perf_counter() - start
    audio_seconds = sum(u.duration for u in utterances)

    ids = [u.id for u in utterances]
    refs = [u.text for u in utterances]
    rates = error_rates(refs, hyps, ids)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hyp.txt").write_text("".join(f"{i} {h}\n" for i, h in zip(ids, hyps)))
    (out / "ref.txt").write_text("".join(f"{i} {r}\n" for i, r in zip(ids, refs)))
    (out / "alignment.txt").write_text(alignment_report(refs, hyps, ids))
    summary = {
        **rates,
        "utterances": len(utterances),
        "skipped": len(report),
        "audio_seconds": audio_seconds,
        "decode_seconds": elapsed,
        "rtf": elapsed / audio_seconds,
        "beam": args.beam,
        "checkpoint": str(args.checkpoint),
        "data": str(data),
    }
    (out / "wer.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"WER {100 * rates['wer']:.2f}% (S={rates['substitutions']} D={rates['deletions']} "
        f"I={rates['insertions']} N={rates['ref_words']}) CER {100 * rates['cer']:.2f}% "
        f"on {len(utterances)} utterances of {data}"
    )
    print(f"real-time factor {summary['rtf']:.4f} ({elapsed:.1f} s for {audio_seconds:.1f} s of audio); results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
