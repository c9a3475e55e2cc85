"""Does padding each batch's frames (``data.pad_frames_to``) buy updates per minute on this machine, at equal
dev loss? Trains a recipe for a fixed number of updates once per padding, alternating the paddings over
``--rounds`` (A B A B ...), each run alone on the machine with the recipe's thread count, and prints, per run,
the seconds of its updates (the trainer's own clock, validation excluded), updates per minute and the dev
loss after the last update.

    python benchmarks/padding_speed.py recipes/rehearsal_las.yaml data.root=/data/rehearsal30 \\
        train.schedules.ctc_weight=null --pad 1 --pad 128 --updates 500 --rounds 2 --out /tmp/padding_speed

Overrides after the recipe apply to every run. Each run is ``python -m asr.train`` in its own folder under
``--out`` (an existing one is trained again from scratch only with ``--overwrite``). Nothing else should run
on the machine meanwhile: the figures are wall-clock.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

STEP = re.compile(r"step (\d+) loss [-\d.naif]+ lr [^,]+, ([\d.e+-]+) s/update")
VALID = re.compile(r"step (\d+) \(epoch \d+[^)]*\): valid loss ([\d.naif]+)")


def read_log(log: Path) -> tuple[float, int, float | None]:
    """(seconds of updates, updates, dev loss at the last validation) from a run's train.log: each logged
    interval's seconds per update times its updates."""
    seconds, last, loss = 0.0, 0, None
    for line in log.read_text().splitlines():
        step = STEP.search(line)
        if step:
            number, per_update = int(step.group(1)), float(step.group(2))
            seconds += per_update * (number - last)
            last = number
        valid = VALID.search(line)
        if valid:
            loss = float(valid.group(2))
    return seconds, last, loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    parser.add_argument("--pad", action="append", required=True, help="a data.pad_frames_to value (give two or more)")
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.updates % 50:
        parser.error("--updates must be a multiple of 50 (the log interval)")
    rows = []
    for round_ in range(args.rounds):
        for pad in args.pad:
            exp = args.out / f"pad{pad.replace(',', '_').strip('[]')}_round{round_}"
            if exp.exists():
                if not args.overwrite:
                    print(f"error: {exp} exists; give another --out, or --overwrite to train it again",
                          file=sys.stderr)
                    return 2
                shutil.rmtree(exp)
            command = [sys.executable, "-m", "asr.train", args.recipe, *args.overrides,
                       f"data.pad_frames_to={pad}", f"exp_dir={exp}", "train.max_minutes=null",
                       f"train.max_steps={args.updates}", f"train.valid_every_steps={args.updates}",
                       "train.log_every_steps=50"]
            print(" ".join(command), flush=True)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            seconds, updates, loss = read_log(exp / "train.log")
            rows.append((pad, round_, seconds, updates, loss))
    print("\n| pad_frames_to | round | seconds of updates | updates per minute | dev loss |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for pad, round_, seconds, updates, loss in rows:
        print(f"| {pad} | {round_} | {seconds:.0f} | {60 * updates / seconds:.1f} | {loss} |")
    for pad in args.pad:
        rates = [60 * updates / seconds for p, _, seconds, updates, _ in rows if p == pad]
        print(f"pad {pad}: median {statistics.median(rates):.1f} updates per minute over {len(rates)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
