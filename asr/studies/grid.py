"""Grid studies: every combination of config values trained, scored and tabulated (``python -m asr.study``).

A study's runs are :class:`Run` s (one ``asr.train`` subprocess each, in its own
``exp_dir``); each is scored by ``asr.evaluate`` subprocesses, once per
:class:`Scoring` (a split and the decoding settings: plain, with test-time VTLN,
adapted). Each run's convergence (steps to a target validation loss or WER,
area under the loss curve: :mod:`asr.studies.convergence`) is tabulated per run and,
over a seed key, as mean ± std per setting. The command line, with the whole
story, is :mod:`asr.cli.study`.

A study that trains holds ``--out/study.lock`` (:func:`study_in_progress`): a second ``asr.study`` on the
same folder is refused at once, naming the first. Its ``asr.train``, ``asr.evaluate`` and ``asr.average``
processes run in sessions of their own, so that a stop signal (SIGTERM, SIGINT, SIGUSR1) reaches them
once, through the study, which forwards it: each run writes ``last.pt`` and stops, the study stops
(:class:`StudyStopped`), and the same command resumes them. On Linux they also receive SIGTERM when the
study dies of a signal it cannot catch (``kill -9``: :mod:`asr.studies.tether`), so they stop the same way
instead of training on, orphaned. A run whose ``train.lock`` another process
holds is reported as held, not failed, and its log is left to that process. The study's own files are
written whole or not at all (:func:`asr.writing.atomic_write`); a ``study_time.json`` found damaged is
named and rebuilt from the run's ``last.pt``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from asr.config import ConfigError
from asr.studies.convergence import (
    Convergence,
    Reached,
    RunCurves,
    Targets,
    format_mean_std,
    measure,
    metric_tag,
    read_run_curves,
    summarise_reached,
    up_to_step,
)
from asr.studies.curves import EPOCH_AXIS, EVENT_GLOB, run_curves
from asr.studies.tether import tethered
from asr.writing import atomic_write

if TYPE_CHECKING:
    from asr.inference import DecodeSettings

# The recipe's config and data readers (and torch with them) are imported where they are used, so
# that ``asr.study --help`` answers at once.

logger = logging.getLogger("asr.study")


class StudyError(ValueError):
    """A grid that cannot be run; the message names the grid entry or the run."""


class RunHeld(StudyError):
    """A run's folder is held by another process (its ``train.lock``): it is not trained here."""


class StudyBusy(StudyError):
    """``--out`` is held by another ``asr.study`` (its ``study.lock``); the message names that process."""


class StudyStopped(StudyError):
    """A stop signal reached the study: the runs in progress wrote ``last.pt`` and stopped."""

    exit_code = 75  # as asr.train's (asr.training.signals.EXIT_STOPPED): the same command goes on


STUDY_LOCK = "study.lock"


