"""DropHead (asr/models/drophead.py) in the Transformer, its schedule, and the trainer driving it."""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import torch
import yaml
from helpers import tiny_transformer_run
from helpers import make_transformer as make_model
from helpers import teacher_forced
from helpers import transformer_batch as random_batch

from asr.cli.train import main as train_main
from asr.config import ConfigError, from_dict, to_dict
from asr.studies.curves import read_scalars
from asr.experiment import TrainConfig
from asr.models.drophead import drop_heads
from asr.models.las import LAS, LASConfig
from asr.models.transformer import MultiHeadAttention, TransformerConfig
from asr.training.schedules import SchedulerConfig, build_schedules, learning_rate, model_default_schedules
from asr.training import shapes
from asr.training.shapes import RunPlan, ScheduleConfig, build_shape
from asr.run import planned_updates

DROPHEAD = {"encoder": {"drophead": 0.5}, "decoder": {"drophead": 0.5}}


def test_drophead_rates_are_checked_and_named():
    for key in ("encoder", "decoder"):
        with pytest.raises(ConfigError, match=f"{key}.drophead"):
            from_dict(TransformerConfig, {key: {"drophead": 1.0}}, "model")
    from asr.experiment import experiment_config_from_dict

    for name in ("points", "vshap"):  # points has no scale for the peak to set
        with pytest.raises(ConfigError, match=rf"^model.drophead_schedule: '{name}' is not one of constant, cosine, "
                                              r".*vshape \(the schedule shapes with a scale") as err:
            experiment_config_from_dict({"model": {"type": "transformer", "drophead_schedule": name}})
        assert "\n" not in str(err.value)


def test_evaluation_is_bit_identical_to_a_model_without_drophead():
    plain, dropping = make_model(dropout=0.0), make_model(dropout=0.0, **DROPHEAD)
    dropping.load_state_dict(plain.state_dict())
    batch = random_batch([40, 31], [5, 3])
    plain.eval(), dropping.eval()
    rng = torch.get_rng_state()
    _, expected = teacher_forced(plain, *batch)
    _, got = teacher_forced(dropping, *batch)
    assert torch.equal(got, expected)
    assert torch.equal(torch.get_rng_state(), rng)  # nothing was drawn


def test_training_drops_heads_in_every_attention_of_both_stacks():
    plain, dropping = make_model(dropout=0.0), make_model(dropout=0.0, **DROPHEAD)
    dropping.load_state_dict(plain.state_dict())
    attentions = [m for m in dropping.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attentions) == 2 + 2 * 2  # encoder self; decoder self and cross, two layers each
    assert all(m.drophead == 0.5 for m in attentions)
    plain.train(), dropping.train()
    batch = random_batch([40, 31], [5, 3])
    torch.manual_seed(3)
    _, expected = teacher_forced(plain, *batch)
    torch.manual_seed(3)
    _, got = teacher_forced(dropping, *batch)
    assert not torch.allclose(got, expected, atol=1e-3)


def _heads(batch: int, heads: int = 4, length: int = 3, dim: int = 2) -> torch.Tensor:
    """(B, H, L, D/H): every example the same, head h holding values around h + 1."""
    one = torch.arange(1, heads + 1.0)[:, None, None] + 0.1 * torch.randn(heads, length, dim)
    return one.expand(batch, heads, length, dim).clone()


def test_whole_heads_are_dropped_per_example_and_the_rest_scaled_by_heads_over_kept():
    torch.manual_seed(0)
    heads = _heads(batch=64)
    dropped = drop_heads(heads, 0.5)
    scale = (dropped / heads)[..., 0, 0]  # (B, H): one factor per example and head...
    assert torch.allclose(dropped, heads * scale[:, :, None, None])  # ...for all its positions and dimensions
    kept = (scale > 0).sum(dim=1)
    assert kept.min() >= 1
    assert torch.allclose(scale[scale > 0], (4 / kept[:, None].float()).expand_as(scale)[scale > 0])
    patterns = {tuple(row.tolist()) for row in scale > 0}
    assert len(patterns) > 4  # examples of one batch get different masks


