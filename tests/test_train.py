"""The trainer end to end on real speech: experiment directory, checkpoints,
non-finite steps, exact resume after SIGKILL, DDP with gloo, recipe errors."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from helpers import LAS_RECIPE as RECIPE
from helpers import PROJECT_ROOT, TINY, fail_writes_to, subprocess_env, tiny_run, tiny_valid

from asr.checkpoints.averaging import average_checkpoints
from asr.checkpoints.io import load_checkpoint
from asr.cli.train import main
from asr.studies.curves import read_scalars, run_curves
from asr.experiment import load_experiment_config
from asr.run import build_trainer
from asr.training.errors import TrainingError
from asr.training.data import build_training_data, make_loader
from asr.training.schedules import SchedulerConfig, learning_rate
from asr.training.shapes import RunPlan
from asr.training.skips import SkipReason

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_demo_corpus")]  # every test here trains


def overrides(tmp_path: Path, *extra: str) -> list[str]:
    return tiny_run(tmp_path, *extra)[1:]


def test_a_run_fills_the_experiment_directory(tmp_path):
    args = overrides(tmp_path, "train.max_epochs=2", "train.keep_best=1", "features.mvn=global")
    assert main([str(RECIPE), *args]) == 0
    exp = tmp_path / "exp"
    for name in ("config.yaml", "train.log", "last.pt", "epoch1.pt", "epoch2.pt"):  # epochs count from 1
        assert (exp / name).is_file(), name
    assert len(list(exp.glob("best_epoch*.pt"))) == 1
    assert not (exp / "train.lock").exists()  # the run's lock is released when it ends
    # The run records which code computed its LSTMs, and that code is what ran.
    recorded = yaml.safe_load((exp / "config.yaml").read_text())["runtime"]
    chosen = {name for names in recorded["lnlstm_backends"].values() for name in names}
    assert {"listener.layers.0", "speller.cells.0"} <= chosen
    # and which code computed its attention (the fused C++ step, where it builds)
    assert [name for names in recorded["attention_backends"].values() for name in names] == ["speller.attention"]
    # What ran is known at the end, and told in train.log (config.yaml is written once, at the start): the chosen code
    log_lines = (exp / "train.log").read_text().splitlines()
    (ran,) = [line for line in log_lines if " ran: LN-LSTM " in line]
    assert f"ran: LN-LSTM {', '.join(sorted(recorded['lnlstm_backends']))} on cpu; attention " in ran
    assert set(recorded["attention_backends"]) <= set(ran.split("; attention ")[1].split(", "))
    assert "lnlstm_backends_ran" not in recorded and "attention_backends_ran" not in recorded
    # train.log says it in one line, with where the rest is (issue 80); nothing of CUDA graphs on a CPU run
    runtime_lines = [line for line in log_lines if "runtime:" in line]
    assert len(runtime_lines) == 1 and "runtime: cpu; LN-LSTM " in runtime_lines[0], runtime_lines
    assert f"(details: {exp / 'config.yaml'}, runtime; --verbose)" in runtime_lines[0]
    assert "cuda_graphs" not in recorded and "cuda_graphs_recorded" not in recorded
    assert load_experiment_config(exp / "config.yaml").model.lnlstm_backend == "auto"  # loads as a recipe
    assert list(exp.glob("events.out.tfevents.*"))  # in exp_dir itself: TensorBoard names the run "exp"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(exp))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "valid/loss", "valid/wer", "valid/cer"} <= tags
    # Training and validation share one x axis, the optimizer step: each validation at the step its
    # epoch ended on (the step its checkpoint records); the epoch is a scalar of its own, 1 and 2 there.
    ckpt_steps = [load_checkpoint(exp / f"epoch{e}.pt")["training"]["step"] for e in (1, 2)]
    assert [e.step for e in events.Scalars("valid/loss")] == ckpt_steps and 0 < ckpt_steps[0] < ckpt_steps[1]
    train_steps = [e.step for e in events.Scalars("train/loss")]
    assert train_steps == list(range(1, ckpt_steps[1] + 1))  # log_every_steps=1
    epochs = {e.step: e.value for e in events.Scalars("epoch")}
    assert [epochs[s] for s in ckpt_steps] == [1.0, 2.0]
    assert 0 < epochs[1] < 1 and sorted(epochs.values()) == [epochs[s] for s in sorted(epochs)]  # rising
    minutes = [e.value for e in events.Scalars("valid/minutes")]
    assert 0 < minutes[0] < minutes[1]
    # where the training loop's time went, at every logged update
    assert [e.step for e in events.Scalars("time/loader_wait")] == train_steps
    assert all(0 <= e.value <= 1 for e in events.Scalars("time/loader_wait"))
    assert all(e.value > 0 for e in events.Scalars("time/seconds_per_update"))
    assert "s/update, loader wait" in (exp / "train.log").read_text()
    log = (exp / "train.log").read_text()
    # The command line and its overrides in the log and, with the resolved config, in TensorBoard.
    assert f"overrides: {' '.join(args)}" in log and "command line: python -m asr.train" in log
    assert "config/text_summary" in events.Tags()["tensors"]
    assert events.SummaryMetadata("_hparams_/session_start_info").plugin_data.plugin_name == "hparams"
    assert re.search(r"epoch 1: valid loss", log) and re.search(r"epoch 2: valid loss", log)
    assert not re.search(r"epoch 0\b", log) and "training finished (train.max_epochs=2) after" in log
    # The gradient norm per module group, before clipping, at the logged steps.
    groups = {tag for tag in tags if tag.startswith("grad_norm/")}
    assert groups == {"grad_norm/listener", "grad_norm/speller", "grad_norm/attention", "grad_norm/ctc"}
    total = events.Scalars("train/grad_norm")[0].value
    assert sum(events.Scalars(g)[0].value ** 2 for g in groups) == pytest.approx(total**2, rel=1e-4)
    # The attention of a few dev utterances, drawn over their features, at every validation,
    # and the last one as a picture in exp_dir.
    images = [tag for tag in events.Tags()["images"] if tag.startswith("alignment/")]
    assert len(images) == 3 and [e.step for e in events.Images(images[0])] == ckpt_steps
    pictures = sorted(p.name for p in exp.glob("alignment_*.png"))
    assert pictures == sorted(f"alignment_{tag.split('/', 1)[1]}.png" for tag in images)
    # A checkpoint is self-contained: config, tokenizer and feature statistics travel with it.
    ckpt = load_checkpoint(exp / "last.pt")
    assert ckpt["config"]["model"]["type"] == "las"
    assert ckpt["features"]["stats"] is not None  # global MVN's statistics
    assert ckpt["tokenizer"] and ckpt["training"]["progress"]["epoch"] == 2
    # The longest training utterance: longer recordings are decoded in pieces (asr.inference.segmentation).
    config = load_experiment_config(RECIPE, args)
    train_set = build_training_data(config, None).train_set
    durations = [u.duration for u in train_set.utterances]
    assert ckpt["longest_utterance_seconds"] == max(durations) <= config.data.max_duration
    assert ckpt["mean_utterance_seconds"] == pytest.approx(sum(durations) / len(durations))
    averaged = average_checkpoints([exp / "epoch1.pt", exp / "epoch2.pt"])
    assert averaged["longest_utterance_seconds"] == max(durations)
    assert averaged["mean_utterance_seconds"] == ckpt["mean_utterance_seconds"]


def test_a_second_run_in_the_same_directory_needs_resume(tmp_path, capsys):
    args = [str(RECIPE), *overrides(tmp_path, "train.max_steps=1")]
    assert main(args) == 0
    exp = tmp_path / "exp"
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in exp.rglob("*")}
    capsys.readouterr()
    assert main(args) == 2  # refuses to overwrite without --resume
    assert "already holds a run (last.pt); pass --resume" in capsys.readouterr().err
    # and writes nothing into the folder it was refused from: not a line of its train.log
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in exp.rglob("*")} == before


def test_max_steps_inside_an_epoch_validates_there_logs_its_last_step_and_ends_with_a_summary(tmp_path):
    """The tiny run's first epoch has 5 updates: stopped after 3, logged every 2."""
    args = overrides(tmp_path, "train.max_steps=3", "train.log_every_steps=2")
    assert main([str(RECIPE), *args, "--verbose"]) == 0
    exp = tmp_path / "exp"
    # --verbose logs the whole runtime record, at the start and what ran at the end (still nothing of CUDA graphs)
    log = (exp / "train.log").read_text()
    assert "runtime: lnlstm_backends:" in log and "runtime: cpp_build_flags:" in log
    assert "runtime: lnlstm_backends_ran:" in log and "cuda_graphs" not in log
    curves = run_curves(exp, "run")
    assert curves["train/loss"].steps == [1, 2, 3]  # the last step is logged, whatever log_every_steps says
    assert curves["valid/loss"].steps == [3]  # validated where it stopped, on the training's axis
    epochs = dict(zip(curves["epoch"].steps, curves["epoch"].values))
    assert 0 < epochs[3] < 1  # inside the first epoch
    assert not list(exp.glob("epoch*.pt"))  # not an epoch: nothing ranked or kept as one
    log = (exp / "train.log").read_text()
    assert re.search(r"step 3 \(epoch 1, not finished\): valid loss \d", log)
    assert "training finished (train.max_steps=3) after 3 steps" in log
    assert f"next: python -m asr.evaluate --checkpoint {exp / 'last.pt'} --split dev" in log
    # asr.compare draws it: its valid/loss exists now
    from asr.cli.compare import main as compare

    assert compare([str(exp), "--tag", "valid/loss", "--tag", "train/loss", "--out", str(tmp_path / "c.png")]) == 0


