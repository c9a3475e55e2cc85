"""Speed of LNLSTM against torch.nn.LSTM of the same shape, on CPU (default) or CUDA.

    python benchmarks/lnlstm.py                  # defaults below, 2 threads, wall clock
                                                 # (needs the package installed: pip install -e .)
    python benchmarks/lnlstm.py --threads 1 --clock cpu
    python benchmarks/lnlstm.py --build portable # the C++ operator without -march=native (model.lnlstm_build)
    python benchmarks/lnlstm.py --device cuda    # the Triton path against cuDNN (see cuda_main)

One bidirectional layer (B=16, T=300, input 320, hidden 256, float32 by
default). Each round times, interleaved, nn.LSTM and every LNLSTM variant
(fused LN, fused without LN, reference PyTorch path with LN), for training
(forward + backward) and inference (forward under no_grad); the ratios are of
medians over the rounds (minima too). Load from other processes does not hit all variants
alike: nn.LSTM synchronises its threads at every op of every time step and
suffers more from a busy machine than the fused operator, which synchronises
once per layer. So the load average is printed, and ``--threads 1 --clock cpu``
(CPU time of this process, one thread) gives a load-robust comparison of the
work done. Results go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

from asr.models import lnlstm
from asr.models.lnlstm.backends import cpp as lnlstm_ext
from asr.models.lnlstm import LNLSTM


def lscpu_field(name: str) -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return None


def cpu_model() -> str:
    return lscpu_field("Model name") or platform.processor() or "unknown"


def vector_extensions() -> str:
    """The SIMD entries of lscpu's flags (the fused operator is compiled for them)."""
    flags = (lscpu_field("Flags") or "").split()
    return " ".join(f for f in flags if f.startswith(("sse", "ssse", "avx", "fma", "amx", "asimd", "sve"))) or "unknown"


def make_case(model: nn.Module, x: torch.Tensor, grad_y: torch.Tensor, implementation: str | None, train: bool):
    """A closure running one training step (forward + backward) or one inference forward."""

    def run() -> None:
        if implementation is not None:
            lnlstm.set_implementation(implementation)
        if train:
            x.grad = None
            for p in model.parameters():
                p.grad = None
            y = model(x)[0]
            y.backward(grad_y)  # a dense upstream gradient, as from a real loss
        else:
            with torch.no_grad():
                model(x)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--time", type=int, default=300)
    parser.add_argument("--input", type=int, default=320)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds (median taken); at least 7")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-reference", action="store_true", help="skip the slow reference path")
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="wall: elapsed time; cpu: this process's CPU time"
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: the Triton path against cuDNN nn.LSTM at two fixed shapes (the size options are ignored)",
    )
    parser.add_argument("--allow-tf32", action="store_true", help="cuda: allow TF32 in cuBLAS matmuls too")
    parser.add_argument("--build", choices=lnlstm.BUILDS, default="native",
                        help="how the C++ operator is built, as a recipe's model.lnlstm_build: native (-march=native) "
                             "or portable (what a CPU without this one's vector extensions gets)")
    args = parser.parse_args()
    if args.repeats < 7:
        parser.error("--repeats must be at least 7")
    if args.device == "cuda":
        cuda_main(args)
        return

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if lnlstm_ext.load(strict=False, build=args.build) is None:
        sys.exit("the fused C++ operator could not be built; nothing to benchmark")
    x = torch.randn(args.batch, args.time, args.input, requires_grad=True)
    grad_y = torch.randn(args.batch, args.time, 2 * args.hidden)
    shape = {"input_size": args.input, "hidden_size": args.hidden, "bidirectional": True}
    torch_lstm = nn.LSTM(batch_first=True, **shape)
    lstm = dict(shape, build=args.build)
    variants = {
        "nn.LSTM": (torch_lstm, None),
        "LNLSTM fused, layer_norm=True": (LNLSTM(**lstm, layer_norm=True), "cpp"),
        "LNLSTM fused, layer_norm=False": (LNLSTM(**lstm, layer_norm=False), "cpp"),
    }
    if not args.no_reference:
        variants["LNLSTM reference, layer_norm=True"] = (LNLSTM(**lstm, layer_norm=True), "python")

    cases = {}
    for name, (model, implementation) in variants.items():
        for mode in ("train", "infer"):
            cases[(name, mode)] = make_case(model, x, grad_y, implementation, mode == "train")
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    times = {key: [] for key in cases}
    load_before = os.getloadavg()[0]
    for round_index in range(args.warmup + args.repeats):
        for key, run in cases.items():
            start = clock()
            run()
            elapsed = clock() - start
            if round_index >= args.warmup:
                times[key].append(elapsed)

    print(f"CPU: {cpu_model()}; torch {torch.__version__}; threads {args.threads}; {args.clock} clock")
    print(f"vector extensions: {vector_extensions()}")
    print(f"fused operator compiled with: {' '.join(lnlstm_ext.build_flags() or [])}")
    print(f"1-minute load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(
        f"one bidirectional layer, B={args.batch}, T={args.time}, input {args.input}, hidden {args.hidden}, "
        f"float32; median of {args.repeats} interleaved rounds after {args.warmup} warm-up"
    )
    for statistic in (statistics.median, min):
        # The minimum is the least disturbed round: an estimate for a quiet machine.
        print(f"\n{statistic.__name__} over rounds")
        print(f"{'variant':<36} {'train ms':>9} {'x nn.LSTM':>9} {'infer ms':>9} {'x nn.LSTM':>9}")
        base = {mode: statistic(times[("nn.LSTM", mode)]) for mode in ("train", "infer")}
        for name in variants:
            row = [name.ljust(36)]
            for mode in ("train", "infer"):
                value = statistic(times[(name, mode)])
                row.append(f"{value * 1e3:9.1f} {value / base[mode]:9.2f}")
            print(" ".join(row))


