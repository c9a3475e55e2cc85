"""asr/studies/convergence.py and the study's convergence tables, mean-curve bands and tiled pictures,
on hand-made curves and a fake set of study results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import read_png
from torch.utils.tensorboard import SummaryWriter

from asr.studies.convergence import (
    Convergence,
    MetricTarget,
    Reached,
    RunCurves,
    Targets,
    aggregate,
    area_under,
    first_reached,
    format_mean_std,
    late_fall,
    measure,
    read_run_curves,
    summarise_reached,
    up_to_step,
)
from asr.studies.curves import CompareError, band, plot_bands
from asr.studies.grid import Run, Scoring, convergence_table, seed_table

# A run validated after 3 epochs of 100 optimizer steps each, 2 minutes per epoch.
CURVES = RunCurves(epochs=[1, 2, 3], loss=[3.0, 2.0, 1.5], wer=[90.0, 50.0, 25.0], steps=[100, 200, 300],
                   minutes=[2.0, 4.0, 6.0])


def test_first_reached_and_area_under_hand_made_curves():
    assert first_reached([3.0, 2.0, 1.5], 2.0) == 1  # "at most": equal counts
    assert first_reached([3.0, 2.0, 1.5], 1.0) is None
    assert first_reached([math.nan, 1.0], 1.0) == 1  # NaN never reaches
    # Trapezoids: (1 - 0) * (3 + 2) / 2 + (3 - 1) * (2 + 1) / 2 = 2.5 + 3 = 5.5
    assert area_under([0.0, 1.0, 3.0], [3.0, 2.0, 1.0]) == 5.5
    assert area_under([5.0], [1.0]) == 0


def test_late_fall_reads_the_best_loss_so_far_over_the_last_quarter():
    steps = [100, 200, 300, 400, 500]
    # Span 100-500: the last quarter starts at step 400; best so far 1.5 there, 1.2 at 500.
    assert late_fall(steps, [3.0, 2.0, 1.5, 1.5, 1.2]) == pytest.approx(3.0)  # 0.3 per 100 steps
    assert late_fall(steps, [3.0, 2.0, 1.0, 1.0, 1.0]) == 0.0  # a plateau
    # A worse last validation is no fall and no rise: the best so far stays.
    assert late_fall(steps, [3.0, 2.0, 1.0, 1.0, 1.4]) == 0.0
    # A NaN validation counts as no improvement; a run with too few points has no late fall.
    assert late_fall(steps, [3.0, 2.0, 1.5, 1.5, math.nan]) == 0.0
    assert late_fall(steps, [math.nan] * 5) is None
    assert late_fall([100, 200, 300], [3.0, 2.0, 1.0]) is None
    # The share is of the span of steps: half of 100-500 starts at 300.
    assert late_fall(steps, [3.0, 2.0, 1.5, 1.5, 1.2], share=0.5) == pytest.approx(1.5)


def test_measure_gives_steps_minutes_and_epochs_to_each_target():
    result = measure(CURVES, Targets(loss=2.0, wer_percent=30))
    assert result.loss_target == Reached(epoch=2, step=200, minutes=4.0)
    assert result.wer_target == Reached(epoch=3, step=300, minutes=6.0)
    # AUC over optimizer steps in thousands: 0.1 * (3 + 2) / 2 + 0.1 * (2 + 1.5) / 2 = 0.25 + 0.175
    assert result.auc == pytest.approx(0.425)
    assert (result.best_loss, result.best_loss_epoch, result.final_loss) == (1.5, 3, 1.5)
    assert (result.best_wer_percent, result.final_wer_percent, result.epochs, result.steps) == (25.0, 25.0, 3, 300)
    assert result.late_fall is None  # three validations: too few
    longer = RunCurves(epochs=[1, 2, 3, 4, 5], loss=[3.0, 2.0, 1.5, 1.4, 1.3], steps=[100, 200, 300, 400, 500])
    assert measure(longer, Targets()).late_fall == pytest.approx(1.0)
    assert measure(CURVES, Targets(loss=1.0)).loss_target is None  # not reached
    assert measure(CURVES, Targets()).wer_target is None
    # A run from before valid/step was logged: epochs only, no AUC.
    old = measure(RunCurves(epochs=[1, 2], loss=[2.0, 1.0]), Targets(loss=1.0))
    assert old.loss_target == Reached(epoch=2) and old.auc is None and old.best_wer_percent is None
    assert old.late_fall is None
    # One validation has no area under it: None, not the 0 that would look like the best curve.
    assert measure(RunCurves(epochs=[1], loss=[2.0], steps=[100]), Targets()).auc is None


def test_curves_cut_at_a_step_are_the_run_as_it_stood_then():
    with_gap = RunCurves(**{**CURVES.__dict__, "metrics": {"valid_batchnorm_gap": [0.3, math.nan, 0.1]}})
    cut = up_to_step(with_gap, 250, "run")
    # (math.nan is one object, so the lists compare equal by identity where both hold it)
    first_two = RunCurves([1, 2], [3.0, 2.0], [90.0, 50.0], [100, 200], [2.0, 4.0])
    assert cut == RunCurves(**{**first_two.__dict__, "metrics": {"valid_batchnorm_gap": [0.3, math.nan]}})
    assert measure(cut, Targets(loss=1.5)) == measure(first_two, Targets(loss=1.5))
    assert up_to_step(CURVES, 300, "run") == CURVES and up_to_step(CURVES, 10**9, "run") == CURVES
    assert up_to_step(CURVES, 99, "run") is None  # no validation that early
    with pytest.raises(CompareError, match="run old logged its validations by epoch only"):
        up_to_step(RunCurves(epochs=[1, 2], loss=[2.0, 1.0]), 100, "old")


def test_a_metric_target_is_reached_in_the_direction_the_metric_improves_and_never_by_a_missing_value():
    # a LAS's attention measures are not logged while a CTC-only phase keeps the speller off: NaN there
    curves = RunCurves(epochs=[1, 2, 3], loss=[3.0, 2.0, 1.5], steps=[100, 200, 300], minutes=[2.0, 4.0, 6.0],
                       metrics={"valid_attention_spearman": [math.nan, 0.9, 0.95], "valid_ctc_cer": [90.0, 40.0, 30.0]})
    aligned, cer, strict = (MetricTarget("valid_attention_spearman", 0.9, True), MetricTarget("valid_ctc_cer", 35.0, False),
                            MetricTarget("valid_attention_spearman", 0.99, True))
    assert aligned.label == "valid_attention_spearman >= 0.9" and cer.label == "valid_ctc_cer <= 35"
    result = measure(curves, Targets(metrics=(aligned, cer, strict)))
    assert result.metric_targets == {aligned.label: Reached(2, 200, 4.0), cer.label: Reached(3, 300, 6.0),
                                     strict.label: None}
    # the other direction would have been met at once: 90 >= 35
    assert measure(curves, Targets(metrics=(MetricTarget("valid_ctc_cer", 35.0, True),))).metric_targets == {
        "valid_ctc_cer >= 35": Reached(1, 100, 2.0)}
    # a metric the run never logged is never reached
    missing = MetricTarget("valid_batchnorm_gap", 1.0, False)
    assert measure(curves, Targets(metrics=(missing,))).metric_targets == {missing.label: None}
    numbers = aggregate([result, measure(curves, Targets(metrics=(aligned,)))])
    assert numbers["metric_targets"][aligned.label] == {"reached": 2, "step": {"mean": 200, "std": 0.0},
                                                        "minutes": {"mean": 4.0, "std": 0.0},
                                                        "epoch": {"mean": 2, "std": 0.0}}
    assert numbers["metric_targets"][cer.label]["reached"] == 1


def test_metric_curves_are_read_at_the_validations_with_gaps_left_as_nan(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path / "run"))
    for step, loss in ((40, 3.0), (80, 2.0), (120, 1.5)):
        writer.add_scalar("valid/loss", loss, step)
        writer.add_scalar("epoch", step / 40, step)
    for step, value in ((80, 0.5), (120, 0.9375)):  # none at the first validation (values exact in float32)
        writer.add_scalar("valid/attention_spearman", value, step)
    writer.close()
    curves = read_run_curves(tmp_path / "run", "run", metrics=("valid_attention_spearman", "valid_ctc_cer"))
    spearman = curves.metrics["valid_attention_spearman"]
    assert math.isnan(spearman[0]) and spearman[1:] == [0.5, 0.9375]
    assert all(math.isnan(v) for v in curves.metrics["valid_ctc_cer"])
    target = MetricTarget("valid_attention_spearman", 0.9, True)
    assert measure(curves, Targets(metrics=(target,))).metric_targets[target.label] == Reached(3, 120)


def write_events(folder: Path, series: dict[str, list[float]]) -> None:
    writer = SummaryWriter(log_dir=str(folder / "tensorboard"))
    for tag, values in series.items():
        for epoch, value in enumerate(values, start=1):
            writer.add_scalar(tag, value, epoch)
    writer.add_scalar("train/loss", 9.0, 1)
    writer.close()


def test_run_curves_are_read_from_tensorboard_events(tmp_path):
    # Today's layout: every scalar at the optimizer step, the epochs done as `epoch`; the last validation
    # is where train.max_steps stopped the run, half way through epoch 3.
    writer = SummaryWriter(log_dir=str(tmp_path / "now"))
    for step, epoch, loss, wer, minutes in ((40, 1, 3.0, 50, 0.5), (80, 2, 2.0, 25, 1.0), (100, 2.5, 1.5, 25, 1.25)):
        for tag, value in (("valid/loss", loss), ("valid/wer", wer), ("valid/minutes", minutes), ("epoch", epoch)):
            writer.add_scalar(tag, value, step)
    writer.add_scalar("epoch", 0.5, 20)  # a training step's: not a validation
    writer.close()
    assert read_run_curves(tmp_path / "now", "now") == RunCurves(
        [1, 2, 2.5], [3.0, 2.0, 1.5], [50, 25, 25], [40, 80, 100], [0.5, 1.0, 1.25])
    # The older layout: validation at x = epoch number, the steps in valid/step, WER as a fraction (read
    # in percent); older still, epochs only.
    write_events(tmp_path / "new", {"valid/loss": [3.0, 2.0], "valid/wer": [0.5, 0.25], "valid/step": [40, 80],
                                    "valid/minutes": [0.5, 1.0]})
    curves = read_run_curves(tmp_path / "new", "new")
    assert curves == RunCurves([1, 2], [3.0, 2.0], [50.0, 25.0], [40, 80], [0.5, 1.0])
    write_events(tmp_path / "old", {"valid/loss": [3.0, 2.0]})
    assert read_run_curves(tmp_path / "old", "old") == RunCurves([1, 2], [3.0, 2.0])
    write_events(tmp_path / "none", {"valid/wer": [0.5]})
    with pytest.raises(CompareError, match="run none .* no valid/loss"):
        read_run_curves(tmp_path / "none", "none")


def test_mean_std_and_reached_summaries():
    assert format_mean_std([1.0, 2.0, 3.0]) == "2 ± 1"
    assert format_mean_std([0.125, None]) == "0.125"  # one value: no std
    assert format_mean_std([None]) == "n/a"
    assert format_mean_std([0.1, 0.2], 3, 100) == "15 ± 7.1"
    hits = [Reached(2, 200, 4.0), None, Reached(4, 400, 8.0)]
    assert summarise_reached(hits, "step") == "300 ± 140 (2/3)"
    assert summarise_reached(hits, "minutes") == "6 ± 2.8 (2/3)"
    assert summarise_reached([None, None], "step") == "not reached (0/2)"
    assert summarise_reached([Reached(2)], "step") == "n/a (1/1)"
    # A mean of whole steps is printed whole: 2,267, not 2266.67 or 2,270.
    thirds = [Reached(40, 2000, 1.0), Reached(46, 2300, 1.0), Reached(50, 2500, 1.0)]
    assert summarise_reached(thirds, "step") == "2267 ± 250 (3/3)"
    assert summarise_reached([Reached(9, 917, 1.0), Reached(9, 900, 1.0)], "step") == "908 ± 12 (2/2)"


def fake_study() -> tuple[list[Run], dict[str, list[str]]]:
    """Two settings x three seeds, with hand-made convergence and WER."""
    grid = {"model.layer_norm": ["none", "both"], "train.seed": ["0", "1", "2"]}
    runs = []
    for norm, final_losses, reached_steps in [("none", [2.0, 2.5, 3.0], [None, None, None]),
                                              ("both", [1.0, 1.5, 2.0], [100, 300, None])]:
        for seed, final, step in zip(grid["train.seed"], final_losses, reached_steps):
            c = Convergence(epochs=4, steps=400, best_loss=final, best_loss_epoch=4, final_loss=final,
                            best_wer_percent=final * 10, final_wer_percent=final * 10, auc=final * 2,
                            loss_target=None if step is None else Reached(step // 100, step, step / 100),
                            wer_target=None, late_fall=final / 4)
            run = Run({"model.layer_norm": norm, "train.seed": seed}, Path(f"runs/{norm}-{seed}"), convergence=c)
            run.results = {"dev": {"wer_percent": final * 5}, "train_seconds": 120.0}
            runs.append(run)
    return runs, grid


def table_rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_seed_table_aggregates_each_setting_over_its_seeds():
    runs, grid = fake_study()
    table = seed_table(runs, grid, "train.seed", Targets(loss=2.0), [Scoring("dev")])
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header[:4] == ["layer_norm", "seeds", "steps to valid loss <= 2", "minutes to valid loss <= 2"]
    rows = {row[0]: dict(zip(header, row)) for row in table_rows(table)}
    assert rows["none"]["steps to valid loss <= 2"] == "not reached (0/3)"
    assert rows["both"]["steps to valid loss <= 2"] == "200 ± 140 (2/3)"
    assert rows["both"]["minutes to valid loss <= 2"] == "2 ± 1.4 (2/3)"
    assert rows["none"]["final valid loss"] == "2.5 ± 0.5" and rows["both"]["final valid loss"] == "1.5 ± 0.5"
    assert rows["both"]["valid loss AUC (loss x 1k steps)"] == "3 ± 1"
    assert rows["both"]["valid loss fall per 1k steps, last quarter"] == "0.38 ± 0.12"
    assert rows["both"]["final valid WER %"] == "15 ± 5"
    assert rows["both"]["dev WER %"] == "7.5 ± 2.5"
    assert rows["both"]["seeds"] == "3" and rows["both"]["train min"] == "2 ± 0"
    numbers = aggregate([r.convergence for r in runs[3:]])
    assert numbers["final_loss"] == {"mean": 1.5, "std": 0.5, "n": 3}
    assert numbers["loss_target"]["reached"] == 2 and numbers["loss_target"]["step"]["mean"] == 200
    json.dumps(numbers)  # it goes into convergence.json


def test_metric_targets_get_their_columns_in_every_table():
    runs, grid = fake_study()
    target = MetricTarget("valid_attention_spearman", 0.9, True)
    for k, run in enumerate(runs):  # seeds 0 and 1 of each setting aligned, at 200 and 400 steps
        reached = Reached(k % 3 + 1, 200 * (k % 3 + 1), 1.0) if k % 3 < 2 else None
        run.convergence = Convergence(**{**run.convergence.__dict__, "metric_targets": {target.label: reached}})
    targets = Targets(loss=2.0, metrics=(target,))
    header = [c.strip() for c in seed_table(runs, grid, "train.seed", targets, []).splitlines()[0].strip("|").split("|")]
    assert header[2:6] == ["steps to valid loss <= 2", "steps to valid_attention_spearman >= 0.9",
                           "minutes to valid loss <= 2", "minutes to valid_attention_spearman >= 0.9"]
    rows = {row[0]: dict(zip(header, row)) for row in table_rows(seed_table(runs, grid, "train.seed", targets, []))}
    assert rows["both"]["steps to valid_attention_spearman >= 0.9"] == "300 ± 140 (2/3)"
    assert rows["both"]["steps to valid loss <= 2"] == "200 ± 140 (2/3)"
    per_run = table_rows(convergence_table(runs, grid, targets))
    assert per_run[1][4:6] == ["not reached", "400 (epoch 2, 1.0 min)"]
    assert per_run[2][5] == "not reached"


def test_per_run_convergence_table_says_not_reached():
    runs, grid = fake_study()
    rows = table_rows(convergence_table(runs, grid, Targets(loss=2.0)))
    assert rows[0][:5] == ["none", "0", "4", "400", "not reached"]
    assert rows[3][:5] == ["both", "0", "4", "400", "100 (epoch 1, 1.0 min)"]
    assert rows[3][6] == "0.2500"  # late fall, after the AUC


def test_bands_average_aligned_points_and_the_plot_is_written(tmp_path):
    b = band("both", [[100, 200, 300], [110, 210]], [[3.0, 2.0, 1.0], [2.0, 1.0]])
    assert b.x == [105, 205] and b.mean == [2.5, 1.5] and b.cut and b.runs == 2
    spread = math.sqrt(0.5)  # sample std of two values 1 apart
    assert b.low == pytest.approx([2.5 - spread, 1.5 - spread]) and b.high == pytest.approx([2.5 + spread, 1.5 + spread])
    minmax = band("both", [[1, 2], [1, 2]], [[3.0, 2.0], [1.0, 4.0]], spread="minmax")
    assert (minmax.low, minmax.high, minmax.cut) == ([1.0, 2.0], [3.0, 4.0], False)
    out = tmp_path / "bands.png"
    plot_bands({"valid/loss": [b, minmax]}, out, "optimizer step", zoom=True)
    image = read_png(out)
    assert image.ndim == 3 and image.shape[0] > 100


def test_many_settings_get_one_legend_below_the_panels_instead_of_one_over_the_curves(tmp_path):
    def settings(count):
        return [band(f"layer_norm=setting-{i},warmup_steps=300", [[1, 2, 3]], [[3.0, 2.0, 1.0 + i]]) for i in range(count)]

    heights = {}
    for count in (2, 8):
        out = tmp_path / f"{count}.png"
        plot_bands({"valid/loss": settings(count), "valid/wer": settings(count)}, out, "epoch")
        heights[count] = read_png(out).shape[0]
    # The figure is 7.2 in (720 px) high either way; eight legend lines below it add about 100 px.
    assert heights[2] <= 730 < 780 < heights[8]


def test_tiled_pictures_make_one_image(tmp_path):
    from asr.plots import tile_images

    picture = tmp_path / "a.png"
    plot_bands({"valid/loss": [band("x", [[1, 2]], [[2.0, 1.0]])]}, picture, "epoch")
    out = tmp_path / "tiles.png"
    tile_images([[("run a", str(picture)), ("run b", None)], [("run c", str(picture))]], out)
    tiles, single = read_png(out), read_png(picture)
    assert tiles.shape[1] > single.shape[1]  # two columns wide
