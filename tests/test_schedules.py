"""Schedules (asr/training/schedules.py) and the epoch plan they drive (asr/training/plan.py)."""

import math
import pickle

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.experiment import TrainConfig, load_experiment_config
from asr.training.plan import PlannedIndex, plan_epoch
from asr.training.schedules import SchedulerConfig, ScheduleSet, build_schedules, learning_rate
from asr.training.shapes import Points, PointsConfig, RunPlan, cooldown_factor, run_spent
from helpers import LAS_RECIPE


def piecewise(points, interpolation="hold"):
    return Points(PointsConfig(points=points, interpolation=interpolation))


def LearningRateSchedule(lr, config, d_model, total_updates, higher_is_better=None, spent=None):  # noqa: N802
    """The learning rate as the trainer builds it (asr.training.schedules.run_schedules)."""
    return learning_rate(lr, config, RunPlan(total_updates=total_updates, d_model=d_model, spent=spent,
                                             higher_is_better=higher_is_better))


def test_held_points_change_value_exactly_at_their_update():
    schedule = piecewise([[0, 0.0], [100, 1.0], [300, 0.5]])
    assert [schedule.value(s) for s in (0, 99, 100, 299, 300, 10**6)] == [0.0, 0.0, 1.0, 1.0, 0.5, 0.5]


def test_linear_points_interpolate_and_hold_outside_them():
    schedule = piecewise([[10, 1.0], [20, 0.0]], "linear")
    assert schedule.value(0) == 1.0 and schedule.value(10) == 1.0
    assert schedule.value(15) == pytest.approx(0.5)
    assert schedule.value(19) == pytest.approx(0.1)
    assert schedule.value(20) == 0.0 and schedule.value(1000) == 0.0


@pytest.mark.parametrize("points, message", [
    ([], "at least one"),
    ([[10, 1.0], [5, 0.0]], "increasing"),
    ([[0, 1.0, 2.0]], "each point"),
    ([[-1, 1.0]], ">= 0"),
    ([[0, 1.0], [float("nan"), 0.5]], "finite"),  # .nan passed the order check (issue 81)
    ([[0, 1.0], [float("inf"), 0.5]], "finite"),
])
def test_malformed_points_are_refused_naming_the_key(points, message):
    with pytest.raises(ConfigError, match=message) as err:
        from_dict(TrainConfig, {"schedules": {"ctc_weight": {"points": points}}}, "train")
    assert "train.schedules.ctc_weight" in str(err.value)


def test_a_value_out_of_range_or_an_unknown_target_is_refused_from_the_recipe():
    with pytest.raises(ConfigError, match=r"train.schedules.ctc_weight: value 1.5 at update 5.0 is outside \[0.0, 1.0\]"):
        load_experiment_config(LAS_RECIPE, ["train.schedules={ctc_weight: {points: [[0, 0.5], [5, 1.5]]}}"])
    with pytest.raises(ConfigError, match=r"train.schedules.ctc_weight: the last value is 1.0: .* must end below it"):
        load_experiment_config(LAS_RECIPE, ["train.schedules={ctc_weight: {points: [[0, 0.5], [5, 1.0]]}}"])
    load_experiment_config(LAS_RECIPE, ["train.schedules={ctc_weight: {points: [[0, 1.0], [5, 0.5]]}}"])  # a CTC-only phase
    with pytest.raises(ConfigError, match="train.schedules.ctc_wieght: no such schedule target"):
        load_experiment_config(LAS_RECIPE, ["train.schedules={ctc_wieght: {points: [[0, 0.5]]}}"])


class _Model:
    def __init__(self, offered):
        self.offered, self.set = offered, {}

    def scheduled(self):
        return dict(self.offered)

    def set_scheduled(self, name, value):
        self.set[name] = value


def _optimizer(lr=1.0):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_the_set_drives_the_optimizer_and_the_model_once_per_update():
    model, optimizer = _Model({"ctc_weight": 0.3}), _optimizer()
    lr = LearningRateSchedule(0.01, SchedulerConfig(kind="linear_warmup", warmup_steps=4), None, None)
    schedules = build_schedules({"ctc_weight": PointsConfig([[0, 0.5], [2, 0.3]])}, lr, model, optimizer)
    for step in range(6):
        values = schedules.apply(step)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * min((step + 1) / 4, 1.0))
        assert values["lr"] == optimizer.param_groups[0]["lr"]
        assert model.set["ctc_weight"] == values["ctc_weight"] == (0.5 if step < 2 else 0.3)