def test_unknown_config_key_is_an_error_naming_it(tmp_path, capsys):
    assert main([str(RECIPE), f"exp_dir={tmp_path}", "model.listener.hiden_size=3"]) == 2
    assert "model.listener.hiden_size" in capsys.readouterr().err


def test_a_nan_loss_skips_the_step_and_names_the_batch(tmp_path, caplog):
    config = load_experiment_config(RECIPE, overrides(tmp_path, "train.max_steps=2", "train.max_epochs=1"))
    trainer = build_trainer(config)
    model = trainer.raw_model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    original = model.forward
    calls = []

    def poisoned(*args, **kwargs):
        output = original(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            output.loss = output.loss * float("nan")
        return output

    model.forward = poisoned
    steps_before = trainer.progress.step
    # Run the first batch only: the poisoned one, through the trainer's own step.
    trainer.data.sampler.set_epoch(0)
    first = next(iter(make_loader(list(trainer.data.sampler)[:1], trainer.data.train_set, 0, 0, False)))
    outcome = trainer.step.backward(first)
    assert outcome.loss is None and outcome.skipped.reason is SkipReason.NONFINITE_LOSS
    assert str(outcome.skipped).startswith("non-finite loss ")
    trainer.skips.step(trainer.progress, outcome.skipped, first.ids)
    assert trainer.progress.step == steps_before and trainer.progress.nonfinite_in_a_row == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    assert first.ids[0] in caplog.text and "non-finite loss" in caplog.text


def test_too_many_nonfinite_steps_stop_the_run(tmp_path):
    config = load_experiment_config(RECIPE, overrides(tmp_path, "train.max_nonfinite_in_a_row=2"))
    trainer = build_trainer(config)
    original = trainer.raw_model.forward

    def always_nan(*args, **kwargs):
        output = original(*args, **kwargs)
        output.loss = output.loss * float("inf")
        return output

    trainer.raw_model.forward = always_nan
    with pytest.raises(TrainingError, match="2 non-finite steps in a row"):
        trainer.fit()


def _train_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "asr.train", str(RECIPE), *args]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The arguments of a tiny two-epoch run and the last.pt it ends with, uninterrupted."""
    root = tmp_path_factory.mktemp("reference")
    common = TINY + [
        f"data.dev=[{tiny_valid(root)}]",
        "train.max_epochs=2",
        "train.save_every_steps=1",
        "model.listener.dropout=0.2",  # dropout and SpecAugment draw random numbers: resume must restore them
    ]
    subprocess.run(_train_command(common + [f"exp_dir={root / 'exp'}"]), check=True, env=subprocess_env(), capture_output=True)
    return common, load_checkpoint(root / "exp" / "last.pt"), root / "exp"


def _assert_same_weights(expected: dict, resumed: dict) -> None:
    assert resumed["training"]["progress"]["step"] == expected["training"]["progress"]["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name


def _wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_resume_after_sigkill_ends_with_the_same_weights(tmp_path, reference):
    """Kill a run with SIGKILL mid-epoch, resume it, compare with an uninterrupted run."""
    common, expected, _ = reference
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        _train_command(common + [f"exp_dir={killed}"]), env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    last = killed / "last.pt"
    _wait_for(lambda: last.exists() and load_checkpoint(last)["training"]["progress"]["step"] >= 3, "step 3")
    process.send_signal(signal.SIGKILL)
    process.wait()
    progress = load_checkpoint(killed / "last.pt")["training"]["progress"]
    assert progress["epoch"] < 2, "the run finished before it could be killed"
    # its lock is left behind, stale: the resumed run takes it over
    assert (killed / "train.lock").is_file()
    resumed = subprocess.run(
        _train_command(common + [f"exp_dir={killed}", "--resume"]), check=True, env=subprocess_env(), capture_output=True, text=True
    )
    assert "taking over the stale lock" in resumed.stderr
    _assert_same_weights(expected, load_checkpoint(killed / "last.pt"))


def test_the_same_command_at_two_threads_repeats_bit_for_bit(tmp_path):
    """Two threads split the sums of a step in a fixed order, so the same command, seed and thread count
    give the same weights (issue 78: runs that can be trusted to differ). A reduction whose order depended
    on timing, or a draw from an unseeded generator, would fail here. docs/usage.md, "What a repeated run
    varies with", says what does change the numbers: the thread count and the machine's instruction set."""
    env = dict(subprocess_env(), OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    common = TINY + [f"data.dev=[{tiny_valid(tmp_path)}]", "train.max_steps=6", "model.listener.dropout=0.2"]
    for name in ("first", "second"):
        subprocess.run(_train_command(common + [f"exp_dir={tmp_path / name}"]), check=True, env=env, capture_output=True)
    first, second = (load_checkpoint(tmp_path / name / "last.pt") for name in ("first", "second"))
    assert first["training"]["progress"]["step"] > 1
    _assert_same_weights(first, second)
    losses = [re.findall(r"step \d+ loss \S+", (tmp_path / name / "train.log").read_text()) for name in ("first", "second")]
    assert losses[0] and losses[0] == losses[1]


def test_sigterm_mid_epoch_writes_a_checkpoint_and_resume_ends_with_the_same_weights(tmp_path, reference):
    """SIGTERM (a scheduler's preemption): the step in progress ends, last.pt is written, exit 75;
    --resume (given before the overrides) ends where the uninterrupted run ends."""
    common, expected, _ = reference
    exp = tmp_path / "stopped"
    # No periodic saves: the last.pt after the signal is the stop's own.
    process = subprocess.Popen(
        _train_command(common + [f"exp_dir={exp}", "train.save_every_steps=0"]),
        env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    log = exp / "train.log"
    _wait_for(lambda: log.exists() and "epoch 1 step 1 " in log.read_text(), "step 1")  # of 5 in the epoch
    assert not (exp / "last.pt").exists()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 75, err[-3000:]
    assert "SIGTERM received: finishing the current step" in err and "Traceback" not in err
    final = err.strip().splitlines()[-1]
    assert final.startswith("stopped by SIGTERM after step ") and "--resume" in final
    progress = load_checkpoint(exp / "last.pt")["training"]["progress"]
    assert progress["epoch"] == 0 and 0 < progress["batch_in_epoch"] and progress["step"] >= 1
    assert f"after step {progress['step']} (epoch 1, batch {progress['batch_in_epoch']})" in log.read_text()
    assert not (exp / "train.lock").exists()
    subprocess.run(
        _train_command(["--resume", *common, f"exp_dir={exp}"]), check=True, env=subprocess_env(), capture_output=True
    )
    _assert_same_weights(expected, load_checkpoint(exp / "last.pt"))


def test_validations_every_n_updates_are_logged_between_epochs_and_change_nothing_else(tmp_path, reference):
    """train.valid_every_steps=2 on two epochs of 5 updates: validations after updates 2, 4, 6 and 8 of
    the run besides the epochs' own (after 5 and 10), unranked; the weights end exactly as without them (dropout draws the
    same numbers: a validation leaves the random state as it found it)."""
    common, expected, reference_exp = reference
    exp = tmp_path / "exp"
    subprocess.run(_train_command(common + [f"exp_dir={exp}", "train.valid_every_steps=2"]), check=True,
                   env=subprocess_env(), capture_output=True)
    _assert_same_weights(expected, load_checkpoint(exp / "last.pt"))
    curves, before = run_curves(exp, "run"), run_curves(reference_exp, "reference")
    assert before["valid/loss"].steps == [5, 10]
    assert curves["valid/loss"].steps == [2, 4, 5, 6, 8, 10]  # 10 ends an epoch: validated once
    # the epochs' own validations are the reference's, to the last digit
    at = dict(zip(curves["valid/loss"].steps, curves["valid/loss"].values))
    assert [at[5], at[10]] == before["valid/loss"].values
    epochs = dict(zip(curves["epoch"].steps, curves["epoch"].values))
    assert [epochs[s] for s in (2, 4, 5, 6, 10)] == pytest.approx([0.4, 0.8, 1, 1.2, 2])
    log = (exp / "train.log").read_text()
    assert re.search(r"step 2 \(epoch 1, not finished\): valid loss \d", log)
    assert re.search(r"step 6 \(epoch 2, not finished\): valid loss \d", log)
    assert sorted(p.name for p in exp.glob("epoch*.pt")) == ["epoch1.pt", "epoch2.pt"]
    assert load_experiment_config(exp / "config.yaml").train.valid_every_steps == 2  # recorded with the run


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory, reference):
    """The reference run stopped after its first epoch (``train.max_epochs=1``): a folder to copy."""
    common, _, _ = reference
    exp = tmp_path_factory.mktemp("one_epoch") / "exp"
    subprocess.run(_train_command(common + [f"exp_dir={exp}", "train.max_epochs=1"]), check=True, env=subprocess_env(),
                   capture_output=True)
    return exp


def test_resume_falls_back_to_the_newest_readable_epoch_checkpoint(tmp_path, reference, one_epoch):
    """A last.pt cut short (by a copy) does not stop --resume: epoch{E}.pt carries the same state."""
    common, expected, _ = reference
    exp = tmp_path / "exp"
    shutil.copytree(one_epoch, exp)
    last = exp / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    subprocess.run(_train_command(common + [f"exp_dir={exp}", "--resume"]), check=True, env=subprocess_env(),
                   capture_output=True)
    log = (exp / "train.log").read_text()
    assert f"--resume: {last}: it cannot be read (cannot read checkpoint {last}" in log
    assert f"resuming from {exp / 'epoch1.pt'} instead" in log
    assert "asr.checkpoint convert" not in log  # a damaged file is not one of the old format: converting it would not help
    _assert_same_weights(expected, load_checkpoint(last))
    assert "optimizer" not in load_checkpoint(next(exp.glob("best_epoch*.pt")))["training"]  # weights only


def test_resume_without_last_pt_falls_back_to_the_newest_epoch_checkpoint(tmp_path, reference, one_epoch):
    """Issue 49: a full disk before last.pt was first written left epoch1.pt whole; --resume refused."""
    common, expected, _ = reference
    exp = tmp_path / "exp"
    shutil.copytree(one_epoch, exp)
    (exp / "last.pt").unlink()
    subprocess.run(_train_command(common + [f"exp_dir={exp}", "--resume"]), check=True, env=subprocess_env(),
                   capture_output=True)
    log = (exp / "train.log").read_text()
    assert f"--resume: {exp / 'last.pt'}: it is missing; resuming from {exp / 'epoch1.pt'} instead" in log
    _assert_same_weights(expected, load_checkpoint(exp / "last.pt"))


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children + [d for c in children for d in _descendants(c)]


def _environment(pid: int) -> dict:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers through /proc")
def test_under_torchrun_a_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    exp = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29518",
        "-m", "asr.train", str(RECIPE), *TINY, f"data.dev=[{tiny_valid(tmp_path)}]",
        f"exp_dir={exp}", "train.max_epochs=2", "train.device=cpu",
    ]
    process = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = exp / "train.log"
    _wait_for(lambda: log.exists() and "epoch 1 step 1 " in log.read_text(), "step 1")
    rank1 = [p for p in _descendants(process.pid) if _environment(p).get("RANK") == "1"
             and "asr.train" in Path(f"/proc/{p}/cmdline").read_text()]
    assert len(rank1) == 1
    os.kill(rank1[0], signal.SIGTERM)  # rank 1 only; rank 0 learns of it through the all-reduced flag
    output, _ = process.communicate(timeout=600)
    assert process.returncode != 0
    stops = [line for line in output.splitlines() if "stopped by" in line and "after step" in line]
    assert stops, output[-3000:]
    steps = {line.split("after step ")[1].split()[0] for line in stops}
    assert len(steps) == 1, stops  # the same step on both ranks
    assert any("stopped by SIGTERM" in line for line in stops)
    assert any("stopped by a stop signal to another rank" in line for line in stops)
    assert load_checkpoint(exp / "last.pt")["training"]["progress"]["step"] == int(steps.pop())
    assert not (exp / "train.lock").exists()


