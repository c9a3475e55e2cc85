"""The trainer's validation of a checkpoint, again: every validation metric, with batches of any size.

    python -m asr.validate --checkpoint exp/fsdd_conformer/last.pt
    python -m asr.validate --checkpoint exp/a/avg_last5.pt --split test
    python -m asr.validate --checkpoint exp/rc/last.pt --max-frames-per-batch 6000 12000 24000 --decode 0
    python -m asr.validate --checkpoint exp/rc/last.pt --data /data/LibriSpeech/dev-other --out dev_other.json
    python -m asr.validate --checkpoint exp/rc/avg_last5.pt --recompute-batchnorm 100

Runs what ``asr.train`` runs at the end of an epoch (:func:`asr.training.validation.validate`) on the
recipe's dev split stored in the checkpoint (``--split test``: its test split; ``--data``: a
LibriSpeech-layout folder, Kaldi data directory or lhotse manifest), filtered as training filters
its dev split (no duration limit), and prints every metric the model has
(:mod:`asr.training.metrics`): the dev loss, WER and CER of ``--decode`` utterances spread over
the lengths (default: the recipe's ``train.valid_max_utterances``; 0 decodes none, which is fast),
decoded as the recipe's ``train.valid_*`` say, the CTC head's CER, the attention diagnostics and,
for an encoder with BatchNorm, ``batchnorm_gap``: how far the encoder output with each batch's own
statistics (training mode) lies from the output with the running statistics (evaluation).

With the recipe's ``data.max_frames_per_batch`` (the default) and a checkpoint the trainer wrote
after a validation (``last.pt`` at the end of a run, ``epochN.pt``), the figures are those of
``train.log``. ``--max-frames-per-batch`` gives other batch budgets, each validated in turn: the
loss, WER and CER of a model in evaluation mode barely depend on the batch, but BatchNorm's
training-mode statistics do, so ``batchnorm_gap`` at halved and doubled budgets shows how much the
batch a trained model sees moves what training-mode BatchNorm makes of it. Validating a model in
training mode is not training it at another batch size.

``--recompute-batchnorm N`` first re-estimates BatchNorm's running statistics from N batches of the
recipe's training split (its budget and first epoch's shuffle), without augmentation, with the
weights as they are, each batch weighing the same (:mod:`asr.inference.batchnorm`,
what ``torch.optim.swa_utils.update_bn`` does for averaged weights): whether the running averages,
gathered over training as the weights moved and on augmented batches, are what evaluation should use.
The checkpoint is never changed.

Prints one line per budget (batches, utterances per batch, the metrics as ``train.log`` shows them)
and, with ``--out``, writes them as JSON (shares in percent, as everywhere a person reads them) with
the checkpoint, the data, the decoding and the utterances skipped (counted by reason, each message
naming the file). An ``--out`` file that holds the results of another validation (another checkpoint or
data) is refused before anything is computed, unless ``--overwrite``; the same validation again replaces
its own, as in ``asr.evaluate``. Nothing is written beside the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from asr.cli.errors import fail
from asr.cli.outputs import add_overwrite_argument, refuse_to_replace

# The modules below import torch and the data readers: each function imports what it uses, so that
# --help (and a usage error) answer at once.


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.validate", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, type=Path, help="a checkpoint written by asr.train or asr.average")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--split", choices=("dev", "test"), default="dev",
                       help="a split of the recipe stored in the checkpoint (default: dev, what training validates on)")
    where.add_argument("--data", help="a LibriSpeech-layout subset folder, a Kaldi data directory or a lhotse manifest")
    parser.add_argument("--max-frames-per-batch", type=int, nargs="+", metavar="N",
                        help="padded feature frames per batch; several: each validated in turn "
                             "(default: the recipe's data.max_frames_per_batch)")
    parser.add_argument("--decode", type=int, metavar="N",
                        help="utterances decoded for WER and CER, spread over the lengths "
                             "(default: the recipe's train.valid_max_utterances; 0: none)")
    parser.add_argument("--recompute-batchnorm", type=int, metavar="N", default=0,
                        help="first re-estimate BatchNorm's running statistics from N batches of the recipe's "
                             "training split, without augmentation, with the weights as they are (as "
                             "torch.optim.swa_utils.update_bn does); default 0: the checkpoint's own")
    parser.add_argument("--out", type=Path, help="write the results to this JSON file (one holding another "
                                                  "validation's results is refused)")
    add_overwrite_argument(parser, "the results of another validation")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        fail(f"checkpoint not found: {args.checkpoint}")
    for budget in args.max_frames_per_batch or ():
        if budget <= 0:
            fail(f"--max-frames-per-batch must be positive, got {budget}")
    if args.decode is not None and args.decode < 0:
        fail(f"--decode must be >= 0, got {args.decode}")
    if args.recompute_batchnorm < 0:
        fail(f"--recompute-batchnorm must be >= 0, got {args.recompute_batchnorm}")
    if args.out and not args.overwrite:
        clash = clash_with(args.out, args.checkpoint, args.data or f"the {args.split} split of {args.checkpoint}")
        if clash:
            refuse_to_replace(args.out, f"the results of another validation ({clash})")

    from asr.checkpoints.io import CheckpointError
    from asr.console import ProgressBarHandler
    from asr.data.batching import BucketBatchSampler
    from asr.data.report import DataError, SkipReport
    from asr.inference import load_recogniser
    from asr.inference.batchnorm import evaluation_dataset, recompute_from_training_batches
    from asr.training.data import make_loader
    from asr.training.metrics import as_shown
    from asr.training.reporting import format_metrics
    from asr.training.validation import validate, validation_options
    from asr.writing import WriteError, atomic_write

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s",
                        handlers=[ProgressBarHandler(sys.stderr)])
    try:
        recogniser = load_recogniser(args.checkpoint, args.device)
    except (CheckpointError, ValueError) as err:
        fail(err)
    config, model = recogniser.config, recogniser.model
    report = SkipReport()
    try:
        utterances, where = read_split(args, config, recogniser.tokenizer, report)
    except DataError as err:
        fail(err)
    if not utterances:
        fail(f"{where}: no usable utterances ({report.counts_text() if len(report) else 'it lists none'})")
    dataset = evaluation_dataset(recogniser, utterances)
    recomputed = None
    if args.recompute_batchnorm:
        try:
            recomputed = recompute_from_training_batches(recogniser, args.recompute_batchnorm)
        except DataError as err:
            fail(err)
        print(f"BatchNorm's running statistics re-estimated from {recomputed['batches']} batches "
              f"({recomputed['utterances']} utterances) of the training split, without augmentation"
              if recomputed["batches"] else "the model has no BatchNorm: --recompute-batchnorm changed nothing")
    options = validation_options(config.train, model)
    decode = config.train.valid_max_utterances if args.decode is None else args.decode
    budgets = args.max_frames_per_batch or [config.data.max_frames_per_batch]
    rows = []
    print(f"{where if not args.data else f'{args.checkpoint} on {where}'}: {len(utterances)} utterances"
          + (f" ({report.counts_text()} skipped)" if len(report) else ""))
    for budget in budgets:
        batches = list(BucketBatchSampler(dataset.num_frames(), budget, shuffle=False))
        loader = make_loader(batches, dataset, config.data.num_workers, config.data.seed,
                             pin_memory=recogniser.device.type == "cuda")
        result = validate(model, loader, recogniser.tokenizer, recogniser.device, options, decode)
        if not rows:  # the same utterances each time: their unreadable audio is counted once
            for skip in result.skipped.skips:
                report.add(skip)
        shown = as_shown(result.metrics)
        recipe = " (the recipe's)" if budget == config.data.max_frames_per_batch else ""
        print(f"max_frames_per_batch {budget}{recipe}: {len(batches)} batches, "
              f"{result.utterances / max(len(batches), 1):.1f} utterances per batch, {result.decoded} decoded; "
              f"{format_metrics(shown)}")
        rows.append({"max_frames_per_batch": budget, "batches": len(batches), "utterances": result.utterances,
                     "decoded": result.decoded, "metrics": shown})
    if len(report):
        report.log(where)
    if args.out:
        record = {
            "checkpoint": str(args.checkpoint), "data": where,
            "command": ["python", "-m", "asr.validate", *(sys.argv[1:] if argv is None else argv)],
            "decoding": {"beam": options.beam_size, "ctc_weight": options.ctc_weight,
                         "max_len_ratio": options.max_len_ratio},
            "batchnorm_recomputed": recomputed,
            "results": rows, "skipped": len(report), "skips": report.as_dict(),
        }
        try:
            atomic_write(args.out, json.dumps(record, indent=2) + "\n")
        except WriteError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return 0


def clash_with(out: Path, checkpoint: Path, data: str) -> str | None:
    """Why the file ``out`` holds the results of a validation other than one of ``checkpoint`` on ``data``
    (another checkpoint or data, or not a validation's results at all), or None: it does not exist, or it
    holds this one's, which a new run replaces."""
    if not out.exists():
        return None
    try:
        previous = json.loads(out.read_text())
    except (OSError, ValueError) as err:
        return f"it cannot be read as a validation's results: {err}"
    if not isinstance(previous, dict) or "results" not in previous:
        return "it is not a validation's results"
    if previous.get("checkpoint") != str(checkpoint):
        return f"checkpoint {json.dumps(previous.get('checkpoint'))}, here {json.dumps(str(checkpoint))}"
    if previous.get("data") != data:
        return f"data {json.dumps(previous.get('data'))}, here {json.dumps(data)}"
    return None


def read_split(args, config, tokenizer, report):
    """The utterances to validate on, filtered as the trainer filters its dev split (every duration
    kept), and a description of where they come from."""
    from asr.data.corpus import check_demo_prepared, load_split
    from asr.data.dataset import prepare_utterances
    from asr.data.demo import prepare_command
    from asr.data.sources import read_source

    if args.data:
        where = args.data
        utterances = read_source(args.data, report)
    else:
        where = f"the {args.split} split of {args.checkpoint}"
        check_demo_prepared(config.data, prepare_command(args.checkpoint), [args.split])
        utterances, _ = load_split(config.data, args.split, report)
    usable, _ = prepare_utterances(utterances, config.data, tokenizer, report, limit_duration=False,
                                   name="data" if args.data else args.split)
    return usable, where


if __name__ == "__main__":
    sys.exit(main())
