"""How to transcribe: the search options and the test-time strategy, as one settings dataclass.

The same settings come from a YAML file (``--decode-config FILE``) or from the
command line (the shared options of :mod:`asr.cli.options`), so
``asr.evaluate``, ``asr.transcribe`` and ``asr.study`` offer the same choices
with one set of checks. A file looks like::

    decoding:
      beam_size: 4
      ctc_weight: 0.3
    vtln_warps: [0.9, 0.95, 1.0, 1.05, 1.1]   # or "0.8:1.2:0.05"
    adaptation:                                # omit (or null) for none
      rounds: 3
      epochs: 4
    batch_size: 16
    prune_layers: every_other                  # LayerDrop pruning; or {encoder: [0, 2, 4], decoder: every_other}

``prune_layers`` is applied where the recogniser is built from its checkpoints
(``load_recogniser(..., prune=settings.prune_layers)``), to every member of an
ensemble; see :mod:`asr.models.pruning`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from asr.config import ConfigError, from_dict, read_yaml, to_dict
from asr.decoding import DecodingOptions
from asr.inference.adaptation import AdaptationSettings, SelfTraining, adapted_parameters
from asr.inference.interface import RecogniserProtocol
from asr.inference.strategies import PlainDecoding, Strategy, VTLNSearch
from asr.models.pruning import LayerPruning, parse_pruning, pruning_from_config
from features.filterbank import check_mel_filters

WARP_BOUNDS = (0.7, 1.3)  # those of features.vtlp


@dataclass(frozen=True)
class DecodeSettings:
    """Everything that decides the transcripts of a given recogniser."""

    decoding: DecodingOptions = field(default_factory=DecodingOptions)
    vtln_warps: tuple[float, ...] = ()      # test-time VTLN candidates; empty = none
    adaptation: AdaptationSettings | None = None  # self-training per speaker; None = none
    batch_size: int = 16                    # utterances decoded together
    prune_layers: LayerPruning | None = None  # the layers to keep of a model trained with LayerDrop; None = all

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        bad = [w for w in self.vtln_warps if not WARP_BOUNDS[0] <= w <= WARP_BOUNDS[1]]
        if bad:
            raise ValueError(f"vtln_warps: warp {bad[0]:g} is outside [{WARP_BOUNDS[0]}, {WARP_BOUNDS[1]}]")

    def strategy(self) -> Strategy:
        """The strategy these settings describe: VTLN when warps are given, then adaptation when asked."""
        first: Strategy = VTLNSearch(self.vtln_warps) if self.vtln_warps else PlainDecoding()
        return SelfTraining(self.adaptation, first) if self.adaptation else first

    def check_for(self, recogniser: RecogniserProtocol, name: str) -> None:
        """Refuse settings ``recogniser`` (from checkpoint ``name``) cannot serve; ValueError names the setting."""
        if (self.decoding.ctc_weight > 0 or self.decoding.ctc_greedy) and not recogniser.model.has_ctc:
            what = "ctc_greedy" if self.decoding.ctc_greedy else f"ctc_weight {self.decoding.ctc_weight}"
            raise ValueError(f"{what}: {name} was trained without a CTC head (model.ctc_weight=0)")
        if self.vtln_warps:
            try:
                check_mel_filters(recogniser.pipeline.config, list(self.vtln_warps))
            except ValueError as err:
                raise ValueError(f"vtln_warps: {err}") from None
        if self.adaptation:
            for member in recogniser.members():
                try:
                    adapted_parameters(member, self.adaptation.parameters)
                except ValueError as err:
                    raise ValueError(f"adaptation.parameters: {err} in {name}") from None

    def to_dict(self) -> dict:
        """Plain data for ``wer.json`` and a ``--decode-config`` file (the inverse of :func:`settings_from_dict`)."""
        data = to_dict(self)
        data["vtln_warps"] = list(self.vtln_warps)
        # Left out when off, so evaluations made before these settings existed keep comparing equal (asr.studies.grid).
        if self.decoding.segment_seconds is None:
            del data["decoding"]["segment_seconds"]
        if self.prune_layers is None:
            del data["prune_layers"]
        else:
            data["prune_layers"] = self.prune_layers.to_config()
        return data


# What changes the transcripts, in the short names of an evaluation folder (asr.evaluate's default --out).
# A field missing here still shows, under its own name: a new option can never leave two folders alike.
_TAG_NAMES = {
    "beam_size": "beam", "ctc_weight": "ctc", "length_penalty": "lp", "length_normalization": "lennorm",
    "max_len_ratio": "lenratio", "min_len": "minlen", "max_len": "maxlen", "ctc_candidates": "ctccand",
    "coverage_weight": "cov", "coverage_threshold": "covthr", "eos_threshold": "eos", "ctc_greedy": "ctcgreedy",
    "segment_seconds": "seg",
}
_ADAPT_TAG_NAMES = {"epochs": "ep", "lr": "lr", "seed": "seed", "parameters": "", "ctc_agreement": "ctcagree"}


def settings_tag(settings: DecodeSettings) -> str:
    """A short readable name for what in ``settings`` differs from :class:`DecodeSettings`' defaults,
    e.g. ``beam4_ctc0.3``, ``seg0`` or ``vtln0.8-1.2n9_adapt2-ep1-norms``; empty at the defaults.

    Equal settings give equal tags however they were given (options, a ``--decode-config`` file, or a
    default written out, ``--beam 1``). ``batch_size`` is left out: it decides how many utterances
    are padded together, not what the search finds. The tag is for people to read; it is not meant
    to be parsed back, and two settings may share one (VTLN warps are named by their range and count
    only): whoever uses it as a folder name must also record the settings themselves
    (:meth:`DecodeSettings.to_dict`) and compare them.
    """
    parts = []
    default = DecodingOptions()
    for f in dataclasses.fields(DecodingOptions):
        value = getattr(settings.decoding, f.name)
        if value != getattr(default, f.name):
            parts.append(_tag_part(_TAG_NAMES.get(f.name, f.name), value))
    if settings.vtln_warps:
        warps = settings.vtln_warps
        parts.append(f"vtln{_number(warps[0])}-{_number(warps[-1])}n{len(warps)}")
    if settings.adaptation:
        adapt, base = settings.adaptation, AdaptationSettings()
        words = [f"adapt{adapt.rounds}"]
        for f in dataclasses.fields(AdaptationSettings):
            value = getattr(adapt, f.name)
            if f.name != "rounds" and value != getattr(base, f.name):
                words.append(_tag_part(_ADAPT_TAG_NAMES.get(f.name, f.name), value))
        parts.append("-".join(words))
    if settings.prune_layers is not None:
        parts.append("prune-" + settings.prune_layers.describe().replace(":", "").replace(" ", "-"))
    return "_".join(parts)


def _tag_part(name: str, value) -> str:
    if value is True:
        return name
    if value is False or value is None:
        return f"no{name}"
    return f"{name}{_number(value) if isinstance(value, float) else value}"


def _number(value: float) -> str:
    """``0.3`` -> ``0.3``, ``4.0`` -> ``4``: the short form where it reads back as the same number."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def parse_warps(text: str | list) -> tuple[float, ...]:
    """``0.9,1.0,1.1``, ``LOW:HIGH:STEP`` (both ends included) or a list -> sorted distinct warps
    within :data:`WARP_BOUNDS`; a ValueError says what is wrong."""
    try:
        if isinstance(text, (list, tuple)):
            warps = [float(w) for w in text]
        elif ":" in text:
            low, high, step = (float(x) for x in text.split(":"))
            if step <= 0 or high < low:
                raise ValueError
            warps = [round(low + i * step, 6) for i in range(round((high - low) / step) + 1)]
        else:
            warps = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma list of warps or LOW:HIGH:STEP with LOW <= HIGH") from None
    bad = [w for w in warps if not WARP_BOUNDS[0] <= w <= WARP_BOUNDS[1]]
    if bad:
        raise ValueError(f"warp {bad[0]:g} is outside [{WARP_BOUNDS[0]}, {WARP_BOUNDS[1]}]")
    return tuple(sorted(set(warps)))


