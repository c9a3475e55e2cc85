"""The learning rate's shapes (asr/training/shapes.py) against the LambdaLR multipliers they replaced.

``_old_*`` below is the code of asr/schedulers.py and LearningRateSchedule before the learning rate,
the points and DropHead's rate became shapes of one vocabulary, kept here as the reference the shapes
must equal bit for bit, at every update, with and without a cooldown, and across a resume; ``_OLD_DEFAULTS``
is the single ``train.scheduler`` of those versions, whose config.yaml files must still read. Below them,
``train.scheduler.kind`` naming a shape registered from outside the package (issue 79).
"""

import copy
import math
import pickle
from types import SimpleNamespace

import pytest
import torch

from asr.config import ConfigError, from_dict, to_dict
from asr.training.schedules import SchedulerConfig, build_scheduler, learning_rate, learning_rate_kinds, warmup_updates
from asr.training.shapes import RunPlan, build_shape, run_spent, shape_config_class, shape_names
from helpers import LAS_RECIPE, tiny_run

# ---------------------------------------------------------------- the reference: the code before the shapes


def _old_noam(d_model, warmup_steps):
    return lambda step: d_model**-0.5 * min((step + 1) ** -0.5, (step + 1) * warmup_steps**-1.5)


def _old_inverse_sqrt(warmup_steps):
    return lambda step: min((step + 1) / warmup_steps, (warmup_steps / (step + 1)) ** 0.5)


def _old_linear_warmup(warmup_steps):
    return lambda step: min((step + 1) / warmup_steps, 1.0)


def _old_cosine(warmup_steps, total_updates, final_factor=0.0):
    def factor(step):
        s = step + 1
        if s <= warmup_steps:
            return s / warmup_steps
        done = min((s - warmup_steps) / (total_updates - warmup_steps), 1.0)
        return final_factor + (1.0 - final_factor) * 0.5 * (1.0 + math.cos(math.pi * done))

    return factor


def _old_lr_factor(config, d_model, total_updates):
    return {
        "noam": lambda: _old_noam(d_model, config.warmup_steps),
        "inverse_sqrt": lambda: _old_inverse_sqrt(config.warmup_steps),
        "linear_warmup": lambda: _old_linear_warmup(config.warmup_steps),
        "plateau": lambda: _old_linear_warmup(config.warmup_steps),
        "cosine": lambda: _old_cosine(config.warmup_steps, total_updates, config.final_factor),
        "constant": lambda: (lambda step: 1.0),
    }[config.kind]()


def _old_cooldown_factor(spent, cooldown, final_factor):
    left = 1.0 - spent
    if cooldown <= 0.0 or left >= cooldown:
        return 1.0
    return final_factor + (1.0 - final_factor) * max(left, 0.0) / cooldown


# train.scheduler before its kinds were shapes: one config with every kind's keys, at these defaults
_OLD_DEFAULTS = dict(kind="noam", warmup_steps=25000, final_factor=0.0, cooldown=0.0, plateau_metric="valid_loss",
                     plateau_patience=1, plateau_threshold=0.0, decay_factor=0.5, min_factor=0.01)


def _old_config(options):
    """The old single config of ``options``: every key, the unset ones at their old defaults."""
    return SimpleNamespace(**{**_OLD_DEFAULTS, **options})


def _read(options):
    """``train.scheduler: options`` as a recipe gives it."""
    return from_dict(SchedulerConfig, options, "train.scheduler")


class _OldLearningRateSchedule:
    def __init__(self, base_lr, options, d_model, total_updates, spent=None):
        config = _old_config(options)
        self.base_lr, self.config = base_lr, config
        self.factor = _old_lr_factor(config, d_model, total_updates)
        self.spent = spent or (lambda step: min((step + 1) / total_updates, 1.0))
        self.decays, self.best, self.without_improvement = 0, None, 0

    def value(self, step):
        config = self.config
        decay = max(config.decay_factor**self.decays, config.min_factor) if self.decays else 1.0
        cooldown = _old_cooldown_factor(self.spent(step), config.cooldown, config.final_factor) if config.cooldown else 1.0
        return self.base_lr * self.factor(step) * decay * cooldown

    def observe(self, step, metrics):
        config = self.config
        if config.kind != "plateau" or config.plateau_metric not in metrics:
            return None
        value = metrics[config.plateau_metric]
        if not math.isfinite(value):
            return None
        if self.best is None or value < self.best - config.plateau_threshold * abs(self.best):
            self.best, self.without_improvement = value, 0
            return None
        self.without_improvement += 1
        if self.without_improvement < config.plateau_patience or step < config.warmup_steps:
            return None
        if config.decay_factor**self.decays <= config.min_factor:
            return None
        self.decays += 1
        self.without_improvement = 0
        return "decayed"


