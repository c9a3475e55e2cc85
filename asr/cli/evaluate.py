"""Evaluate a checkpoint on a corpus or a split of its recipe: WER, CER and what went wrong.

    python -m asr.evaluate --checkpoint exp/fsdd_las/last.pt --data ../shared/data/fsdd_connected/LibriSpeech/fsdd-dev
    python -m asr.evaluate --checkpoint exp/librispeech100/best_epoch30.pt --data /data/LibriSpeech/test-clean --beam 10
    python -m asr.evaluate --checkpoint exp/demo/last.pt --split test
    python -m asr.evaluate --checkpoint exp/timit/last.pt --data data/manifests/timit_supervisions_TEST.jsonl.gz
    python -m asr.evaluate --checkpoint exp/a/avg_last5.pt exp/b/avg_last5.pt --split test --vtln-warps 0.8:1.2:0.05
    python -m asr.evaluate --checkpoint exp/a/avg_last5.pt --split test --vtln-warps 0.8:1.2:0.05 --adapt-rounds 2

``--split dev`` or ``--split test`` reads that split as the recipe stored in
the checkpoint defines it (its ``data.dev``/``data.test`` folders and any
built sets: the demo corpus's held-out voices, a leave-one-speaker-out fold's
held-out speaker), with relative paths taken from the working directory as in
training. The demo corpus is read, never synthesised: if it has not been
prepared, the error gives the command that prepares it
(``python -m asr.synth_demo CHECKPOINT``).

Writes into ``--out``, by default a folder beside the (first) checkpoint named
after the checkpoint, the data and every decoding setting that is not at its
default: ``exp/demo/eval_last_test``, ``exp/demo/eval_avg_last5_test_beam4_ctc0.3``,
``exp/a/eval_ensemble2_avg_last5_fsdd-dev_vtln0.8-1.2n9`` (names:
:func:`asr.inference.settings_tag`). So evaluations that differ in anything that
can change the transcripts get folders of their own; ``--batch-size`` and
``--device`` are not in the name. ``evaluation.json`` there records what
produced the results (the checkpoints, the data, the settings and the command).
Running the same evaluation again replaces them, as re-running a stage does in
ESPnet or Kaldi; a default folder that holds another evaluation's results
(two data folders with one name, two ensembles of equally named checkpoints,
results without a record) is refused before anything is decoded, with a
message naming the folder and what differs: ``--out`` picks another folder,
``--overwrite`` replaces them. A folder given with ``--out`` follows the same rule.

The files: ``evaluation.json``; ``hyp.txt`` and ``ref.txt`` (``<utterance id>
<text>`` per line, sorted by id), ``alignment.txt`` (per-utterance word alignment with substitutions, deletions
and insertions marked) and ``wer.json`` (``{"wer_percent": 12.5, "cer_percent": ...,
"utterances": ...}`` plus the counts, timing and the settings, and
``by_length``: WER and S/D/I per bin of reference length in words, one bin per
length up to 10 words, else 1-5, 6-10, 11-20, 21-40, 41-80, 81+). WER and CER are
in percent there as everywhere a person reads them, and the keys say so. Prints the
WER line, the by-length table and the real-time factor: wall time of feature extraction plus search
(and adaptation), divided by the audio duration.

Several checkpoints are decoded as one ensemble (the mean of their
next-token distributions; they must share tokenizer and features). The
search and the test-time strategies (VTLN, speaker adaptation) are the shared
options of :mod:`asr.cli.options`; with VTLN, ``wer.json`` gets the chosen
warp and every candidate's mean score per speaker, and with adaptation the
WER before adaptation and after every round (``wer_percent_per_round``).

``wer.json`` also records the model's ``parameters``. With ``--prune-layers``
(LayerDrop pruning, :mod:`asr.models.pruning`) each model is decoded with some
of its layers; the layers kept and the parameters before and after are
printed and recorded under ``pruning``.

Scores use the text normalisation of :mod:`asr.decoding.scoring` on both sides.
Every utterance in the folder is scored (no duration limit, unlike training):
one longer than the longest the model was trained on is decoded in pieces cut
at pauses, and the log says so (``--segment-seconds``: another length, 0: whole).
Utterances that cannot be used (missing audio, audio whose header or samples
cannot be read, NaN samples, an empty transcript) are left out with a logged
reason and counted in ``wer.json``: ``skipped`` (how many) and ``skips``
(counts by reason, and each one's message naming the file), never dropped
silently. One bad file never stops the evaluation. Each output file is written whole or not
at all; a full disk or a denied write ends with one line ``error: <file>: <reason>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from asr.cli.errors import fail
from asr.cli.outputs import add_overwrite_argument, refuse_to_replace
from asr.cli.options import add_decode_arguments, decode_settings

if TYPE_CHECKING:
    from asr.data.report import SkipReport
    from asr.data.utterance import Utterance
    from asr.inference import CorpusResult, DecodeSettings

# The modules below import torch and the data readers: each function imports what it uses, so that
# --help (and a usage error) answer at once.


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", required=True, nargs="+",
        help="a checkpoint written by asr.train or asr.average; several are decoded as an ensemble",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--data", help="a LibriSpeech-layout subset folder, a Kaldi data directory or a lhotse manifest "
        "(asr.data.sources; to transcribe audio files: asr.transcribe)"
    )
    source.add_argument("--split", choices=["dev", "test"], help="a split of the recipe stored in the checkpoint")
    add_decode_arguments(parser)
    parser.add_argument(
        "--out",
        help="output folder (default: beside the first checkpoint, "
        "eval_<checkpoint name>_<data folder name or split>[_<settings not at their default>], e.g. "
        "eval_avg_last5_test_beam4_ctc0.3; eval_ensemble<N>_... for N checkpoints); one holding another "
        "evaluation's results is refused",
    )
    add_overwrite_argument(parser, "the results of another evaluation")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--verbose", action="store_true",
        help="print which code computes the model here (LN-LSTM backends, C++ build flags, CUDA graphs)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = decode_settings(args)
    from tqdm import tqdm

    from asr.checkpoints.io import CheckpointError
    from asr.console import ProgressBarHandler
    from asr.data.report import SkipReport
    from asr.inference import load_recogniser, transcribe_speakers
    from asr.models import runtime
    from asr.writing import WriteError, atomic_write

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s",
                        handlers=[ProgressBarHandler(sys.stderr)])
    checkpoints = [Path(c) for c in args.checkpoint]
    for path in checkpoints:  # cheap checks first, so a typo fails before the model is loaded
        if not path.is_file():
            fail(f"checkpoint not found: {path}")
    record = evaluation_record(checkpoints, args.data, args.split, settings, argv)
    out = Path(args.out) if args.out else default_out(checkpoints, args.data, args.split, settings)
    if not args.overwrite:  # the default folder and one given with --out alike
        clash = clash_with(out, record)
        if clash:
            refuse_to_replace(out, f"the results of another evaluation ({clash})", out_given=bool(args.out),
                              metavar="FOLDER")
    report = SkipReport()
    utterances, where = read_utterances(args, checkpoints[0], report)
    try:
        recogniser = load_recogniser(
            checkpoints if len(checkpoints) > 1 else checkpoints[0], args.device, prune=settings.prune_layers
        )
        settings.check_for(recogniser, str(checkpoints[0]))
    except (CheckpointError, ValueError) as err:
        fail(err)
    if args.verbose:
        for line in runtime.lines(runtime.describe(recogniser.model, args.device)):
            print(line, file=sys.stderr)

    # Decode in order of length (less padding; beam search ends sooner), report in id order.
    by_length = sorted(utterances, key=lambda u: u.duration)
    start = time.perf_counter()
    # a bar on a terminal (per batch; per speaker with VTLN or adaptation); log lines go above it
    with tqdm(total=len(by_length), desc="decoding", unit="utt", disable=None, leave=False) as bar:
        result = transcribe_speakers(recogniser, by_length, settings.strategy(), settings.decoding, settings.batch_size,
                                     progress=bar.update)
    elapsed = time.perf_counter() - start
    for skip in result.skipped:
        report.add(skip)
    if result.skipped:
        report.log(f"{where} (after decoding)")
    scored = [(u, text) for u, text in zip(by_length, result.texts) if text is not None]
    if not scored:
        print(f"error: {where}: no utterance could be read\n{report.summary()}", file=sys.stderr)
        return 2
    try:
        # The record first: results in a folder are never newer than the record that says what made them.
        atomic_write(out / RECORD, json.dumps(record, indent=2) + "\n")
        summary = write_results(out, scored, result, report, elapsed)
    except WriteError as err:  # a full disk, a denied write: one line naming the file, no partial file
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary.update(
        settings=settings.to_dict(), beam=settings.decoding.beam_size, ctc_weight=settings.decoding.ctc_weight,
        length_penalty=settings.decoding.length_penalty, data=where,
        checkpoint=str(checkpoints[0]) if len(checkpoints) == 1 else [str(c) for c in checkpoints],
        parameters=recogniser.parameters,
    )
    if recogniser.pruned:
        summary["pruning"] = [{"checkpoint": str(c), **p.to_dict()} for c, p in zip(checkpoints, recogniser.pruned)]
    summary.update(strategy_summary(result, settings, by_length, {u.id for u, _ in scored}))
    try:
        atomic_write(out / "wer.json", json.dumps(summary, indent=2) + "\n")
    except WriteError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_summary(summary, where, report, out)
    for checkpoint, pruned in zip(checkpoints, recogniser.pruned):
        print(f"model {checkpoint} {pruned.describe()}")
    return 0


RECORD = "evaluation.json"  # what produced the results in an evaluation folder
RESULTS = (RECORD, "wer.json", "hyp.txt", "ref.txt", "alignment.txt")


def default_out(checkpoints: list[Path], data: str | None, split: str | None, settings: DecodeSettings) -> Path:
    """``eval_<model>_<data>[_<settings tag>]`` beside the first checkpoint: the model is the
    checkpoint's file stem (``last``, ``avg_last5``), or ``ensemble<N>_`` and the members' distinct
    stems joined by ``+``; the data is the folder or manifest name (``--data``) or the split."""
    from asr.inference import settings_tag

    stems = list(dict.fromkeys(c.stem for c in checkpoints))
    model = "+".join(stems) if len(checkpoints) == 1 else f"ensemble{len(checkpoints)}_" + "+".join(stems)
    # abspath, not resolve: `--data .` is named after the folder, a symlinked manifest after the link
    source = Path(os.path.abspath(data)).name.removesuffix(".gz").removesuffix(".jsonl") if data else split
    tag = settings_tag(settings)
    return checkpoints[0].parent / "_".join(["eval", model, source] + ([tag] if tag else []))


def evaluation_record(
    checkpoints: list[Path], data: str | None, split: str | None, settings: DecodeSettings, argv: list[str] | None
) -> dict:
    """What decides an evaluation's results (and, to read, the command): written to ``evaluation.json``.
    Paths are absolute, so one evaluation run from two working directories is one evaluation."""
    decode = settings.to_dict()
    del decode["batch_size"]  # how many utterances are padded together, not what is found
    return {
        "checkpoints": [os.path.abspath(c) for c in checkpoints],
        "data": os.path.abspath(data) if data else None,
        "split": split,
        "settings": decode,
        "command": ["python", "-m", "asr.evaluate", *(sys.argv[1:] if argv is None else argv)],
    }


def clash_with(out: Path, record: dict) -> str | None:
    """Why ``out`` holds the results of an evaluation other than ``record``'s, or None when it
    holds none, or those of the same one (the command aside)."""
    found = [name for name in RESULTS if (out / name).exists()]
    if not found:
        return None
    if RECORD not in found:
        return f"{', '.join(found)} without {RECORD} to say what made them"
    try:
        previous = json.loads((out / RECORD).read_text())
    except (OSError, ValueError) as err:
        return f"{out / RECORD} cannot be read: {err}"
    differ = [key for key in ("checkpoints", "data", "split") if previous.get(key) != record[key]]
    old, new = _flat(previous.get("settings") or {}), _flat(record["settings"])
    differ += [key for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]
    if not differ:
        return None
    shown = []
    for key in differ[:3]:
        before, after = (previous.get(key), record[key]) if key in record else (old.get(key), new.get(key))
        shown.append(f"{key} {json.dumps(before)}, here {json.dumps(after)}")
    more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
    return f"its {RECORD} differs: " + "; ".join(shown) + more


def _flat(settings: dict, prefix: str = "") -> dict:
    """``{"decoding": {"beam_size": 4}}`` -> ``{"decoding.beam_size": 4}``."""
    flat = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_utterances(args, checkpoint: Path, report: SkipReport) -> tuple[list[Utterance], str]:
    """The utterances to score (with a transcript) and a description of where they come from."""
    from asr.checkpoints.io import CheckpointError, load_checkpoint
    from asr.config import ConfigError
    from asr.data import report as reasons
    from asr.data.corpus import check_demo_prepared, load_split
    from asr.data.demo import prepare_command
    from asr.data.report import DataError
    from asr.data.sources import read_source
    from asr.experiment import experiment_config_from_dict

    try:
        if args.data:
            where = args.data
            utterances = read_source(args.data, report)
        else:
            config = experiment_config_from_dict(load_checkpoint(checkpoint)["config"])
            where = f"the {args.split} split of {checkpoint}"
            # its demo corpus is read, never synthesised: the error says how to prepare it
            check_demo_prepared(config.data, prepare_command(checkpoint), [args.split])
            utterances, _ = load_split(config.data, args.split, report)
    except (DataError, CheckpointError, ConfigError) as err:
        fail(err)
    usable = []
    for u in utterances:
        if u.text:
            usable.append(u)
        else:
            report.skip(reasons.EMPTY_TRANSCRIPT, f"{u.source}: transcript of {u.id} is empty after normalisation")
    report.log(where)
    if not usable:
        counts = ", ".join(f"{n} {reason}" for reason, n in report.counts().most_common())
        fail(f"{where}: no usable utterances ({counts or 'it lists none'})")
    return usable, where


def write_results(out: Path, scored: list[tuple[Utterance, str]], result: CorpusResult, report: SkipReport, elapsed: float) -> dict:
    """``hyp.txt``, ``ref.txt`` and ``alignment.txt`` in id order; returns the summary's counts and timing."""
    from asr.decoding.scoring import alignment_report, error_rates, error_rates_by_length, rates_in_percent
    from asr.writing import atomic_write

    scored = sorted(scored, key=lambda pair: pair[0].id)
    ids = [u.id for u, _ in scored]
    refs = [u.text for u, _ in scored]
    hyps = [text for _, text in scored]
    audio_seconds = sum(u.duration for u, _ in scored)
    rates = rates_in_percent(error_rates(refs, hyps, ids))
    by_length = [rates_in_percent(b) for b in error_rates_by_length(refs, hyps, ids)]
    atomic_write(out / "hyp.txt", "".join(f"{i} {h}\n" for i, h in zip(ids, hyps)))
    atomic_write(out / "ref.txt", "".join(f"{i} {r}\n" for i, r in zip(ids, refs)))
    atomic_write(out / "alignment.txt", alignment_report(refs, hyps, ids))
    return {
        **rates,
        "by_length": by_length,
        "utterances": len(scored),
        "skipped": len(report),
        "skips": report.as_dict(),
        "audio_seconds": audio_seconds,
        "decode_seconds": elapsed,
        "rtf": elapsed / audio_seconds if audio_seconds > 0 else None,
    }


