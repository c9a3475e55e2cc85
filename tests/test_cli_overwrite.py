"""One overwrite rule for every command that writes results (issue 80, asr.cli.outputs): an output that
another run of the command wrote, or that the command cannot read as its own, is refused in one line
naming it, exit status 2, and left as it was; ``--overwrite`` replaces it; the same command again
replaces its own without it."""

import importlib
import json
from pathlib import Path

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from asr.checkpoints.io import load_checkpoint, save_checkpoint
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline

# Every asr.cli command that writes an output file or folder, each shown below to keep the rule (asr.checkpoint
# convert has its own test; asr.train and asr.synth_librispeech resume what their folder holds and refuse a
# folder of other settings, asr.synth_demo writes a cache keyed by the corpus's options, asr.transcribe
# writes nothing).
WRITERS = ("evaluate", "validate", "check", "compare", "average", "study")


def run(command: str, argv: list[str], capsys) -> tuple[int, str]:
    main = importlib.import_module(f"asr.cli.{command}").main
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    return status, capsys.readouterr().err


def state(paths: list[Path]) -> list[tuple[object, int]]:
    """Each file's bytes (a folder's names) and modification time, to show that a refusal changed nothing."""
    return [(sorted(q.name for q in p.iterdir()) if p.is_dir() else p.read_bytes(), p.stat().st_mtime_ns) for p in paths]


