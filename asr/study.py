"""Train every combination of a grid of config values, then compare them: one command per study.

    python -m asr.study recipes/fsdd_las.yaml --grid model.layer_norm=none,listener,speller,both features.mvn=none,global
    python -m asr.study recipes/fsdd_las.yaml train.max_epochs=10 --grid model.listener.pyramidal=true,false
    python -m asr.study recipes/fsdd_las.yaml --grid data.digits.held_out_speaker=george,jackson,nicolas,yweweler
    python -m asr.study recipes/fsdd_transformer.yaml --grid model.encoder.layer_norm,model.decoder.layer_norm=pre,post
    python -m asr.study recipes/fsdd_las.yaml --grid data.digits.held_out_speaker=george,jackson train.seed,data.seed=0,1 \\
        --pool data.digits.held_out_speaker --ensemble train.seed,data.seed --average-last 5 --vtln-warps 0.8:1.2:0.05

Each run is ``python -m asr.train RECIPE [OVERRIDE ...] KEY=VALUE ...`` with
its own ``exp_dir`` under ``--out`` (default ``exp/study_<recipe name>``),
named after its grid values (``layer_norm=none,mvn=global``). Keys joined by
a comma before the ``=`` are tied: they take each value together. Positional
overrides apply to every run. After training, each run's ``last.pt`` is
evaluated with ``asr.evaluate --split dev``, and ``--split test`` where the
recipe has a test split (a leave-one-speaker-out fold's held-out speaker,
the demo corpus's held-out voices, ``data.test``). With ``--average-last N``
the evaluated model is instead the average of the run's last N epoch
checkpoints (``asr.average --last N``, written as ``avg_lastN.pt``; its
evaluations go to ``eval_avg_lastN_<split>``). With ``--vtln-warps`` every
model is also scored with test-time VTLN (``asr.evaluate --vtln-warps``,
into ``..._<split>_vtln``), beside the plain score, and with
``--adapt-rounds N`` adapted to each speaker without transcripts as well
(``asr.evaluate --adapt-rounds N``, after VTLN when it is on; into
``..._<split>[_vtln]_adapt``). With ``--ensemble KEY``
(a grid key, typically the seed) the runs that differ only in KEY are also
decoded together as one ensemble, into ``--out``/``ensembles/<other values>``.
The study then writes into ``--out``:

- ``valid_loss.png``: the validation-loss curves of all runs over each other
  (drawn by :mod:`asr.compare`, y axis fitted to the epochs after the first;
  ``--tag`` picks other tags);
- ``results.md`` and ``results.json``: per run, the grid values, final and
  best validation loss, dev and test WER, and training minutes; and, when
  ``--pool KEY`` names a grid key (e.g. the held-out speaker), the WER pooled
  over that key's values (errors summed over words summed) for each
  combination of the other keys; with ``--ensemble``, the same for the
  ensembles.

A study is resumable: a finished run (its folder holds ``study_time.json``)
is not trained again, an interrupted one (``last.pt`` but no
``study_time.json``) is continued with ``--resume``, and an evaluation is
reused when its ``wer.json`` is newer than the checkpoint. Values
are split at commas outside brackets, so ``features.speed_perturb=[0.9,1.0,1.1],[]``
is two values.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from asr.compare import CompareError, load_curves, plot
from asr.config import ConfigError
from asr.data.corpus import load_split
from asr.data.report import DataError, SkipReport
from asr.experiment import load_experiment_config
from asr.inference import warp_list

logger = logging.getLogger("asr.study")


class StudyError(ValueError):
    """A grid that cannot be run; the message names the grid entry or the run."""


@dataclass
class Run:
    """One point of the grid: its overrides, its folder and (once done) its results."""

    values: dict[str, str]  # grid entry -> value, in grid order
    exp_dir: Path
    results: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return ",".join(f"{short_key(k)}={v}" for k, v in self.values.items())

    def overrides(self) -> list[str]:
        # A tied entry ("a.x,b.x") sets every one of its keys to the value.
        return [f"{key}={v}" for entry, v in self.values.items() for key in entry.split(",")]


def short_key(entry: str) -> str:
    """A grid entry's name in run names and table headers: the last part of its dotted key
    (``model.layer_norm`` -> ``layer_norm``), for tied keys the distinct last parts joined by ``+``."""
    names = []
    for key in entry.split(","):
        name = key.rsplit(".", 1)[-1]
        if name not in names:
            names.append(name)
    return "+".join(names)


def split_values(text: str) -> list[str]:
    """Split ``a,b,[c,d]`` at commas outside brackets and braces: ``["a", "b", "[c,d]"]``."""
    values, depth, current = [], 0, ""
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += char
    values.append(current)
    return [v.strip() for v in values]


def parse_grid(entries: list[str]) -> dict[str, list[str]]:
    """``["KEY=V1,V2", ...]`` -> ``{KEY: [V1, V2]}``; errors name the entry.

    ``KEY1,KEY2=V1,V2`` ties the keys: both take V1 in one run and V2 in the
    other (e.g. pre- or post-norm in the encoder and the decoder together).
    """
    grid: dict[str, list[str]] = {}
    for entry in entries:
        key, sep, values = entry.partition("=")
        key = ",".join(k.strip() for k in key.split(","))
        if not sep or not all(key.split(",")):
            raise StudyError(f"--grid {entry!r}: expected KEY=VALUE1,VALUE2,... or KEY1,KEY2=VALUE1,VALUE2,...")
        if key in grid:
            raise StudyError(f"--grid: key {key!r} given twice")
        parsed = split_values(values)
        if any(v == "" for v in parsed):
            raise StudyError(f"--grid {entry!r}: empty value")
        if len(set(parsed)) != len(parsed):
            raise StudyError(f"--grid {entry!r}: a value is repeated")
        grid[key] = parsed
    if len({short_key(k) for k in grid}) != len(grid):
        raise StudyError(f"--grid: two keys end in the same name ({', '.join(grid)}); run names would collide")
    return grid


def plan_runs(recipe: Path, overrides: list[str], grid: dict[str, list[str]], out: Path) -> list[Run]:
    """Every combination of the grid as a :class:`Run`, each config validated before anything trains."""
    runs = []
    for combination in itertools.product(*grid.values()):
        values = dict(zip(grid, combination))
        run = Run(values, out / "runs" / folder_name(values))
        try:
            load_experiment_config(recipe, [*overrides, *run.overrides(), f"exp_dir={run.exp_dir}"])
        except ConfigError as err:
            raise StudyError(f"run {run.name}: {err}") from None
        runs.append(run)
    return runs


def folder_name(values: dict[str, str]) -> str:
    """A file-system-safe folder name for a run: ``layer_norm-none_mvn-global``."""
    parts = []
    for key, value in values.items():
        safe = "".join(c if c.isalnum() or c in ".-" else "" for c in value.replace(",", "-")) or "empty"
        parts.append(f"{short_key(key)}-{safe}")
    return "_".join(parts)


def train_run(run: Run, recipe: Path, overrides: list[str], threads: int) -> None:
    """Train (or resume) one run in a subprocess; its output goes to ``exp_dir/study_train.out``.

    ``exp_dir/study_time.json`` is written when training has finished, with
    its wall-clock seconds; a run that has it is not started again.
    """
    timing = run.exp_dir / "study_time.json"
    if timing.exists():
        logger.info("%s has finished training already (%s)", run.name, timing)
        return
    run.exp_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "asr.train", str(recipe), *overrides, *run.overrides(), f"exp_dir={run.exp_dir}"]
    if (run.exp_dir / "last.pt").exists():
        command.append("--resume")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log_path = run.exp_dir / "study_train.out"
    logger.info("training %s -> %s", run.name, run.exp_dir)
    start = time.time()
    with open(log_path, "a") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False).returncode
    seconds = time.time() - start
    if status != 0:
        raise StudyError(f"run {run.name} failed (exit {status}); its output is in {log_path}")
    # An interrupted and resumed run counts only the attempt that finished it.
    timing.write_text(json.dumps({"train_seconds": seconds, "resumed": "--resume" in command}) + "\n")
    logger.info("finished %s in %.1f min", run.name, seconds / 60)


def average_run(run: Run, last: int) -> Path:
    """``avg_last{last}.pt``: the mean of the run's last ``last`` epoch checkpoints (reused when newer than ``last.pt``)."""
    averaged = run.exp_dir / f"avg_last{last}.pt"
    if averaged.exists() and averaged.stat().st_mtime >= (run.exp_dir / "last.pt").stat().st_mtime:
        return averaged
    command = [sys.executable, "-m", "asr.average", str(run.exp_dir), "--last", str(last), "--out", str(averaged)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StudyError(f"averaging the last {last} checkpoints of run {run.name} failed:\n{done.stderr[-2000:]}")
    return averaged


@dataclass(frozen=True)
class Scoring:
    """One way of scoring each model: a split, plain or with test-time VTLN over ``warps``,
    then adapted to each speaker for ``adapt_rounds`` rounds (none when 0)."""

    split: str
    warps: str | None = None  # asr.evaluate's --vtln-warps value
    adapt_rounds: int = 0     # asr.evaluate's --adapt-rounds value

    @property
    def name(self) -> str:
        """Key in results.json and suffix of the evaluation folder."""
        return self.split + ("_vtln" if self.warps else "") + ("_adapt" if self.adapt_rounds else "")

    @property
    def label(self) -> str:
        rounds = f"{self.adapt_rounds} round" + ("s" if self.adapt_rounds > 1 else "")
        how = (["VTLN"] if self.warps else []) + ([f"adapted, {rounds}"] if self.adapt_rounds else [])
        return f"{self.split} WER %" + (f" ({', '.join(how)})" if how else "")


def evaluate_run(
    name: str, checkpoints: list[Path], folder: Path, scoring: Scoring, beam: int, threads: int
) -> dict | None:
    """``wer.json`` of ``checkpoints`` (several: an ensemble) scored as ``scoring`` says, in ``folder``.

    The evaluation goes to ``folder/eval_<split>`` for a ``last.pt``, else
    ``folder/eval_<checkpoint name>_<split>`` (``_vtln`` added with VTLN, then
    ``_adapt`` with speaker adaptation), and
    is reused when its ``wer.json`` is newer than every checkpoint.
    """
    stem = checkpoints[0].stem
    prefix = "eval" if stem == "last" else f"eval_{stem}"
    out = folder / f"{prefix}_{scoring.name}"
    result = out / "wer.json"
    if result.exists() and all(result.stat().st_mtime >= c.stat().st_mtime for c in checkpoints):
        return json.loads(result.read_text())
    command = [
        sys.executable, "-m", "asr.evaluate", "--checkpoint", *map(str, checkpoints),
        "--split", scoring.split, "--beam", str(beam), "--out", str(out),
    ]
    if scoring.warps:
        command += ["--vtln-warps", scoring.warps]
    if scoring.adapt_rounds:
        command += ["--adapt-rounds", str(scoring.adapt_rounds)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    logger.info("evaluating %s on %s", name, scoring.name)
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise StudyError(f"evaluating {name} on {scoring.name} failed:\n{done.stderr[-2000:]}")
    return json.loads(result.read_text())


def check_average(last: int, recipe: Path, overrides: list[str]) -> None:
    """Refuse ``--average-last`` values the runs cannot provide, before anything trains."""
    train = load_experiment_config(recipe, overrides).train
    if last < 0:
        raise StudyError(f"--average-last must be 0 (off) or more, got {last}")
    if last > min(train.keep_last, train.max_epochs):
        raise StudyError(
            f"--average-last {last}: each run keeps only its last {min(train.keep_last, train.max_epochs)} epoch checkpoints"
            f" (train.keep_last={train.keep_last}, train.max_epochs={train.max_epochs})"
        )


def has_split(recipe: Path, overrides: list[str], split: str) -> bool:
    """Whether the recipe (with these overrides) defines any ``split`` data."""
    config = load_experiment_config(recipe, overrides)
    try:
        utterances, _ = load_split(config.data, split, SkipReport())
    except DataError:
        return True  # it names data, which is broken: let evaluation report it properly
    return bool(utterances)


def pooled(runs: list[Run], split: str) -> float | None:
    """Word errors summed over words summed, across ``runs`` (None if any lacks the score)."""
    scores = [r.results.get(split) for r in runs]
    if any(s is None for s in scores):
        return None
    errors = sum(s["substitutions"] + s["deletions"] + s["insertions"] for s in scores)
    words = sum(s["ref_words"] for s in scores)
    return errors / words if words else None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def markdown_table(header: list[str], text_columns: int, rows: list[list[str]]) -> str:
    """A Markdown table: the first ``text_columns`` columns left-aligned, the numbers after them right-aligned."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    lines = [header, align, *rows]
    return "".join("| " + " | ".join(cells) + " |\n" for cells in lines)


def results_table(runs: list[Run], grid: dict[str, list[str]], scorings: list[Scoring]) -> str:
    """One row per run: grid values, validation loss (final, best and its epoch), WER per scoring, minutes."""
    keys = list(grid)
    header = [*(short_key(k) for k in keys), "final valid loss", "best valid loss (epoch)"]
    header += [s.label for s in scorings] + ["train min"]
    rows = []
    for run in runs:
        r = run.results
        best = f"{_num(r.get('best_valid_loss'))} ({r.get('best_epoch', 'n/a')})"
        cells = [run.values[k] for k in keys] + [_num(r.get("final_valid_loss")), best]
        cells += [_pct(r[s.name]["wer"]) if r.get(s.name) else "n/a" for s in scorings]
        minutes = r.get("train_seconds")
        cells.append("n/a" if minutes is None else f"{minutes / 60:.1f}")
        rows.append(cells)
    return markdown_table(header, len(keys), rows)


def pooled_table(runs: list[Run], grid: dict[str, list[str]], pool_key: str, scorings: list[Scoring]) -> str:
    """WER pooled over ``pool_key``'s values, one row per combination of the other keys of ``grid``."""
    others = [k for k in grid if k != pool_key]
    pooled_over = f"pooled over {len(grid[pool_key])} {short_key(pool_key)}"
    header = [short_key(k) for k in others] + [f"{s.label} ({pooled_over})" for s in scorings]
    rows = []
    for combination in itertools.product(*(grid[k] for k in others)):
        fixed = dict(zip(others, combination))
        group = [r for r in runs if all(r.values[k] == v for k, v in fixed.items())]
        rows.append(list(combination) + [_pct(pooled(group, s.name)) for s in scorings])
    return markdown_table(header, len(others), rows)


def plan_ensembles(runs: list[Run], grid: dict[str, list[str]], key: str, out: Path) -> list[tuple[Run, list[Run]]]:
    """For ``--ensemble key``: one (ensemble, members) pair per combination of the other grid keys,
    the members being the runs over all of ``key``'s values. The ensemble is a :class:`Run` without
    ``key`` in its values, with its folder under ``out/ensembles``."""
    others = [k for k in grid if k != key]
    ensembles = []
    for combination in itertools.product(*(grid[k] for k in others)):
        values = dict(zip(others, combination))
        members = [r for r in runs if all(r.values[k] == v for k, v in values.items())]
        ensembles.append((Run(values, out / "ensembles" / (folder_name(values) or "all")), members))
    return ensembles


def ensemble_table(ensembles: list[Run], grid: dict[str, list[str]], key: str, scorings: list[Scoring]) -> str:
    """One row per ensemble: the other grid values and its WER per scoring."""
    others = [k for k in grid if k != key]
    header = [short_key(k) for k in others] + [s.label for s in scorings]
    rows = []
    for ensemble in ensembles:
        r = ensemble.results
        rows.append([ensemble.values[k] for k in others] + [_pct(r[s.name]["wer"]) if r.get(s.name) else "n/a" for s in scorings])
    return markdown_table(header, len(others), rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.study", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path, help="recipe YAML")
    parser.add_argument("overrides", nargs="*", help="key.sub=value applied to every run")
    parser.add_argument("--grid", nargs="+", required=True, metavar="KEY=V1,V2", help="config keys and their values")
    parser.add_argument("--out", type=Path, help="study folder (default exp/study_<recipe name>)")
    parser.add_argument("--tag", action="append", dest="tags", metavar="TAG", help="curves to plot (default valid/loss)")
    parser.add_argument("--pool", metavar="KEY", help="grid key to pool WER over (e.g. the held-out speaker)")
    parser.add_argument("--beam", type=int, default=1, help="beam size for the WER evaluations (default 1: greedy)")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained (and models evaluated) at once, sharing the CPU cores (default 1)")
    parser.add_argument(
        "--average-last", type=int, default=0, metavar="N",
        help="evaluate the average of each run's last N epoch checkpoints instead of last.pt (default 0: last.pt)",
    )
    parser.add_argument(
        "--vtln-warps", metavar="WARPS",
        help="also score every model with test-time VTLN over these warps (asr.evaluate --vtln-warps)",
    )
    parser.add_argument(
        "--ensemble", metavar="KEY",
        help="grid key (e.g. train.seed) whose runs are also decoded together as one ensemble",
    )
    parser.add_argument(
        "--adapt-rounds", type=int, default=0, metavar="N",
        help="also score every model adapted to each speaker without transcripts, N rounds "
        "(asr.evaluate --adapt-rounds; after test-time VTLN when --vtln-warps is given)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.adapt_rounds < 0:
        parser.error(f"--adapt-rounds must be 0 (off) or more, got {args.adapt_rounds}")
    if not args.recipe.is_file():
        parser.error(f"recipe not found: {args.recipe}")
    out = args.out or Path("exp") / f"study_{args.recipe.stem}"
    try:
        grid = parse_grid(args.grid)
        if args.pool is not None and args.pool not in grid:
            raise StudyError(f"--pool {args.pool!r} is not a grid key ({', '.join(grid)})")
        if args.ensemble is not None and args.ensemble not in grid:
            raise StudyError(f"--ensemble {args.ensemble!r} is not a grid key ({', '.join(grid)})")
        if args.ensemble is not None and args.ensemble == args.pool:
            raise StudyError(f"--ensemble and --pool name the same key {args.ensemble!r}")
        if args.vtln_warps:
            try:
                warp_list(args.vtln_warps)  # a bad list fails now, not after training
            except argparse.ArgumentTypeError as err:
                raise StudyError(f"--vtln-warps: {err}") from None
        runs = plan_runs(args.recipe, args.overrides, grid, out)
        if args.average_last:
            check_average(args.average_last, args.recipe, [*args.overrides, *runs[0].overrides()])
    except StudyError as err:
        parser.error(str(err))
    logger.info("%d runs: %s", len(runs), "; ".join(r.name for r in runs))

    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda r: train_run(r, args.recipe, args.overrides, threads), runs))
    except StudyError as err:
        print(f"asr.study: {err}", file=sys.stderr)
        return 1

    splits = ["dev"] + (["test"] if has_split(args.recipe, [*args.overrides, *runs[0].overrides()], "test") else [])
    scorings = [Scoring(split) for split in splits]
    if args.vtln_warps:
        scorings += [Scoring(split, args.vtln_warps) for split in splits]
    if args.adapt_rounds:
        scorings += [Scoring(split, args.vtln_warps, args.adapt_rounds) for split in splits]
    tags = args.tags or ["valid/loss"]
    models = {}  # run name -> the checkpoint evaluated

    def score_run(run: Run) -> None:
        model = average_run(run, args.average_last) if args.average_last else run.exp_dir / "last.pt"
        models[run.name] = model
        for scoring in scorings:
            run.results[scoring.name] = evaluate_run(f"run {run.name}", [model], run.exp_dir, scoring, args.beam, threads)

    def score_ensemble(ensemble: Run, members: list[Run], scoring: Scoring) -> None:
        checkpoints = [models[m.name] for m in members]
        ensemble.results[scoring.name] = evaluate_run(
            f"the ensemble of {', '.join(m.name for m in members)}", checkpoints, ensemble.exp_dir, scoring, args.beam, threads
        )

    try:
        curves = load_curves([r.exp_dir for r in runs], [r.name for r in runs], tags)
        # Evaluations run --jobs at a time, like training.
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(score_run, runs))
        for run in runs:
            loss = load_curves([run.exp_dir], [run.name], ["valid/loss"])["valid/loss"][0]
            best = loss.best()
            timing = run.exp_dir / "study_time.json"
            run.results.update(
                final_valid_loss=loss.final,
                best_valid_loss=best[0] if best else None,
                best_epoch=best[1] if best else None,
                train_seconds=json.loads(timing.read_text())["train_seconds"] if timing.exists() else None,
            )
        ensembles = plan_ensembles(runs, grid, args.ensemble, out) if args.ensemble else []
        for ensemble, members in ensembles:
            ensemble.exp_dir.mkdir(parents=True, exist_ok=True)
            (ensemble.exp_dir / "members.txt").write_text("".join(f"{models[m.name]}\n" for m in members))
        tasks = [(e, members, scoring) for e, members in ensembles for scoring in scorings]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda task: score_ensemble(*task), tasks))
    except (CompareError, StudyError) as err:
        print(f"asr.study: {err}", file=sys.stderr)
        return 1

    image = out / ("_".join(t.replace("/", "_") for t in tags) + ".png")
    plot(curves, image, zoom=True)
    command = "python -m asr.study " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = [f"# Study: {args.recipe}", "", f"    {command}", "", f"![{', '.join(tags)}]({image.name})", ""]
    evaluated = f"the average of its last {args.average_last} epoch checkpoints" if args.average_last else "last.pt"
    search = "greedy" if args.beam == 1 else f"beam {args.beam}"
    report += [f"WER of each run's model ({evaluated}), {search}", ""]
    if args.vtln_warps:
        report += [f"VTLN: test-time warp chosen per speaker from {args.vtln_warps} by the model's own score", ""]
    if args.adapt_rounds:
        report += [
            f"Adapted: fine-tuned on each speaker's own transcripts and decoded again, {args.adapt_rounds} rounds "
            "(asr.adapt; no reference is read)", "",
        ]
    report.append(results_table(runs, grid, scorings))
    if args.pool:
        report += [pooled_table(runs, grid, args.pool, scorings)]
    if ensembles:
        ensemble_grid = {k: v for k, v in grid.items() if k != args.ensemble}
        members = f"{len(grid[args.ensemble])} runs, one per {short_key(args.ensemble)}"
        report += [f"Ensembles: the mean next-token distribution of {members}", ""]
        report.append(ensemble_table([e for e, _ in ensembles], grid, args.ensemble, scorings))
        if args.pool:
            report += [pooled_table([e for e, _ in ensembles], ensemble_grid, args.pool, scorings)]
    (out / "results.md").write_text("\n".join(report))
    rows = [{"name": r.name, "values": r.values, **r.results} for r in runs]
    rows += [{"name": f"ensemble {e.name}", "values": e.values, "ensemble": [m.name for m in members], **e.results}
             for e, members in ensembles]
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    sys.stdout.write("\n".join(report[6:]))
    print(f"wrote {image}, {out / 'results.md'} and {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
