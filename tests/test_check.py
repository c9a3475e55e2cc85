"""asr.check's report: where it goes and when it may be replaced (issue 80). What the checker finds is in
tests/test_bad_data.py."""

import json
import shutil

from asr.cli import check


def test_the_report_goes_under_exp_and_another_checks_report_is_not_replaced(librivox_mini, tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the durations it reads are cached there
    assert check.main([str(librivox_mini), "--jobs", "0"]) == 0
    report = tmp_path / "exp" / f"check_{librivox_mini.name}" / "data_check.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "exp"]  # not data_check.json in the current folder
    written = json.loads(report.read_text())
    assert written["checked"] == {"sources": [str(librivox_mini)]} and written["reports"][str(librivox_mini)]["count"] == 0
    assert f"report in {report.relative_to(tmp_path)}" in capsys.readouterr().out
    # Another folder of the same name would go to the same report: refused, in one line, before anything is read.
    other = tmp_path / "copy" / librivox_mini.name
    shutil.copytree(librivox_mini, other)
    assert check.main([str(other), "--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: exp/check_{librivox_mini.name}/data_check.json holds the report of another check")
    assert "\n" not in err and "--overwrite" in err and json.loads(report.read_text()) == written
    assert check.main([str(other), "--jobs", "0", "--overwrite"]) == 0
    assert json.loads(report.read_text())["checked"] == {"sources": [str(other)]}
    assert check.main([str(other), "--jobs", "0"]) == 0  # the same check again replaces its own