def test_an_example_that_would_lose_every_head_keeps_them_all():
    torch.manual_seed(0)
    heads = _heads(batch=200)
    dropped = drop_heads(heads, 0.99)
    unchanged = (dropped == heads).flatten(1).all(dim=1)
    assert unchanged.sum() > 150  # 0.99 ** 4 of them lose every draw
    assert torch.equal(drop_heads(heads, 0.0), heads)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_the_expected_attention_output_is_preserved(rate):
    """The mean over 20,000 examples' masks is within 5 standard errors of the undropped output
    (without the H/K rescaling it would be (1 - rate) times it)."""
    torch.manual_seed(1)
    attention = MultiHeadAttention(d_model=16, heads=4, dropout=0.0, drophead=rate)
    x = torch.randn(1, 5, 16).expand(20_000, 5, 16)
    keys, values = attention.project_kv(x)
    with torch.no_grad():
        attention.eval()
        expected = attention(x[:1], keys[:1], values[:1], None)[0]
        attention.train()
        draws = attention(x, keys, values, None) - attention.out.bias
    mean, error = draws.mean(0), draws.std(0) / math.sqrt(len(draws))
    assert ((mean - (expected - attention.out.bias)).abs() < 5 * error + 1e-6).all()
    assert not ((mean - (1 - rate) * (expected - attention.out.bias)).abs() < 5 * error).all()


def _old_scheduled_rate(peak: float, schedule: str, step: int, total_steps: int, warmup_steps: int) -> float:
    """The DropHead rate as asr/models/drophead.py computed it before it became a schedule shape: the
    reference the shapes must equal bit for bit."""
    if schedule == "constant" or peak == 0.0:
        return peak
    if step < warmup_steps:
        return peak * (1.0 - step / warmup_steps)
    rise = max(total_steps - warmup_steps, 1)
    return peak * min(1.0, (step - warmup_steps) / rise)


def _rate(peak, schedule, total, warmup):
    """``model.drophead_schedule`` mapped onto its shape, as a run builds it."""
    return build_shape(from_dict(ScheduleConfig, {"shape": schedule, "scale": peak}),
                       RunPlan(total_updates=total, warmup_steps=warmup)).value


def test_vshape_schedule_falls_over_the_warmup_and_rises_back_by_the_end():
    rate = _rate(0.2, "vshape", total=1000, warmup=200)
    assert rate(0) == 0.2
    assert rate(100) == pytest.approx(0.1)
    assert rate(200) == 0.0
    assert rate(600) == pytest.approx(0.1)
    assert rate(1000) == pytest.approx(0.2)
    assert rate(1500) == pytest.approx(0.2)  # past the plan (a resumed run with more epochs): the peak
    assert [_rate(0.2, "constant", 1000, 200)(s) for s in (0, 200, 1000)] == [0.2, 0.2, 0.2]
    assert _rate(0.2, "vshape", 1000, 0)(0) == 0.0  # without warmup it only rises
    assert _rate(0.2, "vshape", 1000, 0)(500) == pytest.approx(0.1)


@pytest.mark.parametrize("schedule", ["vshape", "constant"])
@pytest.mark.parametrize("peak, total, warmup", [(0.2, 1000, 200), (0.1, 37, 0), (0.3, 50, 50), (0.0, 100, 10),
                                                 (0.15, 20, 30)])
def test_drophead_schedules_as_shapes_give_the_old_rates_bit_for_bit(schedule, peak, total, warmup):
    rate = _rate(peak, schedule, total, warmup)
    steps = list(range(2 * total + warmup + 2))
    assert [rate(s) for s in steps] == [_old_scheduled_rate(peak, schedule, s, total, warmup) for s in steps]


def _schedules(model, total=1000, scheduler=None, schedules=None):
    scheduler = scheduler or SchedulerConfig(kind="noam", warmup_steps=200)
    run = RunPlan(total_updates=total, d_model=16, warmup_steps=scheduler.warmup_steps)
    return build_schedules(schedules or {}, learning_rate(1.0, scheduler, run), model, None, run)


def test_the_model_moves_every_attention_to_its_stacks_rate():
    model = make_model(encoder={"drophead": 0.2}, decoder={"drophead": 0.1})
    assert {"drophead_encoder", "drophead_decoder"} <= set(model.scheduled())
    assert not {"drophead_encoder", "drophead_decoder"} & set(LAS(LASConfig(), 10, 8).scheduled())
    rates = _schedules(model).apply(100)
    assert {k: v for k, v in rates.items() if k != "lr"} == pytest.approx({"drophead_encoder": 0.1, "drophead_decoder": 0.05})
    assert {m.drophead for m in model.encoder.modules() if isinstance(m, MultiHeadAttention)} == {rates["drophead_encoder"]}
    assert {m.drophead for m in model.decoder.modules() if isinstance(m, MultiHeadAttention)} == {rates["drophead_decoder"]}
    assert set(_schedules(make_model()).apply(100)) == {"lr"}  # nothing to schedule, nothing logged
    assert model_default_schedules(make_model(encoder={"drophead": 0.2}, drophead_schedule="constant")) == {
        "drophead_encoder": from_dict(ScheduleConfig, {"shape": "constant", "scale": 0.2})}


