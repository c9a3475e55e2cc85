"""What several test modules share: paths to the shared data, the tiny recipes and their runs, failing
writes, and small models and batches. Test modules import from here, never from conftest or from each
other (pytest imports those as it pleases); tests/conftest.py holds the fixtures and imports from here too."""

import os
from pathlib import Path

import torch

from asr.config import from_dict
from asr.models.attention import AttentionConfig
from asr.models.common import add_sos_eos
from asr.models.las import LASConfig
from asr.models.listener import ListenerConfig
from asr.models.speller import SpellerConfig
from asr.models.transformer import Transformer, TransformerConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ASR_SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))


# The shared data's three folders (../shared/data/README.md)
SHARED_SUBSETS = ("fsdd/recordings", "fsdd_connected/LibriSpeech/fsdd-dev", "librivox_mini/LibriSpeech/test-mini")


def require_shared_data(path: Path | None = None) -> Path:
    """``path`` in the shared data (None: the shared data folder, with all of :data:`SHARED_SUBSETS` in
    it), or skip the test that needs it, saying what is missing.

    Without the shared data (docs/install.md) its tests skip; under CI (``CI`` set) a missing
    folder fails instead, so CI cannot pass by skipping them."""
    needed = [path] if path is not None else [SHARED_DATA / subset for subset in SHARED_SUBSETS]
    missing = [str(folder) for folder in needed if not folder.exists()]
    if missing:
        import pytest

        reason = (f"needs the shared data: {', '.join(missing)} not found "
                  "(set ASR_SHARED_DATA to the shared data folder; see docs/install.md)")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return SHARED_DATA if path is None else path
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
    from asr.data.demo import corpus_folder
    from asr.data.librispeech import default_cache_dir
    from asr.synthesis.demo import prepare_corpus
    from asr.experiment import load_experiment_config

    require_shared_data()  # the tiny LAS trains and validates on it
    data = load_experiment_config(LAS_RECIPE, [*TINY, *overrides]).data
    prepare_corpus(data.demo, data.cache_dir or default_cache_dir())
    return corpus_folder(data.demo, data.cache_dir or default_cache_dir())


def tiny_valid(tmp_path: Path, count: int = 6) -> Path:
    """A LibriSpeech-layout copy (symlinks) of the first ``count`` dev utterances, to keep validation short."""
    source = require_shared_data(SHARED_DATA / "fsdd_connected" / "LibriSpeech" / "fsdd-dev" / "9000" / "1")
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


# The modules that take minutes in all, longest first. A worker takes the next module in collection order
# whenever it runs out, so these go first and the short ones fill in at the end: started last, one of
# them would leave the other worker idle for minutes.
LONGEST_FIRST = ("test_train.py", "test_study.py", "test_long_recording.py", "test_device_features.py",
                 "test_inference_cli.py", "test_synth_librispeech.py", "test_bootstraps.py")


def read_png(path: Path):
    """The picture at ``path`` as an array (height, width, channels), by matplotlib's reader, imported here:
    matplotlib takes 0.7 s that every test worker would pay while collecting the modules that read pictures."""
    import matplotlib.image

    return matplotlib.image.imread(path)


def longest_modules_first(items: list) -> list:
    """The collected tests with the modules in LONGEST_FIRST's order first, then the others with slow tests,
    then the rest; a module's tests stay together and in their order (its module-scoped fixtures are built
    once, with or without workers)."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item) -> tuple[int, int]:
        if item.path.name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(item.path.name)
        return (1 if item.path in slow else 2), 0

    return sorted(items, key=rank)  # stable: collection order within a rank


def process_ended(pid: int, within: float = 0.0) -> bool:
    """Whether process ``pid`` has exited, waiting up to ``within`` seconds: gone, or a zombie nobody has
    reaped yet (an orphan's new parent, init or a container's first process, may reap late or never)."""
    import time

    deadline = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


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


# ---------------------------------------------------------------- tiny Transformer (tests/test_transformer.py)

INPUT_DIM = 20  # the tiny Transformer's feature size and vocabulary
VOCAB = 12
PAD, SOS, EOS = 0, 1, 2


def make_transformer(seed: int = 0, input_dim: int = INPUT_DIM, vocab: int = VOCAB, **overrides) -> Transformer:
    """A tiny Transformer; ``overrides`` are recipe keys (nested dicts for encoder/decoder)."""
    data = {
        "d_model": 32,
        "heads": 4,
        "encoder": {"num_layers": 2, "ff_dim": 48},
        "decoder": {"num_layers": 2, "ff_dim": 48},
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    config = from_dict(TransformerConfig, data, "model")
    torch.manual_seed(seed)
    return Transformer(config, input_dim, vocab, pad_id=PAD, sos_id=SOS, eos_id=EOS)


def transformer_batch(lengths, token_lengths, seed=1, pad_value=0.0):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(len(lengths), max(lengths), INPUT_DIM, generator=generator)
    tokens = torch.randint(3, VOCAB, (len(lengths), max(token_lengths)), generator=generator)
    for b, (length, token_length) in enumerate(zip(lengths, token_lengths)):
        features[b, length:] = pad_value
        tokens[b, token_length:] = PAD
    return features, torch.tensor(lengths), tokens, torch.tensor(token_lengths)


def teacher_forced(model, features, lengths, tokens, token_lengths):
    encoder = model.encode(features, lengths)
    decoder_input, _ = add_sos_eos(tokens, token_lengths, SOS, EOS, PAD)
    return encoder, model.decoder_log_probs(encoder, decoder_input, token_lengths + 1)


# ---------------------------------------------------------------- tiny LAS (tests/test_las.py)

def small_las_config(**options) -> LASConfig:
    return LASConfig(
        listener=ListenerConfig(hidden_size=8, num_layers=3, pyramid_layers=2),
        attention=AttentionConfig(type="location", dim=8, conv_channels=2, conv_kernel=3),
        speller=SpellerConfig(embedding_dim=4, hidden_size=8, num_layers=2),
        **options,
    )


def las_batch(vocab=10):
    torch.manual_seed(1)
    features = torch.randn(3, 30, 6)
    feature_lengths = torch.tensor([30, 17, 9])
    tokens = torch.randint(3, vocab, (3, 5))
    token_lengths = torch.tensor([5, 3, 1])
    tokens[1, 3:] = PAD
    tokens[2, 1:] = PAD
    return features, feature_lengths, tokens, token_lengths


# ---------------------------------------------------------------- the LN-LSTM's Triton kernels


def load_triton_kernels() -> bool:
    """Import triton and the LN-LSTM's Triton kernels (once per process), under Triton's interpreter
    where no GPU is present, and say whether they run CPU tensors (interpreted); False without triton.

    ``triton.jit`` reads ``TRITON_INTERPRET`` when a function is defined, i.e. when triton (its
    language library) and asr/models/lnlstm/backends/triton_kernels.py are imported: it is set for
    those imports only and restored at once. The interpreter reads it again while a kernel runs: a
    test that runs them sets it for itself (``monkeypatch.setenv``). Where triton was imported
    before without it, the kernels cannot be interpreted here and this answers False.
    """
    import importlib.util
    import sys

    if importlib.util.find_spec("triton") is None:
        return False
    name = "asr.models.lnlstm.backends.triton_kernels"
    if name not in sys.modules and not torch.cuda.is_available():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            return False  # its language library is compiled-mode already
        previous = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            __import__(name)
        finally:
            if previous is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = previous
    from asr.models.lnlstm.backends import triton as triton_backend

    return triton_backend.interpreting()
