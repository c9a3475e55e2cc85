"""The alignment bootstraps and convergence diagnostics on tiny runs (issue 48), and a validation that
never ends a run (issue 49): every new recipe option trains end to end here."""

import shutil

import pytest
import yaml

from helpers import tiny_run, tiny_valid

from asr.checkpoints.io import load_checkpoint
from asr.cli.train import main
from asr.studies.curves import read_scalars

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_demo_corpus")]  # every test here trains

# Every schedule target, a plateau learning rate, CTC-assisted validation decoding, and a metric where
# higher is better as the one that ranks the epochs.
BOOTSTRAPS = [
    "train.max_epochs=2",
    "train.lr=0.003",
    "train.scheduler.kind=plateau",
    "train.scheduler.warmup_steps=2",
    "train.scheduler.plateau_metric=valid_attention_spearman",
    "train.best_metric=valid_attention_spearman",
    "train.valid_ctc_weight=0.3",
    "train.valid_max_len_ratio=0.5",
    "model.attention.scaling=2.0",
    "features.spec_augment.enabled=true",
    "train.schedules={ctc_weight: {points: [[0, 1.0], [1, 0.6], [4, 0.3]]}, "
    "label_smoothing: {points: [[0, 0.0], [4, 0.1]]}, "
    "sampling_probability: {points: [[0, 0.0], [3, 0.2]], interpolation: linear}, "
    "attention_prior: {points: [[0, 2.0], [5, 0.0]], interpolation: linear}, "
    "spec_augment: {points: [[0, 0.0], [4, 1.0]]}, "
    "max_duration: {points: [[0, 1.2], [3, 100.0]]}, "
    "listener_layers: {points: [[0, 1], [3, 2]]}}",
]


def test_every_bootstrap_and_diagnostic_on_a_tiny_run(tmp_path):
    assert main(tiny_run(tmp_path, *BOOTSTRAPS)) == 0
    exp = tmp_path / "exp"
    scalars = read_scalars(exp)
    values = {tag: {step: value for _, step, value in rows} for tag, rows in scalars.items()}
    # each update logs the values it was made with
    assert values["train/ctc_weight"][1] == 1.0  # update 1: the listener alone (a CTC-only phase)
    assert values["train/ctc_weight"][2] == pytest.approx(0.6) and values["train/ctc_weight"][5] == pytest.approx(0.3)
    assert values["train/label_smoothing"][4] == 0.0 and values["train/label_smoothing"][5] == pytest.approx(0.1)
    assert values["train/sampling_probability"][3] == pytest.approx(0.2 * 2 / 3)
    assert values["train/attention_prior"][1] == pytest.approx(2.0) and values["train/attention_prior"][6] == 0.0
    assert values["train/spec_augment"][1] == 0.0 and values["train/max_duration"][1] == pytest.approx(1.2)
    assert values["train/listener_layers"][1] == 1.0 and values["train/listener_layers"][4] == 2.0
    assert int(load_checkpoint(exp / "last.pt")["model"]["listener.active_layers"]) == 2
    for name in ("loss", "wer", "cer", "ctc_cer", "attention_loss", "loss_without_context",
                 "attention_spearman", "attention_at_end"):
        assert len(values[f"valid/{name}"]) == 2, name
    log = (exp / "train.log").read_text()
    assert "over the max_duration schedule's cap left out" in log  # the first epoch's long batches
    assert "ctc_cer" in log and "attention_spearman" in log
    recorded = yaml.safe_load((exp / "config.yaml").read_text())["train"]
    assert recorded["schedules"]["attention_prior"]["interpolation"] == "linear"
    best = load_checkpoint(next(exp.glob("best_epoch*.pt")))["training"]
    assert best["metric_name"] == "valid_attention_spearman" and best["higher_is_better"] is True
    last = load_checkpoint(exp / "last.pt")["training"]
    assert "decays" in last["scheduler"]["schedules"]["lr"]  # the plateau's state is kept to resume