def test_a_recipes_drophead_schedule_of_any_shape_replaces_the_models_own():
    model = make_model(encoder={"drophead": 0.2}, decoder={"drophead": 0.1})
    cosine = from_dict(ScheduleConfig, {"shape": "cosine", "scale": 0.4}, "train.schedules.drophead_decoder")
    schedules = _schedules(model, total=100, schedules={"drophead_decoder": cosine})
    assert schedules.apply(0)["drophead_decoder"] == pytest.approx(0.4, rel=1e-3)
    assert schedules.apply(99)["drophead_decoder"] == pytest.approx(0.0)
    assert schedules.apply(0)["drophead_encoder"] == 0.2  # the model's vshape, at its peak at the start
    assert {m.drophead for m in model.decoder.modules() if isinstance(m, MultiHeadAttention)} == {
        schedules.apply(0)["drophead_decoder"]}


def test_at_rate_zero_training_is_exactly_training_without_drophead():
    plain, dropping = make_model(), make_model(**DROPHEAD)
    dropping.load_state_dict(plain.state_dict())
    _schedules(dropping, total=1000).apply(200)  # the end of the warmup: rate 0
    plain.train(), dropping.train()
    batch = random_batch([40, 31], [5, 3])
    torch.manual_seed(3)
    expected = plain(*batch).loss
    torch.manual_seed(3)
    assert torch.equal(dropping(*batch).loss, expected)


def test_planned_updates_count_epochs_of_accumulated_batches_or_max_steps():
    assert planned_updates(TrainConfig(max_epochs=3, accum_grad=2), batches_per_epoch=5) == 9
    assert planned_updates(TrainConfig(max_epochs=3, max_steps=4), batches_per_epoch=5) == 4


@pytest.mark.slow
def test_drophead_and_layerdrop_train_from_the_command_line_and_log_the_schedule(tmp_path):
    peak, warmup = 0.2, 4
    assert train_main(tiny_transformer_run(
        tmp_path, "train.max_epochs=3", "data.max_frames_per_batch=600", f"train.scheduler.warmup_steps={warmup}",
        f"model.encoder.drophead={peak}", "model.decoder.drophead=0.1",
        "model.encoder.layerdrop=0.2", "model.decoder.layerdrop=0.2",
    )) == 0
    scalars = read_scalars(tmp_path / "exp")
    logged = {step: value for _, step, value in scalars["train/drophead_encoder"]}
    total = max(step for _, step, _ in scalars["train/loss"])
    assert sorted(logged) == list(range(1, total + 1)) and total > 2 * warmup
    # Logged after update s: the rate that update was made with, after s - 1 completed ones.
    for step, value in logged.items():
        assert value == pytest.approx(_old_scheduled_rate(peak, "vshape", step - 1, total, warmup))
    assert logged[1] == pytest.approx(peak) and logged[warmup + 1] == 0.0
    assert logged[total] == pytest.approx(peak * (total - 1 - warmup) / (total - warmup))
    assert {step: value for _, step, value in scalars["train/drophead_decoder"]}[1] == pytest.approx(0.1)


# ---------------------------------------------------------------- model.drophead_schedule: any shape with a scale

RECIPES = sorted(Path(__file__).resolve().parent.parent.glob("recipes/*.yaml"))
VARIANTS = sorted(Path(__file__).resolve().parent.parent.glob("recipes/variants/*.yaml"))


def _recipe_runs():
    """Every recipe, and every recipe with each variant of the variant files (their own recipe)."""
    runs = [(recipe, []) for recipe in RECIPES]
    for path in VARIANTS:
        variants = yaml.safe_load(path.read_text())
        recipe = next(r for r in RECIPES if f"recipes/{r.name}" in path.read_text())
        runs += [(recipe, list(overrides)) for overrides in variants.values()]
    return runs


@pytest.mark.parametrize("recipe, variant", _recipe_runs(),
                         ids=lambda v: v.stem if isinstance(v, Path) else "+".join(v)[:40] or "as-is")