# --- CUDA: the Triton path against cuDNN ---------------------------------------------------

# (B, T, input, hidden): a first listener layer on 80 fbank features, and a
# higher one (4x reduced) reading 2 x 320 outputs of the layer below.
CUDA_SHAPES = ((32, 1000, 80, 320), (32, 250, 640, 320))


def make_cuda_case(model: nn.Module, x: torch.Tensor, grad_y: torch.Tensor, implementation, train: bool, bf16: bool):
    """One training step (forward + backward) or inference forward, under bf16 autocast or not."""

    def run() -> None:
        if implementation is not None:
            lnlstm.set_implementation(implementation)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            if train:
                x.grad = None
                for p in model.parameters():
                    p.grad = None
                y = model(x)[0]
            else:
                with torch.no_grad():
                    model(x)
        if train:
            y.backward(grad_y.to(y.dtype))  # nn.LSTM's y is bf16 under autocast, LNLSTM's float32

    return run


def cuda_main(args) -> None:
    """Both CUDA_SHAPES, one bidirectional layer, float32 and bf16 autocast, training and
    inference: nn.LSTM (cuDNN), LNLSTM on the Triton path with and without layer norm
    (the LN cost), and the reference path with --no-reference unset (slow). Times are
    wall clock between synchronisations, medians over interleaved rounds; the warm-up
    rounds include compiling the kernels and recording the CUDA graphs."""
    import triton

    if not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device")
    device = torch.device("cuda")
    if args.allow_tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    lnlstm.set_implementation("triton")  # raises if the kernels do not compile here
    print(
        f"GPU: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; triton {triton.__version__}; "
        f"TF32: cuDNN {torch.backends.cudnn.allow_tf32}, cuBLAS matmul {torch.backends.cuda.matmul.allow_tf32}"
    )
    print(f"median of {args.repeats} interleaved rounds after {args.warmup} warm-up; ratio = time / nn.LSTM's")
    for batch, time_steps, input_size, hidden in CUDA_SHAPES:
        torch.manual_seed(0)
        x = torch.randn(batch, time_steps, input_size, device=device, requires_grad=True)
        grad_y = torch.randn(batch, time_steps, 2 * hidden, device=device)
        shape = {"input_size": input_size, "hidden_size": hidden, "bidirectional": True}
        variants = {
            "nn.LSTM (cuDNN)": (nn.LSTM(batch_first=True, **shape).to(device), None),
            "LNLSTM triton, layer_norm=True": (LNLSTM(**shape, layer_norm=True).to(device), "triton"),
            "LNLSTM triton, layer_norm=False": (LNLSTM(**shape, layer_norm=False).to(device), "triton"),
        }
        if not args.no_reference:
            variants["LNLSTM reference, layer_norm=True"] = (LNLSTM(**shape, layer_norm=True).to(device), "python")
        for precision in ("float32", "bf16 autocast"):
            cases = {
                (name, mode): make_cuda_case(model, x, grad_y, impl, mode == "train", precision != "float32")
                for name, (model, impl) in variants.items()
                for mode in ("train", "infer")
            }
            times = {key: [] for key in cases}
            for round_index in range(args.warmup + args.repeats):
                for key, run in cases.items():
                    torch.cuda.synchronize(device)
                    start = time.perf_counter()
                    run()
                    torch.cuda.synchronize(device)
                    if round_index >= args.warmup:
                        times[key].append(time.perf_counter() - start)
            print(f"\nB={batch}, T={time_steps}, input {input_size}, hidden {hidden}, one bidirectional layer, "
                  f"{precision}")
            print(f"{'variant':<36} {'train ms':>9} {'x nn.LSTM':>9} {'infer ms':>9} {'x nn.LSTM':>9}")
            base = {mode: statistics.median(times[("nn.LSTM (cuDNN)", mode)]) for mode in ("train", "infer")}
            for name in variants:
                row = [name.ljust(36)]
                for mode in ("train", "infer"):
                    value = statistics.median(times[(name, mode)])
                    row.append(f"{value * 1e3:9.2f} {value / base[mode]:9.2f}")
                print(" ".join(row))


if __name__ == "__main__":
    main()