def test_distributed_training_with_gloo_on_two_processes(tmp_path):
    exp = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29517",
        "-m", "asr.train", str(RECIPE), *TINY, f"data.dev=[{tiny_valid(tmp_path)}]",
        f"exp_dir={exp}", "train.max_epochs=1", "train.device=cpu",
    ]
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = load_checkpoint(exp / "last.pt")
    assert ckpt["training"]["progress"]["epoch"] == 1
    assert ckpt["training"]["progress"]["step"] > 0
    log = (exp / "train.log").read_text()
    assert log.count("training finished") == 1  # rank 0 logs, rank 1 does not write the file


def test_a_conformer_with_batchnorm_trains_and_validates_under_ddp(tmp_path):
    # The convolution module's BatchNorm sums its statistics over the ranks in training
    # (asr/models/norms.py, tests/test_conformer.py); rank 0's validation, valid_batchnorm_gap's
    # training-mode pass included, must join no collective (it hung until 2026-11-25).
    from helpers import tiny_transformer_run

    exp = tmp_path / "exp"
    args = tiny_transformer_run(tmp_path, "model.encoder.kind=conformer", "model.encoder.conv_kernel=5",
                                "train.max_epochs=1", "train.device=cpu")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29519",
               "-m", "asr.train", *args]
    process = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the ranks too: a hung collective keeps them spinning
        process.communicate()
        raise
    assert process.returncode == 0, stderr[-3000:]
    state = load_checkpoint(exp / "last.pt")
    assert state["training"]["progress"]["step"] > 0
    running = [v for k, v in state["model"].items() if k.endswith("conv_module.norm.running_var")]
    assert running and all(not torch.allclose(v, torch.ones_like(v)) for v in running)
    assert "valid/batchnorm_gap" in read_scalars(exp)


