"""Learning-rate schedules (asr/schedulers.py)."""

import math

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.schedulers import (
    SchedulerConfig,
    build_scheduler,
    cosine_lambda,
    inverse_sqrt_lambda,
    linear_warmup_lambda,
    noam_lambda,
)


def _lrs(factor, steps):
    return [factor(step) for step in range(steps)]


def test_noam_peaks_at_warmup_with_the_paper_value():
    d_model, warmup = 256, 100
    values = _lrs(noam_lambda(d_model, warmup), 1000)
    peak_step = max(range(len(values)), key=values.__getitem__)
    # LambdaLR's step index w-1 is the w-th update.
    assert peak_step == warmup - 1
    assert values[peak_step] == pytest.approx(d_model**-0.5 * warmup**-0.5)
    assert values[0] > 0  # the first update already moves the weights


def test_noam_warms_up_linearly_then_decays_as_inverse_sqrt():
    warmup = 50
    factor = noam_lambda(64, warmup)
    # Before the peak: proportional to the update number s = step + 1.
    ramp = [factor(step) / (step + 1) for step in range(warmup)]
    assert max(ramp) == pytest.approx(min(ramp))
    # After the peak: factor * sqrt(s) is constant, i.e. decay proportional to s^-0.5.
    decay = [factor(step) * math.sqrt(step + 1) for step in range(warmup - 1, 20 * warmup)]
    assert max(decay) == pytest.approx(min(decay))
    assert factor(4 * warmup - 1) == pytest.approx(factor(warmup - 1) / 2)


def test_inverse_sqrt_is_noam_normalised_to_peak_one():
    d_model, warmup = 128, 40
    noam = noam_lambda(d_model, warmup)
    inverse_sqrt = inverse_sqrt_lambda(warmup)
    assert inverse_sqrt(warmup - 1) == pytest.approx(1.0)
    assert max(_lrs(inverse_sqrt, 500)) == pytest.approx(1.0)
    for step in (0, 10, warmup - 1, warmup, 333):
        assert inverse_sqrt(step) == pytest.approx(noam(step) * math.sqrt(d_model * warmup))


def test_linear_warmup_ramps_then_holds():
    factor = linear_warmup_lambda(10)
    assert [factor(step) for step in range(12)] == pytest.approx([0.1 * s for s in range(1, 11)] + [1.0, 1.0])
    assert factor(10_000) == 1.0


def test_cosine_is_torchs_linear_warmup_then_cosine_annealing():
    lr, warmup, total, final = 0.5, 7, 60, 0.1
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=lr)
    reference = torch.optim.lr_scheduler.SequentialLR(optimizer, [
        torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup - 1),
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=final * lr),
    ], milestones=[warmup - 1])
    expected = []
    for _ in range(total):  # torch's cosine turns back up after T_max; ours holds (below)
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step()
    factor = cosine_lambda(warmup, total, final)
    assert [lr * factor(step) for step in range(total)] == pytest.approx(expected, abs=1e-9)


def test_cosine_reaches_its_floor_at_the_last_planned_update_and_stays():
    warmup, total = 10, 110
    factor = cosine_lambda(warmup, total, 0.2)
    assert factor(warmup - 1) == 1.0
    assert factor(warmup - 1 + (total - warmup) // 2) == pytest.approx(0.6)  # halfway down
    after_warmup = _lrs(factor, total)[warmup - 1 :]
    assert all(a > b for a, b in zip(after_warmup, after_warmup[1:]))
    assert after_warmup[-1] == pytest.approx(0.2)
    assert factor(total) == factor(10 * total) == pytest.approx(0.2)
    assert cosine_lambda(warmup, total)(total - 1) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="warmup"):
        cosine_lambda(100, 100)


def test_build_scheduler_drives_the_optimizer():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    scheduler = build_scheduler(optimizer, SchedulerConfig(kind="noam", warmup_steps=5), d_model=16)
    factor = noam_lambda(16, 5)
    seen = []
    for _ in range(12):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([2.0 * factor(step) for step in range(12)])

    optimizer = torch.optim.SGD([parameter], lr=0.5)
    scheduler = build_scheduler(optimizer, SchedulerConfig(kind="constant", warmup_steps=0))
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_bad_settings_are_rejected_with_the_key_named():
    with pytest.raises(ValueError, match="d_model"):
        build_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), SchedulerConfig(kind="noam"))
    with pytest.raises(ConfigError, match="scheduler.kind"):
        from_dict(SchedulerConfig, {"kind": "cosin"}, "scheduler")
    with pytest.raises(ConfigError, match="final_factor"):
        from_dict(SchedulerConfig, {"kind": "cosine", "final_factor": 1.5}, "scheduler")
    with pytest.raises(ValueError, match="planned number of updates"):
        build_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), SchedulerConfig(kind="cosine"))
    with pytest.raises(ConfigError, match="warmup_steps"):
        from_dict(SchedulerConfig, {"kind": "inverse_sqrt", "warmup_steps": 0}, "scheduler")
    with pytest.raises(ValueError, match="warmup_steps"):
        noam_lambda(256, 0)