class _Processes:
    """The processes a study has running, and the stop signals that reached it, forwarded to each of them.

    The processes run in sessions of their own: a terminal's Ctrl-C reaches the study alone, which forwards
    it once. asr.train takes a second signal for "stop at once", so each process gets every signal exactly
    once, whether it came before or after the process started."""

    def __init__(self):
        self._lock = threading.RLock()  # an RLock: the handler may run in a thread that holds it
        self._running: dict[subprocess.Popen, int] = {}  # process -> how many signals it was sent
        self.signals: list[int] = []

    @property
    def stopped_by(self) -> str | None:
        return signal.Signals(self.signals[0]).name if self.signals else None

    def forward(self, signum: int, frame=None) -> None:
        if signum == signal.SIGHUP:  # the terminal closed: the runs save and stop as on SIGTERM
            signum = signal.SIGTERM
        with self._lock:
            self.signals.append(signum)
            for process in list(self._running):
                self._catch_up(process)

    def _catch_up(self, process: subprocess.Popen) -> None:
        for signum in self.signals[self._running[process]:]:
            try:
                process.send_signal(signum)
            except ProcessLookupError:
                pass
        self._running[process] = len(self.signals)

    def run(self, command: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run(command, **kwargs)`` in a session of its own, signalled as the study is;
        :class:`StudyStopped` instead of starting ``what`` once the study was told to stop."""
        with self._lock:
            if self.signals:
                raise StudyStopped(f"stopped by {self.stopped_by} before {what} started")
            # tethered: a study killed with SIGKILL, which it cannot forward, still stops its processes
            process = subprocess.Popen(tethered(command), start_new_session=True, **kwargs)
            self._running[process] = 0
            self._catch_up(process)
        try:
            out, err = process.communicate()
        finally:
            with self._lock:
                self._running.pop(process, None)
        return subprocess.CompletedProcess(command, process.returncode, out, err)


_processes = _Processes()


@contextmanager
def study_in_progress(out: Path):
    """Hold ``out/study.lock`` while a study trains and evaluates into ``out`` (a second asr.study there is
    refused at once: :class:`StudyBusy` naming the first; a lock whose process on this host is gone is
    taken over, with a warning), and forward the stop signals to its processes."""
    from asr.training.runlock import RunLock, RunLockError
    from asr.training.signals import STOP_SIGNALS

    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out, STUDY_LOCK, holder="asr.study", option="--out")
    try:
        lock.acquire()
    except RunLockError as err:
        raise StudyBusy(str(err)) from None
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, _processes.forward) for signum in (*STOP_SIGNALS, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _processes.signals.clear()
        lock.release()


def _stopped_or(error: StudyError) -> StudyError:
    """The error to raise for a process that failed: :class:`StudyStopped` when the study was told to stop."""
    if _processes.signals:
        return StudyStopped(f"stopped by {_processes.stopped_by}; the same command goes on from where it stopped")
    return error


@dataclass
class Run:
    """One point of the grid: its overrides, its folder and (once done) its results."""

    values: dict[str, str]  # grid entry -> value, in grid order
    exp_dir: Path
    results: dict = field(default_factory=dict)
    convergence: Convergence | None = None
    finals: dict[str, float | None] = field(default_factory=dict)  # --metric name -> its last validation value
    variant_overrides: list[str] = field(default_factory=list)  # what values[VARIANT] stands for (--variants)

    @property
    def name(self) -> str:
        return ",".join(f"{short_key(k)}={v}" for k, v in self.values.items())

    def overrides(self) -> list[str]:
        # A tied entry ("a.x,b.x") sets every one of its keys to the value, or to one part each of "v1:v2";
        # the variant (--variants) is its list of overrides, applied first.
        return [*self.variant_overrides,
                *(f"{key}={v}" for entry, value in self.values.items() if entry != VARIANT
                  for key, v in tied_values(entry, value))]


# The grid entry that --variants adds: its values are the names of a variants file's override lists.
VARIANT = "variant"
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def read_variants(path: Path) -> dict[str, list[str]]:
    """A variants file (``asr.study --variants``): a YAML mapping of names to lists of overrides, one
    list per variant, for comparisons a grid cannot express, such as an ablation that removes one
    thing at a time (each name its own set of keys)::

        recipe: []                                      # the recipe as it is
        no_prior: [train.schedules.attention_prior=null]
        cosine: [train.scheduler.kind=cosine, train.scheduler.final_factor=0.05]

    Errors name the file and the variant."""
    import yaml

    from asr.config import ConfigError, parse_override

    from asr.config import load_yaml_strictly

    try:
        data = load_yaml_strictly(path.read_text(), f"--variants {path}")  # a variant named twice is refused
    except ConfigError as err:
        raise StudyError(str(err)) from None
    except OSError as err:
        raise StudyError(f"--variants {path}: cannot be read ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise StudyError(f"--variants {path}: not valid YAML: {err}") from None
    if not isinstance(data, dict) or not data:
        raise StudyError(f"--variants {path}: expected a mapping of variant names to lists of overrides")
    variants = {}
    for name, overrides in data.items():
        if not isinstance(name, str) or not VARIANT_NAME.fullmatch(name):
            raise StudyError(f"--variants {path}: variant name {name!r} must be letters, digits and . _ + - "
                             "(it names the run's folder)")
        if overrides is None:
            overrides = []
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise StudyError(f"--variants {path}: variant {name!r}: expected a list of key.sub=value strings")
        for text in overrides:
            try:
                parse_override(text)
            except (ConfigError, yaml.YAMLError) as err:
                raise StudyError(f"--variants {path}: variant {name!r}: {err}") from None
        variants[name] = list(overrides)
    return variants


def tied_values(entry: str, value: str) -> list[tuple[str, str]]:
    """The (key, value) pairs one grid value gives: every key of a tied entry takes the value, unless
    the value has one ``:``-separated part per key (``layernorm:false``), which go to the keys in order.
    Any other number of parts for tied keys is a :class:`StudyError`."""
    keys = entry.split(",")
    parts = value.split(":")
    if len(keys) > 1 and len(parts) > 1:
        if len(parts) != len(keys):
            raise StudyError(f"--grid {entry!r}: {value!r} has {len(parts)} ':'-parts for {len(keys)} tied keys")
        return list(zip(keys, parts))
    return [(key, value) for key in keys]


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


def parse_grid(entries: list[str], variants_file: bool = False) -> dict[str, list[str]]:
    """``["KEY=V1,V2", ...]`` -> ``{KEY: [V1, V2]}``; errors name the entry.

    ``variant=A,B`` is a grid entry only beside a variants file (``variants_file``): it picks
    which of the file's variants run (:func:`choose_variants`).

    ``KEY1,KEY2=V1,V2`` ties the keys: both take V1 in one run and V2 in the
    other (e.g. pre- or post-norm in the encoder and the decoder together).
    A tied value may give each key its own part, ``KEY1,KEY2=A1:A2,B1:B2``
    (e.g. ``model.norm_type,model.fixnorm=layernorm:false,scalenorm:true``).
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
        for value in parsed:
            tied_values(key, value)  # a tied value with the wrong number of parts fails here, before any run
        grid[key] = parsed
    if VARIANT in grid and not variants_file:
        raise StudyError(f"--grid: {VARIANT!r} is not a config key (--variants FILE gives the variants)")
    if len({short_key(k) for k in grid}) != len(grid):
        raise StudyError(f"--grid: two keys end in the same name ({', '.join(grid)}); run names would collide")
    return grid


def choose_variants(variants: dict[str, list[str]], names: list[str] | None, path: Path) -> dict[str, list[str]]:
    """The variants a study runs: all of ``variants`` (read from ``path``) when ``names`` is None, else
    those ``names`` picks (``--grid variant=A,B``), in that order; an unknown name is an error naming
    the file and its variants. Runs keep their folders either way, so a study of the whole file later
    reuses the runs a subset made."""
    if names is None:
        return variants
    unknown = [name for name in names if name not in variants]
    if unknown:
        raise StudyError(f"--grid {VARIANT}=...: {', '.join(map(repr, unknown))} not in {path} "
                         f"(its variants: {', '.join(variants)})")
    return {name: variants[name] for name in names}


def study_grid(entries: list[str], variants_path: Path | None) -> tuple[dict[str, list[str]], dict[str, list[str]] | None]:
    """The grid and the variants a study runs, from ``--grid`` ``entries`` and ``--variants`` ``variants_path``:
    beside a variants file the grid's :data:`VARIANT` entry comes first and names the chosen variants
    (all of the file's when ``--grid`` names none)."""
    grid = parse_grid(entries, variants_file=variants_path is not None)
    if variants_path is None:
        return grid, None
    variants = choose_variants(read_variants(variants_path), grid.pop(VARIANT, None), variants_path)
    return {VARIANT: list(variants), **grid}, variants


def plan_runs(recipe: Path, overrides: list[str], grid: dict[str, list[str]], out: Path,
              variants: dict[str, list[str]] | None = None) -> list[Run]:
    """Every combination of the grid as a :class:`Run`, each config validated before anything trains.
    With ``variants`` (:func:`read_variants`), the grid's :data:`VARIANT` entry names them."""
    from asr.experiment import load_experiment_config

    runs = []
    for combination in itertools.product(*grid.values()):
        values = dict(zip(grid, combination))
        run = Run(values, out / "runs" / folder_name(values))
        if VARIANT in values:
            run.variant_overrides = list((variants or {})[values[VARIANT]])
        try:
            load_experiment_config(recipe, [*overrides, *run.overrides(), f"exp_dir={run.exp_dir}"])
        except ConfigError as err:
            raise StudyError(f"run {run.name}: {err}") from None
        runs.append(run)
    return runs


def check_demo_corpora(recipe: Path, overrides: list[str], runs: list[Run]) -> None:
    """Refuse to start when a run would read a demo corpus that has not been prepared.

    The runs only read it, so it is made once, before the study, not per run: the error
    lists the command that prepares each missing corpus (runs that differ only in options
    that do not change the corpus share one)."""
    from asr.data.corpus import check_demo_prepared
    from asr.data.demo import DemoCorpusNotPrepared, prepare_command
    from asr.experiment import load_experiment_config

    unprepared: dict[str, str] = {}  # corpus key -> the command that prepares it
    for run in runs:
        config = load_experiment_config(recipe, [*overrides, *run.overrides()])
        try:
            check_demo_prepared(config.data, prepare_command(recipe, [*overrides, *run.overrides()]))
        except DemoCorpusNotPrepared as err:
            unprepared.setdefault(err.key, err.command)
    if unprepared:
        raise StudyError(
            f"the runs read {len(unprepared)} demo corpus(es) not prepared yet ({', '.join(unprepared)}); "
            "prepare them first, once:\n" + "\n".join(f"    {command}" for command in unprepared.values())
        )


def folder_name(values: dict[str, str]) -> str:
    """A file-system-safe folder name for a run: ``layer_norm-none_mvn-global``."""
    parts = []
    for key, value in values.items():
        spaced = value.replace(",", "-").replace(":", "-")
        safe = "".join(c if c.isalnum() or c in ".-" else "" for c in spaced) or "empty"
        parts.append(f"{short_key(key)}-{safe}")
    return "_".join(parts)


def train_run(run: Run, recipe: Path, overrides: list[str], threads: int) -> None:
    """Train (or resume) one run in a subprocess; its output goes to ``exp_dir/study_train.out``.

    ``exp_dir/study_time.json`` is written when training has finished, with
    its wall-clock seconds; a run that has it is not started again. A run whose folder another
    process holds (its ``train.lock``) raises :class:`RunHeld`, its log untouched.
    """
    timing = run.exp_dir / "study_time.json"
    if timing.exists():
        logger.info("%s has finished training already (%s)", run.name, timing)
        return
    _check_not_held(run)
    run.exp_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "asr.train", str(recipe), *overrides, *run.overrides(), f"exp_dir={run.exp_dir}"]
    if (run.exp_dir / "last.pt").exists():
        command.append("--resume")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log_path = run.exp_dir / "study_train.out"
    logger.info("training %s -> %s", run.name, run.exp_dir)
    start = time.time()
    with open(log_path, "a") as log:  # appended: an earlier attempt's output stays
        status = _processes.run(command, f"run {run.name}", stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    seconds = time.time() - start
    if status != 0:
        _check_not_held(run)  # another process took the folder between the check and the start
        raise _stopped_or(StudyError(f"run {run.name} failed (exit {status}); its output is in {log_path}"))
    # attempt_seconds: the attempt that finished it; train_seconds: the trainer's own clock, every attempt
    # of an interrupted and resumed run (training and validation, the pauses between attempts not counted).
    clock = trainer_clock(run.exp_dir)
    atomic_write(timing, json.dumps({"train_seconds": seconds if clock is None else clock, "attempt_seconds": seconds,
                                     "resumed": "--resume" in command}) + "\n")
    logger.info("finished %s in %.1f min", run.name, seconds / 60)


def train_runs(runs: list[Run], recipe: Path, overrides: list[str], threads: int, jobs: int) -> None:
    """Train every run (:func:`train_run`), ``jobs`` at a time. A run held by another process, or one that
    failed, does not stop the others; once all are done, one error names every run that did not finish, each
    as held or failed, or :class:`StudyStopped` when a stop signal ended them."""
    from concurrent.futures import ThreadPoolExecutor

    errors: list[StudyError] = []

    def train(run: Run) -> None:
        try:
            train_run(run, recipe, overrides, threads)
        except StudyError as err:
            errors.append(err)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(train, runs))
    if _processes.signals:
        raise StudyStopped(f"stopped by {_processes.stopped_by}: the runs in progress wrote last.pt and stopped; "
                           "the same command resumes them and trains the rest")
    if errors:
        raise StudyError("; ".join(map(str, errors)))