# Every kind, with the options each takes, as recipes set them.
SETTINGS = [
    dict(kind="noam", warmup_steps=25),
    dict(kind="noam", warmup_steps=1),
    dict(kind="inverse_sqrt", warmup_steps=40),
    dict(kind="linear_warmup", warmup_steps=10),
    dict(kind="linear_warmup", warmup_steps=10, cooldown=0.3, final_factor=0.1),
    dict(kind="cosine", warmup_steps=7, final_factor=0.1),
    dict(kind="cosine", warmup_steps=1),
    dict(kind="constant", warmup_steps=0),
    dict(kind="constant", warmup_steps=500, cooldown=0.25),  # a constant rate ignores the warmup
    dict(kind="plateau", warmup_steps=5, decay_factor=0.5, min_factor=0.2, plateau_patience=2, cooldown=0.5),
]
TOTAL, D_MODEL = 300, 144
STEPS = list(range(0, 2 * TOTAL)) + [10**4, 10**6]
# validation losses heard at the end of each "epoch" of 30 updates
LOSSES = [3.0, 2.0, 2.1, 2.05, 1.9, 1.95, 1.95, 1.99, 1.8, 1.85, 1.9, 1.9]


@pytest.mark.parametrize("options", SETTINGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_every_scheduler_setting_gives_the_old_rates_bit_for_bit(options):
    config = _read(options)
    old = _OldLearningRateSchedule(0.7, options, D_MODEL, TOTAL)
    new = learning_rate(0.7, config, RunPlan(total_updates=TOTAL, d_model=D_MODEL))
    for epoch, loss in enumerate(LOSSES):
        steps = range(30 * epoch, 30 * epoch + 30)
        assert [new.value(s) for s in steps] == [old.value(s) for s in steps], epoch
        assert (new.observe(steps[-1], {"valid_loss": loss}) is None) == (old.observe(steps[-1], {"valid_loss": loss}) is None)
    assert [new.value(s) for s in STEPS] == [old.value(s) for s in STEPS]
    if options["kind"] == "plateau":
        assert old.decays >= 2  # the comparison saw the plateau decay, down to its floor


@pytest.mark.parametrize("options", [o for o in SETTINGS if o.get("cooldown")], ids=lambda o: o["kind"])
def test_a_cooldown_on_the_clock_gives_the_old_rates(options):
    minutes = [0.0]
    spent = run_spent(10_000, max_minutes=60.0, minutes=lambda: minutes[0])
    config = _read(options)
    old = _OldLearningRateSchedule(2.0, options, None, 10_000, spent=spent)
    new = learning_rate(2.0, config, RunPlan(total_updates=10_000, spent=spent))
    for now in (0.0, 30.0, 45.0, 50.0, 52.5, 59.9, 60.0, 75.0):
        minutes[0] = now
        assert [new.value(s) for s in (0, 10, 7_000, 9_999)] == [old.value(s) for s in (0, 10, 7_000, 9_999)]


def test_a_plateau_resumed_from_its_state_continues_as_the_run_that_was_not_interrupted():
    config = SchedulerConfig(kind="plateau", warmup_steps=3, plateau_patience=2, decay_factor=0.5, min_factor=0.1)
    run = RunPlan(total_updates=TOTAL)
    through, interrupted = learning_rate(1.0, config, run), learning_rate(1.0, config, run)
    for epoch, loss in enumerate(LOSSES[:6]):
        for lr in (through, interrupted):
            lr.observe(30 * epoch + 29, {"valid_loss": loss})
    resumed = learning_rate(1.0, config, run)
    resumed.load_state_dict(pickle.loads(pickle.dumps(interrupted.state_dict())))  # as last.pt keeps it
    assert resumed.state_dict() == through.state_dict() and through.state_dict()["decays"] == 1
    for epoch, loss in enumerate(LOSSES[6:], start=6):
        steps = range(30 * epoch, 30 * epoch + 30)
        assert [resumed.value(s) for s in steps] == [through.value(s) for s in steps]
        assert resumed.observe(steps[-1], {"valid_loss": loss}) == through.observe(steps[-1], {"valid_loss": loss})
    assert resumed.state_dict() == through.state_dict() and through.state_dict()["decays"] >= 2


def test_the_stateless_shapes_have_nothing_to_resume_and_an_old_lambdalr_state_changes_nothing():
    old_state = torch.optim.lr_scheduler.LambdaLR(_optimizer(), lambda s: 1.0).state_dict()
    for options in SETTINGS:
        lr = learning_rate(1.0, _read(options), RunPlan(total_updates=TOTAL, d_model=D_MODEL))
        before = [lr.value(s) for s in STEPS]
        lr.load_state_dict(old_state)
        assert [lr.value(s) for s in STEPS] == before
        if options["kind"] != "plateau":
            assert lr.state_dict() == {}


def test_every_lr_kind_is_a_shape_of_the_one_vocabulary_taking_the_options_it_declares():
    assert {o["kind"] for o in SETTINGS} | {"vshape"} <= set(learning_rate_kinds()) <= set(shape_names())
    assert "points" in shape_names() and "points" not in learning_rate_kinds()  # no scale for train.lr to set
    options = learning_rate(0.5, SchedulerConfig(kind="plateau", warmup_steps=9, decay_factor=0.3), RunPlan()).config
    assert (options.shape, options.scale, options.warmup_steps, options.decay_factor) == ("plateau", 0.5, 9, 0.3)
    assert not hasattr(shape_config_class("noam")(), "cooldown")  # noam has no flat phase to cool down from
    assert warmup_updates(_read(dict(kind="constant", warmup_steps=500))) == 0


def _optimizer(lr=1.0):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_noam_peaks_at_warmup_with_the_paper_value():
    d_model, warmup = 256, 100
    noam = build_shape(shape_config_class("noam")(warmup_steps=warmup), RunPlan(d_model=d_model))
    values = [noam.value(step) for step in range(1000)]
    peak_step = max(range(len(values)), key=values.__getitem__)
    assert peak_step == warmup - 1  # the w-th update, after w - 1 completed ones
    assert values[peak_step] == pytest.approx(d_model**-0.5 * warmup**-0.5)
    assert values[0] > 0  # the first update already moves the weights
    assert values[4 * warmup - 1] == pytest.approx(values[warmup - 1] / 2)  # decay as s^-0.5


def test_cosine_is_torchs_linear_warmup_then_cosine_annealing():
    lr, warmup, total, final = 0.5, 7, 60, 0.1
    optimizer = _optimizer(lr)
    reference = torch.optim.lr_scheduler.SequentialLR(optimizer, [
        torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup - 1),
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=final * lr),
    ], milestones=[warmup - 1])
    expected = []
    for _ in range(total):  # torch's cosine turns back up after T_max; ours holds
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step()
    cosine = learning_rate(lr, SchedulerConfig(kind="cosine", warmup_steps=warmup, final_factor=final),
                           RunPlan(total_updates=total))
    assert [cosine.value(step) for step in range(total)] == pytest.approx(expected, abs=1e-9)
    assert cosine.value(total) == cosine.value(10 * total) == pytest.approx(final * lr)