@pytest.mark.parametrize("recipe", ["librispeech100.yaml", "librispeech100_transformer.yaml", "librispeech100_conformer.yaml"])
def test_librispeech_recipes_start_on_librispeech_layout_data(tmp_path, recipe, librivox_mini):
    small = {
        "librispeech100.yaml": [
            "model.listener.hidden_size=16", "model.attention.dim=16", "model.speller.hidden_size=16",
            "model.speller.embedding_dim=16",
        ],
        "librispeech100_transformer.yaml": [
            "model.d_model=32", "model.encoder.num_layers=2", "model.decoder.num_layers=1",
            "model.encoder.ff_dim=64", "model.decoder.ff_dim=64",
        ],
        "librispeech100_conformer.yaml": [
            "model.d_model=32", "model.encoder.num_layers=2", "model.decoder.num_layers=1",
            "model.encoder.ff_dim=64", "model.decoder.ff_dim=64",
        ],
    }[recipe]
    args = [
        str(PROJECT_ROOT / "recipes" / recipe),
        f"exp_dir={tmp_path / 'exp'}",
        f"data.root={librivox_mini.parent}",
        "data.train=[test-mini]",
        "data.dev=[test-mini]",
        "data.test=[]",
        "data.bpe_vocab_size=40",
        "data.num_workers=0",
        "train.max_steps=2",
        "train.amp=false",
        *small,
    ]
    assert main(args) == 0
    assert load_checkpoint(tmp_path / "exp" / "last.pt")["training"]["progress"]["step"] == 2


