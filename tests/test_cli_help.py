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


@pytest.mark.slow  # starts a process per module
def test_a_library_module_run_as_a_command_names_the_command_that_uses_it():
    """``python -m asr.studies.curves --help`` printed nothing (issue 80): a module the documents name, run as a command."""
    for module, command in (("asr.studies.curves", "asr.compare"), ("asr.studies.diagnosis", "asr.compare"), ("asr.studies.convergence", "asr.study")):
        done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, env=subprocess_env())
        assert done.returncode == 0 and f"its command is python -m {command}" in done.stdout, (module, done.stderr[-500:])
        done = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, env=subprocess_env())
        assert done.returncode == 2 and done.stderr.startswith(f"error: {module} is a library module"), module


@pytest.mark.slow  # starts a process
def test_every_module_with_a_main_answers_help_as_a_command():
    """``python -m MODULE --help`` for every module under asr/ with a ``main`` or a ``__main__`` block (two
    under asr/cli printed nothing: they had no ``__main__`` block): the entry points
    (``asr.train`` and ``asr.cli.train`` alike) print their usage, the library modules name their command."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    modules = sorted(".".join(path.relative_to(root).with_suffix("").parts) for path in (root / "asr").rglob("*.py")
                     if "def main(" in path.read_text() or '__name__ == "__main__"' in path.read_text())
    internal = {"asr.studies.tether"}  # started by asr.study with its own arguments, never by a person
    assert {"asr.train", "asr.cli.validate", "asr.cli.synth_librispeech", "asr.studies.curves"} <= set(modules)
    script = (
        "import contextlib, io, runpy, sys\n"
        f"for name in {sorted(set(modules) - internal)!r}:\n"
        "    sys.argv = [name, '--help']\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            runpy.run_module(name, run_name='__main__', alter_sys=True)\n"
        "            code = None\n"
        "        except SystemExit as stop:\n"
        "            code = stop.code\n"
        "    text = out.getvalue()\n"
        "    assert code in (0, None) and (text.startswith('usage: python -m asr.') or 'is a library module' in text), "
        "(name, code, text[:200])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=subprocess_env())
    assert done.returncode == 0, done.stderr[-2000:]
