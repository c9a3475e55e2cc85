"""Evaluate a checkpoint on a LibriSpeech-layout folder or a split of its recipe: WER, CER and what went wrong.

    python -m asr.evaluate --checkpoint exp/fsdd_las/last.pt --data ../shared/data/fsdd_connected/LibriSpeech/fsdd-dev
    python -m asr.evaluate --checkpoint exp/librispeech100/best_epoch30.pt --data /data/LibriSpeech/test-clean --beam 10
    python -m asr.evaluate --checkpoint exp/demo/last.pt --split test
    python -m asr.evaluate --checkpoint exp/a/avg_last5.pt exp/b/avg_last5.pt --split test --vtln-warps 0.8:1.2:0.05
    python -m asr.evaluate --checkpoint exp/a/avg_last5.pt --split test --vtln-warps 0.8:1.2:0.05 --adapt-rounds 2

``--split dev`` or ``--split test`` reads that split as the recipe stored in
the checkpoint defines it (its ``data.dev``/``data.test`` folders and any
built sets: the demo corpus's held-out voices, a leave-one-speaker-out fold's
held-out speaker), with relative paths taken from the working directory as in
training.

Writes into ``--out`` (default ``<checkpoint folder>/eval_<data folder name or split>``):
``hyp.txt`` and ``ref.txt`` (``<utterance id> <text>`` per line, sorted by id),
``alignment.txt`` (per-utterance word alignment with substitutions, deletions
and insertions marked) and ``wer.json`` (``{"wer": ..., "cer": ...,
"utterances": ...}`` plus the counts, timing and settings). Prints the WER
line and the real-time factor: wall time of feature extraction plus search,
divided by the audio duration (what a user waits per second of speech).

Several checkpoints are decoded as one ensemble (the mean of their
next-token distributions; they must share tokenizer and features), and
``--vtln-warps`` adds test-time VTLN: each speaker is decoded under every
candidate warp and keeps the one the model scores highest, without reading
any transcript (see :mod:`asr.inference`). The chosen warps and every
candidate's mean score go into ``wer.json``. ``--adapt-rounds N`` adapts
the models to each speaker without transcripts (:mod:`asr.adapt`: fine-tune
on the model's own transcripts, decode again, N times) and records the WER
before adaptation and after every round in ``wer.json``; the time it takes
counts in the real-time factor.

Scores use the text normalisation of :mod:`asr.metrics` on both sides.
Every utterance in the folder is scored (no duration limit, unlike training).
Utterances that cannot be used (missing audio, audio whose header or samples
cannot be read, NaN samples, an empty transcript) are left out with a logged
reason and counted in ``wer.json``: ``skipped`` (how many) and ``skips``
(counts by reason, and each one's message naming the file), never dropped
silently. One bad file never stops the evaluation.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from asr.adapt import ADAPTABLE, AdaptationSettings, adapt_and_transcribe, adapted_parameters
from asr.checkpoint import CheckpointError, load_checkpoint
from asr.config import ConfigError
from asr.data import report as reasons
from asr.data.corpus import load_split
from asr.data.librispeech import read_subset
from asr.data.report import DataError, SkipReport
from asr.experiment import experiment_config_from_dict
from asr.inference import load_recogniser, warp_list
from asr.metrics import alignment_report, error_rates
from features.filterbank import check_mel_filters


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint",
        required=True,
        nargs="+",
        help="a checkpoint written by asr.train or asr.average; several are decoded as an ensemble",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="a LibriSpeech-layout subset folder")
    source.add_argument("--split", choices=["dev", "test"], help="a split of the recipe stored in the checkpoint")
    parser.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy search)")
    parser.add_argument("--ctc-weight", type=float, default=0.0, help="CTC prefix score weight in beam search")
    parser.add_argument("--length-penalty", type=float, default=0.0, help="score added per emitted token in beam search")
    parser.add_argument("--batch-size", type=int, default=16, help="utterances decoded together")
    parser.add_argument(
        "--vtln-warps",
        type=warp_list,
        help="test-time VTLN: candidate warps, a comma list (0.9,1.0,1.1) or LOW:HIGH:STEP (0.8:1.2:0.05), "
        "one chosen per speaker by the model's own score",
    )
    adapt = parser.add_argument_group("unsupervised speaker adaptation (asr.adapt)")
    adapt.add_argument(
        "--adapt-rounds",
        type=int,
        default=0,
        help="fine-tune on each speaker's own transcripts and decode again, this many times (0 = off)",
    )
    adapt.add_argument("--adapt-epochs", type=int, default=AdaptationSettings.epochs, help="passes per round")
    adapt.add_argument("--adapt-lr", type=float, default=AdaptationSettings.lr, help="Adam learning rate")
    adapt.add_argument(
        "--adapt-parameters", choices=ADAPTABLE, default=AdaptationSettings.parameters,
        help="what is fine-tuned: all parameters, or only the norms' gains and biases",
    )
    adapt.add_argument(
        "--adapt-seed", type=int, default=AdaptationSettings.seed, help="seed of dropout, augmentation and batch order"
    )
    adapt.add_argument(
        "--adapt-ctc-agreement",
        action="store_true",
        help="fine-tune only on the transcripts the CTC best path agrees with (worse on FSDD; see asr.adapt)",
    )
    parser.add_argument(
        "--out",
        help="output folder (default: <first checkpoint's folder>/eval_<data folder name or split>, "
        "eval_ensemble<N>_... for N checkpoints)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.beam < 1:
        parser.error(f"--beam must be at least 1, got {args.beam}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    if not 0.0 <= args.ctc_weight <= 1.0:
        parser.error(f"--ctc-weight must be in [0, 1], got {args.ctc_weight}")
    adaptation = None
    if args.adapt_rounds:
        try:
            adaptation = AdaptationSettings(
                rounds=args.adapt_rounds,
                epochs=args.adapt_epochs,
                lr=args.adapt_lr,
                seed=args.adapt_seed,
                parameters=args.adapt_parameters,
                ctc_agreement=args.adapt_ctc_agreement,
            )
        except ValueError as err:
            parser.error(f"--adapt-rounds/--adapt-epochs/--adapt-lr: {err}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    checkpoints = [Path(c) for c in args.checkpoint]
    checkpoint = checkpoints[0]  # its recipe defines --split
    name = Path(args.data).name if args.data else args.split
    if len(checkpoints) > 1:
        name = f"ensemble{len(checkpoints)}_{name}"
    out = Path(args.out) if args.out else checkpoint.parent / f"eval_{name}"
    # Cheap checks first, so a typo in a path fails before the model is loaded.
    for path in checkpoints:
        if not path.is_file():
            parser.error(f"checkpoint not found: {path}")
    report = SkipReport()
    try:
        if args.data:
            where = args.data
            utterances = read_subset(args.data, report)
        else:
            config = experiment_config_from_dict(load_checkpoint(checkpoint)["config"])
            where = f"the {args.split} split of {checkpoint}"
            utterances, _ = load_split(config.data, args.split, report)
    except (DataError, CheckpointError, ConfigError) as err:
        parser.error(str(err))
    usable = []
    for u in utterances:
        if u.text:
            usable.append(u)
        else:
            report.skip(reasons.EMPTY_TRANSCRIPT, f"{u.source}: transcript of {u.id} is empty after normalisation")
    report.log(where)
    if not usable:
        counts = ", ".join(f"{n} {reason}" for reason, n in report.counts().most_common())
        parser.error(f"{where}: no usable utterances ({counts or 'it lists none'})")
    try:
        recogniser = load_recogniser(checkpoints if len(checkpoints) > 1 else checkpoint, args.device)
    except CheckpointError as err:
        parser.error(str(err))
    if args.vtln_warps:
        try:
            check_mel_filters(recogniser.pipeline.config, args.vtln_warps)
        except ValueError as err:
            parser.error(f"--vtln-warps: {err}")
    if adaptation:
        try:
            adapted_parameters(recogniser.model, adaptation.parameters)
        except ValueError as err:
            parser.error(f"--adapt-parameters: {err} in {checkpoint}")
    if args.ctc_weight > 0 and getattr(recogniser.config.model, "ctc_weight", 0.0) == 0:
        parser.error(f"--ctc-weight {args.ctc_weight}: {checkpoint} was trained without a CTC head (model.ctc_weight=0)")

    # Decode in order of length (less padding; beam search ends sooner), report in id order.
    by_length = sorted(usable, key=lambda u: u.duration)
    # With --beam 1 and no CTC weight, decode() runs greedy search and ignores the length penalty.
    options = {"ctc_weight": args.ctc_weight, "length_penalty": args.length_penalty}
    start = time.perf_counter()
    decode = dict(beam_size=args.beam, batch_size=args.batch_size, warps=args.vtln_warps, report=report, **options)
    if adaptation:
        adapted = adapt_and_transcribe(recogniser, by_length, adaptation, **decode)
        texts = adapted.texts
    else:
        texts = recogniser.transcribe_utterances(by_length, **decode)
    elapsed = time.perf_counter() - start
    # Audio that failed where it was read has no transcript; the report names it.
    hyp_by_id = {u.id: text for u, text in zip(by_length, texts) if text is not None}
    usable = sorted((u for u in usable if u.id in hyp_by_id), key=lambda u: u.id)
    if not usable:
        print(f"error: {where}: no utterance could be read\n{report.summary()}", file=sys.stderr)
        return 2
    ids = [u.id for u in usable]
    refs = [u.text for u in usable]
    hyps = [hyp_by_id[i] for i in ids]
    audio_seconds = sum(u.duration for u in usable)

    rates = error_rates(refs, hyps, ids)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hyp.txt").write_text("".join(f"{i} {h}\n" for i, h in zip(ids, hyps)))
    (out / "ref.txt").write_text("".join(f"{i} {r}\n" for i, r in zip(ids, refs)))
    (out / "alignment.txt").write_text(alignment_report(refs, hyps, ids))
    summary = {
        **rates,
        "utterances": len(usable),
        "skipped": len(report),
        "skips": report.as_dict(),
        "audio_seconds": audio_seconds,
        "decode_seconds": elapsed,
        "rtf": elapsed / audio_seconds if audio_seconds > 0 else None,
        "beam": args.beam,
        **options,
        "checkpoint": str(checkpoint) if len(checkpoints) == 1 else [str(c) for c in checkpoints],
        "data": where,
    }
    if args.vtln_warps:
        summary["vtln_warps"] = recogniser.chosen_warps
        summary["vtln_scores"] = {
            speaker: {f"{w:g}": score for w, score in scores.items()} for speaker, scores in recogniser.warp_scores.items()
        }
    if adaptation:
        # The references score each round here; adaptation itself never reads them.
        rounds = [dict(zip((u.id for u in by_length), round_texts)) for round_texts in adapted.texts_per_round]
        summary["adaptation"] = {
            "rounds": adaptation.rounds,
            "epochs": adaptation.epochs,
            "lr": adaptation.lr,
            "seed": adaptation.seed,
            "parameters": adaptation.parameters,
            "ctc_agreement": adaptation.ctc_agreement,
            "wer_per_round": [error_rates(refs, [r[i] for i in ids], ids)["wer"] for r in rounds],
            "warps": adapted.warps,
            "untranscribed": adapted.untranscribed,
            "disagreed": adapted.disagreed,
            "nonfinite_steps": adapted.nonfinite_steps,
        }
    (out / "wer.json").write_text(json.dumps(summary, indent=2) + "\n")
    if len(texts) != sum(t is not None for t in texts):
        report.log(f"{where} (after decoding)")
    print(
        f"WER {100 * rates['wer']:.2f}% (S={rates['substitutions']} D={rates['deletions']} "
        f"I={rates['insertions']} N={rates['ref_words']}) CER {100 * rates['cer']:.2f}% "
        f"on {len(usable)} utterances of {where}" + (f" ({report.counts_text()} skipped)" if len(report) else "")
    )
    if adaptation:
        per_round = " -> ".join(f"{100 * w:.2f}%" for w in summary["adaptation"]["wer_per_round"])
        print(f"WER before adaptation and after each round: {per_round}")
    rtf = f"{summary['rtf']:.4f}" if summary["rtf"] is not None else "n/a"
    print(f"real-time factor {rtf} ({elapsed:.1f} s for {audio_seconds:.1f} s of audio); results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
