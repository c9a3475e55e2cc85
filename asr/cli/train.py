"""Train a recogniser from a YAML recipe.

Single process (CPU or one GPU)::

    python -m asr.train recipes/fsdd_las.yaml [key.sub=value ...] [--resume]

Several processes with DistributedDataParallel (gloo on CPU, nccl on GPUs)::

    torchrun --nproc_per_node=2 -m asr.train recipes/fsdd_las.yaml

What the run writes into its ``exp_dir`` is listed in :mod:`asr.training.trainer`.
``--resume`` may come anywhere among the arguments. ``--show-config`` lists every key of the recipe
(with the overrides applied) with its value, its default and what it means, and trains nothing::

    python -m asr.train recipes/fsdd_las.yaml train.max_steps=30 --show-config

One run at a time per ``exp_dir``: the run holds ``exp_dir/train.lock`` (:mod:`asr.training.runlock`).
SIGTERM, SIGINT or SIGUSR1 stop it after the step in progress with a resumable
``last.pt`` (:mod:`asr.training.signals`).

Exit status: 0 the run finished; 2 it could not go on (a config, data or checkpoint error,
a file that could not be written, a folder in use), with one line ``error: ...``;
75 stopped on a signal after writing ``last.pt`` (continue with ``--resume``);
128 + N stopped at once by a second signal N (143 for SIGTERM), ``last.pt`` is the one before.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
from pathlib import Path

from asr.config import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="recipe YAML (e.g. recipes/fsdd_las.yaml)")
    parser.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    parser.add_argument("--resume", action="store_true", help="continue the run in exp_dir from last.pt")
    parser.add_argument("--show-config", action="store_true",
                        help="list every config key with its value, default and meaning, and exit")
    parser.add_argument("--verbose", action="store_true",
                        help="log every entry of the runtime record (which code computes the model: LN-LSTM and "
                             "attention backends, C++ build flags, CUDA graphs), not only its one-line summary; "
                             "the run's config.yaml holds them either way")
    return parser


def show_config(recipe: str, overrides: list[str]) -> str:
    """Every key of the recipe with the overrides applied: ``key = value  [default D]  meaning``, a ``*``
    before the keys not at their default."""
    from asr.config import describe_config
    from asr.experiment import load_experiment_config

    keys = describe_config(load_experiment_config(recipe, overrides))
    width = max(len(k.key) for k in keys)
    shown = [(k, _plain(k.value), _plain(k.default)) for k in keys]
    value_width = min(max(len(value) for _, value, _ in shown), 24)
    changed = sum(value != default for _, value, default in shown)
    lines = [f"# {recipe}" + (f" with {' '.join(overrides)}" if overrides else "") +
             f": {len(keys)} keys, {changed} not at their default (*); override any as key=value"]
    for key, value, default in shown:
        mark = "*" if value != default else " "
        lines.append(f"{mark} {key.key:<{width}} = {value:<{value_width}}  [default {default}]  {key.meaning}".rstrip())
    from asr.training.resume import may_change_on_resume

    resumable = [k.key for k in keys if may_change_on_resume(k.key)]
    lines.append(f"# may change on --resume (recorded in config.yaml's history; any other change is refused): "
                 f"{', '.join(resumable)}")
    return "\n".join(lines) + "\n"


def _plain(value) -> str:
    """A value as it would be written in a recipe or an override (``null``, ``[0.9, 0.98]``, ``true``)."""
    import json

    return json.dumps(value) if not isinstance(value, str) else value


def main(argv: list[str] | None = None) -> int:
    # intermixed: "RECIPE --resume key=value" as well as "RECIPE key=value --resume"
    args = build_parser().parse_intermixed_args(argv)
    if args.show_config:
        try:
            sys.stdout.write(show_config(args.recipe, args.overrides))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    # imported once the arguments are parsed: --help and --show-config need none of it (torch)
    import torch
    import torch.distributed as dist

    from asr.checkpoints.io import CheckpointError
    from asr.data.corpus import check_demo_prepared
    from asr.data.demo import prepare_command
    from asr.data.report import DataError
    from asr.experiment import load_experiment_config
    from asr.run import build_trainer
    from asr.training.errors import TrainingError
    from asr.training.resume import refusal
    from asr.training.runlock import RunLock, RunLockError
    from asr.training.signals import StopNow, TrainingStopped
    from asr.writing import WriteError

    lock = None
    previous_hook = threading.excepthook
    threading.excepthook = _quiet_tensorboard_write_errors(previous_hook)
    try:
        config = load_experiment_config(args.recipe, args.overrides)
        check_demo_prepared(config.data, prepare_command(args.recipe, args.overrides))
        refused = refusal(Path(config.exp_dir), args.resume)
        if refused:  # before the lock and the folder are made: a refused run writes nothing
            raise TrainingError(refused)
        if int(os.environ.get("RANK", "0")) == 0:  # one lock for the whole job, taken by its rank 0
            lock = RunLock(config.exp_dir)
            Path(config.exp_dir).mkdir(parents=True, exist_ok=True)
            lock.acquire()
        command = "python -m asr.train " + shlex.join(sys.argv[1:] if argv is None else argv)
        build_trainer(config, resume=args.resume, overrides=args.overrides, command=command, verbose=args.verbose).fit()
        if dist.is_available() and dist.is_initialized():
            # rank 0 still writes checkpoints after the last collective: no rank takes its end of
            # the process group down while another is busy (not on the error path: a rank that
            # failed never reaches a barrier, and the others would wait for it)
            dist.barrier()
    except (CheckpointError, ConfigError, DataError, TrainingError, RunLockError, WriteError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except torch.cuda.OutOfMemoryError as err:  # one that could not be skipped (asr.training.step)
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as err:  # a file or folder that could not be made (mkdir of exp_dir, ...)
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except TrainingStopped as stopped:
        print(stopped, file=sys.stderr)
        return stopped.exit_code
    except StopNow as stopped:
        print(f"{stopped}; last.pt is the checkpoint written before it", file=sys.stderr)
        return stopped.exit_code
    finally:
        threading.excepthook = previous_hook
        if lock is not None:
            lock.release()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _quiet_tensorboard_write_errors(previous):
    """TensorBoard writes its event file on a thread; a failed write there is raised again in the
    trainer, which reports it as one error naming the file. Its traceback from the thread is left out."""

    def hook(args):
        if isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard"):
            return
        previous(args)

    return hook


if __name__ == "__main__":
    sys.exit(main())
