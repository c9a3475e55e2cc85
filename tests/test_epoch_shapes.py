"""benchmarks/epoch_shapes.py: its count of the LN-LSTM's recordings follows the real graph cache, and it
packs an epoch as asr.train does."""

import random
import sys

import torch
from helpers import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import epoch_shapes  # noqa: E402

from asr.models import cuda_graphs  # noqa: E402
from asr.models.lnlstm.backends import triton as triton_backend  # noqa: E402


def test_the_simulated_arena_records_and_drops_as_the_graph_cache_does():
    """The same calls into asr.models.cuda_graphs.GraphCache (CPU buffers) and into the benchmark's model of
    it: a new key is a recording there exactly when it is one here, arena growth included."""
    spec = triton_backend._Config(4, True, 1.0, 1e-5, torch.float32)
    real, simulated = cuda_graphs.GraphCache(), epoch_shapes.ArenaCache()
    rng = random.Random(0)
    device = torch.device("cpu")
    misses = 0
    for _ in range(60):
        key = (cuda_graphs.padded_batch(rng.randint(1, 20)), cuda_graphs.padded_time(rng.randint(5, 300)))
        specs = triton_backend._forward_specs(2, *key, spec, True)
        misses += key not in real.entries.get(device, {})  # a recording: run_recorded records what has no graph
        real.buffers(key, specs, device)
        real.set_graph(key, device, object())  # as run_recorded does after a capture
        simulated.call(key, cuda_graphs.arena_bytes(specs))
    assert simulated.recorded == misses and simulated.dropped > 0
    assert set(simulated.entries) == set(real.entries[device])


def test_padding_leaves_fewer_frame_lengths_and_counts_its_share(tmp_path):
    durations = tmp_path / "durations.txt"
    rng = random.Random(1)
    durations.write_text("".join(f"utt{i}\t{rng.uniform(1.0, 17.0):.3f}\n" for i in range(3000)))
    before, after = (epoch_shapes.main(["--durations", str(durations), "--recipes", "librispeech100_transformer.yaml",
                                        f"data.pad_frames_to={pad}"])[0] for pad in (1, 64))
    assert before["utterances"] == after["utterances"] == 3000
    assert before["lengths"] == before["batches"] > 40  # without padding each batch its own length
    assert after["lengths"] <= (1700 - 100) // 64 + 1 < before["lengths"]
    assert 0 <= before["padding"] < after["padding"] < 63 / 100  # at most 63 more frames a row of at least 100
