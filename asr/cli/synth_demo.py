"""Prepare the synthetic demo corpus a recipe reads: synthesise it once, before training.

    python -m asr.synth_demo recipes/demo.yaml
    python -m asr.synth_demo recipes/study_las_demo.yaml data.demo.seed=1     # the same overrides as the run
    python -m asr.synth_demo exp/demo/last.pt                                   # the corpus a checkpoint's recipe read

The corpus is the one the recipe's ``data.demo`` section describes (with the
overrides given), written in LibriSpeech layout under
``<data.cache_dir>/demo/<key>/LibriSpeech/{train,dev,test}`` (``data.cache_dir``
defaults to ``$XDG_CACHE_HOME/lnasr`` or ``~/.cache/lnasr``; ``<key>`` is a hash
of the options that change the corpus, :func:`asr.data.demo.corpus_key`).
``asr.train``, ``asr.evaluate``, ``asr.study`` and ``asr.check`` then only read
it, and stop with the command to run when it is missing. A second call finds
the corpus there and returns at once. A checkpoint (``.pt``) stands for the
recipe it was trained with. What the corpus holds: :mod:`asr.synthesis.demo`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from asr.config import ConfigError, apply_overrides

if TYPE_CHECKING:
    from asr.experiment import ExperimentConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.synth_demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="recipe YAML (e.g. recipes/demo.yaml), or a checkpoint (.pt) trained with one")
    parser.add_argument("overrides", nargs="*", help="config overrides key.sub=value, as given to asr.train")
    args = parser.parse_args(argv)
    # imported once the arguments are parsed: --help needs none of it (torch, the synthesisers)
    from asr.checkpoints.io import CheckpointError
    from asr.data.demo import corpus_folder
    from asr.data.librispeech import default_cache_dir
    from asr.synthesis import espeak, pico, piper
    from asr.synthesis.demo import prepare_corpus

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.source, args.overrides)
        if not config.data.demo.enabled:
            raise ConfigError(f"{args.source}: data.demo.enabled is false: this recipe reads no demo corpus")
        cache_dir = config.data.cache_dir or default_cache_dir()
        paths = prepare_corpus(config.data.demo, cache_dir)
    except (CheckpointError, ConfigError, ValueError, espeak.EspeakError, pico.PicoError, piper.PiperError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"demo corpus {corpus_folder(config.data.demo, cache_dir)}")
    for split, path in paths.items():
        print(f"  {split}: {path}")
    return 0


def load_config(source: str, overrides: list[str]) -> ExperimentConfig:
    """The experiment config of a recipe, or the one a checkpoint holds, with ``overrides`` applied."""
    from asr.checkpoints.io import load_checkpoint
    from asr.experiment import experiment_config_from_dict, load_experiment_config

    if Path(source).suffix != ".pt":
        return load_experiment_config(source, overrides)
    data = apply_overrides(load_checkpoint(source)["config"], overrides)
    try:
        return experiment_config_from_dict(data)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


if __name__ == "__main__":
    sys.exit(main())