def test_a_model_target_the_model_does_not_offer_is_a_config_error_naming_it():
    lr = LearningRateSchedule(0.01, SchedulerConfig(kind="constant"), None, None)
    with pytest.raises(ConfigError, match="train.schedules.ctc_weight: the model .* has no 'ctc_weight'"):
        build_schedules({"ctc_weight": PointsConfig([[0, 0.5]])}, lr, _Model({"label_smoothing": 0.1}), _optimizer())


def test_null_removes_a_recipes_schedule_and_the_value_it_moved_then_holds():
    recipe = LAS_RECIPE.parent / "rehearsal_las.yaml"
    full = load_experiment_config(recipe, [])
    assert {"ctc_weight", "attention_prior"} <= set(full.train.schedules)
    ablated = load_experiment_config(recipe, ["train.schedules.ctc_weight=null"])
    assert set(ablated.train.schedules) == set(full.train.schedules) - {"ctc_weight"}
    assert ablated.train.schedules["attention_prior"] == full.train.schedules["attention_prior"]
    lr = LearningRateSchedule(0.01, SchedulerConfig(kind="constant"), None, None)
    offered = {"ctc_weight": ablated.model.ctc_weight, "attention_prior": 0.0, "label_smoothing": 0.1}
    model = _Model(offered)
    values = build_schedules(ablated.train.schedules, lr, model, _optimizer()).apply(0)
    assert "ctc_weight" not in values and "ctc_weight" not in model.set  # the recipe's 0.5 is left as it is
    model = _Model(offered)
    assert build_schedules(full.train.schedules, lr, model, _optimizer()).apply(0)["ctc_weight"] == 1.0
    assert model.set["ctc_weight"] == 1.0


def _plateau(**options):
    config = SchedulerConfig(kind="plateau", warmup_steps=2, decay_factor=0.5, min_factor=0.25, **options)
    return LearningRateSchedule(1.0, config, None, None, higher_is_better=lambda name: name == "valid_attention_spearman")


def test_plateau_warms_up_then_halves_after_each_plateau_down_to_its_floor():
    lr = _plateau(plateau_patience=2)
    assert [lr.value(s) for s in (0, 1, 5)] == [0.5, 1.0, 1.0]
    lines = [ScheduleSet({"lr": lr}).observe(10, {"valid_loss": v}) for v in (3.0, 2.0, 2.5, 2.1)]
    assert lines[:3] == [[], [], []] and lines[3][0].startswith("learning rate x0.5 (now 0.5): valid_loss")
    assert lr.value(11) == 0.5
    lr.observe(12, {"valid_loss": 2.0})
    assert lr.observe(13, {"valid_loss": 2.0}) is not None and lr.value(14) == 0.25
    lr.observe(15, {"valid_loss": 2.0})
    assert lr.observe(16, {"valid_loss": 2.0}) is None and lr.value(17) == 0.25  # min_factor


def test_plateau_follows_the_metrics_direction_and_its_state_survives_a_resume():
    lr = _plateau(plateau_metric="valid_attention_spearman")
    assert lr.observe(5, {"valid_attention_spearman": 0.5}) is None
    assert lr.observe(6, {"valid_attention_spearman": 0.7}) is None  # higher is better: an improvement
    assert lr.observe(7, {"valid_attention_spearman": 0.6}) is not None
    resumed = _plateau(plateau_metric="valid_attention_spearman")
    ScheduleSet({"lr": resumed}).load_state_dict(pickle.loads(pickle.dumps(ScheduleSet({"lr": lr}).state_dict())))
    assert resumed.value(8) == lr.value(8) == 0.5 and resumed.best == 0.7


def test_a_cooldown_falls_linearly_to_the_final_factor_over_the_last_share_of_the_planned_updates():
    config = SchedulerConfig(kind="linear_warmup", warmup_steps=5, cooldown=0.2, final_factor=0.1)
    lr = LearningRateSchedule(2.0, config, None, total_updates=100)
    # update number s = step + 1: the warmup ends at s = 5, the cooldown starts after s = 80, ends at s = 100
    assert lr.value(0) == pytest.approx(2.0 / 5) and lr.value(4) == pytest.approx(2.0)
    assert lr.value(79) == pytest.approx(2.0)
    assert lr.value(89) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))
    assert lr.value(99) == pytest.approx(2.0 * 0.1) and lr.value(500) == pytest.approx(2.0 * 0.1)
    rates = [lr.value(s) for s in range(79, 100)]
    assert all(a > b for a, b in zip(rates, rates[1:]))