def test_dither_at_inference_changes_validation_but_not_training(tmp_path):
    # The recipe dithers in training (features.dither: 1.0); dither_inference adds it to validation,
    # with noise of its own, so the weights a run ends with are the same to the bit.
    runs = {}
    for name, flag in (("plain", "false"), ("dithered", "true")):
        folder = tmp_path / name
        folder.mkdir()
        assert main([str(RECIPE), *overrides(folder, "train.max_epochs=2", f"features.dither_inference={flag}")]) == 0
        runs[name] = folder / "exp"
    plain, dithered = (load_checkpoint(runs[n] / "last.pt") for n in ("plain", "dithered"))
    assert plain["features"]["config"]["dither_inference"] is False
    assert dithered["features"]["config"]["dither_inference"] is True
    assert plain["model"].keys() == dithered["model"].keys()
    for key, weights in plain["model"].items():
        assert torch.equal(weights, dithered["model"][key]), key
    metrics = [load_checkpoint(runs[n] / "epoch2.pt")["training"]["metric"] for n in ("plain", "dithered")]
    assert metrics[0] != metrics[1]


def test_the_cosine_schedule_ends_at_its_floor_on_the_runs_last_update(tmp_path):
    lr, warmup, final = 0.002, 3, 0.1
    args = overrides(tmp_path, "train.max_epochs=3", "data.max_frames_per_batch=600", "train.accum_grad=2",
                     "train.log_every_steps=1", f"train.lr={lr}", "train.scheduler.kind=cosine",
                     f"train.scheduler.warmup_steps={warmup}", f"train.scheduler.final_factor={final}")
    assert main([str(RECIPE), *args]) == 0
    logged = {step: value for _, step, value in read_scalars(tmp_path / "exp")["train/lr"]}
    total = max(logged)  # the updates the run planned: epochs of accumulated batches
    assert sorted(logged) == list(range(1, total + 1)) and total > 2 * warmup
    rate = learning_rate(lr, SchedulerConfig(kind="cosine", warmup_steps=warmup, final_factor=final),
                         RunPlan(total_updates=total)).value
    # Logged at update s: the rate update s was made with, after s - 1 completed ones.
    assert [logged[s] for s in sorted(logged)] == pytest.approx([rate(s - 1) for s in sorted(logged)])
    assert logged[total] == pytest.approx(lr * final) and logged[warmup] == pytest.approx(lr)