def _check_not_held(run: Run) -> None:
    """Raise :class:`RunHeld` when a live process holds ``run``'s folder (an asr.train started by hand, or
    by a study that was killed)."""
    from asr.training.runlock import LOCK_NAME, describe, is_stale, read_lock

    holder = read_lock(run.exp_dir / LOCK_NAME)
    if holder is not None and not is_stale(holder):
        raise RunHeld(f"run {run.name} is held by another process ({describe(holder)}); it is not trained here, "
                      f"and its output is that process's. Run the study again once it has ended")


def trainer_clock(exp_dir: Path) -> float | None:
    """The run's own clock in ``exp_dir/last.pt`` (seconds of training and validation over every attempt),
    or None where last.pt is missing or saved none."""
    from asr.checkpoints.io import CheckpointError, load_checkpoint

    try:
        progress = load_checkpoint(exp_dir / "last.pt").get("training", {}).get("progress", {})
    except CheckpointError:
        return None
    seconds = progress.get("seconds") if isinstance(progress, dict) else None
    return float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None


def training_seconds(exp_dir: Path) -> float | None:
    """How long a finished run trained, from its ``study_time.json``: every attempt of a resumed run.

    Files written before ``attempt_seconds`` existed timed only the attempt that finished a resumed run;
    for those the trainer's clock in ``last.pt`` is read instead."""
    saved = read_timing(exp_dir)
    if saved is None:
        return None
    if saved.get("resumed") and "attempt_seconds" not in saved:
        clock = trainer_clock(exp_dir)
        if clock is not None:
            return clock
    return saved["train_seconds"]