def test_a_lambdalr_of_the_config_takes_the_cooldown_as_the_trainer_does():
    from asr.training.schedules import build_scheduler

    config = SchedulerConfig(kind="linear_warmup", warmup_steps=5, cooldown=0.3, final_factor=0.2)
    optimizer = _optimizer(lr=0.5)
    scheduler = build_scheduler(optimizer, config, total_updates=50)
    trainer = LearningRateSchedule(0.5, config, None, total_updates=50)
    for step in range(60):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(trainer.value(step)), step
        optimizer.step()
        scheduler.step()


def test_a_cooldown_follows_the_clock_when_the_time_budget_runs_out_before_the_planned_updates():
    minutes = [0.0]
    spent = run_spent(total_updates=10_000, max_minutes=60.0, minutes=lambda: minutes[0])
    config = SchedulerConfig(kind="constant", cooldown=0.25, final_factor=0.0)
    lr = LearningRateSchedule(1.0, config, None, total_updates=10_000, spent=spent)
    assert lr.value(10) == 1.0
    minutes[0] = 45.0  # three quarters of the budget: the cooldown begins
    assert lr.value(10) == pytest.approx(1.0)
    minutes[0] = 52.5
    assert lr.value(10) == pytest.approx(0.5)
    minutes[0] = 61.0  # past the budget (the run's last update)
    assert lr.value(10) == 0.0
    # the planned updates lead when they are further on than the clock
    minutes[0] = 0.0
    assert lr.value(8_749) == pytest.approx(cooldown_factor(0.875, 0.25, 0.0)) == pytest.approx(0.5)


def test_a_plateaus_decays_and_the_cooldown_multiply():
    config = SchedulerConfig(kind="plateau", warmup_steps=1, decay_factor=0.5, cooldown=0.5, final_factor=0.0)
    lr = LearningRateSchedule(1.0, config, None, total_updates=100)
    lr.observe(10, {"valid_loss": 1.0})
    lr.observe(20, {"valid_loss": 1.0})  # a plateau: halved
    assert lr.value(20) == 0.5 and lr.value(74) == pytest.approx(0.5 * 0.5)


@pytest.mark.parametrize("options, message", [
    (["train.scheduler.kind=cosine", "train.scheduler.cooldown=0.2"],
     r"unknown config key 'train.scheduler.cooldown' for the learning-rate kind 'cosine' .*the kinds with a cooldown"),
    (["train.scheduler.cooldown=1.0"], r"train.scheduler: cooldown must be within \[0, 1\)"),
])
def test_a_cooldown_the_schedule_cannot_take_is_refused_naming_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment_config(LAS_RECIPE.parent / "rehearsal_las.yaml", options)


def test_an_older_runs_lambdalr_state_restores_nothing():
    lr = _plateau()
    old = torch.optim.lr_scheduler.LambdaLR(_optimizer(), lambda s: 1.0).state_dict()
    ScheduleSet({"lr": lr}).load_state_dict(old)
    assert lr.decays == 0 and lr.value(10) == 1.0


def test_the_plan_leaves_out_batches_over_the_cap_at_their_expected_update():
    durations = [2.0, 3.0, 12.0, 4.0, 15.0, 1.0, 9.0]
    batches = [[0, 1], [2], [3], [4], [5], [6]]
    schedules = ScheduleSet({"max_duration": piecewise([[0, 5.0], [12, 10.0]])})
    plan = plan_epoch(batches, durations, first_step=10, accum_grad=1, schedules=schedules)
    # updates 10 and 11 admit [0, 1] and [3]; from 12 the cap is 10 s: [5] and [6] in, [4] (15 s) out
    assert plan.batches == [[0, 1], [3], [5], [6]]
    assert (plan.left_out_batches, plan.left_out_utterances) == (2, 2)
    # with two batches an update, the cap lifts two admitted batches later
    plan = plan_epoch(batches, durations, first_step=10, accum_grad=2, schedules=schedules)
    assert plan.batches == [[0, 1], [3], [5]]
    # no schedule: every batch, each index with SpecAugment's full share
    plan = plan_epoch(batches, durations, 0, 1, ScheduleSet({}))
    assert plan.batches == batches and all(i.spec_augment == 1.0 for b in plan.batches for i in b)


def test_planned_indices_carry_the_spec_augment_share_to_the_workers():
    schedules = ScheduleSet({"spec_augment": piecewise([[0, 0.0], [2, 1.0]])})
    plan = plan_epoch([[0], [1], [2], [3]], [1.0] * 4, 0, 1, schedules)
    assert [b[0].spec_augment for b in plan.batches] == [0.0, 0.0, 1.0, 1.0]
    index = pickle.loads(pickle.dumps(plan.batches[2][0]))
    assert isinstance(index, PlannedIndex) and index == 2 and index.spec_augment == 1.0
    assert [10, 20, 30, 40][index] == 30  # still an index


