"""The whole workflow as a user runs it, in fresh processes: train on real FSDD audio, evaluate, transcribe."""

import json
import subprocess
import sys

import pytest
from helpers import LAS_RECIPE as RECIPE
from helpers import PROJECT_ROOT, TINY, subprocess_env, tiny_valid

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_demo_corpus")]


def _run(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=PROJECT_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{args[0]} failed:\n{result.stderr[-3000:]}"
    return result


def test_train_then_evaluate_then_transcribe(tmp_path, fsdd_recordings):
    exp, dev = tmp_path / "exp", tiny_valid(tmp_path)
    _run("asr.train", str(RECIPE), *TINY, f"exp_dir={exp}", f"data.dev={dev}", "train.max_steps=6")
    checkpoint = exp / "last.pt"
    assert checkpoint.is_file() and (exp / "config.yaml").is_file()

    evaluated = _run("asr.evaluate", "--checkpoint", str(checkpoint), "--data", str(dev))
    assert "WER" in evaluated.stdout
    scores = json.loads((exp / f"eval_last_{dev.name}" / "wer.json").read_text())  # the default folder
    # in percent, which insertions can take past 100
    assert scores["utterances"] == 6 and scores["skipped"] == 0 and 0 <= scores["cer_percent"]

    audio = [fsdd_recordings / "4_jackson_1.wav", fsdd_recordings / "8_george_3.wav"]
    transcribed = _run("asr.transcribe", str(checkpoint), *map(str, audio))
    lines = transcribed.stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(p) for p in audio]