def refused(command: str, argv: list[str], planted: list[Path], capsys) -> str:
    """Run ``command`` into the ``planted`` output: one error line naming it, exit 2, nothing changed."""
    before = state(planted)
    status, err = run(command, argv, capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, (command, err)
    assert lines[0].startswith(f"error: {planted[0]} holds "), (command, err)
    assert lines[0].endswith("to write elsewhere, or --overwrite to replace it"), (command, err)
    assert state(planted) == before, command
    return lines[0]


def test_every_command_with_an_output_option_offers_overwrite(capsys):
    import asr.cli

    commands = [p.stem for p in Path(asr.cli.__file__).parent.glob("*.py")
                if "def main(" in p.read_text()]
    assert set(WRITERS) <= set(commands) and len(commands) > len(WRITERS)
    for command in commands:
        with pytest.raises(SystemExit):
            importlib.import_module(f"asr.cli.{command}").main(["--help"])
        shown = capsys.readouterr().out
        if command in WRITERS:
            assert "--overwrite" in shown, command
        else:  # a command not in WRITERS has no --out, or one of the rules named at WRITERS
            assert "--out " not in shown or command == "checkpoint", command


def _write_run(folder: Path, losses: list[float]) -> Path:
    writer = SummaryWriter(log_dir=str(folder))
    for step, loss in enumerate(losses, start=1):
        writer.add_scalar("valid/loss", loss, step)
    writer.close()
    return folder


def test_compare_refuses_another_comparisons_image_and_replaces_its_own(tmp_path, capsys):
    run_a, run_b = _write_run(tmp_path / "a", [3.0, 2.0]), _write_run(tmp_path / "b", [4.0, 3.5])
    out = tmp_path / "cmp.png"
    out.write_bytes(b"an image someone drew")  # no table beside it to say what it compares
    argv = [str(run_a), str(run_b), "--out", str(out)]
    assert "without the table" in refused("compare", argv, [out], capsys)
    assert run("compare", argv + ["--overwrite"], capsys)[0] == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    table = out.with_suffix(".md")
    # Another comparison (other runs) into the same --out: refused, naming what the table records.
    message = refused("compare", [str(run_a), "--out", str(out)], [out, table], capsys)
    assert f'runs ["{run_a}", "{run_b}"], here ["{run_a}"]' in message
    message = refused("compare", argv + ["--tag", "valid/wer"], [out, table], capsys)  # other tags
    assert 'tags ["valid/loss"], here ["valid/wer"]' in message
    # The same comparison again (runs still training: a step more) replaces its own without --overwrite.
    _write_run(run_b, [4.0, 3.5, 1.25])
    assert run("compare", argv + ["--labels", "A", "B"], capsys)[0] == 0
    assert "| B | 3 | 1.25 |" in table.read_text()


def _epoch(path: Path, epoch: int) -> Path:
    """A tiny checkpoint in the trainer's layout."""
    torch.manual_seed(epoch)
    save_checkpoint(path, {
        "config": {"exp_dir": str(path.parent), "model": {"type": "las"}},
        "model": torch.nn.Linear(3, 2).state_dict(),
        "tokenizer": {"type": "char", "symbols": list("ab ")},
        "features": FeaturePipeline(FeatureConfig(num_mel_bins=10)).state_dict(),
        "training": {"metric": 1.0 / (epoch + 1), "metric_name": "valid_loss", "epoch": epoch},
    })
    return path


def test_average_refuses_a_checkpoint_that_is_not_this_average_and_replaces_its_own(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for epoch in (1, 2, 3):
        _epoch(run_dir / f"epoch{epoch}.pt", epoch)
    # --out naming the run's own checkpoint, the file most worth keeping: refused.
    last = _epoch(run_dir / "last.pt", 3)
    argv = [str(run_dir), "--last", "2"]
    assert "a checkpoint that is not an average" in refused("average", argv + ["--out", str(last)], [last], capsys)
    out = run_dir / "avg_last2.pt"
    out.write_text("notes\n")
    assert "something other than an average" in refused("average", argv, [out], capsys)
    assert run("average", argv + ["--overwrite"], capsys)[0] == 0
    assert load_checkpoint(out)["training"]["averaged_from"] == [str(run_dir / "epoch2.pt"), str(run_dir / "epoch3.pt")]
    # Another average (the last 3) into that file: refused; the same average after another epoch replaces its own.
    message = refused("average", [str(run_dir), "--last", "3", "--out", str(out)], [out], capsys)
    assert f"another average (of the last 2 of {run_dir.resolve()}; here of the last 3 of {run_dir.resolve()})" in message
    _epoch(run_dir / "epoch4.pt", 4)
    assert run("average", argv, capsys)[0] == 0
    assert load_checkpoint(out)["training"]["averaged_from"] == [str(run_dir / "epoch3.pt"), str(run_dir / "epoch4.pt")]


def test_check_refuses_a_file_that_is_not_its_report_and_replaces_it_with_overwrite(librivox_mini, tmp_path, capsys,
                                                                                   monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "report.json"
    out.write_text('{"mine": true}\n')  # JSON, but no record of what was checked
    argv = [str(librivox_mini), "--jobs", "0", "--out", str(out)]
    assert "not the report of a check" in refused("check", argv, [out], capsys)
    assert run("check", argv + ["--overwrite"], capsys)[0] == 0
    assert json.loads(out.read_text())["checked"] == {"sources": [str(librivox_mini)]}


def test_evaluate_and_validate_refuse_before_reading_the_checkpoint(tmp_path, capsys):
    """Their replacing with --overwrite, which decodes, is in test_inference_cli.py and the slow test below."""
    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"")  # refused only after the output is checked: the rule comes first
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "wer.json").write_text("{}\n")  # results without evaluation.json to say what made them
    argv = ["--checkpoint", str(checkpoint), "--data", str(tmp_path), "--out", str(folder)]
    assert "without evaluation.json" in refused("evaluate", argv, [folder, folder / "wer.json"], capsys)
    out = tmp_path / "dev.json"
    out.write_text("[1, 2]\n")
    argv = ["--checkpoint", str(checkpoint), "--out", str(out)]
    assert "not a validation's results" in refused("validate", argv, [out], capsys)
    # With --overwrite the rule lets them on, to their next check (data, checkpoint); the output is kept until
    # there are results to replace it.
    for command, argv, kept in (("evaluate", argv[:2] + ["--data", str(tmp_path), "--out", str(folder)], folder / "wer.json"),
                                ("validate", argv, out)):
        before = state([kept])
        status, err = run(command, argv + ["--overwrite"], capsys)
        assert status == 2 and "--overwrite" not in err and err.startswith("error: "), (command, err)
        assert state([kept]) == before


@pytest.mark.slow  # decodes with a model
def test_evaluate_and_validate_replace_another_result_with_overwrite(librivox_mini, tmp_path, capsys):
    from helpers import small_las_config

    from asr.data.dataset import compute_global_stats
    from asr.data.librispeech import read_subset
    from asr.data.tokenizer import CharTokenizer
    from asr.experiment import ExperimentConfig, experiment_config_to_dict
    from asr.models.registry import build_model

    utterances = read_subset(librivox_mini)
    features = FeatureConfig(kind="fbank", num_mel_bins=20, mvn="global")
    pipeline = FeaturePipeline(features)
    compute_global_stats(utterances, pipeline)
    tokenizer = CharTokenizer.train(u.text for u in utterances)
    model_config = small_las_config()
    torch.manual_seed(0)
    model = build_model(model_config, pipeline.feature_dim, tokenizer)
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(checkpoint, {"config": experiment_config_to_dict(ExperimentConfig(exp_dir="unused", features=features,
                                                                                      model=model_config)),
                                 "model": model.state_dict(), "tokenizer": tokenizer.state_dict(),
                                 "features": pipeline.state_dict()})
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "wer.json").write_text("{}\n")
    argv = ["--checkpoint", str(checkpoint), "--data", str(librivox_mini), "--out", str(folder), "--max-len-ratio", "0.2"]
    refused("evaluate", argv, [folder, folder / "wer.json"], capsys)
    assert run("evaluate", argv + ["--overwrite"], capsys)[0] == 0
    assert "wer_percent" in json.loads((folder / "wer.json").read_text())
    out = tmp_path / "dev.json"
    out.write_text("[1, 2]\n")
    argv = ["--checkpoint", str(checkpoint), "--data", str(librivox_mini), "--decode", "0", "--out", str(out)]
    refused("validate", argv, [out], capsys)
    assert run("validate", argv + ["--overwrite"], capsys)[0] == 0
    assert json.loads(out.read_text())["checkpoint"] == str(checkpoint)