def test_build_scheduler_drives_the_optimizer_as_the_old_lambdalr_did():
    for options in SETTINGS:
        config = _read(options)
        new, old = _optimizer(2.0), _optimizer(2.0)
        scheduler = build_scheduler(new, config, d_model=16, total_updates=40)
        reference = torch.optim.lr_scheduler.LambdaLR(old, _OldLearningRateSchedule(1.0, options, 16, 40).value)
        for _ in range(50):
            assert new.param_groups[0]["lr"] == old.param_groups[0]["lr"]
            for optimizer, lr_scheduler in ((new, scheduler), (old, reference)):
                optimizer.step()
                lr_scheduler.step()


def test_bad_settings_are_rejected_with_the_key_named():
    with pytest.raises(ValueError, match="d_model"):
        build_scheduler(_optimizer(), SchedulerConfig(kind="noam"))
    with pytest.raises(ConfigError, match="^scheduler.kind: 'cosin' is not one of constant, cosine, "):
        from_dict(SchedulerConfig, {"kind": "cosin"}, "scheduler")
    with pytest.raises(ConfigError, match="final_factor"):
        from_dict(SchedulerConfig, {"kind": "cosine", "final_factor": 1.5}, "scheduler")
    with pytest.raises(ValueError, match="planned number of updates"):
        build_scheduler(_optimizer(), SchedulerConfig(kind="cosine"))
    with pytest.raises(ConfigError, match="warmup_steps"):
        from_dict(SchedulerConfig, {"kind": "inverse_sqrt", "warmup_steps": 0}, "scheduler")
    with pytest.raises(ConfigError, match="more updates than its warmup_steps"):
        learning_rate(1.0, SchedulerConfig(kind="cosine", warmup_steps=100), RunPlan(total_updates=100))


