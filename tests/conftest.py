"""Shared test fixtures: the real speech in ``../shared/data`` (see its README), a tiny LAS recipe that
trains in seconds, and the environment for tests that run the entry points as subprocesses.

Tiers: tests that train a model or start processes are marked ``slow``;
``python -m pytest -m "not slow" -q`` is the quick loop, ``python -m pytest -q`` runs everything.
Both run on two worker processes, a module to a worker (``-n 2 --dist loadfile`` in setup.cfg);
``-n 0`` runs in this process, for a debugger or ``-s``."""

import logging
from pathlib import Path

import pytest

# helpers (and torch with it) is imported by the hooks and fixtures that use it, not here: under xdist the
# controlling process loads this file too, and runs no test, so that its 4 s of imports would only delay
# the workers' start.


def pytest_collection_modifyitems(config, items):
    from helpers import longest_modules_first

    items[:] = longest_modules_first(items)  # docs/architecture.md, "Tests"


@pytest.fixture(scope="session")
def tiny_demo_corpus() -> Path:
    """The tiny LAS's demo corpus in the default cache folder, prepared once per session: test modules
    that train it say ``pytestmark = pytest.mark.usefixtures("tiny_demo_corpus")``."""
    from helpers import prepare_tiny_demo

    return prepare_tiny_demo()


def _require(*parts: str) -> Path:
    from helpers import SHARED_DATA, require_shared_data

    return require_shared_data(SHARED_DATA.joinpath(*parts))  # skips without it (fails under CI)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    from helpers import require_shared_data

    return require_shared_data()  # all of its folders


@pytest.fixture(scope="session")
def fsdd_recordings() -> Path:
    """Free Spoken Digit Dataset recordings: {digit}_{speaker}_{take}.wav, 8 kHz."""
    return _require("fsdd", "recordings")


@pytest.fixture(scope="session")
def librivox_mini() -> Path:
    """Five LibriVox utterances in LibriSpeech layout (subset folder), 16 kHz FLAC."""
    return _require("librivox_mini", "LibriSpeech", "test-mini")


@pytest.fixture(scope="session")
def fsdd_dev() -> Path:
    """Connected-digit dev set in LibriSpeech layout (subset folder)."""
    return _require("fsdd_connected", "LibriSpeech", "fsdd-dev")


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")} if folder.exists() else {}


@pytest.fixture(scope="session", autouse=True)
def _shared_data_is_never_written():
    """No test may write into the shared data (whoever runs the suite: as root, its read-only
    modes stop nothing). Checked after the whole session: anything added, removed or changed fails."""
    from helpers import SHARED_DATA

    before = _snapshot(SHARED_DATA)
    yield
    after = _snapshot(SHARED_DATA)
    changed = sorted(set(before) ^ set(after) | {p for p in before.keys() & after.keys() if before[p] != after[p]})
    if changed:
        pytest.fail(f"tests wrote into {SHARED_DATA}: {changed[:5]}")


@pytest.fixture(autouse=True)
def _root_logging_is_restored():
    """An entry point's logging.basicConfig binds a handler to the stream of the test that called it;
    left in place, it would write into a closed stream in every later test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Small models run faster on one thread (and the CI machine has two cores for
    the whole suite); tests that need more threads set it themselves."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
