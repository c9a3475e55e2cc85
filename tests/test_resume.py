"""A resumed run compares its settings with its checkpoint's before it writes anything (asr.training.resume):
a change that shapes the model, features, tokenizer, data or optimiser is refused naming each key; the
keys that may change are recorded in train.log and config.yaml's history; stale checkpoint writes go."""

from pathlib import Path

import pytest
import yaml
from helpers import LAS_RECIPE, PROJECT_ROOT, TINY, tiny_run

from asr.config import ConfigError, describe_config
from asr.experiment import as_recipe, experiment_config_to_dict, load_experiment_config
from asr.training.resume import MAY_CHANGE_ON_RESUME, check_resume, config_changes, may_change_on_resume


def _resolved(*overrides: str) -> dict:
    return experiment_config_to_dict(load_experiment_config(LAS_RECIPE, [*TINY, *overrides]))


# issue 81's probe: each of these gave a state_dict traceback after config.yaml was rewritten, or (the
# features) trained on with the old value while the record said the new one
REFUSED = ["model.listener.hidden_size=32", "model.speller.hidden_size=32", "model.listener.pyramid_layers=0",
           "model.attention.dim=32", "model.layer_norm=none", "model.lnlstm_variant=raw_gates", "model.ctc_weight=0.0",
           "features.num_ceps=20", "data.bpe_vocab_size=40", "train.lr=0.01", "train.seed=1"]


@pytest.mark.parametrize("override", REFUSED)
def test_a_change_that_shapes_the_run_is_refused_naming_the_key_and_both_values(override):
    key, new = override.split("=")
    saved, resolved = _resolved(), _resolved(override)
    with pytest.raises(ConfigError) as err:
        check_resume(saved, resolved, "exp/last.pt")
    message = str(err.value)
    (change,) = config_changes(saved, resolved)
    assert change.key == key and str(change.new) == new and change.old != change.new
    assert f"{key}: {change.old} -> {new}" in message  # the key, its recorded value and the new one
    assert "exp/last.pt" in message and "\n" not in message


def test_the_keys_that_may_change_are_recorded_not_refused():
    changes = check_resume(_resolved("train.max_steps=3"), _resolved("train.max_steps=6", "train.device=cpu",
                                                                      "data.num_workers=1", "model.lnlstm_backend=reference"),
                           "last.pt")
    assert {c.key: (c.old, c.new) for c in changes} == {
        "train.max_steps": (3, 6), "train.device": ("auto", "cpu"), "data.num_workers": (0, 1),
        "model.lnlstm_backend": ("auto", "reference")}
    assert check_resume(_resolved(), _resolved(), "last.pt") == []


def test_a_key_an_older_checkpoint_did_not_write_compares_at_its_default():
    saved = _resolved()
    del saved["train"]["valid_every_steps"], saved["model"]["forget_bias"]
    assert config_changes(as_recipe(saved), _resolved()) == []
    assert [c.key for c in config_changes(as_recipe(saved), _resolved("model.forget_bias=0.5"))] == ["model.forget_bias"]


def test_every_pattern_that_may_change_names_keys_of_a_recipe():
    """The list cannot rot: each pattern matches a key of some recipe."""
    keys = {k.key for recipe in (PROJECT_ROOT / "recipes").glob("*.yaml")
            for k in describe_config(load_experiment_config(recipe))}
    for pattern in MAY_CHANGE_ON_RESUME:
        assert any(may_change_on_resume(key) and __import__("fnmatch").fnmatchcase(key, pattern) for key in keys), pattern
    assert not may_change_on_resume("model.listener.hidden_size") and not may_change_on_resume("features.kind")