# ---------------------------------------------------------------- CUDA out of memory (simulated on CPU)


class _OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_a_batch_out_of_cuda_memory_is_skipped_counted_and_training_goes_on(tmp_path, caplog):
    config = load_experiment_config(RECIPE, overrides(tmp_path, "train.max_epochs=1"))
    trainer = build_trainer(config)
    original, calls, sizes = trainer.raw_model.forward, [], {}

    def forward(features, lengths, *args):
        calls.append(len(calls) + 1)
        if calls[-1] == 2:
            sizes["forward"] = (features.shape[0], int(lengths.sum()))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        output = original(features, lengths, *args)
        if calls[-1] == 4:
            sizes["backward"] = (features.shape[0], int(lengths.sum()))
            output.loss = _OutOfMemoryInBackward.apply(output.loss)
        return output

    trainer.raw_model.forward = forward
    progress = trainer.fit()
    batches = len(trainer.data.sampler)
    assert progress.step == batches - 2 and progress.epoch == 1  # two batches skipped, the rest trained
    for where, (utterances, frames) in sizes.items():
        assert (f"CUDA out of memory in the {where} pass of a batch of {utterances} utterances, {frames} frames"
                in caplog.text)
    assert caplog.text.count("step skipped, weights unchanged") == 2
    skipped = sum(n for n, _ in sizes.values())
    assert f"({skipped} CUDA out of memory)" in caplog.text  # the epoch's line counts the utterances
    assert read_scalars(tmp_path / "exp")["train/skipped_utterances"][0][2] == skipped
    assert all(torch.isfinite(p).all() for p in trainer.raw_model.parameters())