# ---------------------------------------------------------------- the keys of a kind, and what older runs wrote


@pytest.mark.parametrize("options", SETTINGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_an_old_runs_config_yaml_reads_as_its_kind_with_its_keys_and_the_old_rates(options):
    written = {**_OLD_DEFAULTS, **options}  # what a run of the single config wrote: every kind's keys
    config = _read(written)
    assert config == _read(options) and type(config) is not SchedulerConfig
    new = to_dict(config)
    own = set(new) - {"kind"}
    assert new == {key: written[key] for key in new}  # the kind's own keys keep their values
    assert own == {f for f in _OLD_DEFAULTS if hasattr(shape_config_class(options["kind"])(), f)}
    assert _read(new) == config  # what a run writes now reads back the same
    old = _OldLearningRateSchedule(0.7, options, D_MODEL, TOTAL)
    rate = learning_rate(0.7, config, RunPlan(total_updates=TOTAL, d_model=D_MODEL))
    assert [rate.value(s) for s in STEPS] == [old.value(s) for s in STEPS]


@pytest.mark.parametrize("options, message", [
    ({"kind": "inverse_sqrt", "gamma": 0.5},
     r"^unknown config key 'train.scheduler.gamma' for the learning-rate kind 'inverse_sqrt' \(its keys: kind, warmup_steps\)$"),
    ({"kind": "noam", "cooldown": 0.2},
     r"^unknown config key 'train.scheduler.cooldown' for the learning-rate kind 'noam' .*; the kinds with a cooldown: "
     r"constant, linear_warmup, plateau$"),
    ({"kind": "vshape", "decay_factor": 0.5},  # a kind of no earlier version: no earlier keys to leave out
     r"^unknown config key 'train.scheduler.decay_factor' for the learning-rate kind 'vshape'"),
    ({"kind": "points"}, r"^train.scheduler.kind: 'points' is not one of constant, cosine, .*vshape"),
    ({"kind": "plateau", "plateau_metric": "valid_wre"}, r"^train.scheduler: plateau_metric: no validation metric 'valid_wre'"),
    ({"kind": "plateau", "decay_factor": 1.5}, r"^train.scheduler: decay_factor must be in \(0, 1\)"),
])
def test_a_key_the_kind_does_not_take_or_a_bad_value_is_one_line_naming_the_key(options, message):
    with pytest.raises(ConfigError, match=message) as err:
        _read(options)
    assert "\n" not in str(err.value)


def test_an_earlier_kind_leaves_out_the_earlier_keys_it_does_not_take_and_null_removes_any():
    # a variant switching a plateau recipe to linear_warmup by one override leaves its plateau settings
    # behind (recipes/variants/rehearsal_las_bootstraps.yaml): earlier versions ignored them, so does this one
    switched = _read(dict(kind="linear_warmup", warmup_steps=200, plateau_metric="valid_ctc_cer", decay_factor=0.3))
    assert switched == _read(dict(kind="linear_warmup", warmup_steps=200))
    assert _read(dict(kind="vshape", decay_factor=None, warmup_steps=None)) == _read(dict(kind="vshape"))
    with pytest.raises(TypeError, match="warmup_steps"):  # Python callers name the kind's own keys only
        SchedulerConfig(kind="constant", warmup_steps=0)


def test_a_kinds_options_copy_pickle_and_show_their_keys_with_the_shapes_comments():
    from asr.config import describe_config
    from asr.experiment import TrainConfig

    config = _read(dict(kind="plateau", warmup_steps=9, plateau_metric="valid_ctc_cer", cooldown=0.2))
    for again in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config)):
        assert again == config and type(again) is type(config)
    keys = {k.key: k for k in describe_config(TrainConfig(scheduler=config), "train") if k.key.startswith("train.scheduler.")}
    assert set(keys) == {f"train.scheduler.{name}" for name in to_dict(config)}
    assert "scale" not in to_dict(config) and "shape" not in to_dict(config)  # train.lr is the scale
    assert keys["train.scheduler.plateau_metric"].value == "valid_ctc_cer"
    assert keys["train.scheduler.plateau_metric"].default == "valid_loss"
    assert all(key.meaning for key in keys.values())


# ---------------------------------------------------------------- a learning-rate shape written outside the package

from dataclasses import dataclass  # noqa: E402
from typing import Literal  # noqa: E402