def test_show_config_marks_the_keys_that_may_change_on_resume(capsys):
    from asr.cli.train import main

    assert main([str(LAS_RECIPE), "--show-config"]) == 0
    out = capsys.readouterr().out
    footer = [line for line in out.splitlines() if "may change on --resume" in line]
    assert len(footer) == 1 and "train.max_steps" in footer[0] and "model.listener.hidden_size" not in footer[0]


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_demo_corpus")
def test_a_refused_resume_writes_nothing_and_an_allowed_one_keeps_the_record(tmp_path, capsys):
    from asr.checkpoints.io import load_checkpoint
    from asr.cli.train import main

    args = tiny_run(tmp_path, "train.max_epochs=2", "train.max_steps=2")
    exp = tmp_path / "exp"
    assert main(args) == 0
    before = {name: (exp / name).read_bytes() for name in ("config.yaml", "train.log", "last.pt")}
    names = sorted(p.name for p in exp.iterdir())
    capsys.readouterr()
    assert main([*args, "model.listener.hidden_size=32", "features.num_ceps=20", "--resume"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert "model.listener.hidden_size: 16 -> 32" in lines[0] and "features.num_ceps: 13 -> 20" in lines[0]
    for name, content in before.items():  # byte for byte: the record still describes the checkpoints
        assert (exp / name).read_bytes() == content, name
    assert sorted(p.name for p in exp.iterdir()) == names  # no file added (the lock came and went)
    # A killed checkpoint write left its temporary file; another command's (asr.average) is not the run's.
    stale, other = exp / ".last.pt.k3x9q1.tmp", exp / ".avg_last2.pt.a1b2c3.tmp"
    stale.write_bytes(b"\0" * 1000)
    other.write_bytes(b"\0" * 10)
    assert main([*[a for a in args if a != "train.max_steps=2"], "train.max_steps=3", "--resume"]) == 0
    assert load_checkpoint(exp / "last.pt")["training"]["progress"]["step"] == 3
    assert not stale.exists() and other.exists()
    log = (exp / "train.log").read_text()
    assert f"removed {stale}" in log and "resumed with train.max_steps: 2 -> 3" in log
    record = yaml.safe_load((exp / "config.yaml").read_text())
    assert record["train"]["max_steps"] == 2  # the settings the run was started with
    (resume,) = record["history"]
    assert resume["changed"] == {"train.max_steps": {"from": 2, "to": 3}} and resume["at_step"] == 2
    assert load_experiment_config(exp / "config.yaml").train.max_steps == 2  # still reads as a recipe
    assert load_checkpoint(exp / "last.pt")["config"]["train"]["max_steps"] == 3  # what wrote the checkpoint
    assert Path(resume["from"]) == exp / "last.pt"


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_demo_corpus")
def test_config_yaml_is_written_once_when_a_run_starts_and_once_when_it_resumes(tmp_path, monkeypatch):
    """A write of config.yaml is a rename onto it (asr.writing.atomic_write), counted here; one made any
    other way after the start would change its inode or its modification time, checked after the run."""
    import os

    from asr.checkpoints.io import load_checkpoint
    from asr.models import runtime
    from asr.run import build_trainer

    writes = []
    replace = os.replace

    def counted(source, target, *args, **kwargs):
        if Path(target).name == "config.yaml":
            writes.append(target)
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", counted)

    def run(overrides: list[str], resume: bool) -> tuple[bytes, dict]:
        writes.clear()
        trainer = build_trainer(load_experiment_config(recipe, overrides), resume=resume)
        path = Path(trainer.parts.exp_dir) / "config.yaml"
        assert len(writes) == 1, "written when the run is built"
        started, written = path.stat(), path.read_bytes()
        trainer.fit()
        assert len(writes) == 1, "and never after"
        assert (path.stat().st_ino, path.stat().st_mtime_ns) == (started.st_ino, started.st_mtime_ns)
        assert path.read_bytes() == written
        # what it records: the settings, then which code computes the model (asr.models.runtime)
        described = runtime.describe(trainer.parts.raw_model, trainer.parts.device)
        return written, described

    recipe, *overrides = tiny_run(tmp_path, "train.max_epochs=2", "train.max_steps=2")
    exp = tmp_path / "exp"
    written, described = run(overrides, resume=False)
    settings = load_checkpoint(exp / "last.pt")["config"]  # the resolved recipe every checkpoint carries
    assert written == yaml.safe_dump({**settings, "runtime": described}, sort_keys=False).encode()

    resumed = [arg for arg in overrides if arg != "train.max_steps=2"] + ["train.max_steps=3"]
    written, described = run(resumed, resume=True)
    record = yaml.safe_load(written)
    (resume,) = record.pop("history")
    assert resume["changed"] == {"train.max_steps": {"from": 2, "to": 3}} and resume["at_step"] == 2
    assert record == {**settings, "runtime": described}  # the settings the run was started with, kept
