"""Typed configuration: dataclasses loaded from YAML, validated on load.

Every component owns a ``@dataclass`` of its options (``features.config``,
``asr.data.config``, ``asr.models.*``). This module only knows how to turn a
nested ``dict`` into those dataclasses and how to apply command-line overrides
of the form ``key.sub=value``. An unknown key is an error that names the key's
full dotted path, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names the key."""


def from_dict(cls: type, data: dict | None, path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, recursing into nested dataclasses.

    ``path`` is the dotted prefix used in error messages (``"model.listener"``).
    """
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__} {data!r}")
    # A config of variants (a schedule, asr.training.shapes) is read as the variant its data names.
    if hasattr(cls, "config_variant"):
        cls = cls.config_variant(data, path)
    # A config may read its data first: refuse a key naming why, or leave out what older versions wrote
    # (an encoder kind's keys, asr.models.encoder_registry).
    if hasattr(cls, "config_data"):
        data = cls.config_data(data, path)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f" in '{path}'" if path else ""
        known = ", ".join(sorted(fields))
        raise ConfigError(f"unknown config key '{_join(path, unknown[0])}'{where} (known keys: {known})")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in data.items():
        values[name] = _convert(hints[name], value, _join(path, name))
    try:
        obj = cls(**values)
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{path or 'config'}: {err}") from err
    return obj


def to_dict(obj: Any) -> Any:
    """Inverse of :func:`from_dict`: plain dicts/lists, safe to dump as YAML."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One key of a config, as ``--show-config`` lists it."""

    key: str          # dotted, as an override names it: model.listener.num_layers
    value: Any        # in this config (plain data)
    default: Any      # the dataclass's default (plain data; None when the field has none)
    meaning: str      # the comment beside (or above) the field in its class


def describe_config(obj: Any, prefix: str = "") -> list[ConfigKey]:
    """Every leaf key of config dataclass ``obj`` with its value, its default and its meaning, the
    comment written beside the field (or on the lines just above it) in the class that defines it."""
    keys = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = _join(prefix, f.name)
        if dataclasses.is_dataclass(value):
            keys += describe_config(value, path)
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        keys.append(ConfigKey(path, to_dict(value), to_dict(default), _field_comment(type(obj), f.name)))
    return keys


def _field_comment(cls: type, name: str) -> str:
    """The comment on field ``name``'s line in the source of a class in ``cls``'s MRO that declares it
    (the first that comments it: a subclass may redeclare a default alone), or the comment lines just
    above it; "" when there is none."""
    import re

    declaration = re.compile(rf"^\s+{re.escape(name)}\s*:")
    for owner in cls.__mro__:
        if name not in getattr(owner, "__annotations__", {}):
            continue
        lines = _source_lines(owner)
        for index, line in enumerate(lines):
            if not declaration.match(line):
                continue
            trailing = re.search(r"\s#", line)
            if trailing:
                comment = line[trailing.end() :]
                # a trailing comment may go on below, its '#' in the same column
                column = trailing.end() - 1
                for following in lines[index + 1 :]:
                    if following[:column].strip() or following[column : column + 1] != "#":
                        break
                    comment += " " + following[column + 1 :].strip()
                return comment.strip()
            # else the comment lines above it, or above the fields without comments of their own that
            # it follows: one comment for a group of fields, as in "the chunk, the bias and the noise"
            above = []
            for previous in reversed(lines[:index]):
                stripped = previous.strip()
                if stripped.startswith("#"):
                    above.insert(0, stripped.lstrip("#").strip())
                elif above or re.search(r"\s#", previous) or not re.match(r"^\s+\w+\s*:", previous):
                    break
            if above:
                return " ".join(above)
            break
    return ""


@functools.lru_cache(maxsize=None)
def _source_lines(cls: type) -> list[str]:
    """The lines of ``cls``'s source (none when it cannot be found); read once per class."""
    import inspect

    try:
        return inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return []


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config dict as dotted keys, the form overrides take: ``{"model.layer_norm": "both", ...}``.
    Lists and other values are leaves; an empty section is left out."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, _join(prefix, str(key))))
        else:
            flat[_join(prefix, str(key))] = value
    return flat


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{path}: cannot convert {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(map(repr, allowed))}")
        return value
    if origin in (list, tuple):
        item_types = typing.get_args(hint)
        if isinstance(value, str) and item_types and item_types[0] is str:
            # `data.dev=path/to/subset` on the command line means a one-folder list.
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is not Any:
            return {key: _convert(args[1], item, _join(path, str(key))) for key, item in value.items()}
        return dict(value)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):
            # PyYAML reads "1e-3" (no dot) as a string; accept what float() accepts.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    return value


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"model.listener.num_layers=4"`` -> (["model", "listener", "num_layers"], 4).

    The value is parsed as YAML, so ``true``, ``3``, ``1e-3``, ``[1, 2]`` and
    ``null`` mean what they mean in a recipe.
    """
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key.sub=value")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override '{text}' has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        # A tag such as !!python/object is refused here too, as in a recipe: nothing in an override runs.
        raise ConfigError(f"override '{text}': the value of {key.strip()} is not valid YAML ({_yaml_problem(err)})") from None
    return keys, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``key.sub=value`` overrides to a nested dict (a new dict is returned)."""
    import copy

    data = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override '{text}': '{k}' is not a section")
            node = child
        node[keys[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe file not found: {path}")
    try:
        data = load_yaml_strictly(path.read_text(encoding="utf-8-sig"), str(path))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}): not a recipe") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys")
    return data


