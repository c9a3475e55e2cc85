"""Typed config loading: unknown keys, type errors and overrides name the key."""

import re
from dataclasses import dataclass, field
from typing import Literal

import pytest
from helpers import PROJECT_ROOT

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


@pytest.mark.parametrize("recipe", sorted((PROJECT_ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_key_has_a_value_a_default_and_a_meaning(recipe):
    from asr.config import describe_config
    from asr.experiment import load_experiment_config

    keys = describe_config(load_experiment_config(recipe))
    assert len({k.key for k in keys}) == len(keys) > 100
    assert [k.key for k in keys if not k.meaning] == []  # a new field needs its comment


def test_show_config_lists_the_keys_and_trains_nothing(tmp_path, capsys):
    from asr.cli.train import main

    exp = tmp_path / "exp"
    recipe = PROJECT_ROOT / "recipes" / "fsdd_las.yaml"
    assert main([str(recipe), "train.max_steps=30", f"exp_dir={exp}", "--show-config"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if " train.max_steps " in line)
    assert line.startswith("* train.max_steps") and "= 30" in line and "[default null]" in line
    assert "stop after this many optimizer steps" in line
    assert re.search(r"^  train\.seed +=", out, re.M)  # at its default: no mark
    assert not exp.exists()  # nothing written, nothing trained
    assert main([str(recipe), "train.max_stepz=3", "--show-config"]) == 2
    assert "unknown config key 'train.max_stepz'" in capsys.readouterr().err


def test_a_key_given_twice_at_any_depth_is_refused_naming_it_and_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys; a recipe with model: twice lost the first block (issue 81)."""
    from asr.config import read_yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  type: las\ntrain:\n  lr: 0.1\n  max_epochs: 2\nmodel:\n  type: las\n")
    with pytest.raises(ConfigError, match=r"key 'model' is given twice \(lines 1 and 6\)") as err:
        read_yaml(recipe)
    assert str(recipe) in str(err.value)
    recipe.write_text("model:\n  type: las\n  listener:\n    hidden_size: 8\n    hidden_size: 16\n")
    with pytest.raises(ConfigError, match=r"key 'model.listener.hidden_size' is given twice \(lines 4 and 5\)"):
        read_yaml(recipe)
    recipe.write_text("model:\n  type: las\n  listener:\n    hidden_size: 8\n  speller:\n    hidden_size: 16\n")
    assert read_yaml(recipe)["model"]["speller"]["hidden_size"] == 16  # one name in two sections is no repeat


@pytest.mark.parametrize("override", ["model.layer_norm=[both", "model.layer_norm=!!python/object/apply:os.system [x]"])
def test_an_override_that_is_not_valid_yaml_is_one_error_naming_the_key(override):
    with pytest.raises(ConfigError) as err:
        parse_override(override)
    message = str(err.value)
    assert "model.layer_norm" in message and "not valid YAML" in message and "\n" not in message


@pytest.mark.parametrize("lr", [".inf", ".nan", "-1", "0", "1e39"])
def test_a_learning_rate_that_is_not_a_finite_positive_number_is_refused_at_load(lr, tmp_path):
    from asr.experiment import load_experiment_config

    with pytest.raises(ConfigError, match=r"train\.lr must be a finite positive number"):
        load_experiment_config(PROJECT_ROOT / "recipes" / "fsdd_las.yaml", [f"train.lr={lr}", f"exp_dir={tmp_path / 'x'}"])
    assert not (tmp_path / "x").exists()


def test_the_train_command_refuses_a_bad_override_in_one_line_with_status_2(tmp_path, capsys):
    from asr.cli.train import main

    recipe = PROJECT_ROOT / "recipes" / "fsdd_las.yaml"
    assert main([str(recipe), f"exp_dir={tmp_path / 'x'}", "model.layer_norm=[both"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "model.layer_norm" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
