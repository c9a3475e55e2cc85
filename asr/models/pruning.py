"""LayerDrop pruning: decode with a subset of a trained model's layers, without fine-tuning.

Fan, Grave & Joulin (2019), "Reducing Transformer Depth on Demand with
Structured Dropout" (ICLR 2020). A stack trained with LayerDrop
(``model.encoder.layerdrop``, ``model.decoder.layerdrop``) has learnt to work
with layers missing, so at inference some can be removed for a smaller, faster
model. Which ones, per stack:

- ``every_other``: layers 0, 2, 4, ... (the paper's "every other" strategy,
  which drops every other layer; fairseq's LayerDrop README keeps
  ``0,2,4,...,14`` of 16 layers, the even ones counted from 0);
- an explicit list of layer indices to keep (fairseq's
  ``--encoder-layers-to-keep`` / ``--decoder-layers-to-keep``);
- nothing given: all of its layers.

fairseq prunes whatever it is told to; here pruning a stack that was trained
without LayerDrop (rate 0 in the checkpoint's config) is allowed but logged as
a warning, since nothing taught that stack to do without its layers. A model
with no prunable stacks (LAS) is refused. The entry points take the choice as
``--prune-layers`` (:mod:`asr.cli.options`) or ``prune_layers`` in a decode
config file (:mod:`asr.inference.settings`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Union

from torch import nn

from asr.models.interface import PrunableLayers

logger = logging.getLogger(__name__)

EVERY_OTHER = "every_other"
STACKS = ("encoder", "decoder")
SHORT_NAMES = {"enc": "encoder", "dec": "decoder", "encoder": "encoder", "decoder": "decoder"}

# Per stack: None (keep all), EVERY_OTHER, or the layer indices to keep.
StackChoice = Union[None, str, tuple[int, ...]]


@dataclass(frozen=True)
class LayerPruning:
    """Which layers of each stack to keep (see the module docstring)."""

    encoder: StackChoice = None
    decoder: StackChoice = None

    def __post_init__(self) -> None:
        for name in STACKS:
            choice = self.choice(name)
            if choice is None or choice == EVERY_OTHER:
                continue
            if not isinstance(choice, tuple) or not choice:
                raise ValueError(f"{name}: expected {EVERY_OTHER!r} or layer indices to keep, got {choice!r}")
            if any(isinstance(i, bool) or not isinstance(i, int) for i in choice):
                raise ValueError(f"{name}: layer indices must be integers, got {list(choice)}")
            if list(choice) != sorted(set(choice)) or choice[0] < 0:
                raise ValueError(f"{name}: layer indices must be increasing and >= 0, got {list(choice)}")
        if self.encoder is None and self.decoder is None:
            raise ValueError("no stack to prune (give every_other, or enc:/dec: layers)")

    def choice(self, stack: str) -> StackChoice:
        return self.encoder if stack == "encoder" else self.decoder

    def layers_to_keep(self, num_layers: dict[str, int]) -> dict[str, list[int]]:
        """Stack -> the layer indices to keep, for stacks of ``num_layers`` layers; only stacks with a choice."""
        keep = {}
        for name in STACKS:
            choice = self.choice(name)
            if choice is None:
                continue
            count = num_layers[name]
            indices = list(range(0, count, 2)) if choice == EVERY_OTHER else list(choice)
            if indices[-1] >= count:
                raise ValueError(f"{name}: layer {indices[-1]} does not exist (the model has {count}: 0..{count - 1})")
            keep[name] = indices
        return keep

    def describe(self) -> str:
        """The command-line form: ``every_other`` or ``enc:0,2,4 dec:every_other``."""
        if self.encoder == self.decoder == EVERY_OTHER:
            return EVERY_OTHER
        parts = []
        for short, name in (("enc", "encoder"), ("dec", "decoder")):
            choice = self.choice(name)
            if choice is not None:
                parts.append(f"{short}:{choice if choice == EVERY_OTHER else ','.join(map(str, choice))}")
        return " ".join(parts)

    def to_config(self) -> str | dict:
        """Plain data for a decode config file (the inverse of :func:`pruning_from_config`)."""
        if self.encoder == self.decoder == EVERY_OTHER:
            return EVERY_OTHER
        return {name: c if c is None or c == EVERY_OTHER else list(c) for name in STACKS for c in [self.choice(name)]}


def parse_pruning(words: list[str]) -> LayerPruning:
    """``["every_other"]`` or words ``enc:SPEC`` / ``dec:SPEC`` (SPEC: ``every_other`` or ``0,2,4``;
    ``encoder:``/``decoder:`` work too) -> :class:`LayerPruning`. A ValueError says what is wrong."""
    if words == [EVERY_OTHER]:
        return LayerPruning(EVERY_OTHER, EVERY_OTHER)
    choices: dict[str, StackChoice] = {}
    for word in words:
        short, _, spec = word.partition(":")
        name = SHORT_NAMES.get(short)
        if name is None or not spec:
            raise ValueError(
                f"{word!r} is not {EVERY_OTHER} or enc:/dec: followed by {EVERY_OTHER} or layer indices "
                "(e.g. enc:0,2,4 dec:0); after it, end the option with -- before file arguments"
            )
        if name in choices:
            raise ValueError(f"the {name} is named twice")
        choices[name] = spec if spec == EVERY_OTHER else _indices(spec, word)
    return LayerPruning(**choices)


def _indices(spec: str, word: str) -> tuple[int, ...]:
    try:
        return tuple(int(i) for i in spec.split(","))
    except ValueError:
        raise ValueError(f"{word!r}: layer indices must be integers separated by commas") from None


def pruning_from_config(value) -> LayerPruning:
    """``every_other``, ``{encoder: every_other | [0, 2], decoder: ...}`` or the command-line
    form ``"enc:0,2 dec:0"`` (from a decode config file) -> :class:`LayerPruning`."""
    if isinstance(value, str):
        return parse_pruning(value.split())
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(STACKS))
        if unknown:
            raise ValueError(f"unknown stack {unknown[0]!r} (known: {', '.join(STACKS)})")
        return LayerPruning(**{stack: tuple(c) if isinstance(c, list) else c for stack, c in value.items()})
    raise ValueError(f"expected {EVERY_OTHER!r}, a mapping of stacks or 'enc:... dec:...', got {value!r}")


@dataclass(frozen=True)
class PrunedModel:
    """What pruning did to one model: per stack, the layers it had and those kept; parameters before and after."""

    layers: dict[str, int]
    kept: dict[str, list[int]]
    layerdrop: dict[str, float]
    parameters: int
    parameters_before: int

    def to_dict(self) -> dict:
        return {
            "kept": self.kept, "layers": self.layers, "layerdrop": self.layerdrop,
            "parameters": self.parameters, "parameters_before": self.parameters_before,
        }

    def describe(self) -> str:
        stacks = ", ".join(
            f"{name} layers {','.join(map(str, kept))} of {self.layers[name]}" for name, kept in self.kept.items()
        )
        return f"pruned to {stacks}: {self.parameters:,} parameters of {self.parameters_before:,}"


def prune_model(model: nn.Module, pruning: LayerPruning, name: str) -> PrunedModel:
    """Prune ``model`` (from checkpoint ``name``) in place as ``pruning`` says; a ValueError names what is wrong."""
    if not isinstance(model, PrunableLayers):
        raise ValueError(
            f"prune_layers: {name} is a {type(model).__name__}, which has no layer stacks to prune "
            "(LayerDrop pruning needs a Transformer)"
        )
    stacks = model.layer_stacks()
    before = count_parameters(model)
    try:
        keep = pruning.layers_to_keep({stack: info.num_layers for stack, info in stacks.items()})
    except ValueError as err:
        raise ValueError(f"prune_layers: {err} in {name}") from None
    for stack in keep:
        if stacks[stack].layerdrop == 0.0:
            logger.warning(
                "pruning the %s of %s, which was trained without LayerDrop (model.%s.layerdrop=0): "
                "nothing taught it to work with layers missing, so accuracy may fall sharply "
                "(docs/studies/transformer_norms.md measures it: a pre-norm encoder lost little, a decoder everything)",
                stack, name, stack,
            )
    model.keep_layers(keep)
    return PrunedModel(
        layers={stack: stacks[stack].num_layers for stack in keep},
        kept=keep,
        layerdrop={stack: stacks[stack].layerdrop for stack in keep},
        parameters=count_parameters(model),
        parameters_before=before,
    )


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())
