"""Train every combination of a grid of config values, then compare them: one command per study.

    python -m asr.study recipes/fsdd_las.yaml --grid model.layer_norm=none,listener,speller,both features.mvn=none,global
    python -m asr.study recipes/fsdd_las.yaml train.max_epochs=10 --grid model.listener.pyramidal=true,false
    python -m asr.study recipes/fsdd_las.yaml --grid data.digits.held_out_speaker=george,jackson,nicolas,yweweler
    python -m asr.study recipes/fsdd_transformer.yaml --grid model.encoder.layer_norm,model.decoder.layer_norm=pre,post
    python -m asr.study recipes/fsdd_las.yaml --grid data.digits.held_out_speaker=george,jackson train.seed,data.seed=0,1 \\
        --pool data.digits.held_out_speaker --ensemble train.seed,data.seed --average-last 5 --vtln-warps 0.8:1.2:0.05
    python -m asr.study recipes/study_las_demo.yaml --grid model.layer_norm=none,both train.seed=0,1,2 \\
        --seeds train.seed --target-loss 1.0 --target-wer 10

Each run is ``python -m asr.train RECIPE [OVERRIDE ...] KEY=VALUE ...`` with
its own ``exp_dir`` under ``--out`` (default ``exp/study_<recipe name>``),
named after its grid values (``layer_norm=none,mvn=global``). ``--variants
FILE`` adds comparisons a grid cannot express, such as an ablation that
removes one thing at a time: FILE maps names to lists of overrides
(:func:`asr.studies.grid.read_variants`), and the runs take each in turn as the
grid key ``variant``, crossed with ``--grid`` (``variant=no_prior,seed=1``); ``--grid variant=A,B``
runs only those of the file's variants. Keys joined by
a comma before the ``=`` are tied: they take each value together, or one
``:``-separated part each (``model.norm_type,model.fixnorm=layernorm:false,scalenorm:true``). Positional
overrides apply to every run. After training, each run's ``last.pt`` is
evaluated with ``asr.evaluate --split dev``, and ``--split test`` where the
recipe has a test split (a leave-one-speaker-out fold's held-out speaker,
the demo corpus's held-out voices, ``data.test``). With ``--average-last N``
the evaluated model is instead the average of the run's last N epoch
checkpoints (``asr.average --last N``, written as ``avg_lastN.pt``; its
evaluations go to ``eval_avg_lastN_<split>``).

The search and test-time options are those of ``asr.evaluate``
(:mod:`asr.cli.options`). Every model is scored with the search alone; with
``--vtln-warps`` also with test-time VTLN (into ``..._<split>_vtln``), and
with ``--adapt-rounds N`` also adapted to each speaker without transcripts
(after VTLN when it is on; into ``..._<split>[_vtln]_adapt``). With
``--ensemble KEY`` (a grid key, typically the seed) the runs that differ only
in KEY are also decoded together as one ensemble, into
``--out``/``ensembles/<other values>``. The study then writes into ``--out``:

- ``valid_loss.png``: the validation-loss curves of all runs over each other
  (drawn by :mod:`asr.studies.curves`, y axis fitted to the epochs after the first;
  ``--tag`` picks other tags);
- ``results.md`` and ``results.json``: per run, the grid values, final and
  best validation loss, dev and test WER, and training minutes; and, when
  ``--pool KEY`` names a grid key (e.g. the held-out speaker), the WER pooled
  over that key's values (errors summed over words summed) for each
  combination of the other keys; with ``--ensemble``, the same for the
  ensembles;
- with ``--metric NAME`` (any validation metric of :mod:`asr.training.metrics`,
  e.g. ``valid_batchnorm_gap``), each run's last logged value of it, in the
  convergence tables and in ``results.json`` (``final_metrics``);
- in ``results.md`` too, how each run converged (:mod:`asr.studies.convergence`, from
  its TensorBoard validation curves): epochs and optimizer steps, the steps
  (epoch, minutes) to the first validation at or below ``--target-loss`` and
  ``--target-wer`` (in percent; "not reached" when none was), and where each
  ``--target-metric NAME=VALUE`` first reached its value (``valid_attention_spearman=0.9``:
  the steps until a LAS's attention aligned), the area under
  the validation-loss curve over optimizer steps, how much the best
  validation loss fell over the last quarter of the steps (near 0: a plateau),
  best and final validation loss and WER. With ``--seeds KEY`` (a grid key, tied keys allowed, e.g.
  ``train.seed`` or ``train.seed,data.seed``), every measure and WER also as
  mean ± sample std over KEY's values per setting of the other keys (steps
  to a target over the seeds that reached it, counted), ``convergence.json``
  with the numbers, and ``valid_mean.png``: per setting the mean validation
  loss and WER curves over the seeds against optimizer steps, with a band of
  ±1 std (``--band minmax``: minimum to maximum). ``--compare KEY`` (with
  ``--seeds``) then sets each of KEY's values against its first, per setting
  of the other keys: per measure, the difference of the means over the seeds
  and the two-sided p of Welch's t-test (a grid that gives KEY one value, one
  cell of a larger study, compares nothing and says so);
- ``alignments.png``: each run's attention on the same dev utterance after
  its last epoch (the ``alignment_<utterance>.png`` the trainer writes), one
  row per setting (with ``--seeds``, the seeds side by side);
- with ``--diagnose``, ``diagnosis.png``: a LAS's convergence diagnostics over
  optimizer steps, every run a line coloured by its setting (the CTC head's
  CER, the attention's Spearman and share at the end, the speller's loss with
  and without its context, the gradient norms per stack; :mod:`asr.studies.diagnosis`),
  and a table of where each run aligned. ``--progress`` draws it too, from the
  runs as they stand (up to ``--at-step``).

A recipe that reads the demo corpus (``data.demo``) needs it prepared first,
once (``python -m asr.synth_demo RECIPE [OVERRIDE ...]``): the runs only read
it, and the study stops before anything trains with the commands to run when
a corpus the runs read is missing.

``--progress`` trains and evaluates nothing: it reads the runs' folders as
they are now (a study still training, or stopped) and writes
``progress.md`` in ``--out``: each run's state (finished, training or
stopped at its last logged step, not started) and the convergence tables
of the runs that have a validation (:func:`asr.studies.grid.measure_progress`),
with ``--seeds`` their mean curves so far in ``progress_mean.png``; no
``valid_mean.png``, ``convergence.json`` or WER on dev or test.
``--at-step N`` reads every run at its last validation at or before
optimizer step N, so that runs stopped at different points are compared
at one budget; a run that has not trained to N is left out.

A study is resumable: a finished run (its folder holds ``study_time.json``)
is not trained again, unless another study trained it (its ``config.yaml`` differs from what this
study gives the run in a key that may not change on resume: another recipe, other overrides into the
same ``--out``), which is refused before anything trains, naming the run, unless ``--overwrite``, which
trains it again from the start (:mod:`asr.cli.outputs`), but never deletes a run folder that a live
process holds (its ``train.lock``: an ``asr.train`` started there by hand), refused naming the holder
before any folder goes; an interrupted one (``last.pt`` but no
``study_time.json``) is continued with ``--resume``, and an evaluation is
reused when its ``wer.json`` is newer than the checkpoint and was made with
the same settings. A resumed run's training minutes are the trainer's own
clock, summed over its attempts. Values are split at commas outside brackets, so
``features.speed_perturb=[0.9,1.0,1.1],[]`` is two values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shlex
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asr.cli.errors import fail
from asr.cli.options import add_decode_arguments, decode_settings
from asr.cli.outputs import add_overwrite_argument, refuse_to_replace
from asr.studies.convergence import MetricTarget, RunCurves, Targets, aggregate, measure, read_run_curves
from asr.studies.curves import Band, CompareError, band, load_curves, plot, plot_bands
from asr.studies.grid import (
    Run,
    Scoring,
    StudyBusy,
    StudyError,
    StudyStopped,
    average_run,
    check_average,
    check_demo_corpora,
    comparison_table,
    convergence_table,
    ensemble_table,
    evaluate_run,
    group_runs,
    has_split,
    length_table,
    measure_progress,
    measure_runs,
    plan_ensembles,
    plan_runs,
    pooled_table,
    results_table,
    scorings_for,
    seed_table,
    short_key,
    state_table,
    study_grid,
    study_in_progress,
    train_runs,
    training_seconds,
)
from asr.writing import atomic_write

if TYPE_CHECKING:
    from asr.inference import DecodeSettings

logger = logging.getLogger("asr.study")


@dataclass
class Study:
    """What the command line asks for, checked before anything trains."""

    args: argparse.Namespace
    grid: dict[str, list[str]]
    runs: list[Run]
    out: Path
    settings: DecodeSettings
    threads: int
    targets: Targets

    @property
    def compares_nothing(self) -> bool:
        """--compare names a key the grid gives one value: one cell of a documented grid, whose seeds still report."""
        return bool(self.args.compare) and len(self.grid[self.args.compare]) < 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asr.study", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path, help="recipe YAML")
    parser.add_argument("overrides", nargs="*", help="key.sub=value applied to every run")
    parser.add_argument("--grid", nargs="+", default=[], metavar="KEY=V1,V2", help="config keys and their values")
    parser.add_argument(
        "--variants", type=Path, metavar="FILE",
        help="a YAML mapping of variant names to lists of overrides: the runs take each variant in turn "
             "(crossed with --grid), as the grid key 'variant' (e.g. one bootstrap removed at a time); "
             "--grid variant=A,B runs only those of them",
    )
    parser.add_argument("--out", type=Path, help="study folder (default exp/study_<recipe name>)")
    parser.add_argument("--tag", action="append", dest="tags", metavar="TAG", help="curves to plot (default valid/loss)")
    parser.add_argument("--pool", metavar="KEY", help="grid key to pool WER over (e.g. the held-out speaker)")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained (and models evaluated) at once, sharing the CPU cores (default 1)")
    parser.add_argument(
        "--threads", type=int, metavar="N",
        help="threads of each run and evaluation (default: the CPU cores shared out among --jobs); fewer leave "
             "cores to other work on the machine",
    )
    parser.add_argument(
        "--average-last", type=int, default=0, metavar="N",
        help="evaluate the average of each run's last N epoch checkpoints instead of last.pt (default 0: last.pt)",
    )
    parser.add_argument(
        "--ensemble", metavar="KEY",
        help="grid key (e.g. train.seed) whose runs are also decoded together as one ensemble",
    )
    parser.add_argument(
        "--seeds", metavar="KEY",
        help="grid key (e.g. train.seed, or train.seed,data.seed) to report mean ± std over, per setting of the others",
    )
    parser.add_argument(
        "--compare", metavar="KEY",
        help="with --seeds, a grid key (e.g. model.encoder.conv_norm) whose values are each set against its "
             "first: the difference of the means and the p of Welch's t-test over the seeds, per measure",
    )
    parser.add_argument("--target-loss", type=float, metavar="X", help="report the steps to the first validation loss <= X")
    parser.add_argument("--target-wer", type=float, metavar="Y", help="report the steps to the first validation WER <= Y percent")
    parser.add_argument(
        "--target-metric", action="append", dest="target_metrics", default=[], metavar="NAME=VALUE",
        help="report the steps to the first validation where metric NAME reaches VALUE (as logged: shares in "
             "percent): at least VALUE when higher is better, else at most; e.g. valid_attention_spearman=0.9, "
             "valid_ctc_cer=30; repeatable",
    )
    parser.add_argument(
        "--band", choices=("std", "minmax"), default="std",
        help="with --seeds, the band around the mean curves: ±1 sample std (default) or min-max",
    )
    parser.add_argument("--by-length", action="store_true", help="add each run's WER by reference length to the report")
    parser.add_argument(
        "--metric", action="append", dest="metrics", default=[], metavar="NAME",
        help="report each run's last value of this validation metric (any name of asr.training.metrics, "
             "e.g. valid_batchnorm_gap), and with --seeds its mean ± std per setting; repeatable",
    )
    parser.add_argument(
        "--progress", action="store_true",
        help="train and evaluate nothing: report the runs as their validations stand now (a study still "
             "training, or stopped), in progress.md; the convergence tables only, no dev or test WER",
    )
    parser.add_argument(
        "--at-step", type=int, metavar="N",
        help="with --progress, compare the runs at one budget: each at its last validation at or before "
             "optimizer step N; a run that has not trained to N is left out until it has",
    )
    parser.add_argument(
        "--diagnose", action="store_true",
        help="also draw diagnosis.png: a LAS's convergence diagnostics, every run coloured by its setting "
             "(asr.studies.diagnosis), with a table of where each run aligned",
    )
    add_overwrite_argument(parser, "the finished runs of another study (they are trained again)")
    add_decode_arguments(parser)
    return parser


def plan(parser: argparse.ArgumentParser, argv: list[str] | None) -> Study:
    args = parser.parse_args(argv)
    settings = decode_settings(args)
    if args.jobs < 1:
        fail(f"--jobs must be at least 1, got {args.jobs}")
    if args.threads is not None and args.threads < 1:
        fail(f"--threads must be at least 1, got {args.threads}")
    if not args.recipe.is_file():
        fail(f"recipe not found: {args.recipe}")
    if args.at_step is not None and not args.progress:
        fail("--at-step needs --progress: a finished study's report is at each run's end")
    if args.at_step is not None and args.at_step < 1:
        fail(f"--at-step must be at least 1, got {args.at_step}")
    out = args.out or Path("exp") / f"study_{args.recipe.stem}"
    targets = check_targets(args)
    for name in args.metrics:
        check_metric(name)
    if not args.grid and args.variants is None:
        parser.error("give --grid KEY=V1,V2 ..., --variants FILE, or both")  # a command line without a study
    try:
        grid, variants = study_grid(args.grid, args.variants)
        for option, key in (("--pool", args.pool), ("--ensemble", args.ensemble), ("--seeds", args.seeds)):
            if key is not None and key not in grid:
                raise StudyError(f"{option} {key!r} is not a grid key ({', '.join(grid)})")
        if args.ensemble is not None and args.ensemble == args.pool:
            raise StudyError(f"--ensemble and --pool name the same key {args.ensemble!r}")
        if args.seeds is not None and args.seeds == args.pool:
            raise StudyError(f"--seeds and --pool name the same key {args.seeds!r}")
        if args.compare is not None:
            if args.seeds is None:
                raise StudyError("--compare needs --seeds: the test is over the seeds of each value")
            if args.compare not in grid or args.compare == args.seeds:
                raise StudyError(f"--compare {args.compare!r} is not a grid key other than --seeds ({', '.join(grid)})")
        runs = plan_runs(args.recipe, args.overrides, grid, out, variants)
        if not args.progress:  # --progress reads the runs' folders only
            check_demo_corpora(args.recipe, args.overrides, runs)
        if args.average_last:
            check_average(args.average_last, args.recipe, [*args.overrides, *runs[0].overrides()])
    except StudyError as err:
        fail(err)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    return Study(args, grid, runs, out, settings, threads, targets)


def check_metric(name: str, option: str = "--metric") -> None:
    from asr.config import ConfigError
    from asr.training.metrics import check_metric_name

    try:
        check_metric_name(name, option)
    except ConfigError as err:
        fail(err)


def check_targets(args: argparse.Namespace) -> Targets:
    from asr.training.metrics import higher_is_better

    if args.target_loss is not None and not args.target_loss > 0:
        fail(f"--target-loss must be positive, got {args.target_loss}")
    if args.target_wer is not None and not 0 < args.target_wer <= 100:
        fail(f"--target-wer is a percentage in (0, 100], got {args.target_wer}")
    metrics = []
    for given in args.target_metrics:
        name, sep, text = given.partition("=")
        if not sep or not name or not text:
            fail(f"--target-metric takes NAME=VALUE (e.g. valid_attention_spearman=0.9), got {given!r}")
        check_metric(name, "--target-metric")
        try:
            value = float(text)
        except ValueError:
            fail(f"--target-metric {name}: {text!r} is not a number")
        if not math.isfinite(value):
            fail(f"--target-metric {name}: the value must be finite, got {text!r}")
        if any(m.name == name for m in metrics):
            fail(f"--target-metric {name} is given twice")
        metrics.append(MetricTarget(name, value, higher_is_better(name)))
    return Targets(args.target_loss, args.target_wer, tuple(metrics))


def main(argv: list[str] | None = None) -> int:
    study = plan(build_parser(), argv)
    args = study.args
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if study.compares_nothing:
        logger.warning("--compare %s: the grid gives it one value (%s), so nothing is compared", args.compare,
                       study.grid[args.compare][0])
    if args.progress:
        return report_progress(study, argv)
    logger.info("%d runs: %s", len(study.runs), "; ".join(r.name for r in study.runs))
    try:
        # one study at a time in --out; a stop signal reaches the runs, which save and stop (asr.studies.grid)
        with study_in_progress(study.out):
            replace_other_studies_runs(study)
            train_runs(study.runs, args.recipe, args.overrides, study.threads, args.jobs)
            splits = ["dev"] + (["test"] if has_split(args.recipe, [*args.overrides, *study.runs[0].overrides()], "test") else [])
            scorings = scorings_for(splits, study.settings)
            curves = load_curves([r.exp_dir for r in study.runs], [r.name for r in study.runs], args.tags or ["valid/loss"])
            models = score_runs(study, scorings)
            ensembles = score_ensembles(study, scorings, models)
            measure_runs(study.runs, study.targets, args.metrics)
            write_report(study, scorings, curves, ensembles, argv)
    except StudyBusy as busy:  # nothing was done: an input error, as a bad --out is
        fail(busy)
    except StudyStopped as stopped:
        print(f"asr.study: {stopped}", file=sys.stderr)
        return stopped.exit_code
    except (CompareError, StudyError) as err:
        print(f"asr.study: {err}", file=sys.stderr)
        return 1
    return 0


def other_studies_runs(study: Study) -> list[tuple[Run, str]]:
    """The finished runs in ``--out`` that were trained with other settings than this study gives them
    (another study's, into the same folder), each with what differs; keys that may change on resume aside.
    A run whose ``config.yaml`` cannot be read as a recipe (an older version's) is taken as it is."""
    from asr.config import ConfigError
    from asr.experiment import experiment_config_to_dict, load_experiment_config
    from asr.training.resume import config_changes, may_change_on_resume

    found = []
    for run in study.runs:
        record = run.exp_dir / "config.yaml"
        if not (run.exp_dir / "study_time.json").exists() or not record.is_file():
            continue
        here = f"exp_dir={run.exp_dir}"
        try:
            saved = experiment_config_to_dict(load_experiment_config(record, [here]))
        except (ConfigError, OSError, ValueError):
            continue
        wanted = experiment_config_to_dict(load_experiment_config(study.args.recipe,
                                                                  [*study.args.overrides, *run.overrides(), here]))
        changes = [str(c) for c in config_changes(saved, wanted) if not may_change_on_resume(c.key)]
        if changes:
            found.append((run, "; ".join(changes[:3]) + (f" and {len(changes) - 3} more" if len(changes) > 3 else "")))
    return found


def replace_other_studies_runs(study: Study) -> None:
    """Refuse the finished runs of another study found in ``--out`` (:func:`other_studies_runs`), or with
    ``--overwrite`` remove them, so that they are trained again from the start.

    A folder is removed only under its run's lock (:class:`asr.training.runlock.RunLock`), taken for every
    one of them before any goes: a run a live process holds (an ``asr.train`` someone started there by
    hand, or one on another host, which cannot be checked from here) stops the study with one error line
    naming the holder, exit status 2, and nothing deleted; a lock whose process is gone is taken over."""
    from asr.training.runlock import RunLock, RunLockError

    found = other_studies_runs(study)
    if found and not study.args.overwrite:
        run, changes = found[0]
        more = f"; {len(found) - 1} more run(s) there too" if len(found) > 1 else ""
        refuse_to_replace(run.exp_dir, f"a run another study trained (its config.yaml -> here: {changes}){more}",
                          out_given=study.args.out is not None, metavar="FOLDER")
    locks = []
    try:
        for run, _ in found:
            lock = RunLock(run.exp_dir, option="--out")
            try:
                lock.acquire()
            except RunLockError as err:
                fail(f"--overwrite does not delete a run folder in use: {err}")
            locks.append(lock)
        for run, changes in found:
            logger.warning("--overwrite: %s held a run another study trained (%s); training it again from the start",
                           run.exp_dir, changes)
            shutil.rmtree(run.exp_dir)  # its lock with it: until then no asr.train can start there
    finally:
        for lock in locks:
            lock.release()  # removes nothing once the folder is gone (nor another's lock)


def report_progress(study: Study, argv: list[str] | None) -> int:
    """``--progress``: ``progress.md`` in ``--out`` and on stdout, from the runs' folders as they are now."""
    args = study.args
    if not study.out.is_dir():
        fail(f"no study folder {study.out}: --progress reads the runs of a study started with the same "
             "command (--out, default exp/study_<recipe name>)")
    try:
        states = measure_progress(study.runs, study.targets, args.metrics, args.at_step)
    except CompareError as err:
        print(f"asr.study: {err}", file=sys.stderr)
        return 1
    measured = sum(r.convergence is not None for r in study.runs)
    command = "python -m asr.study " + shlex.join(sys.argv[1:] if argv is None else argv)
    budget = f" at or before optimizer step {args.at_step}" if args.at_step else ""
    lines = [f"# Study in progress: {args.recipe}", "", f"    {command}", "",
             f"Nothing was trained or evaluated: each run as its TensorBoard events stand now, at its last "
             f"validation{budget}. {measured} of {len(study.runs)} runs are in the tables below; the rest are left out "
             "until they have a validation" + (f" and have trained to step {args.at_step}" if args.at_step else "")
             + ". Dev and test WER come with the study's own report, once every run has finished.", "",
             state_table(study.runs, study.grid, states)]
    if not args.at_step and len({r.convergence.steps for r in study.runs if r.convergence is not None}) > 1:
        lines += ["The runs were measured at different steps: a mean or a difference over them mixes budgets. "
                  "`--at-step N` compares them at one.", ""]
    if measured:
        lines += convergence_lines(study, [], write_files=False)
        if args.seeds:
            seeds = f"{len(study.grid[args.seeds])} values of {short_key(args.seeds)}"
            image = band_plot(study, {r.name: s.validations for r, s in zip(study.runs, states) if s.validations},
                              "progress_mean.png")
            lines += [f"![mean validation curves so far over {seeds}, each setting over the runs in the tables, "
                      f"as far as all of them reach]({image.name})", ""]
    if measured and args.diagnose:
        lines += diagnosis_section(study, args.at_step)
    atomic_write(study.out / "progress.md", "\n".join(lines))
    sys.stdout.write("\n".join(lines[4:]))
    print(f"wrote {study.out / 'progress.md'}")
    return 0


def score_runs(study: Study, scorings: list[Scoring]) -> dict[str, Path]:
    """Evaluate every run's model (``--jobs`` at a time) and gather its validation curve's summary;
    returns run name -> the checkpoint evaluated."""
    models: dict[str, Path] = {}

    def score_run(run: Run) -> None:
        model = average_run(run, study.args.average_last) if study.args.average_last else run.exp_dir / "last.pt"
        models[run.name] = model
        for scoring in scorings:
            run.results[scoring.name] = evaluate_run(f"run {run.name}", [model], run.exp_dir, scoring, study.threads)

    with ThreadPoolExecutor(max_workers=study.args.jobs) as pool:
        list(pool.map(score_run, study.runs))
    for run in study.runs:
        validations = measure(read_run_curves(run.exp_dir, run.name), Targets())
        finite = math.isfinite(validations.best_loss)
        run.results.update(
            final_valid_loss=validations.final_loss,
            best_valid_loss=validations.best_loss if finite else None,
            best_epoch=validations.best_loss_epoch if finite else None,
            train_seconds=training_seconds(run.exp_dir),
        )
    return models


def score_ensembles(study: Study, scorings: list[Scoring], models: dict[str, Path]) -> list[tuple[Run, list[Run]]]:
    """With ``--ensemble``: decode the runs that differ only in that key together, every scoring."""
    if not study.args.ensemble:
        return []
    ensembles = plan_ensembles(study.runs, study.grid, study.args.ensemble, study.out)
    for ensemble, members in ensembles:
        ensemble.exp_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(ensemble.exp_dir / "members.txt", "".join(f"{models[m.name]}\n" for m in members))

    def score(task) -> None:
        ensemble, members, scoring = task
        name = f"the ensemble of {', '.join(m.name for m in members)}"
        checkpoints = [models[m.name] for m in members]
        ensemble.results[scoring.name] = evaluate_run(name, checkpoints, ensemble.exp_dir, scoring, study.threads)

    tasks = [(e, members, scoring) for e, members in ensembles for scoring in scorings]
    with ThreadPoolExecutor(max_workers=study.args.jobs) as pool:
        list(pool.map(score, tasks))
    return ensembles


def write_report(study: Study, scorings: list[Scoring], curves, ensembles, argv: list[str] | None) -> None:
    """``results.md``, ``results.json`` and the curves' image in ``--out``; the tables on stdout."""
    args, grid, runs, out = study.args, study.grid, study.runs, study.out
    tags = args.tags or ["valid/loss"]
    image = out / ("_".join(t.replace("/", "_") for t in tags) + ".png")
    plot(curves, image, zoom=True)
    command = "python -m asr.study " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = [f"# Study: {args.recipe}", "", f"    {command}", "", f"![{', '.join(tags)}]({image.name})", ""]
    evaluated = f"the average of its last {args.average_last} epoch checkpoints" if args.average_last else "last.pt"
    beam = study.settings.decoding.beam_size
    report += [f"WER of each run's model ({evaluated}), {'greedy' if beam == 1 else f'beam {beam}'}", ""]
    if study.settings.vtln_warps:
        warps = ",".join(f"{w:g}" for w in study.settings.vtln_warps)
        report += [f"VTLN: test-time warp chosen per speaker from {warps} by the model's own score", ""]
    if study.settings.adaptation:
        report += [
            f"Adapted: fine-tuned on each speaker's own transcripts and decoded again, {study.settings.adaptation.rounds} "
            "rounds (asr.inference.adaptation; no reference is read)", "",
        ]
    report.append(results_table(runs, grid, scorings))
    if args.by_length:
        report += ["WER % by reference length in words", "", length_table(runs, scorings)]
    if args.pool:
        report += [pooled_table(runs, grid, args.pool, scorings)]
    if ensembles:
        ensemble_grid = {k: v for k, v in grid.items() if k != args.ensemble}
        members = f"{len(grid[args.ensemble])} runs, one per {short_key(args.ensemble)}"
        report += [f"Ensembles: the mean next-token distribution of {members}", ""]
        report.append(ensemble_table([e for e, _ in ensembles], grid, args.ensemble, scorings))
        if args.pool:
            report += [pooled_table([e for e, _ in ensembles], ensemble_grid, args.pool, scorings)]
    report += convergence_section(study, scorings)
    report += alignment_section(study)
    if args.diagnose:
        report += diagnosis_section(study)
    atomic_write(out / "results.md", "\n".join(report))
    rows = [{"name": r.name, "values": r.values, **r.results,
             "convergence": dataclasses.asdict(r.convergence) if r.convergence else None,
             **({"final_metrics": r.finals} if r.finals else {})} for r in runs]
    rows += [{"name": f"ensemble {e.name}", "values": e.values, "ensemble": [m.name for m in members], **e.results}
             for e, members in ensembles]
    atomic_write(out / "results.json", json.dumps(rows, indent=2) + "\n")
    sys.stdout.write("\n".join(report[6:]))
    print(f"wrote {image}, {out / 'results.md'} and {out / 'results.json'}")


def convergence_section(study: Study, scorings: list[Scoring]) -> list[str]:
    """The convergence tables (per run; with ``--seeds`` per setting, with ``valid_mean.png`` and
    ``convergence.json``) as lines of ``results.md``."""
    return convergence_lines(study, scorings, write_files=True)


def convergence_lines(study: Study, scorings: list[Scoring], write_files: bool) -> list[str]:
    """The convergence tables of the runs that have a :attr:`Run.convergence`; with ``write_files``, also
    ``valid_mean.png`` and ``convergence.json`` (a finished study's), else neither."""
    args, targets = study.args, study.targets
    wanted = []
    if targets.loss is not None:
        wanted.append(f"valid loss <= {targets.loss:g}")
    if targets.wer_percent is not None:
        wanted.append(f"valid WER <= {targets.wer_percent:g}%")
    wanted += [t.label for t in targets.metrics]
    lines = ["## Convergence", "",
             "From each run's validation curves (one point per validation: per epoch, and every "
             "train.valid_every_steps updates where a run sets it; valid WER on the first "
             "train.valid_max_utterances dev utterances). Steps to a target: optimizer steps at the first "
             "validation that reached it" + (f" ({', '.join(wanted)})" if wanted else " (no --target-loss, --target-wer or --target-metric given)")
             + ". AUC: area under the validation loss over optimizer steps (trapezoid rule). Fall per 1k steps, "
             "last quarter: how much the best validation loss so far fell over the last quarter of the steps; "
             "near 0 on a plateau, well above 0 when the run was still learning.", ""]
    lines.append(convergence_table(study.runs, study.grid, targets, args.metrics))
    if not args.seeds:
        return lines
    seeds = f"{len(study.grid[args.seeds])} values of {short_key(args.seeds)}"
    lines += [f"### Mean ± sample std over {seeds}", "",
              "Steps and minutes to a target: over the seeds that reached it (how many, in brackets).", ""]
    lines.append(seed_table(study.runs, study.grid, args.seeds, targets, scorings, args.metrics))
    if write_files:
        image = band_plot(study)
        lines += [f"![mean validation curves over {seeds}]({image.name})", ""]
    if study.compares_nothing:
        lines += [f"### {short_key(args.compare)}: one value in this grid, nothing compared", ""]
    elif args.compare:
        compare = short_key(args.compare)
        lines += [f"### {compare}: each value against {study.grid[args.compare][0]}", "",
                  f"The difference of the means over the seeds (this value's minus {study.grid[args.compare][0]}'s) "
                  "and the two-sided p of Welch's t-test (unequal variances); with few seeds only a large, steady "
                  "difference reaches a small p, and a large p is no evidence of no difference.", ""]
        lines.append(comparison_table(study.runs, study.grid, args.seeds, args.compare, targets, scorings, args.metrics))
    if not write_files:
        return lines
    settings = [{"values": values, "runs": [r.name for r in group],
                 "measures": aggregate([r.convergence for r in group if r.convergence])}
                for values, group in group_runs(study.runs, study.grid, args.seeds)]
    report = {"seeds": args.seeds, "targets": dataclasses.asdict(targets), "settings": settings}
    atomic_write(study.out / "convergence.json", json.dumps(report, indent=2) + "\n")
    return lines


def band_plot(study: Study, measured: dict[str, RunCurves] | None = None, name: str = "valid_mean.png") -> Path:
    """``valid_mean.png``: per setting, the mean validation loss (and WER) over the seeds, with a band; from
    ``measured`` (run name -> its validations) where given, over the runs it holds, else from every run's
    whole curves."""
    if measured is None:
        measured = {r.name: read_run_curves(r.exp_dir, r.name) for r in study.runs}
    by_steps = all(c.steps for c in measured.values())
    panels: dict[str, list[Band]] = {"valid/loss": []}
    if all(c.wer for c in measured.values()):
        panels["valid/wer"] = []
    for values, group in group_runs(study.runs, study.grid, study.args.seeds):
        label = ",".join(f"{short_key(k)}={v}" for k, v in values.items()) or "all"
        curves = [measured[r.name] for r in group if r.name in measured]
        if not curves:
            continue
        xs = [c.steps if by_steps else c.epochs for c in curves]
        for tag in panels:
            ys = [c.loss if tag == "valid/loss" else c.wer for c in curves]
            panels[tag].append(band(label, xs, ys, study.args.band))
    image = study.out / name
    plot_bands(panels, image, "optimizer step" if by_steps else "epoch", study.args.band, zoom=True)
    return image


def diagnosis_section(study: Study, at_step: int | None = None) -> list[str]:
    """``diagnosis.png`` and its table (:mod:`asr.studies.diagnosis`), over the runs that have logged anything (each
    cut at ``at_step`` where given), coloured by setting: the grid values other than ``--seeds``'."""
    from asr.studies.curves import Curve
    from asr.studies.diagnosis import Diagnosed, diagnosis_figure, diagnosis_table, read_diagnosed

    runs = []
    for run in study.runs:
        if not any(run.exp_dir.rglob("events.out.tfevents.*")):
            continue
        values = {k: v for k, v in run.values.items() if k != study.args.seeds}
        setting = ",".join(f"{short_key(k)}={v}" for k, v in values.items()) or "all"
        diagnosed = read_diagnosed(run.exp_dir, run.name, setting)
        if at_step is not None:
            cut = {}
            for tag, curve in diagnosed.curves.items():
                kept = [(s, v) for s, v in zip(curve.steps, curve.values) if s <= at_step]
                cut[tag] = Curve(curve.run, tag, [s for s, _ in kept], [v for _, v in kept], curve.axis)
            diagnosed = Diagnosed(diagnosed.label, diagnosed.setting, cut)
        runs.append(diagnosed)
    if not runs:
        return []
    image = study.out / "diagnosis.png"
    diagnosis_figure(runs, image)
    cer_target = next((t.value for t in study.targets.metrics if t.name == "valid_ctc_cer"), None)
    budget = f", up to optimizer step {at_step}" if at_step is not None else ""
    return ["## Diagnosis: why a run converged or did not", "",
            "Every run a line in its setting's colour (asr.studies.diagnosis): the CTC head's dev CER, the attention's "
            "Spearman and share of steps on the last frames, the speller's dev loss with and without its context, "
            f"and the gradient norms per stack before clipping{budget}. Aligned: the first validation with Spearman "
            ">= 0.9 and at most 10% of steps at the end. The gradient columns are means over the updates logged "
            "at steps up to 300.", "",
            f"![diagnosis]({image.name})", "", diagnosis_table(runs, cer_target), ""]


def alignment_section(study: Study) -> list[str]:
    """``alignments.png``: every run's last attention picture of one dev utterance, side by side."""
    from asr.training.validation import ALIGNMENT_PREFIX

    pictures = {r.name: {p.name: p for p in r.exp_dir.glob(f"{ALIGNMENT_PREFIX}*.png")} for r in study.runs}
    common = sorted(set.intersection(*(set(p) for p in pictures.values()))) if pictures else []
    if not common:
        return []  # a model without attention, or runs from before the trainer wrote the pictures
    name = common[0]
    groups = group_runs(study.runs, study.grid, study.args.seeds) if study.args.seeds else [({}, [r]) for r in study.runs]
    rows = [[(r.name, str(pictures[r.name][name])) for r in group] for _, group in groups]
    image = study.out / "alignments.png"
    from asr.plots import tile_images  # matplotlib and librosa: only when there is something to draw

    tile_images(rows, image)
    utterance = name[len(ALIGNMENT_PREFIX) : -len(".png")]
    layout = "one row per setting, its seeds side by side" if study.args.seeds else "one per run"
    return ["## Attention after the last epoch", "",
            f"Dev utterance {utterance}, {layout} (each run's {name}).", "",
            f"![alignments]({image.name})", ""]


if __name__ == "__main__":
    sys.exit(main())
