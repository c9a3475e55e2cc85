"""asr.studies.diagnosis: a LAS's convergence diagnostics read back from real TensorBoard event files, where a run
aligned, the early gradient norms, and asr.compare --diagnose end to end."""

import pytest
from helpers import read_png, small_las_config
from torch.utils.tensorboard import SummaryWriter

from asr.cli.compare import main
from asr.studies.convergence import metric_tag
from asr.studies.curves import Curve
from asr.studies.diagnosis import PANELS, aligned_at, early_mean, first_at_most
from asr.models.las import LAS
from asr.training.metrics import metrics_for
from asr.training.step import gradient_groups


def test_every_panel_draws_a_tag_the_trainer_logs_for_a_las():
    model = LAS(small_las_config(ctc_weight=0.5), input_dim=6, vocab_size=10)
    logged = {metric_tag(m.name) for m in metrics_for(model)}
    logged |= {f"grad_norm/{group}" for group in gradient_groups(model).values()}
    drawn = {tag for panel in PANELS for tag, _ in panel.tags}
    assert drawn <= logged, drawn - logged


def _curves(spearman, at_end, steps=(250, 500, 750, 1000)):
    return {
        "valid/attention_spearman": Curve("r", "valid/attention_spearman", list(steps), list(spearman)),
        "valid/attention_at_end": Curve("r", "valid/attention_at_end", list(steps), list(at_end)),
    }


def test_aligned_needs_both_measures_at_one_validation():
    # Spearman passes at 500 but the peaks still sit at the end there; both pass first at 750.
    assert aligned_at(_curves([0.2, 0.95, 0.97, 0.99], [80.0, 30.0, 8.0, 3.0])) == 750
    # At the end but never monotone, and monotone but never off the end: not aligned.
    assert aligned_at(_curves([0.1, 0.2, 0.3, 0.4], [5.0, 5.0, 5.0, 5.0])) is None
    assert aligned_at(_curves([0.9, 0.95, 0.97, 0.99], [50.0, 40.0, 11.0, 10.5])) is None
    # The bounds themselves count as aligned.
    assert aligned_at(_curves([0.5, 0.9, 0.9, 0.9], [50.0, 10.0, 10.0, 10.0])) == 500
    assert aligned_at({}) is None


def test_first_at_most_and_early_mean():
    curve = Curve("r", "valid/ctc_cer", [250, 500, 750], [90.0, 30.0, 20.0])
    assert first_at_most(curve, 30.0) == 500 and first_at_most(curve, 10.0) is None and first_at_most(None, 1) is None
    norms = Curve("r", "grad_norm/listener", [1, 25, 50, 300, 301, 325], [1.0, 2.0, 3.0, 6.0, 100.0, float("nan")])
    assert early_mean(norms) == pytest.approx(3.0)  # steps 1..300 only
    assert early_mean(norms, until=0) is None


def _write_run(folder, spearman, at_end, ctc_cer, listener_norms):
    writer = SummaryWriter(log_dir=str(folder))
    for step, norm in listener_norms:
        writer.add_scalar("grad_norm/listener", norm, step)
        writer.add_scalar("grad_norm/speller", norm / 2, step)
        writer.add_scalar("epoch", step / 1000, step)
    for i, step in enumerate((250, 500, 750)):
        writer.add_scalar("valid/attention_spearman", spearman[i], step)
        writer.add_scalar("valid/attention_at_end", at_end[i], step)
        writer.add_scalar("valid/ctc_cer", ctc_cer[i], step)
        writer.add_scalar("valid/attention_loss", 3.0 - i, step)
        writer.add_scalar("valid/loss_without_context", 3.5, step)
    writer.close()


def _rows(table: str) -> dict[str, list[str]]:
    lines = [line for line in table.splitlines() if line.startswith("|")][2:]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in (line.strip("|").split("|") for line in lines)}


def test_compare_diagnose_draws_the_runs_and_tabulates_where_they_aligned(tmp_path, capsys):
    _write_run(tmp_path / "ok0", [0.5, 0.95, 0.99], [40.0, 5.0, 2.0], [80.0, 40.0, 25.0], [(1, 0.5), (25, 1.5), (400, 9.0)])
    _write_run(tmp_path / "ok1", [0.3, 0.6, 0.92], [60.0, 20.0, 9.0], [85.0, 45.0, 30.0], [(1, 1.0), (25, 2.0)])
    _write_run(tmp_path / "stuck", [0.0, 0.0, 0.0], [100.0, 100.0, 100.0], [99.0, 98.0, 98.0], [(1, 0.125), (25, 0.125)])
    out = tmp_path / "fig" / "why.png"
    code = main([str(tmp_path / n) for n in ("ok0", "ok1", "stuck")]
                + ["--diagnose", "--settings", "none", "none", "both", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    table = out.with_suffix(".md").read_text().rsplit("\n<!-- asr.compare: ", 1)[0]  # less the record (asr.cli.compare)
    assert table in printed
    rows = _rows(table)
    # columns: setting, last step, aligned at, CTC CER, Spearman, at end, loss with / without, grad listener ...
    assert rows["ok0"][:3] == ["none", "750", "500"]
    assert rows["ok1"][:3] == ["none", "750", "750"]
    assert rows["stuck"][:3] == ["both", "750", "no"]
    assert rows["ok0"][3] == "25" and rows["stuck"][5] == "100"
    assert rows["ok0"][6] == "1 / 3.5"
    assert rows["ok0"][7] == "1" and rows["stuck"][7] == "0.125"  # the listener's mean over steps 1..300
    image = read_png(out)
    assert image.shape[0] > 400 and image.shape[1] > 600


def test_compare_diagnose_refuses_settings_that_do_not_match_the_runs(tmp_path, capsys):
    _write_run(tmp_path / "a", [0.1] * 3, [90.0] * 3, [90.0] * 3, [(1, 1.0)])
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "a"), "--diagnose", "--settings", "x", "y"])
    assert exit_info.value.code == 2
    assert "--settings" in capsys.readouterr().err
    assert main([str(tmp_path / "missing"), "--diagnose", "--out", str(tmp_path / "d.png")]) == 2
    assert "missing" in capsys.readouterr().err