def test_spec_augment_share_zero_leaves_features_unmasked_and_one_changes_nothing():
    from features.config import FeatureConfig, SpecAugmentConfig
    from features.pipeline import FeaturePipeline

    pipeline = FeaturePipeline(FeatureConfig(num_mel_bins=23, mvn="utterance", dither=0.0,
                                             spec_augment=SpecAugmentConfig(enabled=True, freq_masks=2, time_masks=2)))
    wave = torch.randn(16000) * 0.1

    def features(share):
        generator = torch.Generator().manual_seed(3)
        return pipeline.from_waveform(wave, 16000, train=True, generator=generator, spec_augment=share)

    plain = pipeline.from_waveform(wave, 16000, train=False)
    assert torch.equal(features(0.0), plain)
    masked = features(1.0)
    assert not torch.equal(masked, plain)
    generator = torch.Generator().manual_seed(3)
    assert torch.equal(masked, pipeline.from_waveform(wave, 16000, train=True, generator=generator))  # the default
    shares = [not torch.equal(features_seeded(pipeline, wave, seed, 0.5), plain) for seed in range(40)]
    assert 8 <= sum(shares) <= 32  # about half the utterances masked


def features_seeded(pipeline, wave, seed, share):
    return pipeline.from_waveform(wave, 16000, train=True, generator=torch.Generator().manual_seed(seed),
                                  spec_augment=share)


