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
import dataclasses
from typing import TYPE_CHECKING

from asr.inference.config import ADAPTABLE, AdaptationSettings

if TYPE_CHECKING:
    from asr.inference.settings import DecodeSettings

# option -> field of DecodingOptions
_SEARCH = {
    "beam": "beam_size",
    "ctc_weight": "ctc_weight",
    "length_penalty": "length_penalty",
    "length_normalization": "length_normalization",
    "max_len_ratio": "max_len_ratio",
    "coverage_weight": "coverage_weight",
    "coverage_threshold": "coverage_threshold",
    "eos_threshold": "eos_threshold",
    "ctc_greedy": "ctc_greedy",
    "segment_seconds": "segment_seconds",
}
# option -> field of AdaptationSettings
_ADAPT = {
    "adapt_rounds": "rounds",
    "adapt_epochs": "epochs",
    "adapt_lr": "lr",
    "adapt_seed": "seed",
    "adapt_parameters": "parameters",
    "adapt_ctc_agreement": "ctc_agreement",
}


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


def decode_settings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> DecodeSettings:
    """The settings the options describe (over the ``--decode-config`` file's); a bad one is a usage error."""
    # here, not at the top: --help needs none of it (and it imports torch)
    from asr.config import ConfigError
    from asr.inference.settings import DecodeSettings, load_settings, parse_warps
    from asr.models.pruning import parse_pruning

    try:
        base = load_settings(args.decode_config) if args.decode_config else DecodeSettings()
        search = {field: getattr(args, option) for option, field in _SEARCH.items() if getattr(args, option) is not None}
        try:
            decoding = dataclasses.replace(base.decoding, **search)
        except ValueError as err:
            raise ValueError(_with_flags(str(err))) from None
        try:
            adaptation = _adaptation(args, base.adaptation)
        except ValueError as err:
            raise ValueError(f"--adapt-*: {err}") from None
        changes = {"decoding": decoding, "adaptation": adaptation}
        if args.vtln_warps is not None:
            try:
                changes["vtln_warps"] = parse_warps(args.vtln_warps)
            except ValueError as err:
                raise ValueError(f"--vtln-warps: {err}") from None
        if args.batch_size is not None:
            changes["batch_size"] = args.batch_size
        if args.prune_layers is not None:
            try:
                changes["prune_layers"] = parse_pruning(args.prune_layers)
            except ValueError as err:
                raise ValueError(f"--prune-layers: {err}") from None
        return dataclasses.replace(base, **changes)
    except (ConfigError, ValueError) as err:
        parser.error(str(err))


def _with_flags(message: str) -> str:
    """A DecodingOptions error in the options' own names (``beam_size must ...`` -> ``--beam: beam_size must ...``)."""
    for option, field in _SEARCH.items():
        if message.startswith(field):
            return f"--{option.replace('_', '-')}: {message}"
    return message


def _adaptation(args: argparse.Namespace, base: AdaptationSettings | None) -> AdaptationSettings | None:
    given = {field: getattr(args, option) for option, field in _ADAPT.items() if getattr(args, option) is not None}
    if given.get("rounds") == 0:
        return None
    if base is None and given and "rounds" not in given:
        raise ValueError(f"--{next(o for o, f in _ADAPT.items() if f in given).replace('_', '-')} needs --adapt-rounds")
    if base is None and not given:
        return None
    return dataclasses.replace(base or AdaptationSettings(), **given)