from asr.training import shapes  # noqa: E402


@dataclass
class ExponentialConfig(shapes.ScheduleConfig):
    scale: float = 1.0   # the value at the first update (train.lr for the learning rate)
    gamma: float = 0.9   # what each update multiplies the value by
    shape: Literal["exponential"] = "exponential"

    def __post_init__(self) -> None:
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")

    def extremes(self):
        return 0.0, self.scale


class Exponential(shapes.Shape):
    def __init__(self, config: ExponentialConfig, run: shapes.RunPlan):
        self.scale, self.gamma = config.scale, config.gamma

    def value(self, step):
        return self.scale * self.gamma**step


@pytest.fixture
def exponential(monkeypatch):
    monkeypatch.setattr(shapes, "_SHAPES", dict(shapes._SHAPES))  # the registry as it was, after the test
    shapes.register_shape("exponential", ExponentialConfig, Exponential)


def test_a_shape_registered_from_outside_drives_the_learning_rate_as_torchs_exponentiallr_does(exponential):
    from asr.experiment import experiment_config_from_dict, experiment_config_to_dict, load_experiment_config
    from asr.training.schedules import run_schedules

    config = load_experiment_config(LAS_RECIPE, ["train.lr=0.5", "train.scheduler={kind: exponential, gamma: 0.8}"])
    written = experiment_config_to_dict(config)
    assert written["train"]["scheduler"] == {"kind": "exponential", "gamma": 0.8}  # config.yaml: its own keys
    assert experiment_config_from_dict(written).train.scheduler == config.train.scheduler
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=123.0)  # the schedule sets it before each update
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    exponential_lr = torch.optim.lr_scheduler.ExponentialLR(reference_optimizer, gamma=0.8)
    # the builder the trainer uses (asr/run.py), with train.lr and train.scheduler from the recipe
    schedules = run_schedules(config.train, model, optimizer, total_updates=20)
    inputs = torch.randn(5, 3)
    for step in range(20):
        assert schedules.apply(step)["lr"] == pytest.approx(reference_optimizer.param_groups[0]["lr"], rel=1e-12)
        for net, opt in ((model, optimizer), (reference, reference_optimizer)):
            opt.zero_grad()
            net(inputs).square().sum().backward()
            opt.step()
        exponential_lr.step()
        for ours, theirs in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 0.8**19)


def test_an_outside_kind_is_known_once_registered_and_its_shape_checks_its_keys(monkeypatch):
    with pytest.raises(ConfigError, match="train.scheduler.kind: 'exponential' is not one of"):
        _read({"kind": "exponential"})
    monkeypatch.setattr(shapes, "_SHAPES", dict(shapes._SHAPES))
    shapes.register_shape("exponential", ExponentialConfig, Exponential)
    assert "exponential" in learning_rate_kinds()
    assert to_dict(_read({"kind": "exponential"})) == {"kind": "exponential", "gamma": 0.9}
    assert learning_rate(2.0, SchedulerConfig(kind="exponential", gamma=0.5), RunPlan()).value(3) == 0.25
    with pytest.raises(ConfigError, match=r"^train.scheduler: gamma must be in \(0, 1\], got 1.5$"):
        _read({"kind": "exponential", "gamma": 1.5})
    with pytest.raises(ConfigError, match="^unknown config key 'train.scheduler.warmup_steps' for the learning-rate "
                                          r"kind 'exponential' \(its keys: gamma, kind\)$"):
        _read({"kind": "exponential", "warmup_steps": 100})


@pytest.mark.slow
def test_a_run_trains_with_an_outside_learning_rate_shape_and_records_it(exponential, tmp_path):
    import yaml

    from asr.cli.train import main
    from asr.studies.curves import read_scalars

    lr, gamma = 0.002, 0.9
    assert main(tiny_run(tmp_path, "train.max_epochs=1", "train.log_every_steps=1", f"train.lr={lr}",
                         f"train.scheduler={{kind: exponential, gamma: {gamma}}}")) == 0
    logged = {step: value for _, step, value in read_scalars(tmp_path / "exp")["train/lr"]}
    assert len(logged) > 3
    # logged at update s: the rate update s was made with, after s - 1 completed ones
    assert [logged[s] for s in sorted(logged)] == pytest.approx([lr * gamma ** (s - 1) for s in sorted(logged)])
    recorded = yaml.safe_load((tmp_path / "exp" / "config.yaml").read_text())
    assert recorded["train"]["scheduler"] == {"kind": "exponential", "gamma": gamma}