def test_the_recipes_schedules_load_and_are_recorded_with_the_run_config():
    from asr.experiment import experiment_config_from_dict, experiment_config_to_dict

    config = load_experiment_config(LAS_RECIPE.parent / "rehearsal_las.yaml")
    assert set(config.train.schedules) == {"ctc_weight", "max_duration", "attention_prior", "spec_augment", "label_smoothing"}
    again = experiment_config_from_dict(experiment_config_to_dict(config))
    assert again.train.schedules == config.train.schedules
    prior = Points(config.train.schedules["attention_prior"])
    ctc = Points(config.train.schedules["ctc_weight"])
    assert ctc.value(0) == 1.0 and ctc.value(10**6) == config.model.ctc_weight < 1.0
    # the prior holds while the CTC-only phase rests the speller, and fades once the speller trains
    lifted = min(step for step, _ in config.train.schedules["ctc_weight"].points if ctc.value(step) < 1.0)
    faded = config.train.schedules["attention_prior"].points[-1][0]
    assert prior.value(0) == prior.value(lifted) == 1.0 and prior.value(faded) == 0.0
    assert 0.0 < prior.value((lifted + faded) // 2 + 100) < 1.0


@pytest.mark.parametrize("kind", ["las", "transformer"])
def test_a_ctc_weight_of_one_rests_the_decoder_and_decodes_by_ctc_until_the_schedule_lowers_it(kind):
    from helpers import las_batch, make_transformer, small_las_config, transformer_batch

    from asr.decoding import DecodingOptions, ctc_best_path, search
    from asr.models.las import LAS

    torch.manual_seed(0)
    if kind == "las":
        model, batch = LAS(small_las_config(ctc_weight=0.5), input_dim=6, vocab_size=10), las_batch()
        decoder = model.speller
    else:
        model, batch = make_transformer(ctc_weight=0.5), transformer_batch([40, 31, 22], [5, 3, 1])
        decoder = model.decoder
    assert "ctc_weight" in model.scheduled() and not model.ctc_only
    model.set_scheduled("ctc_weight", 1.0)
    assert model.ctc_only
    output = model(*batch)
    assert output.attention_loss is None and output.loss is output.ctc_loss
    output.loss.backward()
    assert all(p.grad is None for p in decoder.parameters())  # never run
    model.eval()
    with torch.no_grad():
        encoder = model.encode(batch[0], batch[1])
        assert search(model, encoder, DecodingOptions(beam_size=3)) == ctc_best_path(encoder, model.pad_id)
    model.set_scheduled("ctc_weight", 0.5)
    assert not model.ctc_only and model(*batch).attention_loss is not None


# ---------------------------------------------------------------- shapes by name, and one from outside


def test_a_schedule_names_any_shape_and_is_recorded_with_the_run_config():
    from asr.experiment import experiment_config_from_dict, experiment_config_to_dict
    from asr.training.shapes import CosineConfig

    config = load_experiment_config(LAS_RECIPE.parent / "rehearsal_las.yaml", [
        "train.schedules.label_smoothing={shape: cosine, scale: 0.1, final_factor: 0.2}"])
    smoothing = config.train.schedules["label_smoothing"]
    assert smoothing == CosineConfig(scale=0.1, final_factor=0.2)
    again = experiment_config_from_dict(experiment_config_to_dict(config))
    assert again.train.schedules == config.train.schedules  # config.yaml reads back as the same shapes
    model = _Model({"label_smoothing": 0.1})
    schedules = build_schedules({"label_smoothing": smoothing}, None, model, _optimizer(), RunPlan(total_updates=101))
    values = [schedules.apply(step)["label_smoothing"] for step in range(0, 101, 25)]
    assert values[0] < 0.1 and values[-1] == pytest.approx(0.02) and values == sorted(values, reverse=True)
    assert model.set["label_smoothing"] == values[-1]


@pytest.mark.parametrize("schedule, message", [
    ("{shape: cosin}", r"train.schedules.label_smoothing.shape: 'cosin' is not one of .*cosine"),
    ("{shape: cosine, points: [[0, 1]]}", "unknown config key 'train.schedules.label_smoothing.points'"),
    ("{shape: cosine, scale: 1.5}", r"train.schedules.label_smoothing: the cosine shape goes from 0.0 to 1.5, outside"),
    ("{shape: constant, cooldown: 1.0}", r"cooldown must be within \[0, 1\)"),
])
def test_a_shape_that_is_unknown_misspelt_or_out_of_range_is_refused_naming_the_key(schedule, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment_config(LAS_RECIPE.parent / "rehearsal_las.yaml", [f"train.schedules.label_smoothing={schedule}"])


# A shape written outside the package: the one class, its options, one registry line.

from dataclasses import dataclass  # noqa: E402
from typing import Literal  # noqa: E402

from asr.training import shapes  # noqa: E402


@dataclass
class HalvingConfig(shapes.ScheduleConfig):
    scale: float = 1.0   # the first value
    every: int = 10      # updates between two halvings
    shape: Literal["halving"] = "halving"

    def extremes(self):
        return 0.0, self.scale


class Halving(shapes.Shape):
    """Halves every ``every`` updates, and once more after each validation that did not improve
    (state, which a resume must keep)."""

    def __init__(self, config: HalvingConfig, run: shapes.RunPlan):
        self.config, self.extra, self.best = config, 0, math.inf

    def value(self, step):
        return self.config.scale * 0.5 ** (step // self.config.every + self.extra)

    def observe(self, step, metrics):
        if metrics["valid_loss"] < self.best:
            self.best = metrics["valid_loss"]
            return None
        self.extra += 1
        return "halved"

    def state_dict(self):
        return {"extra": self.extra, "best": self.best}

    def load_state_dict(self, state):
        self.extra, self.best = state["extra"], state["best"]


@pytest.fixture
def halving(monkeypatch):
    monkeypatch.setattr(shapes, "_SHAPES", dict(shapes._SHAPES))  # the registry as it was, after the test
    shapes.register_shape("halving", HalvingConfig, Halving)


def test_a_shape_registered_from_outside_drives_a_scheduled_value_from_the_recipe_and_resumes(halving):
    config = load_experiment_config(LAS_RECIPE.parent / "rehearsal_las.yaml", [
        "train.schedules.attention_prior={shape: halving, scale: 4.0, every: 3}"])
    assert config.train.schedules["attention_prior"] == HalvingConfig(scale=4.0, every=3)
    offered = {"attention_prior": 0.0, "ctc_weight": 0.5, "label_smoothing": 0.1}
    model = _Model(offered)
    schedules = build_schedules(config.train.schedules, None, model, _optimizer(), RunPlan(total_updates=50))
    assert [schedules.apply(step)["attention_prior"] for step in (0, 2, 3, 7)] == [4.0, 4.0, 2.0, 1.0]
    assert model.set["attention_prior"] == 1.0
    assert schedules.observe(8, {"valid_loss": 2.0}) == [] and schedules.observe(9, {"valid_loss": 2.5}) == ["attention_prior halved"]
    resumed = build_schedules(config.train.schedules, None, _Model(offered), _optimizer(), RunPlan(total_updates=50))
    resumed.load_state_dict(pickle.loads(pickle.dumps(schedules.state_dict())))
    assert [resumed.apply(s)["attention_prior"] for s in range(9, 30)] == [schedules.apply(s)["attention_prior"] for s in range(9, 30)]
    with pytest.raises(ConfigError, match="the halving shape goes from 0.0 to 3.0, outside"):
        load_experiment_config(LAS_RECIPE, ["train.schedules={ctc_weight: {shape: halving, scale: 3.0}}"])