def test_a_run_stopped_and_resumed_mid_epoch_plans_the_same_batches(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for folder in (straight, stopped):
        folder.mkdir()
    assert main(tiny_run(straight, *BOOTSTRAPS)) == 0
    args = tiny_run(stopped, *BOOTSTRAPS)
    assert main([*args, "train.max_steps=4"]) == 0
    assert load_checkpoint(stopped / "exp" / "last.pt")["training"]["progress"]["batch_in_epoch"] > 0  # mid-epoch
    assert main([*args, "--resume"]) == 0
    expected = load_checkpoint(straight / "exp" / "last.pt")
    got = load_checkpoint(stopped / "exp" / "last.pt")
    assert got["training"]["progress"]["step"] == expected["training"]["progress"]["step"]
    for key, weights in expected["model"].items():
        assert (weights == got["model"][key]).all(), key


def test_a_cap_on_decoded_utterances_below_half_a_dev_batch_still_scores_that_many(tmp_path):
    # issue 49: 20 dev utterances in one batch and valid_max_utterances=4 crashed at the end of the first epoch
    valid = tiny_valid(tmp_path / "dev20", count=20)
    args = tiny_run(tmp_path, "train.max_epochs=1", "data.max_frames_per_batch=50000", "train.valid_max_utterances=4")
    args = [a if not a.startswith("data.dev=") else f"data.dev=[{valid}]" for a in args]
    assert main(args) == 0
    values = read_scalars(tmp_path / "exp")
    assert len(values["valid/wer"]) == 1
    assert (tmp_path / "exp" / "epoch1.pt").is_file()


def test_a_dev_set_that_cannot_be_read_stops_the_run_with_its_epoch_saved(tmp_path, capsys):
    valid = tiny_valid(tmp_path / "broken", count=4)
    for flac in valid.rglob("*.flac"):  # cut mid-stream: the headers read, the audio does not
        data = flac.resolve().read_bytes()
        flac.unlink()
        flac.write_bytes(data[: len(data) // 3])
    args = [a if not a.startswith("data.dev=") else f"data.dev=[{valid}]"
            for a in tiny_run(tmp_path, "train.max_epochs=2")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "none of the 4 dev utterances could be read" in err and "Traceback" not in err
    assert (tmp_path / "exp" / "epoch1.pt").is_file() and (tmp_path / "exp" / "last.pt").is_file()
    # the dev set mended, --resume goes on from the saved epoch
    shutil.rmtree(valid)
    mended = tiny_valid(tmp_path / "mended", count=4)
    args = [a if not a.startswith("data.dev=") else f"data.dev=[{mended}]" for a in args]
    assert main([*args, "--resume"]) == 0
    assert load_checkpoint(tmp_path / "exp" / "last.pt")["training"]["progress"]["epoch"] == 2


def _rates(exp):
    return {step: value for _, step, value in read_scalars(exp)["train/lr"]}


def test_a_cooldown_brings_the_rate_down_over_the_last_share_of_the_runs_updates(tmp_path):
    args = tiny_run(tmp_path, "train.max_epochs=20", "train.max_steps=8", "train.lr=0.004",
                    "train.scheduler.kind=constant", "train.scheduler.cooldown=0.5", "train.scheduler.final_factor=0.25")
    assert main(args) == 0
    rates = _rates(tmp_path / "exp")
    assert sorted(rates) == list(range(1, 9))
    # update s of 8: the rate falls from the peak after update 4 to a quarter of it at update 8
    expected = {s: 0.004 * (1.0 if s <= 4 else 0.25 + 0.75 * (8 - s) / 4) for s in range(1, 9)}
    assert rates == pytest.approx(expected)


def fake_clock(monkeypatch, per_update: bool = False) -> None:
    """Give the trainer a clock that starts now and moves 2 s at every reading of it, or, ``per_update``,
    2 s at every optimizer update (so the readings between two updates, at an epoch's end, say, agree)."""
    import time as real_time

    import asr.training.step as step_module
    import asr.training.timing as timing_module

    class Clock:
        now = real_time.time()

        @classmethod
        def time(cls):
            if not per_update:
                cls.now += 2.0
            return cls.now

    monkeypatch.setattr(timing_module, "time", Clock)
    if per_update:
        update = step_module.TrainingStep.update

        def ticking(self, *args, **kwargs):
            Clock.now += 2.0
            return update(self, *args, **kwargs)

        monkeypatch.setattr(step_module.TrainingStep, "update", ticking)


def test_a_cooldown_follows_the_time_budget_when_the_clock_runs_out_first(tmp_path, monkeypatch):
    fake_clock(monkeypatch, per_update=True)
    args = tiny_run(tmp_path, "train.max_epochs=1000", "train.lr=0.004", "train.scheduler.kind=constant",
                    "train.scheduler.cooldown=0.5", "train.max_minutes=1")
    assert main(args) == 0
    exp = tmp_path / "exp"
    assert "train.max_minutes=1" in (exp / "train.log").read_text()
    rates = [value for _, value in sorted(_rates(exp).items())]
    # 1,000 planned epochs leave the planned updates' share near 0: only the clock can bring the rate down,
    # and it does, steadily, to near nothing by the last update
    assert rates[0] == pytest.approx(0.004)
    assert all(a >= b for a, b in zip(rates, rates[1:])) and rates[-1] < 0.004 * 0.3


def test_every_last_pt_carries_the_clock_as_of_its_writing(tmp_path, monkeypatch):
    """A run resumed from a checkpoint written between validations (train.save_every_steps, a stop signal,
    preemption) goes on from the time of that checkpoint. The clock used to be brought up to date only at
    validations, so such a resume restarted it at the last validation's time and gave the run the minutes
    since then a second time."""
    import asr.training.trainer as trainer_module

    fake_clock(monkeypatch)
    saved = []
    real_save = trainer_module.save_checkpoint

    def recording(path, payload):
        if payload.get("training"):
            saved.append((payload["training"]["progress"]["step"], payload["training"]["progress"]["seconds"]))
        return real_save(path, payload)

    monkeypatch.setattr(trainer_module, "save_checkpoint", recording)
    assert main(tiny_run(tmp_path, "train.max_steps=3", "train.save_every_steps=1")) == 0
    by_step = {}
    for step, seconds in saved:
        by_step.setdefault(step, []).append(seconds)
    # the saves after updates 1 and 2 come before any validation: their clocks are already running
    assert 0 < by_step[1][0] < by_step[2][0] < by_step[3][-1]
    clocks = [seconds for _, seconds in saved]
    assert all(later > earlier for earlier, later in zip(clocks, clocks[1:]))


def test_a_time_budget_ends_the_run_after_the_first_update_past_it_and_a_resume_trains_no_more(tmp_path):
    # train.max_minutes: the proof's "at most 90 minutes of wall time", and a CTC-only model given the same
    # 60 ns: spent before the first batch arrives, and the run still makes its one update
    args = tiny_run(tmp_path, "train.max_epochs=3", "train.max_minutes=0.000000001")
    assert main(args) == 0
    exp = tmp_path / "exp"
    progress = load_checkpoint(exp / "last.pt")["training"]["progress"]
    assert progress["step"] == 1 and progress["epoch"] == 0  # stopped inside the first epoch
    assert "train.max_minutes=1e-09" in (exp / "train.log").read_text()
    assert len(read_scalars(exp)["valid/loss"]) == 1  # validated where it stopped
    assert main([*args, "--resume"]) == 0
    assert load_checkpoint(exp / "last.pt")["training"]["progress"]["step"] == 1
