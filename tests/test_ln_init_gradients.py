"""benchmarks/ln_init_gradients.py: the gradient norms of a LAS at initialisation, per LN placement and cell."""

import math
import sys

import pytest
from helpers import LAS_RECIPE, PROJECT_ROOT, TINY

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from ln_init_gradients import measure  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_demo_corpus")]  # builds the tiny LAS's data


def test_the_ctc_head_sees_only_the_listener_whatever_the_speller_holds(tmp_path):
    """LN in the speller too changes nothing the CTC head computes: its gradient is the same with LN in the
    listener only and in both stacks, at every length, while the speller's (and, through the attention
    loss, the listener's) differs (same seed, same listener weights). A probe that mixed the runs' weights or batches would break the first equality."""
    both = measure(LAS_RECIPE, TINY, "both:ba2016", (0.1, 0.9), tmp_path)
    listener = measure(LAS_RECIPE, TINY, "listener:ba2016", (0.1, 0.9), tmp_path)
    assert [r["frames"] for r in both] == [r["frames"] for r in listener] and both[0]["frames"] < both[1]["frames"]
    for a, b in zip(both, listener):
        assert a["ctc"] == b["ctc"]
        assert a["speller"] != b["speller"] and a["listener"] != b["listener"]  # the attention loss reaches the listener
        assert all(math.isfinite(a[g]) and a[g] > 0 for g in ("listener", "speller", "ctc"))
        assert a["largest"][0].startswith("listener.") and a["largest"][1] <= a["listener"]
