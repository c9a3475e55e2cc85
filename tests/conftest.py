"""Shared test fixtures: the real speech in ``../shared/data`` (see its README)."""

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


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Small models run faster on one thread (and the CI machine has two cores for
    the whole suite); tests that need more threads set it themselves."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
