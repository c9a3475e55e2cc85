"""Average the weights of several checkpoints of one run.

    python -m asr.average exp/librispeech100_transformer --last 10
    python -m asr.average exp/librispeech100 --best 5 --out exp/librispeech100/avg_best5.pt
    python -m asr.average exp/librispeech100_conformer --last 10 --recompute-batchnorm 100

What is averaged, and how, is in :mod:`asr.checkpoints.averaging`. An average's BatchNorm running statistics are the
average of its members', not the statistics of the averaged weights: ``--recompute-batchnorm N``
re-estimates them from N batches of the recipe's training split without augmentation, with the averaged
weights (:mod:`asr.inference.batchnorm`, as ``torch.optim.swa_utils.update_bn`` does after SWA), and writes
those into the average; ``training.batchnorm_recomputed`` in the file records how many batches and
utterances went in. ``--last 1`` gives a single checkpoint's weights with re-estimated statistics.

Writes ``--out`` (default ``EXP_DIR/avg_last{N}.pt`` or ``avg_best{N}.pt``). A file there that is not
the same average (another run folder, ``--last``/``--best``, N or ``--recompute-batchnorm``, or a
checkpoint that is no average at all, such as ``last.pt``) is refused before anything is averaged,
unless ``--overwrite`` (:mod:`asr.cli.outputs`); the same average again replaces its own, with the
run's newest checkpoints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.cli.errors import fail, what_file
from asr.cli.outputs import add_overwrite_argument, refuse_to_replace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.average", description=__doc__.split("\n\n")[0])
    parser.add_argument("exp_dir", type=Path, metavar="EXP_DIR", help="the run folder (exp_dir of the recipe)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, metavar="N", help="average the N newest epoch{E}.pt")
    which.add_argument("--best", type=int, metavar="N", help="average the N best best_epoch{E}.pt by validation metric")
    parser.add_argument("--out", type=Path, metavar="FILE", help="default: EXP_DIR/avg_last{N}.pt or avg_best{N}.pt")
    parser.add_argument("--recompute-batchnorm", type=int, default=0, metavar="N",
                        help="re-estimate BatchNorm's running statistics of the average from N batches of the "
                             "recipe's training split, without augmentation (default 0: the members' mean)")
    parser.add_argument("--device", default="cpu", help="where --recompute-batchnorm runs the model (default cpu)")
    add_overwrite_argument(parser, "a checkpoint other than this average")
    args = parser.parse_args(argv)
    # imported once the arguments are parsed: --help needs none of it (torch and the data readers)
    from asr.checkpoints.averaging import average_checkpoints, select_checkpoints
    from asr.checkpoints.io import CheckpointError, save_checkpoint
    from asr.writing import WriteError

    if args.exp_dir.is_file():
        fail(f"{args.exp_dir} is {what_file(args.exp_dir)}, not a run folder: give the exp_dir whose epoch checkpoints "
             "to average")
    count = args.last if args.last is not None else args.best
    if count < 1:
        fail(f"the number of checkpoints must be at least 1, got {count}")
    if args.recompute_batchnorm < 0:
        fail(f"--recompute-batchnorm must be >= 0, got {args.recompute_batchnorm}")
    out = args.out or args.exp_dir / (f"avg_last{count}.pt" if args.last is not None else f"avg_best{count}.pt")
    if not args.overwrite and (clash := clash_with(out, args)):
        refuse_to_replace(out, clash, out_given=args.out is not None)
    try:
        paths = select_checkpoints(args.exp_dir, args.last, args.best)
        payload = average_checkpoints(paths)
    except CheckpointError as err:
        fail(err)
    if args.recompute_batchnorm:
        from asr.data.report import DataError

        try:
            recomputed = recompute_batchnorm(payload, args.recompute_batchnorm, paths[-1].parent, args.device)
        except (CheckpointError, DataError, ValueError) as err:
            fail(err)
        if not recomputed["batches"]:
            fail("--recompute-batchnorm: the model has no BatchNorm; nothing was written")
        print(f"BatchNorm's running statistics re-estimated from {recomputed['batches']} batches "
              f"({recomputed['utterances']} utterances) of the training split, without augmentation")
    try:
        save_checkpoint(out, payload)
    except WriteError as err:  # a full disk, a denied write: nothing partial is left at out
        fail(err)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")
    return 0


def clash_with(out: Path, args: argparse.Namespace) -> str | None:
    """What ``out`` holds when it is not the average these arguments make (another run folder, selection,
    count or BatchNorm re-estimation; a checkpoint that is no average; not a checkpoint), or None: it does
    not exist, or it holds this same average, which a new run replaces."""
    from asr.checkpoints.averaging import BEST_PREFIX, EPOCH_PREFIX
    from asr.checkpoints.io import CheckpointError, load_checkpoint

    if not out.exists():
        return None
    if out.is_dir():
        return "other files: it is a folder, not a checkpoint file"
    try:
        training = load_checkpoint(out).get("training") or {}
    except CheckpointError as err:
        return f"something other than an average ({err})"
    members = training.get("averaged_from")
    if not isinstance(members, list) or not members:
        return "a checkpoint that is not an average (no training.averaged_from)"
    names = [Path(str(m)).name for m in members]
    kind = "best" if all(n.startswith(BEST_PREFIX) for n in names) else (
        "last" if all(n.startswith(EPOCH_PREFIX) for n in names) else "?")
    folders = {Path(str(m)).parent.resolve() for m in members}
    batches = (training.get("batchnorm_recomputed") or {}).get("batches", 0)
    before = (folders, kind, len(members), bool(batches))
    if before == ({args.exp_dir.resolve()}, *_selection(args), bool(args.recompute_batchnorm)):
        return None
    folder = next(iter(folders)) if len(folders) == 1 else "several folders"
    there = _describe(folder, kind, len(members), bool(batches))
    here = _describe(args.exp_dir.resolve(), *_selection(args), bool(args.recompute_batchnorm))
    return f"another average (of {there}; here of {here})"


def _selection(args: argparse.Namespace) -> tuple[str, int]:
    return ("last", args.last) if args.last is not None else ("best", args.best)


def _describe(folder: Path | str, kind: str, count: int, recomputed: bool) -> str:
    """``the last 5 of /runs/a`` (``--last 5``), ``the best 3 of /runs/a with BatchNorm re-estimated``."""
    return f"the {kind} {count} of {folder}" + (" with BatchNorm re-estimated" if recomputed else "")


def recompute_batchnorm(payload: dict, batches: int, exp_dir: Path, device: str) -> dict:
    """Replace the BatchNorm running statistics in ``payload`` (an average of ``exp_dir``'s checkpoints) by
    those its weights give on ``batches`` training batches; returns what went in (0 batches: no BatchNorm,
    and ``payload`` is unchanged), also recorded as ``payload["training"]["batchnorm_recomputed"]``."""
    from asr.inference.batchnorm import recompute_from_training_batches
    from asr.inference.recogniser import recogniser_from_payload
    from asr.models.norms import MaskedBatchNorm1d

    recogniser = recogniser_from_payload(payload, f"the average of {exp_dir}'s checkpoints", device)
    recomputed = recompute_from_training_batches(recogniser, batches)
    if not recomputed["batches"]:
        return recomputed
    state = recogniser.model.state_dict()
    buffers = [f"{name}.{buffer}" for name, module in recogniser.model.named_modules()
               if isinstance(module, MaskedBatchNorm1d) for buffer, _ in module.named_buffers(recurse=False)]
    for name in buffers:
        payload["model"][name] = state[name].detach().to("cpu", copy=True)
    payload["training"]["batchnorm_recomputed"] = recomputed
    return recomputed


if __name__ == "__main__":
    sys.exit(main())
