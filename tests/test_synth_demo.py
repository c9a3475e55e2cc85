"""The demo corpus is prepared apart from training (``python -m asr.synth_demo``): training,
checking, studies and evaluation only read it, and say how to prepare it when it is missing."""

import json
import shlex
import shutil
import subprocess
import sys

import pytest
from helpers import LAS_RECIPE as RECIPE
from helpers import PROJECT_ROOT, TINY, prepare_tiny_demo, subprocess_env, tiny_run

from asr.cli import check, evaluate, study, synth_demo
from asr.cli.train import main as train_main
from asr.data.corpus import load_split
from asr.data.demo import DemoCorpusNotPrepared, corpus_folder, prepare_command
from asr.synthesis import demo, espeak, piper
from asr.synthesis.demo import speaker_ids
from asr.experiment import load_experiment_config


def forbid_synthesis(monkeypatch) -> None:
    """Make every way into the synthesisers fail the test."""

    def synthesised(*args, **kwargs):
        raise AssertionError("the demo corpus was synthesised outside python -m asr.synth_demo")

    monkeypatch.setattr(demo, "prepare_corpus", synthesised)
    monkeypatch.setattr(demo, "_render_all", synthesised)
    monkeypatch.setattr(espeak, "synthesize_many", synthesised)
    monkeypatch.setattr(piper, "speak_many", synthesised)


def test_an_unprepared_corpus_stops_every_entry_point_with_its_key_and_the_command(
        shared_data, tmp_path, monkeypatch, capsys):
    forbid_synthesis(monkeypatch)
    overrides = [*TINY, f"data.cache_dir={tmp_path / 'cache'}", f"exp_dir={tmp_path / 'exp'}"]
    config = load_experiment_config(RECIPE, overrides)
    key = corpus_folder(config.data.demo, tmp_path / "cache").name
    command = shlex.join(["python", "-m", "asr.synth_demo", str(RECIPE), *overrides])
    assert prepare_command(RECIPE, overrides) == command

    # the reader alone does not know the recipe: it names the key, the folder and the command's form
    with pytest.raises(DemoCorpusNotPrepared, match=rf"data\.demo: the demo corpus {key} has not been prepared") as err:
        load_split(config.data, "train")
    assert err.value.key == key and "python -m asr.synth_demo RECIPE" in str(err.value)
    dev, _ = load_split(config.data, "dev")  # data.demo.splits: [train]: the other splits do not read it
    assert dev and not {u.speaker for u in dev} & set(speaker_ids(config.data.demo).values())

    # the entry points know it: the exact command, before anything is written
    assert train_main(overrides_with_recipe := [str(RECIPE), *overrides]) == 2
    assert key in (printed := capsys.readouterr().err) and command in printed
    assert check.main(overrides_with_recipe) == 2
    assert command in capsys.readouterr().err
    # a study prepares nothing per run: one command per corpus its runs read (here two seeds of it)
    grid = ["--grid", "data.demo.seed=0,1", "model.layer_norm=none,both", "--out", str(tmp_path / "study")]
    with pytest.raises(SystemExit):
        study.main([str(RECIPE), *overrides, *grid])
    printed = capsys.readouterr().err
    for seed in (0, 1):
        assert prepare_command(RECIPE, [*overrides, f"data.demo.seed={seed}", "model.layer_norm=none"]) in printed
    assert "layer_norm=both" not in printed  # runs that differ in the model only share their corpus
    assert not (tmp_path / "exp").exists() and not (tmp_path / "study").exists() and not (tmp_path / "cache" / "demo").exists()


@pytest.mark.slow  # starts processes
def test_the_command_prepares_what_training_reads_and_reuses_it(tmp_path):
    overrides = [*TINY, f"data.cache_dir={tmp_path / 'cache'}"]

    def synth(*args):
        return subprocess.run([sys.executable, "-m", "asr.synth_demo", *args], cwd=PROJECT_ROOT,
                              env=subprocess_env(), capture_output=True, text=True, timeout=300)

    first = synth(str(RECIPE), *overrides)
    assert first.returncode == 0, first.stderr
    folder = corpus_folder(load_experiment_config(RECIPE, overrides).data.demo, tmp_path / "cache")
    assert f"demo corpus {folder}" in first.stdout
    for split, count in {"train": 12, "dev": 1, "test": 1}.items():  # TINY's 12; the recipe's 1 and 1
        subset = folder / "LibriSpeech" / split
        assert f"{split}: {subset}" in first.stdout
        assert len(list(subset.glob("*/*/*.flac"))) == count
        assert len(list(subset.glob("*/*/*.trans.txt"))) >= 1
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no partial build left behind
    stamps = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}

    again = synth(str(RECIPE), *overrides)
    assert again.returncode == 0 and "reusing the demo corpus" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == stamps

    refused = synth("recipes/fsdd_transformer.yaml")
    assert refused.returncode == 2 and "data.demo.enabled is false" in refused.stderr


@pytest.mark.slow  # trains
def test_training_and_evaluation_only_read_the_prepared_corpus(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    on_demo = [f"data.cache_dir={cache}", "data.demo.splits=[train,test]", "train.max_steps=3"]
    folder = prepare_tiny_demo(*on_demo)
    forbid_synthesis(monkeypatch)
    assert train_main(tiny_run(tmp_path, *on_demo)) == 0
    checkpoint = tmp_path / "exp" / "last.pt"

    assert evaluate.main(["--checkpoint", str(checkpoint), "--split", "test", "--out", str(tmp_path / "test")]) == 0
    scored = json.loads((tmp_path / "test" / "wer.json").read_text())
    assert scored["utterances"] == 1  # the demo corpus's one held-out utterance: the recipe's test split

    # A checkpoint whose recipe read a demo corpus that is gone: explicit folders still evaluate,
    # and its test split says how to prepare the corpus again, from the checkpoint itself.
    shutil.rmtree(folder)
    assert evaluate.main(["--checkpoint", str(checkpoint), "--data", str(tmp_path / "valid")]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(checkpoint), "--split", "test"])
    assert f"python -m asr.synth_demo {checkpoint}" in capsys.readouterr().err
    assert not folder.exists()

    monkeypatch.undo()
    assert synth_demo.main([str(checkpoint)]) == 0
    assert folder.is_dir()
    assert evaluate.main(["--checkpoint", str(checkpoint), "--split", "test", "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "wer.json").read_text())
    assert (again["utterances"], again["wer_percent"]) == (scored["utterances"], scored["wer_percent"])
