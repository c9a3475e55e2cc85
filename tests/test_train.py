"""The trainer end to end on real speech: experiment directory, checkpoints,
non-finite steps, exact resume after SIGKILL, DDP with gloo, recipe errors."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import LAS_RECIPE as RECIPE
from conftest import PROJECT_ROOT, TINY, subprocess_env, tiny_run, tiny_valid

from asr.checkpoint import load_checkpoint
from asr.cli.train import main
from asr.curves import read_scalars
from asr.experiment import load_experiment_config
from asr.schedulers import cosine_lambda
from asr.training import Trainer, TrainingError
from asr.training.data import make_loader

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_demo_corpus")]  # every test here trains


def overrides(tmp_path: Path, *extra: str) -> list[str]:
    return tiny_run(tmp_path, *extra)[1:]


def test_a_run_fills_the_experiment_directory(tmp_path):
    args = overrides(tmp_path, "train.max_epochs=2", "train.keep_best=1", "features.mvn=global")
    assert main([str(RECIPE), *args]) == 0
    exp = tmp_path / "exp"
    for name in ("config.yaml", "train.log", "last.pt", "epoch0.pt", "epoch1.pt"):
        assert (exp / name).is_file(), name
    assert len(list(exp.glob("best_epoch*.pt"))) == 1
    assert list((exp / "tensorboard").glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(exp / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "valid/loss", "valid/wer", "valid/cer"} <= tags
    assert [e.step for e in events.Scalars("valid/loss")] == [1, 2]
    # The optimizer steps and minutes at each validation, for curves against steps or time.
    ckpt_steps = [load_checkpoint(exp / f"epoch{e}.pt")["training"]["step"] for e in (0, 1)]
    assert [e.value for e in events.Scalars("valid/step")] == ckpt_steps and ckpt_steps[0] > 0
    minutes = [e.value for e in events.Scalars("valid/minutes")]
    assert 0 < minutes[0] < minutes[1]
    # The gradient norm per module group, before clipping, at the logged steps.
    groups = {tag for tag in tags if tag.startswith("grad_norm/")}
    assert groups == {"grad_norm/listener", "grad_norm/speller", "grad_norm/attention", "grad_norm/ctc"}
    total = events.Scalars("train/grad_norm")[0].value
    assert sum(events.Scalars(g)[0].value ** 2 for g in groups) == pytest.approx(total**2, rel=1e-4)
    # The attention of a few dev utterances, drawn over their features, at every validation,
    # and the last one as a picture in exp_dir.
    images = [tag for tag in events.Tags()["images"] if tag.startswith("alignment/")]
    assert len(images) == 3 and [e.step for e in events.Images(images[0])] == [1, 2]
    pictures = sorted(p.name for p in exp.glob("alignment_*.png"))
    assert pictures == sorted(f"alignment_{tag.split('/', 1)[1]}.png" for tag in images)
    # A checkpoint is self-contained: config, tokenizer and feature statistics travel with it.
    ckpt = load_checkpoint(exp / "last.pt")
    assert ckpt["config"]["model"]["type"] == "las"
    assert ckpt["features"]["stats"] is not None  # global MVN's statistics
    assert ckpt["tokenizer"] and ckpt["training"]["progress"]["epoch"] == 2


def test_a_second_run_in_the_same_directory_needs_resume(tmp_path):
    args = [str(RECIPE), *overrides(tmp_path, "train.max_steps=1")]
    assert main(args) == 0
    assert main(args) == 2  # refuses to overwrite without --resume


def test_unknown_config_key_is_an_error_naming_it(tmp_path, capsys):
    assert main([str(RECIPE), f"exp_dir={tmp_path}", "model.listener.hiden_size=3"]) == 2
    assert "model.listener.hiden_size" in capsys.readouterr().err


def test_a_nan_loss_skips_the_step_and_names_the_batch(tmp_path, caplog):
    config = load_experiment_config(RECIPE, overrides(tmp_path, "train.max_steps=2", "train.max_epochs=1"))
    trainer = Trainer(config)
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
    assert outcome.loss is None and "non-finite loss" in outcome.skipped
    trainer._skipped(outcome.skipped, first.ids)
    assert trainer.progress.step == steps_before and trainer.progress.nonfinite_in_a_row == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    assert first.ids[0] in caplog.text and "non-finite loss" in caplog.text


def test_too_many_nonfinite_steps_stop_the_run(tmp_path):
    config = load_experiment_config(RECIPE, overrides(tmp_path, "train.max_nonfinite_in_a_row=2"))
    trainer = Trainer(config)
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


def test_resume_after_sigkill_ends_with_the_same_weights(tmp_path):
    """Kill a run with SIGKILL mid-epoch, resume it, compare with an uninterrupted run."""
    common = TINY + [
        f"data.dev=[{tiny_valid(tmp_path)}]",
        "train.max_epochs=2",
        "train.save_every_steps=1",
        "model.listener.dropout=0.2",  # dropout and SpecAugment draw random numbers: resume must restore them
    ]
    reference = tmp_path / "reference"
    subprocess.run(_train_command(common + [f"exp_dir={reference}"]), check=True, env=subprocess_env(), capture_output=True)

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        _train_command(common + [f"exp_dir={killed}"]), env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        last = killed / "last.pt"
        if last.exists() and load_checkpoint(last)["training"]["progress"]["step"] >= 3:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    progress = load_checkpoint(killed / "last.pt")["training"]["progress"]
    assert progress["epoch"] < 2, "the run finished before it could be killed"
    subprocess.run(
        _train_command(common + [f"exp_dir={killed}", "--resume"]), check=True, env=subprocess_env(), capture_output=True
    )
    expected = load_checkpoint(reference / "last.pt")
    resumed = load_checkpoint(killed / "last.pt")
    assert resumed["training"]["progress"]["step"] == expected["training"]["progress"]["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name


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


@pytest.mark.parametrize("recipe", ["librispeech100.yaml", "librispeech100_transformer.yaml"])
def test_librispeech_recipes_start_on_librispeech_layout_data(tmp_path, recipe, librivox_mini):
    small = {
        "librispeech100.yaml": [
            "model.listener.hidden_size=16", "model.attention.dim=16", "model.speller.hidden_size=16",
            "model.speller.embedding_dim=16",
            "train.scheduler.warmup_steps=1",  # the recipe's cosine schedule needs more updates than its warmup
        ],
        "librispeech100_transformer.yaml": [
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
    metrics = [load_checkpoint(runs[n] / "epoch1.pt")["training"]["metric"] for n in ("plain", "dithered")]
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
    factor = cosine_lambda(warmup, total, final)
    # Logged after update s: the rate of the next update.
    assert [logged[s] for s in sorted(logged)] == pytest.approx([lr * factor(s) for s in sorted(logged)])
    assert logged[total - 1] == pytest.approx(lr * final)