def test_study_refuses_a_finished_run_another_study_trained_and_trains_it_again_with_overwrite(tmp_path, capsys,
                                                                                               monkeypatch):
    import yaml
    from helpers import LAS_RECIPE, TINY

    from asr.cli import study
    from asr.experiment import experiment_config_to_dict, load_experiment_config
    from asr.studies.grid import StudyError

    def trained(runs, *args):  # what would train: the runs left to train, stopped here
        raise StudyError("trained " + " ".join(sorted(r.name for r in runs if not (r.exp_dir / "study_time.json").exists())))

    monkeypatch.setattr(study, "train_runs", trained)
    argv = [str(LAS_RECIPE), *TINY, "data.demo.enabled=false", "--grid", "train.seed=0,1", "--out", str(tmp_path / "s")]
    runs = study.plan(study.build_parser(), argv).runs

    def finish(run, *overrides):  # a finished run, as the trainer and the study leave it
        config = experiment_config_to_dict(load_experiment_config(
            LAS_RECIPE, [*TINY, "data.demo.enabled=false", *run.overrides(), f"exp_dir={run.exp_dir}", *overrides]))
        run.exp_dir.mkdir(parents=True)
        (run.exp_dir / "config.yaml").write_text(yaml.safe_dump({**config, "runtime": {"device": "cpu"}}))
        (run.exp_dir / "study_time.json").write_text('{"train_seconds": 1.0}\n')

    finish(runs[0])  # this study's own: reused
    finish(runs[1], "model.listener.hidden_size=32")  # another study's (another model) into the same folder
    planted = [runs[1].exp_dir / "config.yaml", runs[1].exp_dir / "study_time.json"]
    message = refused("study", argv, [runs[1].exp_dir, *planted], capsys)
    assert "a run another study trained" in message and "model.listener.hidden_size: 32 -> 16" in message
    # --overwrite: the other study's run is trained again from the start (its folder emptied), this study's kept.
    status, err = run("study", argv + ["--overwrite"], capsys)
    assert status == 1 and f"asr.study: trained {runs[1].name}\n" in err, err
    assert not runs[1].exp_dir.exists() and (runs[0].exp_dir / "study_time.json").exists()


