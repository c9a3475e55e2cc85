"""Train a recogniser from a YAML recipe.

Single process (CPU or one GPU)::

    python -m asr.train recipes/fsdd_las.yaml [key.sub=value ...] [--resume]

Several processes with DistributedDataParallel (gloo on CPU, nccl on GPUs)::

    torchrun --nproc_per_node=2 -m asr.train recipes/fsdd_las.yaml

What the run writes into its ``exp_dir`` is listed in :mod:`asr.training.trainer`.
"""

from __future__ import annotations

import argparse
import sys

import torch.distributed as dist

from asr.checkpoint import CheckpointError
from asr.config import ConfigError
from asr.data.corpus import check_demo_prepared
from asr.data.demo import prepare_command
from asr.data.report import DataError
from asr.experiment import load_experiment_config
from asr.training import Trainer, TrainingError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="recipe YAML (e.g. recipes/fsdd_las.yaml)")
    parser.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    parser.add_argument("--resume", action="store_true", help="continue the run in exp_dir from last.pt")
    args = parser.parse_args(argv)
    try:
        config = load_experiment_config(args.recipe, args.overrides)
        check_demo_prepared(config.data, prepare_command(args.recipe, args.overrides))
        Trainer(config, resume=args.resume).fit()
        if dist.is_available() and dist.is_initialized():
            # rank 0 still writes checkpoints after the last collective: no rank takes its end of
            # the process group down while another is busy (not on the error path: a rank that
            # failed never reaches a barrier, and the others would wait for it)
            dist.barrier()
    except (CheckpointError, ConfigError, DataError, TrainingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
