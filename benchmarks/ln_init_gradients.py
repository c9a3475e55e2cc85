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

``--through-time STEPS`` measures why instead: for the listener's first layer, backward direction (the
parameter that takes most of the gradient), how a gradient changes going back through time at
initialisation. Driven by each length's utterance read from its end, as that direction reads it, it
back-propagates a random unit vector from the state after ``STEPS`` steps one step at a time and fits the
slope of log10 of the norm of the gradient on the state (h and c) over the steps: below 0 the gradient
decays going back, about 0 it neither decays nor grows, and a long utterance's gradient then sums
contributions from all of its frames. It also gives the spread ``std(W_h h)`` of the recurrent term that
``ba2016``'s recurrent norm divides by. One row per cell, over ``--seeds`` (each its own initial weights)
and the five utterances.
"""

from __future__ import annotations

import argparse
import math
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
    from asr.run import build_trainer

    placement, _, variant = cell.partition(":")
    keys = [f"model.layer_norm={placement}"] + ([f"model.lnlstm_variant={variant}"] if variant else [])
    config = load_experiment_config(recipe, [*overrides, "train.max_minutes=null", "data.num_workers=0", *keys,
                                             f"exp_dir={folder / cell.replace(':', '_')}"])
    trainer = build_trainer(config)
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


def through_time(recipe: Path, overrides: list[str], cell: str, quantiles: tuple[float, ...], folder: Path,
                 steps: int, seeds: tuple[int, ...]) -> list[dict]:
    """Per seed and length: the slope of log10 ||dL/d(h, c)|| per step back through time in the listener's
    first layer, backward direction, the gradient's norm ``steps`` steps back, and the recurrent term's spread."""
    from asr.data.batching import collate
    from asr.experiment import load_experiment_config
    from asr.run import build_trainer

    placement, _, variant = cell.partition(":")
    rows = []
    for seed in seeds:
        keys = [f"model.layer_norm={placement}", f"train.seed={seed}"] + ([f"model.lnlstm_variant={variant}"] if variant else [])
        config = load_experiment_config(recipe, [*overrides, "train.max_minutes=null", "data.num_workers=0", *keys,
                                                 f"exp_dir={folder / (cell.replace(':', '_') + f'_seed{seed}')}"])
        trainer = build_trainer(config)
        dataset = trainer.data.train_set
        dataset.set_epoch(0)
        frames = dataset.num_frames()
        order = sorted(range(len(frames)), key=frames.__getitem__)
        backward = trainer.raw_model.listener.layers[0].cells[1]  # first layer, backward direction
        direction = torch.nn.functional.normalize(torch.randn(backward.hidden_size, generator=torch.Generator().manual_seed(seed)), dim=0)
        for q in quantiles:
            features = collate([dataset[order[int(q * (len(order) - 1))]]]).features[0]
            row = _decay(backward, features.flip(0)[: steps + 1], direction)
            rows.append({"seed": seed, "frames": int(features.size(0)), **row})
    return rows


def _decay(cell, x: torch.Tensor, direction: torch.Tensor) -> dict:
    """x (T, I) in the order the cell reads it: the gradient of ``direction . h_T`` on each earlier state
    the cell computed (steps T-1 back to 1): the slope of log10 of its norm per step, log10 of the norm on
    the first state, and the median spread of ``W_h h``."""
    gates = cell.input_gates(x.unsqueeze(1)).detach()  # (T, 1, 4H)
    h = c = x.new_zeros(1, cell.hidden_size)
    steps, spreads = [], []
    for t in range(x.size(0)):
        h, c = h.detach().requires_grad_(), c.detach().requires_grad_()
        if t:  # the first state is zero: no spread to speak of
            spreads.append(float(torch.nn.functional.linear(h, cell.weight_h).detach().std()))
        h_next, c_next = cell.recurrent_step(gates[t], h, c)
        steps.append((h, c, h_next, c_next))
        h, c = h_next, c_next
    grad_h, grad_c = direction.unsqueeze(0), torch.zeros_like(c)
    logs, log_norm = [], 0.0
    for h_in, c_in, h_out, c_out in reversed(steps[1:]):  # not onto the zero state the cell starts from: a constant
        grad_h, grad_c = torch.autograd.grad((h_out, c_out), (h_in, c_in), (grad_h, grad_c))
        # Carried at unit norm with its scale kept as a logarithm, so a gradient that decays 10^-600 over a long
        # utterance does not underflow float32 (the Lyapunov-exponent way of measuring it).
        norm = float(torch.cat([grad_h, grad_c], 1).norm())
        log_norm += math.log10(norm) if norm > 0 else -math.inf
        logs.append(log_norm)
        grad_h, grad_c = grad_h / norm, grad_c / norm
    finite = torch.tensor([v for v in logs if math.isfinite(v)], dtype=torch.float64)
    back = torch.arange(len(finite), dtype=torch.float64)
    slope = float(((back - back.mean()) * (finite - finite.mean())).sum() / ((back - back.mean()) ** 2).sum())
    return {"slope": slope, "log10_last": logs[-1], "spread": float(torch.tensor(spreads).median())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("overrides", nargs="*", help="key.sub=value for every cell")
    parser.add_argument("--cells", nargs="+", default=list(DEFAULT_CELLS),
                        help="PLACEMENT[:VARIANT] each (default: %(default)s)")
    parser.add_argument("--through-time", type=int, metavar="STEPS",
                        help="measure the gradient's decay back through time over STEPS steps instead")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="with --through-time (default: 0 1 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    if args.through_time:
        return _print_through_time(args)
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


def _print_through_time(args) -> int:
    import statistics

    print(f"\nlistener layer 0, backward direction: log10 of the gradient's norm per step back ({args.through_time} steps), "
          f"seeds {' '.join(map(str, args.seeds))} x {len(QUANTILES)} utterances\n")
    print(f"| cell | slope, mean ± std | log10 of the norm at most {args.through_time} steps back, median (max) | "
          "spread of W_h h, median |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as folder:
        for cell in args.cells:
            rows = through_time(args.recipe, args.overrides, cell, QUANTILES, Path(folder), args.through_time, tuple(args.seeds))
            slopes = [row["slope"] for row in rows]
            spread = f"{statistics.median(row['spread'] for row in rows):.3g}"
            print(f"| {cell} | {statistics.mean(slopes):.4f} ± {statistics.stdev(slopes) if len(slopes) > 1 else 0.0:.4f} | "
                  f"{statistics.median(row['log10_last'] for row in rows):.1f} ({max(row['log10_last'] for row in rows):.1f}) | {spread} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
