"""DropHead (asr/models/drophead.py) in the Transformer, its schedule, and the trainer driving it."""

import math

import pytest
import torch
from helpers import tiny_transformer_run
from helpers import make_transformer as make_model
from helpers import teacher_forced
from helpers import transformer_batch as random_batch

from asr.cli.train import main as train_main
from asr.config import ConfigError, from_dict
from asr.studies.curves import read_scalars
from asr.experiment import TrainConfig
from asr.models.drophead import drop_heads
from asr.models.las import LAS, LASConfig
from asr.models.transformer import MultiHeadAttention, TransformerConfig
from asr.training.schedules import SchedulerConfig, build_schedules, learning_rate, model_default_schedules
from asr.training.shapes import RunPlan, ScheduleConfig, build_shape
from asr.run import planned_updates

DROPHEAD = {"encoder": {"drophead": 0.5}, "decoder": {"drophead": 0.5}}


def test_drophead_rates_are_checked_and_named():
    for key in ("encoder", "decoder"):
        with pytest.raises(ConfigError, match=f"{key}.drophead"):
            from_dict(TransformerConfig, {key: {"drophead": 1.0}}, "model")
    with pytest.raises(ConfigError, match="model.drophead_schedule"):
        from_dict(TransformerConfig, {"drophead_schedule": "cosine"}, "model")


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