def test_batches_out_of_memory_in_a_row_stop_the_run(tmp_path):
    config = load_experiment_config(RECIPE, overrides(tmp_path, "train.max_oom_batches_in_a_row=3"))
    trainer = build_trainer(config)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    trainer.raw_model.forward = out_of_memory
    with pytest.raises(TrainingError, match=r"3 batches in a row ran out of CUDA memory \(train.max_oom_batches_in_a_row=3\)"):
        trainer.fit()
    assert trainer.progress.step == 0


# ---------------------------------------------------------------- write errors: one line naming the file


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def _no_partial_files(exp: Path) -> None:
    assert not [p for p in exp.rglob("*.tmp")]
    assert not (exp / "train.lock").exists()  # released on the error path too


def test_permission_denied_on_config_yaml_is_one_error_naming_it(tmp_path, monkeypatch, capsys):
    fail_writes_to(monkeypatch, "config.yaml", errno.EACCES)
    assert main(tiny_run(tmp_path, "train.max_steps=1")) == 2
    exp = tmp_path / "exp"
    assert _one_error_line(capsys) == f"error: {exp / 'config.yaml'}: Permission denied"
    assert not (exp / "config.yaml").exists()
    _no_partial_files(exp)


def test_no_space_while_writing_a_checkpoint_is_one_error_and_the_earlier_one_stays(tmp_path, monkeypatch, capsys):
    fail_writes_to(monkeypatch, "last.pt", errno.ENOSPC, after=1)  # the first save succeeds, the second fails
    assert main(tiny_run(tmp_path, "train.max_steps=3", "train.save_every_steps=1")) == 2
    exp = tmp_path / "exp"
    assert _one_error_line(capsys) == f"error: {exp / 'last.pt'}: No space left on device"
    assert load_checkpoint(exp / "last.pt")["training"]["progress"]["step"] == 1
    _no_partial_files(exp)


