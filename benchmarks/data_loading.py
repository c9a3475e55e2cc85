"""Does data loading starve training? Loader wait as a share of step time.

    python benchmarks/data_loading.py [--workers 2] [--steps 40] [recipe overrides ...]
    python benchmarks/data_loading.py --recipe demo.yaml --workers 8 train.device=cuda

Builds the trainer of a recipe (default recipes/fsdd_las.yaml, real FSDD audio;
features are computed on the fly, with dither and SpecAugment, by DataLoader
workers) and runs training steps, timing how long each step waits for its batch and how
long the whole step takes. Prints the wait share for the requested number of
workers and, as the reference measured in the same run, for 0 workers (features
computed in the training process). Target: at most 10% with 2 workers on CPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from asr.experiment import load_experiment_config
from asr.training import Trainer
from asr.training.data import make_loader

ROOT = Path(__file__).resolve().parents[1]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(recipe: str, overrides: list[str], workers: int, steps: int, warmup: int) -> tuple[float, float]:
    """(seconds waiting for batches, seconds in total) over ``steps`` steps after ``warmup``."""
    with tempfile.TemporaryDirectory() as exp_dir:
        config = load_experiment_config(
            ROOT / "recipes" / recipe, overrides + [f"exp_dir={exp_dir}", f"data.num_workers={workers}"]
        )
        trainer = Trainer(config)
        data = trainer.data
        data.sampler.set_epoch(0)
        data.train_set.set_epoch(0)
        batches = list(data.sampler)[: steps + warmup]
        iterator = iter(make_loader(batches, data.train_set, workers, config.data.seed, pin_memory=False))
        wait = total = 0.0
        for index in range(len(batches)):
            start = time.perf_counter()
            batch = next(iterator)
            fetched = time.perf_counter()
            if trainer.step.backward(batch.to(trainer.device)).loss is not None:
                trainer.step.update()
            synchronize(trainer.device)
            end = time.perf_counter()
            if index >= warmup:  # the first batches include worker start-up
                wait += fetched - start
                total += end - start
        return wait, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="fsdd_las.yaml", help="a recipe file in recipes/")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="recipe overrides key.sub=value")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = list(args.overrides)
    if args.recipe == "fsdd_las.yaml":
        overrides = [f"data.root={ROOT.parent / 'shared' / 'data'}", "data.digits.utterances=600", *overrides]
    for workers in (args.workers, 0):
        wait, total = measure(args.recipe, overrides, workers, args.steps, args.warmup)
        print(
            f"workers={workers}: {args.steps} steps in {total:.1f} s, waiting for data {wait:.2f} s "
            f"= {100 * wait / total:.1f}% of step time"
        )


if __name__ == "__main__":
    main()