def test_every_recipe_gives_the_old_drophead_rate_at_every_update(recipe, variant):
    """As each recipe (and variant) is, with DropHead turned on, and with each of the earlier schedules: the
    rates the run applies at every update are the earlier code's (_old_scheduled_rate) bit for bit."""
    from asr.experiment import load_experiment_config
    from asr.models.transformer import Transformer
    from asr.run import build_run_schedules
    from asr.training.schedules import warmup_updates

    for schedule in (None, "vshape", "constant"):
        config = load_experiment_config(recipe, variant)
        if config.model.type != "transformer":  # DropHead is the Transformer's: no rate before or now
            assert not hasattr(config.model, "drophead_schedule")
            continue
        extra = ["model.encoder.drophead=0.2", "model.decoder.drophead=0.1"]
        config = load_experiment_config(recipe, variant + extra + ([f"model.drophead_schedule={schedule}"] if schedule else []))
        model = Transformer(config.model, 13, 40, pad_id=0, sos_id=1, eos_id=2)
        schedules = build_run_schedules(config, model, None, batches_per_epoch=400)
        total = planned_updates(config.train, 400)
        warmup = warmup_updates(config.train.scheduler)
        assert warmup > 0  # the fall over the warmup is tested, and (where total > warmup) the rise
        steps = range(total + 50)
        for name, peak in (("drophead_encoder", 0.2), ("drophead_decoder", 0.1)):
            expected = [_old_scheduled_rate(peak, schedule or "vshape", s, total, warmup) for s in steps]
            assert [schedules.schedules[name].value(s) for s in steps] == expected


@dataclass
class _HalvingConfig(shapes.ScheduleConfig):
    scale: float = 1.0  # the value at the first update
    every: int = 10     # updates between halvings
    shape: Literal["halving"] = "halving"

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")

    def extremes(self):
        return 0.0, self.scale


class _Halving(shapes.Shape):
    def __init__(self, config: _HalvingConfig, run: RunPlan):
        self.scale, self.every = config.scale, config.every

    def value(self, step):
        return self.scale * 0.5 ** (step // self.every)


@dataclass
class _NeedsOptionsConfig(shapes.ScheduleConfig):
    scale: float                # no default: a recipe must give it
    shape: Literal["needs_options"] = "needs_options"


@pytest.fixture
def outside_shapes(monkeypatch):
    monkeypatch.setattr(shapes, "_SHAPES", dict(shapes._SHAPES))  # the registry as it was, after the test
    shapes.register_shape("halving", _HalvingConfig, _Halving)
    shapes.register_shape("needs_options", _NeedsOptionsConfig, _Halving)


def test_a_shape_registered_from_outside_drives_the_drophead_rate(outside_shapes):
    model = make_model(encoder={"drophead": 0.4}, decoder={"drophead": 0.1}, drophead_schedule="halving")
    written = to_dict(model.config)
    assert written["drophead_schedule"] == "halving"
    assert from_dict(TransformerConfig, written, "model") == model.config  # config.yaml reads back
    schedules = _schedules(model, total=100)
    for step in (0, 9, 10, 35, 99):
        rates = schedules.apply(step)
        assert rates["drophead_encoder"] == 0.4 * 0.5 ** (step // 10)
        assert rates["drophead_decoder"] == 0.1 * 0.5 ** (step // 10)
        assert {m.drophead for m in model.encoder.modules() if isinstance(m, MultiHeadAttention)} == {
            rates["drophead_encoder"]}


def test_a_shape_that_cannot_run_at_its_defaults_is_one_line_naming_the_key(outside_shapes):
    with pytest.raises(ConfigError, match=r"^model.drophead_schedule: the 'needs_options' shape does not run at its "
                                          r"default options \(.*\); give it with its options in "
                                          r"train.schedules instead") as err:
        from asr.experiment import experiment_config_from_dict

        experiment_config_from_dict({"model": {"type": "transformer", "drophead_schedule": "needs_options"}})
    assert "\n" not in str(err.value)


def test_every_shape_with_a_scale_moves_the_rate_as_train_schedules_does_with_that_scale():
    """model.drophead_schedule: cosine is train.schedules.drophead_encoder: {shape: cosine, scale: peak}."""
    for name in ("cosine", "linear_warmup", "inverse_sqrt", "constant", "vshape"):
        model = make_model(encoder={"drophead": 0.3}, drophead_schedule=name)
        own = _schedules(model, total=500)
        given = _schedules(make_model(encoder={"drophead": 0.3}), total=500, schedules={
            "drophead_encoder": from_dict(ScheduleConfig, {"shape": name, "scale": 0.3})})
        steps = range(0, 600, 7)
        assert [own.apply(s)["drophead_encoder"] for s in steps] == [given.apply(s)["drophead_encoder"] for s in steps]