def read_timing(exp_dir: Path) -> dict | None:
    """A finished run's ``study_time.json``, or None when it has none. One that cannot be read (a study
    killed while it wrote it, before it was written whole) is named in a warning and rebuilt from the run:
    it is written only after training ended, so the run is finished, and its trainer's clock is in last.pt."""
    timing = exp_dir / "study_time.json"
    try:
        saved = json.loads(timing.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        saved, why = None, str(err) or type(err).__name__
    else:
        why = None if isinstance(saved, dict) and "train_seconds" in saved else "not a timing record"
    if why is not None:
        saved = {"train_seconds": trainer_clock(exp_dir), "rebuilt_from": "last.pt"}
        logger.warning("%s is damaged (%s); rebuilt from %s (training minutes: %s)", timing, why,
                       exp_dir / "last.pt", "unknown" if saved["train_seconds"] is None else f"{saved['train_seconds'] / 60:.1f}")
        atomic_write(timing, json.dumps(saved) + "\n")
    return saved


def average_run(run: Run, last: int) -> Path:
    """``avg_last{last}.pt``: the mean of the run's last ``last`` epoch checkpoints (reused when newer than ``last.pt``)."""
    averaged = run.exp_dir / f"avg_last{last}.pt"
    if averaged.exists() and averaged.stat().st_mtime >= (run.exp_dir / "last.pt").stat().st_mtime:
        return averaged
    command = [sys.executable, "-m", "asr.average", str(run.exp_dir), "--last", str(last), "--out", str(averaged)]
    done = _processes.run(command, f"averaging run {run.name}", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise _stopped_or(StudyError(f"averaging the last {last} checkpoints of run {run.name} failed:\n{done.stderr[-2000:]}"))
    return averaged


@dataclass(frozen=True)
class Scoring:
    """One way of scoring each model: a split, and the decoding settings (the study's search, and
    optionally test-time VTLN and speaker adaptation)."""

    split: str
    settings: DecodeSettings = field(default_factory=lambda: _plain_settings())

    @property
    def name(self) -> str:
        """Key in results.json and suffix of the evaluation folder."""
        return self.split + ("_vtln" if self.settings.vtln_warps else "") + ("_adapt" if self.settings.adaptation else "")

    @property
    def label(self) -> str:
        how = ["VTLN"] if self.settings.vtln_warps else []
        if self.settings.adaptation:
            rounds = self.settings.adaptation.rounds
            how.append(f"adapted, {rounds} round" + ("s" if rounds > 1 else ""))
        return f"{self.split} WER %" + (f" ({', '.join(how)})" if how else "")


def _plain_settings() -> DecodeSettings:
    """The default decoding: the search alone."""
    from asr.inference import DecodeSettings

    return DecodeSettings()


def scorings_for(splits: list[str], settings: DecodeSettings) -> list[Scoring]:
    """Plain decoding of every split; with VTLN in ``settings``, VTLN too; with adaptation, adapted too
    (after VTLN when it is on). Every scoring uses the search of ``settings``."""
    plain = dataclasses.replace(settings, vtln_warps=(), adaptation=None)
    scorings = [Scoring(split, plain) for split in splits]
    if settings.vtln_warps:
        vtln = dataclasses.replace(plain, vtln_warps=settings.vtln_warps)
        scorings += [Scoring(split, vtln) for split in splits]
    if settings.adaptation:
        scorings += [Scoring(split, settings) for split in splits]
    return scorings


def evaluate_run(name: str, checkpoints: list[Path], folder: Path, scoring: Scoring, threads: int) -> dict:
    """``wer.json`` of ``checkpoints`` (several: an ensemble) scored as ``scoring`` says, in ``folder``.

    The evaluation goes to ``folder/eval_<split>`` for a ``last.pt``, else
    ``folder/eval_<checkpoint name>_<split>`` (``_vtln`` added with VTLN, then
    ``_adapt`` with speaker adaptation), with its settings in ``decode.yaml``
    there. It is reused when its ``wer.json`` is newer than every checkpoint
    and was made with the same settings (and states WER in percent: one of an older version, with
    fractions, is made again).
    """
    stem = checkpoints[0].stem
    prefix = "eval" if stem == "last" else f"eval_{stem}"
    out = folder / f"{prefix}_{scoring.name}"
    result = out / "wer.json"
    wanted = scoring.settings.to_dict()
    if result.exists() and all(result.stat().st_mtime >= c.stat().st_mtime for c in checkpoints):
        try:
            previous = json.loads(result.read_text())
        except (OSError, ValueError) as err:  # damaged: made again
            logger.warning("%s cannot be read (%s); evaluating again", result, err)
            previous = {}
        if isinstance(previous, dict) and previous.get("settings") == wanted and "wer_percent" in previous:
            return previous
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "decode.yaml", yaml.safe_dump(wanted, sort_keys=False))
    command = [
        sys.executable, "-m", "asr.evaluate", "--checkpoint", *map(str, checkpoints),
        "--split", scoring.split, "--decode-config", str(out / "decode.yaml"), "--out", str(out),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    logger.info("evaluating %s on %s", name, scoring.name)
    done = _processes.run(command, f"evaluating {name}", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if done.returncode != 0:
        raise _stopped_or(StudyError(f"evaluating {name} on {scoring.name} failed:\n{done.stderr[-2000:]}"))
    return json.loads(result.read_text())


def check_average(last: int, recipe: Path, overrides: list[str]) -> None:
    """Refuse ``--average-last`` values the runs cannot provide, before anything trains."""
    from asr.experiment import load_experiment_config

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
    from asr.data.corpus import load_split
    from asr.data.report import DataError, SkipReport
    from asr.experiment import load_experiment_config

    config = load_experiment_config(recipe, overrides)
    try:
        utterances, _ = load_split(config.data, split, SkipReport())
    except DataError:
        return True  # it names data, which is broken: let evaluation report it properly
    return bool(utterances)


def pooled(runs: list[Run], split: str) -> float | None:
    """WER in percent: word errors summed over words summed, across ``runs`` (None if any lacks the score)."""
    scores = [r.results.get(split) for r in runs]
    if any(s is None for s in scores):
        return None
    errors = sum(s["substitutions"] + s["deletions"] + s["insertions"] for s in scores)
    words = sum(s["ref_words"] for s in scores)
    return 100 * errors / words if words else None


def wer_of(score: dict | None) -> float | None:
    """The WER in percent of an evaluation's ``wer.json`` (None for none)."""
    return None if score is None else score["wer_percent"]


def _pct(value: float | None) -> str:
    """A value in percent, as the tables print it."""
    return "n/a" if value is None else f"{value:.2f}"


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
        epoch = r.get("best_epoch")
        best = f"{_num(r.get('best_valid_loss'))} ({'n/a' if epoch is None else f'{epoch:g}'})"
        cells = [run.values[k] for k in keys] + [_num(r.get("final_valid_loss")), best]
        cells += [_pct(wer_of(r.get(s.name))) for s in scorings]
        minutes = r.get("train_seconds")
        cells.append("n/a" if minutes is None else f"{minutes / 60:.1f}")
        rows.append(cells)
    return markdown_table(header, len(keys), rows)


def group_runs(runs: list[Run], grid: dict[str, list[str]], key: str) -> list[tuple[dict[str, str], list[Run]]]:
    """For each combination of the grid keys other than ``key``, in grid order: its values and
    the runs that have them (one per value of ``key``)."""
    others = [k for k in grid if k != key]
    groups = []
    for combination in itertools.product(*(grid[k] for k in others)):
        values = dict(zip(others, combination))
        groups.append((values, [r for r in runs if all(r.values[k] == v for k, v in values.items())]))
    return groups


def pooled_table(runs: list[Run], grid: dict[str, list[str]], pool_key: str, scorings: list[Scoring]) -> str:
    """WER pooled over ``pool_key``'s values, one row per combination of the other keys of ``grid``."""
    others = [k for k in grid if k != pool_key]
    pooled_over = f"pooled over {len(grid[pool_key])} {short_key(pool_key)}"
    header = [short_key(k) for k in others] + [f"{s.label} ({pooled_over})" for s in scorings]
    rows = [list(values.values()) + [_pct(pooled(group, s.name)) for s in scorings]
            for values, group in group_runs(runs, grid, pool_key)]
    return markdown_table(header, len(others), rows)


def plan_ensembles(runs: list[Run], grid: dict[str, list[str]], key: str, out: Path) -> list[tuple[Run, list[Run]]]:
    """For ``--ensemble key``: one (ensemble, members) pair per combination of the other grid keys,
    the members being the runs over all of ``key``'s values. The ensemble is a :class:`Run` without
    ``key`` in its values, with its folder under ``out/ensembles``."""
    return [(Run(values, out / "ensembles" / (folder_name(values) or "all")), members)
            for values, members in group_runs(runs, grid, key)]


def ensemble_table(ensembles: list[Run], grid: dict[str, list[str]], key: str, scorings: list[Scoring]) -> str:
    """One row per ensemble: the other grid values and its WER per scoring."""
    others = [k for k in grid if k != key]
    header = [short_key(k) for k in others] + [s.label for s in scorings]
    rows = []
    for ensemble in ensembles:
        r = ensemble.results
        rows.append([ensemble.values[k] for k in others] + [_pct(wer_of(r.get(s.name))) for s in scorings])
    return markdown_table(header, len(others), rows)


def measure_runs(runs: list[Run], targets: Targets, metrics: list[str] = ()) -> None:
    """Set every run's :attr:`Run.convergence` from its TensorBoard validation curves, and its
    :attr:`Run.finals`: the last logged value of each of ``metrics`` (None where it never logged one)."""
    for run in runs:
        curves = run_curves(run.exp_dir, run.name)  # read once: the convergence measures and the metrics
        named = tuple(t.name for t in targets.metrics)
        run.convergence = measure(read_run_curves(run.exp_dir, run.name, curves, named), targets)
        for name in metrics:
            curve = curves.get(metric_tag(name))
            run.finals[name] = curve.values[-1] if curve is not None and curve.values else None


@dataclass(frozen=True)
class RunState:
    """Where one run of a study stands, read from its folder without changing it (``asr.study --progress``):
    what it is doing in words, the last optimizer step its events hold, and the validations the tables read
    (up to ``--at-step``; None: the run is left out of them)."""

    state: str
    latest_step: int | None
    validations: RunCurves | None = None


def _last_finite(values: list[float]) -> float | None:
    return next((v for v in reversed(values) if math.isfinite(v)), None)


def measure_progress(runs: list[Run], targets: Targets, metrics: list[str] = (),
                     at_step: int | None = None) -> list[RunState]:
    """What :func:`measure_runs` does for a finished study, for one that is still training or was stopped:
    every run's :attr:`Run.convergence` and :attr:`Run.finals` from the validations its TensorBoard events hold
    now, or with ``at_step`` from those at or before that optimizer step, so that runs stopped at different
    points are compared at one budget. A run with no validation yet, or one that has not yet trained to
    ``at_step``, keeps ``convergence`` None and stays out of the tables; a run that finished before
    ``at_step`` is measured where it ended. Nothing is trained, evaluated or written; returns each run's
    :class:`RunState`."""
    from asr.training.runlock import LOCK_NAME, is_stale, read_lock

    named = tuple(dict.fromkeys([*(t.name for t in targets.metrics), *metrics]))
    states = []
    for run in runs:
        finished = (run.exp_dir / "study_time.json").exists()
        logged = run.exp_dir.is_dir() and any(p.is_file() for p in run.exp_dir.rglob(EVENT_GLOB))
        curves = run_curves(run.exp_dir, run.name) if logged else {}
        stepped = [c.steps[-1] for c in curves.values() if c.steps and c.axis != EPOCH_AXIS]
        latest = max(stepped) if stepped else None
        holder = read_lock(run.exp_dir / LOCK_NAME)
        live = holder is not None and not is_stale(holder)  # a lock from another host counts as live
        doing = "training" if live else "stopped"
        if finished:
            state = "finished"
        elif latest is not None:
            state = f"{doing} at step {latest}"
        elif curves:  # a run from before the optimizer steps were logged
            state = f"{doing}, its steps not logged"
        else:
            state = "training, nothing logged yet" if live else "not started"
        run.convergence, run.finals = None, {}
        run.results["train_seconds"] = training_seconds(run.exp_dir) if finished else None
        validations = read_run_curves(run.exp_dir, run.name, curves, named) if "valid/loss" in curves else None
        if validations is None:
            state += ", no validation yet" if curves else ""
        elif at_step is not None:
            if validations.steps is not None and not finished and latest < at_step:
                state, validations = f"{state}, short of step {at_step}", None
            else:  # a run logged by epochs only cannot be cut at a step: CompareError, naming it
                validations = up_to_step(validations, at_step, run.name)
                state += "" if validations is not None else f", no validation by step {at_step}"
        if validations is None:
            states.append(RunState(state, latest))
            continue
        run.convergence = measure(validations, targets)
        run.finals = {name: _last_finite(validations.metrics[name]) for name in metrics}
        states.append(RunState(state, latest, validations))
    return states


def _measured_text(run: Run) -> str:
    """Where the tables read a run: its validation's optimizer step (the epoch for a run that logged no
    steps), or "left out"."""
    c = run.convergence
    return "left out" if c is None else str(c.steps) if c.steps is not None else f"epoch {c.epochs:g}"


def state_table(runs: list[Run], grid: dict[str, list[str]], states: list[RunState]) -> str:
    """One row per run: its grid values, what it is doing, its last logged step and the step of the
    validation the tables use."""
    keys = list(grid)
    header = [short_key(k) for k in keys] + ["state", "last logged step", "measured at step"]
    rows = [[run.values[k] for k in keys]
            + [s.state, "n/a" if s.latest_step is None else str(s.latest_step), _measured_text(run)]
            for run, s in zip(runs, states)]
    return markdown_table(header, len(keys), rows)


def _reached_text(reached: Reached | None) -> str:
    """One run's way to a target: ``"1200 (epoch 4, 3.1 min)"``, or ``"not reached"``."""
    if reached is None:
        return "not reached"
    where = [f"epoch {reached.epoch:g}"] + ([f"{reached.minutes:.1f} min"] if reached.minutes is not None else [])
    return f"{reached.step} ({', '.join(where)})" if reached.step is not None else where[0]


def _target_headers(targets: Targets, unit: str) -> list[str]:
    headers = []
    if targets.loss is not None:
        headers.append(f"{unit} to valid loss <= {targets.loss:g}")
    if targets.wer_percent is not None:
        headers.append(f"{unit} to valid WER <= {targets.wer_percent:g}%")
    headers += [f"{unit} to {t.label}" for t in targets.metrics]
    return headers


def _targets_reached(convergence: Convergence, targets: Targets) -> list[Reached | None]:
    """Where ``convergence`` reached each given target, in :func:`_target_headers`' order."""
    given = [(convergence.loss_target, targets.loss), (convergence.wer_target, targets.wer_percent)]
    return [r for r, t in given if t is not None] + [convergence.metric_targets.get(t.label) for t in targets.metrics]


# The convergence tables' column for asr.studies.convergence.late_fall: near 0 on a plateau.
LATE_FALL = "valid loss fall per 1k steps, last quarter"


def _metric_headers(metrics: list[str]) -> list[str]:
    return [f"final {name}" for name in metrics]


def convergence_table(runs: list[Run], grid: dict[str, list[str]], targets: Targets, metrics: list[str] = ()) -> str:
    """One row per run: epochs and optimizer steps trained, steps to each target (with epoch and
    minutes), area under the validation loss, its late fall, best and final validation loss and WER,
    and the last value of each of ``metrics``."""
    keys = list(grid)
    header = [short_key(k) for k in keys] + ["epochs", "steps", *_target_headers(targets, "steps")]
    header += ["valid loss AUC (loss x 1k steps)", LATE_FALL, "best valid loss (epoch)", "final valid loss",
               "best valid WER %", "final valid WER %", *_metric_headers(metrics)]
    rows = []
    for run in runs:
        c = run.convergence
        cells = [run.values[k] for k in keys]
        if c is None:
            rows.append(cells + ["n/a"] * (len(header) - len(keys)))
            continue
        cells += [f"{c.epochs:g}", "n/a" if c.steps is None else str(c.steps)]
        cells += [_reached_text(r) for r in _targets_reached(c, targets)]
        cells += [_num(c.auc), _num(c.late_fall), f"{_num(c.best_loss)} ({c.best_loss_epoch:g})", _num(c.final_loss),
                  _pct(c.best_wer_percent), _pct(c.final_wer_percent)]
        cells += [_num(run.finals.get(name)) for name in metrics]
        rows.append(cells)
    return markdown_table(header, len(keys), rows)


def seed_table(runs: list[Run], grid: dict[str, list[str]], seed_key: str, targets: Targets,
               scorings: list[Scoring], metrics: list[str] = ()) -> str:
    """One row per setting (the grid keys other than ``seed_key``): each measure as mean ± std
    over its seeds (``metrics``: their last values); steps and minutes to a target over the seeds
    that reached it, counted."""
    others = [k for k in grid if k != seed_key]
    header = [short_key(k) for k in others] + ["seeds"]
    header += _target_headers(targets, "steps") + _target_headers(targets, "minutes")
    header += ["valid loss AUC (loss x 1k steps)", LATE_FALL, "best valid loss", "final valid loss", "best valid WER %",
               "final valid WER %", *_metric_headers(metrics), *[s.label for s in scorings], "train min"]
    rows = []
    for values, group in group_runs(runs, grid, seed_key):
        measured = [r.convergence for r in group if r.convergence is not None]
        cells = list(values.values()) + [_count(len(measured), len(group))]
        reached = [_targets_reached(c, targets) for c in measured]
        for field_name in ("step", "minutes"):
            for index in range(len(_target_headers(targets, ""))):
                cells.append(summarise_reached([r[index] for r in reached], field_name))
        cells += [format_mean_std([c.auc for c in measured]),
                  format_mean_std([c.late_fall for c in measured], 2),
                  format_mean_std([c.best_loss for c in measured]),
                  format_mean_std([c.final_loss for c in measured]),
                  format_mean_std([c.best_wer_percent for c in measured], 3),
                  format_mean_std([c.final_wer_percent for c in measured], 3)]
        cells += [format_mean_std([r.finals.get(name) for r in group], 3) for name in metrics]
        cells += [format_mean_std([wer_of(r.results.get(s.name)) for r in group], 3)
                  for s in scorings]
        cells.append(format_mean_std([r.results.get("train_seconds") for r in group], 3, 1 / 60))
        rows.append(cells)
    return markdown_table(header, len(others), rows)


def _count(measured: int, planned: int) -> str:
    """How many of a setting's runs its row covers: ``"3"``, or ``"2 of 3"`` while a study is in progress."""
    return str(planned) if measured == planned else f"{measured} of {planned}"


def welch(a: list[float | None], b: list[float | None]) -> tuple[float, float] | None:
    """``mean(a) - mean(b)`` and the two-sided p of Welch's t-test (unequal variances) between them; values
    that are None (not measured) are left out. None with fewer than 2 values on a side; p is nan when
    neither side varies."""
    a, b = [v for v in a if v is not None], [v for v in b if v is not None]
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    difference = sum(a) / len(a) - sum(b) / len(b)
    if max(a) == min(a) and max(b) == min(b):
        return difference, math.nan  # the t statistic is undefined: no spread to judge the difference by
    with warnings.catch_warnings():  # scipy warns of lost precision when one side does not vary; the p stands
        warnings.simplefilter("ignore", RuntimeWarning)
        return difference, float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def _difference_text(result: tuple[float, float] | None, digits: int = 3, scale: float = 1.0) -> str:
    """``"+1.2 (p 0.031)"``, or "n/a" where it cannot be tested."""
    if result is None:
        return "n/a"
    difference, p = result
    shown = f"{float(f'{difference * scale:.{digits}g}'):+g}"
    return f"{shown} (p {'n/a' if math.isnan(p) else f'{p:.2g}'})"


def comparison_table(runs: list[Run], grid: dict[str, list[str]], seed_key: str, compare_key: str,
                     targets: Targets, scorings: list[Scoring], metrics: list[str] = ()) -> str:
    """Each value of ``compare_key`` against its first, per setting of the other keys: for each measure the
    difference of the means over the seeds (``seed_key``) and the two-sided p of Welch's t-test. Steps to a
    target are compared over the seeds that reached it."""
    others = [k for k in grid if k not in (seed_key, compare_key)]
    base, *rest = grid[compare_key]

    def steps_to(reached_in):
        """A run's steps to the target that ``reached_in(convergence)`` gives, None where it was not reached."""
        def steps(run: Run) -> float | None:
            reached = reached_in(run.convergence) if run.convergence else None
            return None if reached is None or reached.step is None else float(reached.step)
        return steps

    def convergence_field(name: str):
        return lambda run: getattr(run.convergence, name) if run.convergence else None

    measures: list[tuple[str, object, float]] = [(s.label, lambda r, s=s: wer_of(r.results.get(s.name)), 1.0)
                                                 for s in scorings]
    measures += [("final valid WER %", convergence_field("final_wer_percent"), 1.0),
                 ("final valid loss", convergence_field("final_loss"), 1.0)]
    measures += [(f"final {name}", lambda r, name=name: r.finals.get(name), 1.0) for name in metrics]
    if targets.wer_percent is not None:
        measures.append((f"steps to valid WER <= {targets.wer_percent:g}%", steps_to(lambda c: c.wer_target), 1.0))
    measures += [(f"steps to {t.label}", steps_to(lambda c, label=t.label: c.metric_targets.get(label)), 1.0)
                 for t in targets.metrics]
    measures.append(("train min", lambda r: r.results.get("train_seconds"), 1 / 60))
    header = [short_key(k) for k in others] + [short_key(compare_key), "seeds"] + [label for label, _, _ in measures]
    rows = []
    for combination in itertools.product(*(grid[k] for k in others)):
        setting = dict(zip(others, combination))
        matching = [r for r in runs if all(r.values[k] == v for k, v in setting.items())]
        reference = [r for r in matching if r.values[compare_key] == base]
        for value in rest:
            group = [r for r in matching if r.values[compare_key] == value]
            counts = [_count(sum(r.convergence is not None for r in members), len(members))
                      for members in (group, reference)]
            cells = list(combination) + [f"{value} - {base}", " - ".join(counts)]
            cells += [_difference_text(welch([measure(r) for r in group], [measure(r) for r in reference]), 3, scale)
                      for _, measure, scale in measures]
            rows.append(cells)
    return markdown_table(header, len(others) + 2, rows)


def length_table(runs: list[Run], scorings: list[Scoring]) -> str:
    """WER by reference length (``asr.evaluate``'s ``by_length``): one row per run and scoring, one
    column per length bin found in any of them."""
    bins = sorted({tuple(b["words"]) for r in runs for s in scorings for b in (r.results.get(s.name) or {}).get("by_length", [])})
    header = ["run", "scoring"] + [
        (f"{low} word" + ("s" if low > 1 else "")) if low == high else f"{low}-{high} words" for low, high in bins
    ]
    rows = []
    for run in runs:
        for scoring in scorings:
            found = {tuple(b["words"]): b for b in (run.results.get(scoring.name) or {}).get("by_length", [])}
            rows.append([run.name, scoring.name] + [_pct(found[b]["wer_percent"]) if b in found else "n/a" for b in bins])
    return markdown_table(header, 2, rows)