def load_yaml_strictly(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, refusing a mapping that gives one key twice, at any depth.

    PyYAML keeps the last of two equal keys without a word, so a recipe with ``model:`` twice would drop
    the first block's settings. The document is composed into nodes first (no value is built, no tag
    constructed), every mapping is checked, and only then is it loaded. The error names the key's dotted
    path and both lines: ``recipe.yaml: key 'model' is given twice (lines 3 and 40)``."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is not None:
        _check_unique_keys(node, "", source)
    return yaml.safe_load(text)


def _check_unique_keys(node: yaml.Node, path: str, source: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = _join(path, key_node.value)
                line = key_node.start_mark.line + 1
                if key_node.value in seen:
                    raise ConfigError(f"{source}: key '{key}' is given twice (lines {seen[key_node.value]} and {line}); "
                                      "the second would silently replace the first")
                seen[key_node.value] = line
                _check_unique_keys(value_node, key, source)
            else:
                _check_unique_keys(value_node, path, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check_unique_keys(item, f"{path}[{index}]", source)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's reason in one line (its message spans several, with a picture of the place)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return f"{context}: {problem}" if context else problem


def check_range(name: str, value: list, minimum: float, maximum: float = math.inf) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is ``[low, high]`` with ``minimum <= low <= high <= maximum``.

    For config fields that are inclusive ranges (``take_range: [5, 49]``), in ``__post_init__``.
    """
    if len(value) != 2 or not minimum <= value[0] <= value[1] <= maximum:
        upper = f" <= {maximum}" if math.isfinite(maximum) else ""
        raise ValueError(f"{name} must be [low, high] with {minimum} <= low <= high{upper}, got {value}")


def field_defaults(config_class: type) -> dict[str, Any]:
    """Each field of the dataclass ``config_class`` that has a default, with it (a factory's called)."""
    defaults = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def variant_class(data: dict, path: str, tag: str, default: str, variants: dict[str, type]) -> type:
    """The class of a tagged section (``model.attention``'s ``type``, ``model.encoder``'s ``kind``): the one
    ``variants`` holds under ``data[tag]`` (``default`` when absent); another tag is a :class:`ConfigError`
    naming the key and the tags there are. For a base class's ``config_variant``."""
    kind = data.get(tag, default)
    if kind not in variants:
        key = f"{path}.{tag}" if path else tag
        raise ConfigError(f"{key}: {kind!r} is not one of {', '.join(map(repr, variants))}")
    return variants[kind]


def variant_data(config_class: type, data: dict, path: str, what: str, name: str, variants: dict[str, type]) -> dict:
    """``data`` as ``config_class``, one of the tagged ``variants``, reads it (a ``config_data``): its own keys.
    Another variant's key at that variant's default is left out, since runs written before each variant
    owned its keys wrote every variant's at their defaults, and those load; any other key is a
    :class:`ConfigError` naming it, the section's variant (``what`` ``name``: say attention type 'dot'), the
    variants that have it and ``config_class``'s keys."""
    own = {f.name for f in dataclasses.fields(config_class)}
    variant_defaults = {name: field_defaults(c) for name, c in variants.items()}
    kept = {}
    for key, value in data.items():
        if key in own:
            kept[key] = value
            continue
        owners = {name: defaults for name, defaults in variant_defaults.items() if key in defaults}
        if any(value == defaults[key] for defaults in owners.values()):
            continue
        whose = f"; it is a key of {', '.join(map(repr, owners))}" if owners else ""
        raise ConfigError(f"unknown config key '{f'{path}.{key}' if path else key}' for {what} {name!r}{whose} "
                          f"(the keys of {name!r}: {', '.join(sorted(own))})")
    return kept
