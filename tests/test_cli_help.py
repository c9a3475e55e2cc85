"""Every command's --help answers at once: the entry points import torch, the data readers and the
synthesisers only once their arguments are parsed (issue 50)."""

import subprocess
import sys

import pytest
from helpers import subprocess_env

COMMANDS = ("train", "evaluate", "validate", "transcribe", "compare", "study", "average", "check", "checkpoint", "synth_demo",
            "synth_librispeech")


@pytest.mark.slow  # starts a process per command
def test_help_imports_neither_torch_nor_the_data_readers():
    # One process for all the commands: what importing each entry point and building its help loads.
    script = (
        "import contextlib, io, sys, importlib\n"
        f"for name in {COMMANDS!r}:\n"
        "    module = importlib.import_module(f'asr.cli.{name}')\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "        module.main(['--help'])\n"
        "    assert out.getvalue().startswith('usage: python -m asr.' + name), (name, out.getvalue()[:80])\n"
        "    heavy = sorted(m for m in ('torch', 'torchaudio', 'soundfile', 'tensorboard', 'matplotlib') if m in sys.modules)\n"
        "    assert not heavy, (name, heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=subprocess_env())
    assert done.returncode == 0, done.stderr[-2000:]
