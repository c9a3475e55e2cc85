"""Shared test fixtures: the real speech in ``../shared/data`` (see its README), a tiny LAS recipe that
trains in seconds, and the environment for tests that run the entry points as subprocesses.

Tiers: tests that train a model or start processes are marked ``slow``;
``python -m pytest -m "not slow" -q`` is the quick loop, ``python -m pytest -q`` runs everything."""

import logging
import os
from pathlib import Path

import pytest
import torch

# triton.jit reads TRITON_INTERPRET when a kernel is defined, i.e. when
# asr/models/lnlstm_kernels.py is first imported. Without a GPU, set it here,
# before any test module is imported, so that the Triton LN-LSTM kernels run on
# CPU tensors under Triton's interpreter (tests/test_lnlstm_triton.py).
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ASR_SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))
LAS_RECIPE = PROJECT_ROOT / "recipes" / "fsdd_las.yaml"

# A tiny LAS on a few connected-digit utterances of recipes/fsdd_las.yaml: seconds per run on one core.
TINY = [
    f"data.root={SHARED_DATA}",
    "data.digits.utterances=24",
    "data.digits.digits_per_utterance=[1,2]",
    "data.demo.train_utterances=12",  # the recipe adds synthetic voices to training: a few here
    "data.num_workers=0",
    "data.max_frames_per_batch=1200",
    "features.num_mel_bins=23",
    "model.listener.hidden_size=16",
    "model.listener.num_layers=2",
    "model.listener.pyramid_layers=1",
    "model.attention.dim=16",
    "model.speller.embedding_dim=8",
    "model.speller.hidden_size=16",
    "train.valid_max_utterances=4",
    "train.log_every_steps=1",
]


def prepare_tiny_demo(*overrides: str) -> Path:
    """Prepare the demo corpus that the tiny LAS (:data:`TINY`, with these overrides) trains on, as a
    user does with ``python -m asr.synth_demo``: synthesised once (a second or two), then reused.
    Training only reads it. Returns the corpus folder."""
    from asr.data.demo import corpus_folder, prepare_corpus
    from asr.data.librispeech import default_cache_dir
    from asr.experiment import load_experiment_config

    data = load_experiment_config(LAS_RECIPE, [*TINY, *overrides]).data
    prepare_corpus(data.demo, data.cache_dir or default_cache_dir())
    return corpus_folder(data.demo, data.cache_dir or default_cache_dir())


@pytest.fixture(scope="session")
def tiny_demo_corpus() -> Path:
    """The tiny LAS's demo corpus in the default cache folder, prepared once per session: test modules
    that train it say ``pytestmark = pytest.mark.usefixtures("tiny_demo_corpus")``."""
    return prepare_tiny_demo()


def tiny_valid(tmp_path: Path, count: int = 6) -> Path:
    """A LibriSpeech-layout copy (symlinks) of the first ``count`` dev utterances, to keep validation short."""
    source = SHARED_DATA / "fsdd_connected" / "LibriSpeech" / "fsdd-dev" / "9000" / "1"
    target = tmp_path / "valid" / "9000" / "1"
    target.mkdir(parents=True)
    lines = (source / "9000-1.trans.txt").read_text().splitlines()[:count]
    (target / "9000-1.trans.txt").write_text("\n".join(lines) + "\n")
    for line in lines:
        name = line.split()[0] + ".flac"
        (target / name).symlink_to(source / name)
    return tmp_path / "valid"


def tiny_run(tmp_path: Path, *extra: str) -> list[str]:
    """``asr.train`` arguments for the tiny LAS in ``tmp_path/exp``, validated on :func:`tiny_valid`."""
    return [str(LAS_RECIPE), *TINY, f"exp_dir={tmp_path / 'exp'}", f"data.dev=[{tiny_valid(tmp_path)}]", *extra]


TRANSFORMER_RECIPE = PROJECT_ROOT / "recipes" / "fsdd_transformer.yaml"

# A tiny Transformer on the same few connected-digit utterances, from recipes/fsdd_transformer.yaml.
TINY_TRANSFORMER = [
    f"data.root={SHARED_DATA}",
    "data.digits.utterances=24",
    "data.digits.digits_per_utterance=[1,2]",
    "data.num_workers=0",
    "data.max_frames_per_batch=1200",
    "data.tokenizer=char",
    "features.num_mel_bins=23",
    "model.d_model=16",
    "model.heads=4",
    "model.encoder.num_layers=3",
    "model.encoder.ff_dim=32",
    "model.decoder.num_layers=2",
    "model.decoder.ff_dim=32",
    "train.valid_max_utterances=4",
    "train.log_every_steps=1",
]


def tiny_transformer_run(tmp_path: Path, *extra: str) -> list[str]:
    """``asr.train`` arguments for the tiny Transformer in ``tmp_path/exp``, validated on :func:`tiny_valid`."""
    return [str(TRANSFORMER_RECIPE), *TINY_TRANSFORMER, f"exp_dir={tmp_path / 'exp'}",
            f"data.dev=[{tiny_valid(tmp_path)}]", *extra]


def subprocess_env() -> dict:
    """The environment for an entry point run as a subprocess: this checkout importable, one thread."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(PROJECT_ROOT))


class FailingFile:
    """A file whose writes stop with ``OSError(code)`` after ``budget`` bytes: a full disk or a denied
    write injected into the lowest write call (the bytes before it are written, as a real one would)."""

    def __init__(self, file, code: int, budget: int):
        self.file, self.code, self.budget = file, code, budget

    def write(self, data) -> int:
        if len(data) > self.budget:
            self.file.write(data[: self.budget])
            self.budget = 0
            raise OSError(self.code, os.strerror(self.code))
        self.budget -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def fail_writes_to(monkeypatch, name: str, code: int, after: int = 0) -> None:
    """Make the atomic writes of files called ``name`` (their temporary ``.{name}.*.tmp``, opened with
    ``os.fdopen``) fail with ``OSError(code)``, from the ``after + 1``-th such write on (Linux: /proc)."""
    real_fdopen = os.fdopen
    seen = []

    def fdopen(fd, *args, **kwargs):
        file = real_fdopen(fd, *args, **kwargs)
        opened = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if opened.startswith(f".{name}.") and opened.endswith(".tmp"):
            seen.append(opened)
            if len(seen) > after:
                return FailingFile(file, code, budget=100)
        return file

    monkeypatch.setattr(os, "fdopen", fdopen)


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"test data not found: {path} (set ASR_SHARED_DATA to the shared data folder)")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    return _require(SHARED_DATA)


@pytest.fixture(scope="session")
def fsdd_recordings() -> Path:
    """Free Spoken Digit Dataset recordings: {digit}_{speaker}_{take}.wav, 8 kHz."""
    return _require(SHARED_DATA / "fsdd" / "recordings")


@pytest.fixture(scope="session")
def librivox_mini() -> Path:
    """Five LibriVox utterances in LibriSpeech layout (subset folder), 16 kHz FLAC."""
    return _require(SHARED_DATA / "librivox_mini" / "LibriSpeech" / "test-mini")


@pytest.fixture(scope="session")
def fsdd_dev() -> Path:
    """Connected-digit dev set in LibriSpeech layout (subset folder)."""
    return _require(SHARED_DATA / "fsdd_connected" / "LibriSpeech" / "fsdd-dev")


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")} if folder.exists() else {}


@pytest.fixture(scope="session", autouse=True)
def _shared_data_is_never_written():
    """No test may write into the shared data (whoever runs the suite: as root, its read-only
    modes stop nothing). Checked after the whole session: anything added, removed or changed fails."""
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
