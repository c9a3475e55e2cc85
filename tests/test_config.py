"""Typed config loading: unknown keys, type errors and overrides name the key."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from asr.config import ConfigError, apply_overrides, from_dict, parse_override, to_dict


@dataclass
class Inner:
    hidden_size: int = 8
    dropout: float = 0.1
    kind: Literal["a", "b"] = "a"


@dataclass
class Outer:
    name: str = "x"
    inner: Inner = field(default_factory=Inner)
    paths: list[str] = field(default_factory=list)
    limit: float | None = None


def test_nested_values_are_typed_and_defaults_kept():
    cfg = from_dict(Outer, {"inner": {"hidden_size": 16, "dropout": 0}, "paths": ["a", "b"]})
    assert cfg.inner.hidden_size == 16
    assert isinstance(cfg.inner.dropout, float) and cfg.inner.dropout == 0.0
    assert cfg.inner.kind == "a" and cfg.paths == ["a", "b"] and cfg.limit is None


def test_unknown_key_names_its_dotted_path():
    with pytest.raises(ConfigError, match=r"inner\.hiden_size"):
        from_dict(Outer, {"inner": {"hiden_size": 16}})


@pytest.mark.parametrize(
    "data, key",
    [
        ({"inner": {"hidden_size": "big"}}, "inner.hidden_size"),
        ({"inner": {"hidden_size": True}}, "inner.hidden_size"),
        ({"inner": {"kind": "c"}}, "inner.kind"),
        ({"inner": 3}, "inner"),
        ({"paths": 3}, "paths"),
    ],
)
def test_wrong_types_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_dict(Outer, data)


def test_overrides_parse_yaml_values_and_create_sections():
    data = apply_overrides({"inner": {"hidden_size": 8}}, ["inner.hidden_size=32", "limit=1e-3", "inner.kind=b"])
    cfg = from_dict(Outer, data)
    assert cfg.inner.hidden_size == 32 and cfg.limit == pytest.approx(1e-3) and cfg.inner.kind == "b"
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_override("inner.hidden_size")


def test_round_trip_through_plain_dict():
    cfg = from_dict(Outer, {"name": "y", "inner": {"kind": "b"}, "limit": 2})
    assert from_dict(Outer, to_dict(cfg)) == cfg


def test_a_single_string_for_a_list_of_strings_is_a_one_item_list():
    cfg = from_dict(Outer, apply_overrides({}, ["paths=some/folder"]))
    assert cfg.paths == ["some/folder"]
