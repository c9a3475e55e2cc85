"""Average the weights of several checkpoints of one run.

    python -m asr.average exp/librispeech100_transformer --last 10
    python -m asr.average exp/librispeech100 --best 5 --out exp/librispeech100/avg_best5.pt

``--last N`` takes the N newest epoch checkpoints (``epoch{E}.pt``, the trainer
keeps ``train.keep_last`` of them), ``--best N`` the N best-scoring
``best_epoch{E}.pt`` (by the validation metric stored in each, lower is
better). Floating-point weights are averaged; integer buffers (counters) are
taken from the newest checkpoint. The result carries the config, tokenizer and
feature pipeline of the newest one and no optimizer state, written atomically
(default name ``avg_last{N}.pt`` / ``avg_best{N}.pt`` in the run folder).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from asr.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def select_checkpoints(exp_dir: Path, last: int | None = None, best: int | None = None) -> list[Path]:
    """The checkpoint files to average, newest (by epoch) last."""
    if last is not None:
        paths = sorted(exp_dir.glob("epoch*.pt"), key=lambda p: int(p.stem.removeprefix("epoch")))
        chosen, wanted, what = paths[-last:], last, "epoch*.pt"
    else:
        scored = []
        for path in exp_dir.glob("best_epoch*.pt"):
            metric = (load_checkpoint(path).get("training") or {}).get("metric")
            if metric is None:
                raise CheckpointError(f"{path} has no validation metric to rank it by")
            scored.append((metric, int(path.stem.removeprefix("best_epoch")), path))
        chosen = [p for _, _, p in sorted(scored)[:best]]
        chosen.sort(key=lambda p: int(p.stem.removeprefix("best_epoch")))
        wanted, what = best, "best_epoch*.pt"
    if len(chosen) < wanted:
        raise CheckpointError(f"{exp_dir}: asked for {wanted} checkpoints but found {len(chosen)} {what}")
    return chosen


def average_checkpoints(paths: list[Path]) -> dict:
    """The payload of the newest checkpoint with the models' floating-point tensors averaged."""
    states = [load_checkpoint(p) for p in paths]
    newest = states[-1]
    averaged = {}
    for name, tensor in newest["model"].items():
        if tensor.is_floating_point():
            total = torch.zeros_like(tensor, dtype=torch.float64)
            for state in states:
                if name not in state["model"]:
                    raise CheckpointError(f"{name} is missing from one of {', '.join(map(str, paths))}")
                total += state["model"][name].to(torch.float64)
            averaged[name] = (total / len(states)).to(tensor.dtype)
        else:
            averaged[name] = tensor.clone()
    return {
        "config": newest["config"],
        "model": averaged,
        "tokenizer": newest["tokenizer"],
        "features": newest["features"],
        "training": {"averaged_from": [str(p) for p in paths]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.average", description=__doc__.split("\n\n")[0])
    parser.add_argument("exp_dir", type=Path)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, help="average the N newest epoch checkpoints")
    which.add_argument("--best", type=int, help="average the N best checkpoints by validation metric")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    count = args.last if args.last is not None else args.best
    if count < 1:
        parser.error("the number of checkpoints must be at least 1")
    try:
        paths = select_checkpoints(args.exp_dir, args.last, args.best)
        payload = average_checkpoints(paths)
    except CheckpointError as err:
        parser.error(str(err))
    out = args.out or args.exp_dir / (f"avg_last{count}.pt" if args.last is not None else f"avg_best{count}.pt")
    save_checkpoint(out, payload)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
