"""asr.compare: curves read back from real TensorBoard event files, table values, the image."""

import pytest
from helpers import read_png
from torch.utils.tensorboard import SummaryWriter

from asr.cli.compare import main
from asr.studies.curves import Curve, smooth, zoom_limits

# Values exactly representable in float32 and in 4 significant digits, so the
# table can be compared with what was written without tolerance games.
RUN_A = {"valid/loss": [3.5, 2.25, 1.75, 2.0], "valid/wer": [0.875, 0.5, 0.375, 0.25]}
RUN_B = {"valid/loss": [4.0, 3.0, 2.5], "valid/wer": [1.0, 0.75, 0.625]}


def _write_run(folder, series, train_steps=0):
    writer = SummaryWriter(log_dir=str(folder))
    for tag, values in series.items():
        for epoch, value in enumerate(values, start=1):
            writer.add_scalar(tag, value, epoch)
    for step in range(1, train_steps + 1):
        writer.add_scalar("train/loss", 5.0 / step, step)
    writer.close()


def _table_rows(text, tag):
    """{run: [cells]} of the table under '### tag'."""
    lines = text.split(f"### {tag}\n", 1)[1].split("\n\n", 1)[0].splitlines()
    rows = [line.strip("|").split("|") for line in lines[3:] if line.startswith("|")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


@pytest.fixture
def two_runs(tmp_path):
    _write_run(tmp_path / "run_a", RUN_A, train_steps=30)
    _write_run(tmp_path / "run_b", RUN_B)
    return tmp_path / "run_a", tmp_path / "run_b"


def test_table_and_png_match_what_was_written(two_runs, tmp_path, capsys):
    out = tmp_path / "plots" / "cmp.png"
    assert main([str(p) for p in two_runs] + ["--out", str(out), "--labels", "ln", "no-ln"]) == 0
    printed = capsys.readouterr().out
    table, record = (tmp_path / "plots" / "cmp.md").read_text().rsplit("\n<!-- ", 1)
    assert table in printed and "<!--" not in printed  # the record of what was compared is in the file only
    assert record.startswith("asr.compare: ") and str(two_runs[0]) in record
    rows = _table_rows(table, "valid/loss")
    # columns: points, final, final at, best, best at
    assert rows["ln"] == ["4", "2", "4", "1.75", "3"]  # final is the last epoch, best the minimum
    assert rows["no-ln"] == ["3", "2.5", "3", "2.5", "3"]
    image = read_png(out)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100 and image.shape[2] in (3, 4)


def test_several_tags_and_default_tag(two_runs, tmp_path, monkeypatch):
    out = tmp_path / "both.png"
    main([str(p) for p in two_runs] + ["--tag", "valid/wer", "--tag", "valid/loss", "--out", str(out)])
    table = out.with_suffix(".md").read_text()
    wer = _table_rows(table, "valid/wer")
    # These runs are of the older layout (no `epoch` scalar), which logged WER as a fraction: read in percent.
    assert wer["run_a"][1:4] == ["25", "4", "25"] and wer["run_b"][1:4] == ["62.5", "3", "62.5"]
    header = table.split("### valid/wer", 1)[1].splitlines()[2]
    assert "epoch" in header and "final % |" in header  # nor valid/step to put them on the step axis
    assert "final |" in table.split("### valid/loss", 1)[1].splitlines()[2]  # a loss has no unit to state
    # Without --tag and --out: valid/loss, written to compare_valid_loss.png in the working folder.
    monkeypatch.chdir(tmp_path)
    main([str(p) for p in two_runs])
    assert (tmp_path / "compare_valid_loss.png").is_file()
    assert "### valid/loss" in (tmp_path / "compare_valid_loss.md").read_text()


def test_train_tags_are_per_step_and_lr_has_no_best(tmp_path):
    run = tmp_path / "run"
    writer = SummaryWriter(log_dir=str(run))
    for step in range(1, 21):
        writer.add_scalar("train/loss", 10.0 - step * 0.25, step)
        writer.add_scalar("train/lr", step * 0.125, step)
    writer.close()
    out = tmp_path / "t.png"
    main([str(run), "--tag", "train/loss", "--tag", "train/lr", "--out", str(out)])
    table = out.with_suffix(".md").read_text()
    assert "final at optimizer step" in table
    assert _table_rows(table, "train/loss")["run"] == ["20", "5", "20", "5", "20"]
    assert _table_rows(table, "train/lr")["run"] == ["20", "2.5", "20", "n/a", "n/a"]


def test_a_new_and_an_old_run_compare_on_the_optimizer_step_axis(tmp_path):
    """A run of today's layout (every scalar at the optimizer step, the epoch a scalar of its own) and one
    of the older layout (validation at x = epoch number, with valid/step) in one table and one panel."""
    new = SummaryWriter(log_dir=str(tmp_path / "new"))
    for step, loss in ((50, 3.0), (100, 2.0)):
        new.add_scalar("valid/loss", loss, step)
        new.add_scalar("epoch", step / 50, step)
    new.close()
    old = SummaryWriter(log_dir=str(tmp_path / "old" / "tensorboard"))
    for epoch, (step, loss) in enumerate(((40, 2.5), (80, 1.5)), start=1):
        old.add_scalar("valid/loss", loss, epoch)
        old.add_scalar("valid/step", step, epoch)
    old.close()
    out = tmp_path / "mixed.png"
    assert main([str(tmp_path / "new"), str(tmp_path / "old"), "--out", str(out)]) == 0
    table = out.with_suffix(".md").read_text()
    assert "final at optimizer step" in table
    rows = _table_rows(table, "valid/loss")
    assert rows["new"] == ["2", "2", "100", "2", "100"] and rows["old"] == ["2", "1.5", "80", "1.5", "80"]


def test_resumed_run_last_write_of_a_step_wins(tmp_path):
    # A run logs epochs 1-3, crashes, and is resumed from epoch 1 in a new event file:
    # epochs 2-3 are logged again with other values, which are the ones that count.
    run = tmp_path / "run"
    _write_run(run, {"valid/loss": [3.0, 2.0, 1.0]})
    # Which value of a step counts follows the events' wall times, not the order of the files' names
    # (the same run dated the other way round gives the same table): no need to wait for another second.
    writer = SummaryWriter(log_dir=str(run))
    writer.add_scalar("valid/loss", 2.5, 2)
    writer.add_scalar("valid/loss", 2.25, 3)
    writer.add_scalar("valid/loss", 1.5, 4)
    writer.close()
    out = tmp_path / "r.png"
    main([str(run), "--out", str(out)])
    assert _table_rows(out.with_suffix(".md").read_text(), "valid/loss")["run"] == ["4", "1.5", "4", "1.5", "4"]


def test_missing_tag_names_the_run_and_its_tags(two_runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main([str(p) for p in two_runs] + ["--tag", "valid/bleu", "--out", str(tmp_path / "x.png")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "run_a" in err and "valid/bleu" in err and "valid/loss" in err and "train/loss" in err
    assert not (tmp_path / "x.png").exists()


def test_a_tag_one_run_lacks_is_drawn_for_the_others_with_a_warning(two_runs, tmp_path, capsys):
    out = tmp_path / "partial.png"
    # run_b logged no training steps: its train/loss is missing, its valid/loss is drawn
    assert main([str(p) for p in two_runs] + ["--tag", "valid/loss", "--tag", "train/loss", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "warning: run run_b" in captured.err and "no scalar tag 'train/loss'" in captured.err
    table = out.with_suffix(".md").read_text()
    assert set(_table_rows(table, "train/loss")) == {"run_a"} and set(_table_rows(table, "valid/loss")) == {"run_a", "run_b"}
    assert "Not drawn:" in table and "run run_b" in table.split("Not drawn:", 1)[1]
    assert out.is_file()


def test_folder_without_events_and_label_count_are_errors(two_runs, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        main([str(two_runs[0]), str(empty), "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert "no TensorBoard event files" in err and str(empty) in err
    with pytest.raises(SystemExit):
        main([str(p) for p in two_runs] + ["--labels", "only-one"])
    assert "2 experiment folders" in capsys.readouterr().err


def test_smoothing_is_debiased_ema():
    assert smooth([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # a constant stays constant
    assert smooth([0.0, 1.0], 0.5) == pytest.approx([0.0, 0.5 / 0.75])
    assert smooth([1.0, 3.0], 0.0) == [1.0, 3.0]


def test_zoom_fits_the_points_after_the_first():
    runs = [Curve("a", "valid/loss", [1, 2, 3, 4], RUN_A["valid/loss"]), Curve("b", "valid/loss", [1, 2, 3], RUN_B["valid/loss"])]
    low, high = zoom_limits(runs)
    # Points 2+ span 1.75 .. 3.0; the first points (3.5 and 4.0) fall outside, the rest inside with a 5% margin.
    assert (low, high) == pytest.approx((1.75 - 0.0625, 3.0 + 0.0625))
    assert zoom_limits([Curve("c", "valid/loss", [1], [5.0])]) is None  # one point: nothing to fit


def test_the_title_and_table_name_the_keys_that_differ(two_runs, tmp_path, capsys):
    run_a, run_b = two_runs
    (run_a / "config.yaml").write_text("exp_dir: exp/a\nmodel: {layer_norm: both, hidden: 8}\nruntime: {device: cpu}\n")
    (run_b / "config.yaml").write_text("exp_dir: exp/b\nmodel: {layer_norm: none, hidden: 8}\nruntime: {device: cuda}\n")
    out = tmp_path / "ln.png"
    assert main([str(run_a), str(run_b), "--out", str(out), "--labels", "ln", "no-ln"]) == 0
    table = out.with_suffix(".md").read_text()
    # The one key that differs, with each run's value; not exp_dir, not the runtime record, not equal keys.
    assert table.startswith("Runs differ in:\n\n- model.layer_norm: both (ln), none (no-ln)\n\n### valid/loss")
    assert "hidden" not in table and "device" not in table and "exp_dir" not in table
    third = tmp_path / "run_c"
    _write_run(third, RUN_B)  # no config.yaml: its settings cannot be compared
    main([str(run_a), str(third), "--out", str(out), "--overwrite"])  # another comparison into the same --out
    assert "- settings unknown (no config.yaml): run_c" in out.with_suffix(".md").read_text()


def test_a_long_value_is_cut_in_the_table_and_title(two_runs, tmp_path):
    """Issue 80: a list of 440 voices (about 9,000 characters) named in full filled the screen."""
    run_a, run_b = two_runs
    voices = [f"en+voice{i}" for i in range(440)]
    (run_a / "config.yaml").write_text(f"exp_dir: exp/a\ndata: {{demo: {{train_voices: {voices}}}}}\n")
    (run_b / "config.yaml").write_text(f"exp_dir: exp/b\ndata: {{demo: {{train_voices: {voices[:2]}}}}}\n")
    out = tmp_path / "voices.png"
    assert main([str(run_a), str(run_b), "--out", str(out)]) == 0
    line = next(line for line in out.with_suffix(".md").read_text().splitlines() if "train_voices" in line)
    full = str(voices)
    assert f"{full[:60]}... ({len(full):,} characters) (run_a)" in line and len(line) < 250
    assert f"{voices[:2]} (run_b)" in line  # a short value stays whole
