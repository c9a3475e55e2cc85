"""The gradient norms of a LAS at initialisation, per LN placement and cell, against utterance length.

    python benchmarks/ln_init_gradients.py recipes/rehearsal_las.yaml data.root=/data/rehearsal30 \\
        "train.schedules={}" train.curriculum_epochs=0

A LAS that "stops converging" may be lost in its first updates: with ``train.grad_clip`` clipping the
global norm, a stack whose gradient is orders of magnitude larger than the others' takes the whole update,
and Adam's second moments remember it for about ``1 / (1 - beta2)`` updates. This measures it before any
update: one training utterance per batch at each of a few lengths (quantiles of the training split's
frames), the same initial weights (``train.seed``) for every length, the recipe's loss with its
``model.ctc_weight``, and prints per cell the gradient norm of the listener, the speller (attention
included) and the CTC head, and the listener parameter with the largest gradient at the longest length.
The cells are ``model.layer_norm`` x ``model.lnlstm_variant`` (``--cells``); every other key is the
recipe's with the overrides given. Deterministic for a machine and thread count (docs/usage.md, "What a
repeated run varies with"). What it measured: docs/studies/ln_open_vocabulary.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

DEFAULT_CELLS = ("none", "both:ba2016", "both:tf_contrib", "listener:ba2016", "speller:ba2016",
                 "listener:tf_contrib", "speller:tf_contrib")
QUANTILES = (0.02, 0.25, 0.5, 0.75, 0.98)


def measure(recipe: Path, overrides: list[str], cell: str, quantiles: tuple[float, ...], folder: Path) -> list[dict]:
    """Per length: the gradient norm of each top-level module, and the largest listener parameter's."""
    from asr.data.batching import collate
    from asr.experiment import load_experiment_config
    from asr.training.trainer import Trainer

    placement, _, variant = cell.partition(":")
    keys = [f"model.layer_norm={placement}"] + ([f"model.lnlstm_variant={variant}"] if variant else [])
    config = load_experiment_config(recipe, [*overrides, "train.max_minutes=null", "data.num_workers=0", *keys,
                                             f"exp_dir={folder / cell.replace(':', '_')}"])
    trainer = Trainer(config)
    trainer.schedules.apply(0)  # the values of the first update (CTC weight, attention prior, ...)
    dataset = trainer.data.train_set
    dataset.set_epoch(0)
    frames = dataset.num_frames()
    order = sorted(range(len(frames)), key=frames.__getitem__)
    trainer.model.train()
    rows = []
    for q in quantiles:
        batch = collate([dataset[order[int(q * (len(order) - 1))]]])
        trainer.optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(config.train.seed)  # the same dropout masks for every cell
        trainer.step.backward(batch, scale=1.0)
        squares: dict[str, float] = {}
        largest = ("", 0.0)
        for name, p in trainer.raw_model.named_parameters():
            if p.grad is None:
                continue
            norm = float(p.grad.norm())
            group = name.split(".", 1)[0]
            squares[group] = squares.get(group, 0.0) + norm**2
            if group == "listener" and norm > largest[1]:
                largest = (name, norm)
        rows.append({"frames": int(batch.feature_lengths[0]), "largest": largest,
                     **{group: value**0.5 for group, value in squares.items()}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("overrides", nargs="*", help="key.sub=value for every cell")
    parser.add_argument("--cells", nargs="+", default=list(DEFAULT_CELLS),
                        help="PLACEMENT[:VARIANT] each (default: %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as folder:
        results = {cell: measure(args.recipe, args.overrides, cell, QUANTILES, Path(folder)) for cell in args.cells}
    lengths = [row["frames"] for row in next(iter(results.values()))]
    for group in ("listener", "speller", "ctc"):
        print(f"\n{group}: gradient norm at initialisation, one utterance of N frames\n")
        print("| cell | " + " | ".join(f"{n} frames" for n in lengths) + " |")
        print("| --- |" + " ---: |" * len(lengths))
        for cell, rows in results.items():
            print(f"| {cell} | " + " | ".join(f"{row.get(group, 0.0):.3g}" for row in rows) + " |")
    print("\nlargest listener parameter gradient at the longest length:\n")
    for cell, rows in results.items():
        name, norm = rows[-1]["largest"]
        print(f"- {cell}: {name} {norm:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
