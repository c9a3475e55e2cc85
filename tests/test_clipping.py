"""The clipping watch (asr.training.clipping): a gradient far over train.grad_clip is told once, with the share
of each module group, and counted at the end; a run whose gradient stays near the limit hears nothing."""

import logging

import pytest
from helpers import tiny_run

from asr.experiment import load_experiment_config
from asr.run import build_trainer
from asr.training.clipping import FAR_ABOVE, PERSISTENT, ClippingWatch, about
from asr.training.hooks import RunEnd, Update


def _update(step: int, norm: float | None, groups: dict | None = None) -> Update:
    return Update(epoch=1, step=step, loss=1.0, grad_norm=norm, values={}, epochs_done=0.1, group_norms=groups)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "asr.train" and r.levelno == logging.WARNING]


def test_a_regime_far_over_the_limit_is_told_once_with_each_groups_share_and_a_spike_is_not(caplog):
    watch = ClippingWatch(grad_clip=2.0)
    limit = FAR_ABOVE * 2.0
    with caplog.at_level(logging.INFO, logger="asr.train"):
        watch.on_update(None, _update(1, limit))                       # at the limit, not over it: not counted
        watch.on_update(None, _update(2, None))                        # a skipped update has no norm
        watch.on_update(None, _update(3, 2500.0))                      # over, its groups not measured
        # 3-4-5: the speller holds 16/25 of the norm's square, the listener 9/25
        watch.on_update(None, _update(4, 2500.0, {"listener": 1500.0, "speller": 2000.0}))
        watch.on_update(None, _update(5, 1e6, {"listener": 1e6, "speller": 1.0}))
        spike = _warnings(caplog)
        for step in range(6, 6 + PERSISTENT):
            watch.on_update(None, _update(step, 1000.0))
        told = _warnings(caplog)
        watch.on_run_end(None, RunEnd(why="train.max_steps", step=20, epochs_done=1.0))
    assert spike == []  # three updates: not yet a regime
    (text,) = told
    last = 5 + PERSISTENT - 3  # the PERSISTENT-th counted update
    assert text.startswith(f"update {last}: {PERSISTENT} updates from update 3 on had a gradient norm before "
                           "clipping over 100 x train.grad_clip (2), the largest 1,000,000 at update 5 "
                           "(500,000 times the limit)")
    assert ("At update 4 the speller held 64% of the norm's square (speller 2,000, listener 1,500), and every "
            "group's gradient reached the optimiser 1,250 times smaller") in text
    assert "model.lnlstm_recurrent_gain" in text and text.endswith("see docs/studies/ln_open_vocabulary.md")
    (end,) = _warnings(caplog)[1:]
    assert end.startswith(f"{3 + PERSISTENT} update(s) from update 3 on had a gradient norm over 100 x "
                          "train.grad_clip (the largest 1,000,000 at update 5)")


def test_a_few_updates_over_the_limit_are_counted_at_the_end_without_a_warning(caplog):
    watch = ClippingWatch(grad_clip=5.0)
    with caplog.at_level(logging.INFO, logger="asr.train"):
        watch.on_update(None, _update(1, 504.0, {"listener": 504.0}))
        watch.on_run_end(None, RunEnd(why="end", step=100, epochs_done=1.0))
    assert _warnings(caplog) == []
    (line,) = [r.getMessage() for r in caplog.records if "gradient norm over" in r.getMessage()]
    assert line.startswith("1 update(s) from update 1 on had a gradient norm over 100 x train.grad_clip")


def test_a_transformer_s_groups_are_not_sent_to_the_lstm_study(caplog):
    watch = ClippingWatch(grad_clip=1.0)
    with caplog.at_level(logging.WARNING, logger="asr.train"):
        for step in range(1, PERSISTENT + 1):
            watch.on_update(None, _update(step, 1e4, {"encoder": 1e4, "decoder": 3.0} if step == 1 else None))
    (text,) = _warnings(caplog)
    assert "the encoder held 100% of the norm's square" in text and "ln_open_vocabulary" not in text


@pytest.mark.parametrize("value, text", [(5769323.4, "5,770,000"), (2500.0, "2,500"), (999.5, "1,000"), (999.4, "999"),
                                         (4.9712, "4.97"), (0.0086321, "0.00863")])
def test_numbers_are_written_out_to_three_digits(value, text):
    assert about(value) == text


@pytest.mark.parametrize("grad_clip, main", [(0.0, True), (5.0, False)])
def test_no_clipping_or_another_rank_says_nothing(caplog, grad_clip, main):
    watch = ClippingWatch(grad_clip=grad_clip, main=main)
    with caplog.at_level(logging.INFO, logger="asr.train"):
        for step in range(1, PERSISTENT + 1):
            watch.on_update(None, _update(step, 1e9, {"listener": 1e9}))
        watch.on_run_end(None, RunEnd(why="end", step=1, epochs_done=1.0))
    assert not [r for r in caplog.records if "gradient norm" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_demo_corpus")
def test_a_run_far_over_its_limit_says_so_in_train_log_and_one_near_it_does_not(tmp_path):
    """A tiny LAS clipped at 1e-6 (its gradient is far over that at every update) against the same run at
    its recipe's limit: train.log warns at the PERSISTENT-th update with the listener, speller and attention
    measured at the first, and counts every update at the end; the other run has neither."""
    logs = {}
    steps = PERSISTENT + 2
    for name, clip in (("clipped", ["train.grad_clip=0.000001"]), ("recipe", [])):
        recipe, *overrides = tiny_run(tmp_path / name, f"train.max_steps={steps}", "train.log_every_steps=100", *clip)
        build_trainer(load_experiment_config(recipe, overrides)).fit()
        logs[name] = (tmp_path / name / "exp" / "train.log").read_text()
    (told,) = [line for line in logs["clipped"].splitlines() if "had a gradient norm before clipping" in line]
    assert f"update {PERSISTENT}: {PERSISTENT} updates from update 1 on" in told and "train.grad_clip (1e-06)" in told
    measured = told.split("At update 1 the ")[1].split("of the norm's square (")[1].split(")")[0]
    assert {"listener", "speller", "attention"} <= {part.split()[0] for part in measured.split(", ")}
    assert f"{steps} update(s) from update 1 on had a gradient norm over {FAR_ABOVE:g} x train.grad_clip" in logs["clipped"]
    assert "gradient norm over" not in logs["recipe"] and "norm before clipping" not in logs["recipe"]