def test_study_overwrite_never_deletes_a_run_folder_a_live_process_holds(tmp_path, capsys, monkeypatch):
    """--overwrite empties another study's finished run only under that run's lock: an asr.train someone
    started there by hand (a live process holding train.lock) stops the study in one line naming it, exit 2,
    with no folder deleted, not even another one --overwrite would replace; once that process is gone its
    stale lock is taken over and the folder replaced."""
    import os
    import socket
    import subprocess
    import sys

    import yaml
    from helpers import LAS_RECIPE, TINY

    from asr.cli import study
    from asr.experiment import experiment_config_to_dict, load_experiment_config
    from asr.studies.grid import StudyError
    from asr.training.runlock import LOCK_NAME

    def trained(runs, *args):  # what would train: the runs left to train, stopped here
        raise StudyError("trained " + " ".join(sorted(r.name for r in runs if not (r.exp_dir / "study_time.json").exists())))

    monkeypatch.setattr(study, "train_runs", trained)
    argv = [str(LAS_RECIPE), *TINY, "data.demo.enabled=false", "--grid", "train.seed=0,1", "--out", str(tmp_path / "s")]
    runs = study.plan(study.build_parser(), argv).runs
    for planned in runs:  # both finished by another study (another model) into the same folder
        config = experiment_config_to_dict(load_experiment_config(
            LAS_RECIPE, [*TINY, "data.demo.enabled=false", *planned.overrides(), f"exp_dir={planned.exp_dir}",
                         "model.listener.hidden_size=32"]))
        planned.exp_dir.mkdir(parents=True)
        (planned.exp_dir / "config.yaml").write_text(yaml.safe_dump({**config, "runtime": {"device": "cpu"}}))
        (planned.exp_dir / "study_time.json").write_text('{"train_seconds": 1.0}\n')
    held = runs[1].exp_dir
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the asr.train run by hand
    try:
        command = f"python -m asr.train {LAS_RECIPE} exp_dir={held} --resume"
        (held / LOCK_NAME).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                  "started": "2026-11-29T04:00:00+00:00", "command": command}))
        # every file's bytes and mtime, and each folder's names (a lock taken on the first run and let go when
        # the second is refused passes through its folder, whose own mtime moves)
        planted = [p for planned in runs for p in sorted(planned.exp_dir.iterdir())]
        before = state(planted), [sorted(q.name for q in planned.exp_dir.iterdir()) for planned in runs]
        status, err = run("study", argv + ["--overwrite"], capsys)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1, err
        assert lines[0].startswith(f"error: --overwrite does not delete a run folder in use: {held} is in use by "
                                   f"another run: PID {holder.pid} on host {socket.gethostname()}, "
                                   f"started 2026-11-29T04:00:00+00:00, command: {command}. "), err
        # neither run's folder deleted, the holder's lock untouched
        assert (state(planted), [sorted(q.name for q in planned.exp_dir.iterdir()) for planned in runs]) == before
        assert not (tmp_path / "s" / "study.lock").exists()  # the study let go of --out
        assert not (runs[0].exp_dir / LOCK_NAME).exists()  # nor left the lock it took on the other run
    finally:
        holder.kill()
        holder.wait()
    # the hand-started run is over (killed): its stale lock is taken over, and both runs are trained again
    status, err = run("study", argv + ["--overwrite"], capsys)
    assert status == 1 and f"asr.study: trained {runs[0].name} {runs[1].name}\n" in err, err
    assert not runs[0].exp_dir.exists() and not held.exists()
    assert os.path.isdir(tmp_path / "s")