def settings_from_dict(data: dict, where: str = "decode config") -> DecodeSettings:
    """:class:`DecodeSettings` from plain data (a YAML file); an error names the key."""
    data = dict(data or {})
    try:
        warps = parse_warps(data.pop("vtln_warps", None) or ())
    except ValueError as err:
        raise ConfigError(f"{where}: vtln_warps: {err}") from None
    pruning = data.pop("prune_layers", None)
    try:
        pruning = None if pruning is None else pruning_from_config(pruning)
    except ValueError as err:
        raise ConfigError(f"{where}: prune_layers: {err}") from None
    try:
        settings = from_dict(DecodeSettings, data, "")
        return dataclasses.replace(settings, vtln_warps=warps, prune_layers=pruning)
    except (ConfigError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None


def load_settings(path: str | Path) -> DecodeSettings:
    return settings_from_dict(read_yaml(path), str(path))


# The decoding options of the command line (asr.evaluate, asr.transcribe, asr.study: asr.cli.options) by
# their names with underscores, which Recogniser.transcribe takes as keywords too: one set of names and
# checks for both. Option -> field of DecodingOptions:
SEARCH_OPTIONS = {
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
ADAPT_OPTIONS = {
    "adapt_rounds": "rounds",
    "adapt_epochs": "epochs",
    "adapt_lr": "lr",
    "adapt_seed": "seed",
    "adapt_parameters": "parameters",
    "adapt_ctc_agreement": "ctc_agreement",
}
OPTIONS = ("decode_config", *SEARCH_OPTIONS, "batch_size", "vtln_warps", *ADAPT_OPTIONS, "prune_layers")


def settings_from_options(options: dict) -> DecodeSettings:
    """The settings that decoding options (:data:`OPTIONS`; None or absent: not given) describe, over those of
    the ``decode_config`` file when one is named. ``vtln_warps`` is a string (``0.9,1.0,1.1``,
    ``LOW:HIGH:STEP``) or a list; ``prune_layers`` a list of words (``["enc:0,2", "dec:0"]``) or one string.
    A ValueError (ConfigError for the file) names the option, as the command line spells it."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown decoding option {unknown[0]!r} (known: {', '.join(OPTIONS)})")
    given = {name: value for name, value in options.items() if value is not None}
    base = load_settings(given["decode_config"]) if "decode_config" in given else DecodeSettings()
    search = {field: given[option] for option, field in SEARCH_OPTIONS.items() if option in given}
    try:
        decoding = dataclasses.replace(base.decoding, **search)
    except ValueError as err:
        raise ValueError(_with_option(str(err))) from None
    try:
        adaptation = _adaptation(given, base.adaptation)
    except ValueError as err:
        raise ValueError(f"--adapt-*: {err}") from None
    changes = {"decoding": decoding, "adaptation": adaptation}
    if "vtln_warps" in given:
        try:
            changes["vtln_warps"] = parse_warps(given["vtln_warps"])
        except ValueError as err:
            raise ValueError(f"--vtln-warps: {err}") from None
    if "batch_size" in given:
        changes["batch_size"] = given["batch_size"]
    if "prune_layers" in given:
        words = given["prune_layers"]
        try:
            changes["prune_layers"] = parse_pruning(words.split() if isinstance(words, str) else list(words))
        except ValueError as err:
            raise ValueError(f"--prune-layers: {err}") from None
    return dataclasses.replace(base, **changes)


def _with_option(message: str) -> str:
    """A DecodingOptions error in the options' own names (``beam_size must ...`` -> ``--beam: beam_size must ...``)."""
    for option, field_name in SEARCH_OPTIONS.items():
        if message.startswith(field_name):
            return f"--{option.replace('_', '-')}: {message}"
    return message


def _adaptation(given: dict, base: AdaptationSettings | None) -> AdaptationSettings | None:
    changes = {field_name: given[option] for option, field_name in ADAPT_OPTIONS.items() if option in given}
    if changes.get("rounds") == 0:
        return None
    if base is None and changes and "rounds" not in changes:
        first = next(option for option, field_name in ADAPT_OPTIONS.items() if field_name in changes)
        raise ValueError(f"--{first.replace('_', '-')} needs --adapt-rounds")
    if base is None and not changes:
        return None
    return dataclasses.replace(base or AdaptationSettings(), **changes)
