"""On CUDA: a batch too big for the memory it may use is skipped by TrainingStep, the weights untouched,
and the next batch trains.

    python benchmarks/oom_skip.py          # needs a CUDA GPU; prints RESULT PASS or RESULT FAIL

The LAS of recipes/librispeech100.yaml under bf16 autocast takes one update on 8 utterances of 10 s;
then the process may use at most 8 GiB (torch.cuda.set_per_process_memory_fraction), and a batch of 64
utterances of 20 s (then 256, if 64 fit) must come back skipped as "CUDA out of memory", with no
gradient left and the weights unchanged, and the next small batch must train. It prints the memory
allocated before and after the skip. tests/test_step.py simulates the same on CPU; this is the real
allocator. Results: docs/benchmarks.md ("An oversized batch on CUDA")."""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from las_step import stand_ins, synthetic_batch  # noqa: E402

from asr.data.batching import Batch  # noqa: E402
from asr.experiment import load_experiment_config  # noqa: E402
from asr.models.registry import build_model  # noqa: E402
from asr.training.step import TrainingStep  # noqa: E402
from asr.run import build_optimizer  # noqa: E402

if not torch.cuda.is_available():
    sys.exit("benchmarks/oom_skip.py needs a CUDA GPU")
device = torch.device("cuda")
config = load_experiment_config(Path(__file__).resolve().parents[1] / "recipes" / "librispeech100.yaml")
tokenizer, feature_dim = stand_ins(config)
vocab_size = tokenizer.vocab_size
model = build_model(config.model, feature_dim, tokenizer).to(device).train()
optimizer = build_optimizer(model, config.train)
step = TrainingStep(model, optimizer, grad_clip=config.train.grad_clip, use_amp=config.train.amp)


def batch(n, seconds):
    f, l, t, tl = synthetic_batch(n, seconds, 6.0, vocab_size, feature_dim, device)
    return Batch([f"u{i}" for i in range(n)], f, l, t, tl)


small = batch(8, 10.0)
print("warm-up step:", step.backward(small), step.update().grad_norm, flush=True)
torch.cuda.synchronize()
baseline = torch.cuda.memory_allocated()
total = torch.cuda.get_device_properties(0).total_memory
cap = 8 * 2**30
torch.cuda.set_per_process_memory_fraction(cap / total)
print(f"allocated after one update: {baseline / 2**20:.0f} MiB; cap set to {cap / 2**30:.0f} GiB of {total / 2**30:.0f}")
before = {k: v.detach().clone() for k, v in model.state_dict().items()}
torch.cuda.reset_peak_memory_stats()
for n, seconds in [(64, 20.0), (256, 20.0)]:
    big = batch(n, seconds)
    t0 = time.perf_counter()
    outcome = step.backward(big)
    torch.cuda.synchronize()
    print(f"oversized {n} x {seconds} s ({n * seconds * 100:.0f} frames): {outcome} in {time.perf_counter() - t0:.2f} s;"
          f" allocated after: {torch.cuda.memory_allocated() / 2**20:.0f} MiB (baseline {baseline / 2**20:.0f}),"
          f" reserved {torch.cuda.memory_reserved() / 2**20:.0f} MiB, peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB;"
          f" grads left: {sum(p.grad is not None for p in model.parameters())}", flush=True)
    del big
    if outcome.skipped:
        break
unchanged = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
print("weights unchanged by the skipped batch:", unchanged)
after = step.backward(small)
print("next batch:", after, "update grad norm:", step.update().grad_norm)
print("RESULT", "PASS" if outcome.skipped and outcome.skipped.reason.value == "CUDA out of memory" and unchanged
      and after.loss is not None else "FAIL")