def strategy_summary(result: CorpusResult, settings: DecodeSettings, decoded: list[Utterance], scored_ids: set[str]) -> dict:
    """What VTLN chose and, with adaptation, the WER before it and after every round (the
    references score each round here; adaptation itself never reads them). ``decoded`` are the
    utterances in the order ``result`` is aligned with."""
    from asr.decoding.scoring import error_rates

    summary = {}
    if settings.vtln_warps:
        summary["vtln_warps"] = result.warps
        summary["vtln_scores"] = {
            speaker: {f"{w:g}": score for w, score in scores.items()} for speaker, scores in result.warp_scores.items()
        }
    if settings.adaptation:
        ids = sorted(scored_ids)
        refs = {u.id: u.text for u in decoded}
        rounds = [dict(zip((u.id for u in decoded), texts)) for texts in result.rounds]
        summary["adaptation"] = {
            **settings.to_dict()["adaptation"],
            "wer_percent_per_round": [100 * error_rates([refs[i] for i in ids], [r[i] for i in ids], ids)["wer"]
                                      for r in rounds],
            "warps": result.warps,
            "untranscribed": result.counts["untranscribed"],
            "disagreed": result.counts["disagreed"],
            "nonfinite_steps": result.counts["nonfinite_steps"],
        }
    return summary


def print_summary(summary: dict, where: str, report: SkipReport, out: Path) -> None:
    from asr.decoding.scoring import length_table

    print(
        f"WER {summary['wer_percent']:.2f}% (S={summary['substitutions']} D={summary['deletions']} "
        f"I={summary['insertions']} N={summary['ref_words']}) CER {summary['cer_percent']:.2f}% "
        f"on {summary['utterances']} utterances of {where}" + (f" ({report.counts_text()} skipped)" if len(report) else "")
    )
    if len(summary["by_length"]) > 1:
        print("by reference length:\n" + length_table(summary["by_length"]))
    if "adaptation" in summary:
        per_round = " -> ".join(f"{w:.2f}%" for w in summary["adaptation"]["wer_percent_per_round"])
        print(f"WER before adaptation and after each round: {per_round}")
    rtf = f"{summary['rtf']:.4f}" if summary["rtf"] is not None else "n/a"
    print(f"real-time factor {rtf} ({summary['decode_seconds']:.1f} s for {summary['audio_seconds']:.1f} s of audio); results in {out}")


if __name__ == "__main__":
    sys.exit(main())