@pytest.mark.parametrize("records", [0, 4])  # the disk fills as the event file is opened, or a few steps on
def test_no_space_for_tensorboard_events_is_one_error_naming_the_event_file(tmp_path, monkeypatch, capsys, records):
    from tensorboard.summary.writer.record_writer import RecordWriter

    real_write, written = RecordWriter.write, []

    def full(self, data):
        if len(written) >= records:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(data)
        real_write(self, data)

    monkeypatch.setattr(RecordWriter, "write", full)
    assert main(tiny_run(tmp_path, "train.max_steps=2")) == 2
    line = _one_error_line(capsys)
    folder = tmp_path / "exp"
    # the event file, or its folder when the file's first write (as TensorBoard opens it) fails
    event_file = "/events\\.out\\.tfevents\\.[^/ ]+" if records else ""
    assert re.fullmatch(f"error: {re.escape(str(folder))}{event_file}: No space left on device", line), line
    _no_partial_files(tmp_path / "exp")


def test_a_run_on_a_real_file_system_that_fills_up_ends_with_one_error(tmp_path, capsys):
    """exp_dir on a 512 KiB tmpfs (needs root; skipped where mounting is not allowed): the run's
    files fill it within the first epoch. Whichever write fails names its file; nothing is left half-written."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        exp = disk / "exp"
        args = [str(RECIPE), *TINY, f"exp_dir={exp}", f"data.dev=[{tiny_valid(tmp_path)}]", "train.max_epochs=3"]
        assert main(args) == 2
        line = _one_error_line(capsys)
        assert re.fullmatch(f"error: {re.escape(str(exp))}/\\S+: No space left on device", line), line
        _no_partial_files(exp)
        for checkpoint in exp.glob("*.pt"):
            load_checkpoint(checkpoint)  # whatever was written is whole
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_evaluation_reads_a_folder_in_use_and_a_full_disk_is_one_error(tmp_path, reference, monkeypatch, capsys):
    from asr.cli.evaluate import main as evaluate
    from asr.training.runlock import RunLock

    _, _, exp = reference
    lock = RunLock(exp)
    lock.acquire()  # a run is going on in that folder: reading it is fine
    try:
        dev = tiny_valid(tmp_path)
        assert evaluate(["--checkpoint", str(exp / "epoch1.pt"), "--data", str(dev), "--out", str(tmp_path / "ok")]) == 0
        assert json.loads((tmp_path / "ok" / "wer.json").read_text())["utterances"] == 6
        capsys.readouterr()
        fail_writes_to(monkeypatch, "alignment.txt", errno.ENOSPC)
        out = tmp_path / "full"
        assert evaluate(["--checkpoint", str(exp / "epoch1.pt"), "--data", str(dev), "--out", str(out)]) == 2
        assert _one_error_line(capsys) == f"error: {out / 'alignment.txt'}: No space left on device"
        # whole files, no partial one: the evaluation's record, then the results written before the failure
        assert sorted(p.name for p in out.iterdir()) == ["evaluation.json", "hyp.txt", "ref.txt"]
        json.loads((out / "evaluation.json").read_text())
    finally:
        lock.release()
