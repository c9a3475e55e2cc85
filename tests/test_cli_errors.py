"""Every command says what is wrong with a file it was given in one line, ``error: ...`` naming it, and exits
with status 2, with no usage block (issue 80): a WAV file where a recipe, checkpoint, corpus or run folder
belongs, and a path that does not exist. Run in this process: each stops before any model is built."""

import importlib

import pytest

WAV = ("fsdd", "recordings", "0_george_0.wav")

# command -> its arguments with PATH where the wrong file goes (AUDIO: a real recording)
COMMANDS = {
    "train": ["PATH"],
    "evaluate": ["--checkpoint", "PATH", "--data", "PATH"],
    "validate": ["--checkpoint", "PATH"],
    "transcribe": ["--checkpoint", "PATH", "AUDIO"],
    "compare": ["PATH"],
    "study": ["PATH", "--grid", "train.seed=0,1"],
    "average": ["PATH", "--last", "2"],
    "check": ["PATH"],
    "checkpoint": ["convert", "PATH", "OUT"],
    "synth_demo": ["PATH"],
}


def run(command: str, argv: list[str], capsys) -> tuple[int, str, str]:
    main = importlib.import_module(f"asr.cli.{command}").main
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("wrong", ["audio", "missing"])
def test_every_command_names_a_wrong_file_in_one_line_and_exits_2(wrong, shared_data, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a command that wrote a default output would write it here
    audio = str(shared_data.joinpath(*WAV))
    path = audio if wrong == "audio" else str(tmp_path / "nowhere" / "model.pt")
    commands = dict(COMMANDS)
    if wrong == "audio":  # a missing OUT is where the corpus is to be made, not a wrong file
        commands["synth_librispeech"] = ["PATH", "--hours", "0.01"]
    for command, template in commands.items():
        given = {"PATH": path, "AUDIO": audio, "OUT": str(tmp_path / "converted.pt")}
        argv = [given.get(word, word) for word in template]
        status, out, err = run(command, argv, capsys)
        lines = err.strip().splitlines()
        assert status == 2, (command, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), (command, err)  # no usage block, no traceback
        assert path in lines[0], (command, err)  # names the file
        if wrong == "audio" and command not in ("train", "study", "synth_demo", "synth_librispeech"):
            assert "WAV audio file" in lines[0], (command, err)  # says what it got
    assert not any(tmp_path.iterdir())  # and nothing was written


def test_a_malformed_command_line_still_gets_the_usage(capsys):
    status, _, err = run("evaluate", ["--checkpoint", "x.pt", "--split", "dev", "--no-such-option"], capsys)
    assert status == 2 and err.startswith("usage: python -m asr.evaluate") and "unrecognized arguments" in err
    status, _, err = run("transcribe", ["--beam", "2"], capsys)  # no model, no audio
    assert status == 2 and err.startswith("usage: python -m asr.transcribe")
