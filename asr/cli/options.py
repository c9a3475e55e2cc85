"""The command-line options every decoding entry point shares, and their one set of checks.

``asr.evaluate``, ``asr.transcribe`` and ``asr.study`` call :func:`add_decode_arguments`
and :func:`decode_settings`, so they offer the same options with the same meaning:
search (``--beam``, ``--ctc-weight``, ...), test-time VTLN (``--vtln-warps``),
speaker adaptation (``--adapt-*``), LayerDrop pruning of the model
(``--prune-layers``), or all of it from a YAML file
(``--decode-config``, see :mod:`asr.inference.settings`), which the options given
on the command line override.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from asr.cli.errors import fail
from asr.inference.config import ADAPTABLE, AdaptationSettings

if TYPE_CHECKING:
    from asr.inference.settings import DecodeSettings


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the shared options (defaults: :class:`DecodeSettings`' own, or the ``--decode-config`` file's)."""
    search = parser.add_argument_group("search")
    search.add_argument("--decode-config", metavar="FILE", help="YAML file of decoding settings (asr.inference.settings)")
    search.add_argument("--beam", type=int, help="beam size (default 1: greedy search)")
    search.add_argument("--ctc-weight", type=float, help="weight of CTC prefix scores in beam search (default 0)")
    search.add_argument("--length-penalty", type=float, help="score added per emitted token in beam search (default 0)")
    search.add_argument("--length-normalization", action="store_true", default=None,
                        help="rank finished hypotheses by log-probability per token")
    search.add_argument("--max-len-ratio", type=float, help="at most this many output tokens per encoder frame (default 1)")
    search.add_argument("--coverage-weight", type=float, help="beam search bonus per encoder frame covered (default 0)")
    search.add_argument("--coverage-threshold", type=float,
                        help="summed attention a frame needs to count as covered (default 0.5)")
    search.add_argument("--eos-threshold", type=float,
                        help="<eos> only at least this times as probable as the best other token (default 0: off)")
    search.add_argument("--ctc-greedy", action="store_true", default=None,
                        help="decode with the CTC head's best path alone (no decoder)")
    search.add_argument("--segment-seconds", type=float,
                        help="decode recordings longer than this in pieces of at most this many seconds, cut at "
                        "pauses (default: the longest utterance the model was trained on; 0: every recording whole)")
    search.add_argument("--batch-size", type=int, help="utterances decoded together (default 16)")
    strategy = parser.add_argument_group("test-time strategies")
    strategy.add_argument(
        "--vtln-warps",
        help="test-time VTLN: candidate warps, a comma list (0.9,1.0,1.1) or LOW:HIGH:STEP (0.8:1.2:0.05), "
        "one chosen per speaker by the model's own score",
    )
    strategy.add_argument(
        "--adapt-rounds", type=int,
        help="speaker adaptation (asr.inference.adaptation): fine-tune on each speaker's own transcripts and "
        "decode again, this many times (0 = off)",
    )
    strategy.add_argument("--adapt-epochs", type=int, help=f"passes per round (default {AdaptationSettings.epochs})")
    strategy.add_argument("--adapt-lr", type=float, help=f"Adam learning rate (default {AdaptationSettings.lr})")
    strategy.add_argument("--adapt-parameters", choices=ADAPTABLE,
                          help="what is fine-tuned: all parameters, or only the norms' gains and biases")
    strategy.add_argument("--adapt-seed", type=int, help="seed of dropout, augmentation and batch order")
    strategy.add_argument("--adapt-ctc-agreement", action="store_true", default=None,
                          help="fine-tune only on the transcripts the CTC best path agrees with")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--prune-layers", nargs="+", metavar="SPEC",
        help="LayerDrop pruning of a Transformer (asr.models.pruning): every_other keeps layers 0,2,4,... "
        "of both stacks; enc:0,2,4 dec:0,2 (or enc:every_other) keeps those layers; a stack not named keeps all",
    )


def decode_settings(args: argparse.Namespace) -> DecodeSettings:
    """The settings the options describe (over the ``--decode-config`` file's); a bad one is one error line
    naming the option or the file's key (:func:`asr.cli.errors.fail`), exit status 2."""
    # here, not at the top: --help needs none of it (it imports torch)
    from asr.config import ConfigError
    from asr.inference.settings import OPTIONS, settings_from_options

    try:
        return settings_from_options({name: getattr(args, name) for name in OPTIONS})
    except (ConfigError, ValueError) as err:
        fail(err)
