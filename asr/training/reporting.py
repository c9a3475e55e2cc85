"""What a run tells its reader: ``train.log`` lines and TensorBoard scalars, figures and files.

:class:`RunLog` is the trainer's one place for output. Every TensorBoard scalar, training and
validation alike, is logged against the optimizer step (the updates made so far), so train and
valid curves overlay on one axis and runs of different batch sizes compare; the epoch is a scalar
of its own, ``epoch``: the epochs done, 2.5 halfway through the third.

Epochs are numbered from 1 everywhere: ``epoch 1`` in ``train.log`` is the first, after which
``epoch1.pt`` is written and ``epoch`` reaches 1 in TensorBoard.

Per logged optimiser update (every ``train.log_every_steps``, the first, and ``train.max_steps``,
the last): ``train/loss``, ``train/lr``, ``train/grad_norm`` and ``grad_norm/<group>`` (before
clipping, :func:`asr.training.step.gradient_groups`), the value of every other schedule in force
(``train/ctc_weight``, ``train/max_duration``, ...; a model's scheduled regularisers, e.g.
``train/drophead_encoder``), ``time/seconds_per_update`` and ``time/loader_wait`` (the wall time per
update since the last logged one, and the share of it spent waiting for the loader:
:mod:`asr.training.timing`), and ``epoch``. Per validation, at the step it follows: every validation
metric the model has (``valid/loss``, ``valid/wer``, ``valid/ctc_cer``, ``valid/attention_spearman``,
... :mod:`asr.training.metrics`; WER, CER and the other shares in percent, as in ``train.log``,
``wer.json`` and every table), ``valid/minutes`` (so curves can be drawn against time),
``epoch``, ``train/skipped_utterances``, and for models that expose their attention
``alignment/<utterance>`` images of a few dev utterances, also written as
``alignment_<utterance>.png`` (the files hold the last validation's).

Beside the curves, the run's settings (:meth:`RunLog.settings`): every resolved config key as an
hparam, with ``overrides`` (the command line's ``key=value``), so TensorBoard's HParams view lists
the runs with their settings and final metrics, the keys that differ between them first; and the
resolved ``config.yaml`` and the command line as text; and charts that draw ``train/loss`` and
``valid/loss`` over each other (:data:`OVERLAYS`, CUSTOM SCALARS). The event files go straight into ``exp_dir``,
so TensorBoard names the run after its folder (``tensorboard --logdir exp`` shows ``fsdd_las``; a run
begun by an older version goes on writing into its ``exp_dir/tensorboard``).

A run ends with a summary in ``train.log`` (:func:`end_summary`): why it stopped, the best
checkpoint and its metric, the last validation, where its files are, and the commands to run next.
On a terminal, log lines are written above the progress bar, never into it (:mod:`asr.console`).

Event files written before this layout (no ``epoch`` scalar) logged validation at x = epoch number,
with ``valid/step`` beside it, and WER and CER as fractions; :mod:`asr.studies.curves` reads both.
"""

from __future__ import annotations

import io
import json
import logging
import math
import shlex
import sys
from pathlib import Path

import yaml

from asr.checkpoints.averaging import epoch_of
from asr.config import flatten
from asr.console import ProgressBarHandler
from asr.models import runtime

from asr.training.hooks import Hook, RunEnd, Update, Validated
from asr.training.metrics import as_shown, format_value, in_percent
from asr.training.state import Progress
from asr.training.validation import alignment_figures, alignment_file_name
from asr.writing import atomic_write, writing

logger = logging.getLogger("asr.train")

# train.log's epoch line shows these first (in this order), then any other metric the run has
_HEADLINE = ("valid_loss", "valid_wer", "valid_cer")


def format_metrics(shown: dict[str, float]) -> str:
    """``"valid loss 1.2345, WER 12.30%, CER 5.10%, ctc_cer 7.00%, attention_spearman 0.9120"`` from
    metrics as shown (:func:`asr.training.metrics.as_shown`: shares already in percent)."""
    names = [n for n in _HEADLINE if n in shown] + sorted(n for n in shown if n not in _HEADLINE)
    parts = []
    for name in names:
        short = name.removeprefix("valid_")
        label = short.upper() if short in ("wer", "cer") else "valid loss" if short == "loss" else short
        value = shown[name]
        parts.append(f"{label} {value:.2f}%" if in_percent(name) else f"{label} {value:.4f}")
    return ", ".join(parts)


class RunLog:
    """``train.log`` (through the ``asr.train`` logger) and, on the main rank, TensorBoard in ``exp_dir``.

    ``last_step`` (``train.max_steps``) is logged whatever ``log_every_steps`` says: a run's last
    update is always on its curves."""

    def __init__(self, exp_dir: Path, log_every_steps: int, main: bool, last_step: int | None = None):
        self.exp_dir = exp_dir
        self.log_every_steps = log_every_steps
        self.last_step = last_step
        self.main = main
        self.writer = None
        self._epoch_written_at: int | None = None  # `epoch` is written once per step
        if main:
            from torch.utils.tensorboard import SummaryWriter

            folder = event_folder(exp_dir)
            with writing(folder):  # it writes its first event file at once
                self.writer = SummaryWriter(log_dir=str(folder))

    def settings(self, config: dict, overrides: list[str], command: str) -> None:
        """The run's settings in TensorBoard: ``config`` (the resolved recipe, a nested dict) as hparams
        with ``overrides`` first, and as text with the ``command`` line."""
        if self.writer is None:
            return
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb

        values = {"overrides": " ".join(overrides) or "(none)"}
        values.update({key: hparam_value(value) for key, value in flatten(config).items() if key != "exp_dir"})
        # The session's hparams only: without an experiment summary of its own, TensorBoard gathers
        # the hparams of every run it shows, marks those that differ and lists them first. TensorBoard's
        # own writer, not torch's: torch's tests int before bool and logs every boolean as a number.
        session_start = hparams_pb(values, trial_id=str(self.exp_dir))
        text = yaml.safe_dump(config, sort_keys=False)
        with writing(self.event_file()):
            self.writer.file_writer.add_summary(session_start)
            # TensorBoard's CUSTOM SCALARS: training and validation loss drawn in one chart, on the step axis
            self.writer.add_custom_scalars(OVERLAYS)
            # indented four spaces: TensorBoard's Markdown shows it as written
            self.writer.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()), 0)
            self.writer.add_text("command line", f"    {command}", 0)
            self.writer.flush()

    def logs_step(self, step: int) -> bool:
        """Whether optimiser update ``step`` is logged to TensorBoard."""
        return self.writer is not None and (step % self.log_every_steps == 0 or step in (1, self.last_step))

    def step(self, epoch: int, step: int, loss: float, grad_norm: float | None, group_norms: dict | None,
             values: dict[str, float], epochs_done: float, timing: dict[str, float] | None = None) -> None:
        """The update ``step`` just made in epoch number ``epoch`` (from 1), with the schedules'
        ``values`` it was made with; ``epochs_done`` counts the epochs done with this one's share;
        ``timing`` (:meth:`asr.training.timing.LoaderClock.read`) the wall time per update and the loader's
        share of it since the last logged update."""
        if not self.logs_step(step):
            return
        lr = values.get("lr", float("nan"))
        timing = timing or {}
        with writing(self.event_file()):
            self.writer.add_scalar("train/loss", loss, step)
            if grad_norm is not None:
                self.writer.add_scalar("train/grad_norm", grad_norm, step)
            for group, norm in (group_norms or {}).items():
                self.writer.add_scalar(f"grad_norm/{group}", norm, step)
            for name, value in values.items():
                self.writer.add_scalar(f"train/{name}", value, step)
            for name, value in timing.items():
                self.writer.add_scalar(f"time/{name}", value, step)
            self._epoch(step, epochs_done)
        if timing:
            logger.info("epoch %d step %d loss %.4f lr %.3g, %.3g s/update, loader wait %.0f%%", epoch, step, loss,
                        lr, timing["seconds_per_update"], 100 * timing["loader_wait"])
        else:
            logger.info("epoch %d step %d loss %.4f lr %.3g", epoch, step, loss, lr)

    def validation(self, epoch: int, progress: Progress, metrics: dict[str, float], figures,
                   epochs_done: float) -> None:
        """The validation after epoch number ``epoch`` (from 1; ``epochs_done`` short of it when the
        run stopped inside it): its ``metrics`` (as computed: shares as fractions; shown in percent) in
        ``train.log`` and, with the skip count and the attention ``figures`` ((utterance id, figure)
        pairs), in TensorBoard at the optimizer step it follows."""
        skipped_text = progress.skipped_text()
        where = f"epoch {epoch}" if epochs_done == epoch else f"step {progress.step} (epoch {epoch}, not finished)"
        metrics = as_shown(metrics)
        if metrics:
            logger.info("%s: %s; %s", where, format_metrics(metrics), skipped_text)
        else:
            logger.info("%s done; %s", where, skipped_text)
        if self.writer is not None:
            with writing(self.event_file()):
                self._epoch(progress.step, epochs_done)
                write_epoch_summaries(self.writer, self.exp_dir, progress, metrics, figures)

    def summary(self, lines: list[str]) -> None:
        """The run's closing lines (:func:`end_summary`), in ``train.log`` (the main rank's)."""
        if self.main:
            for line in lines:
                logger.info("%s", line)

    def _epoch(self, step: int, epochs_done: float) -> None:
        if self._epoch_written_at != step:
            self.writer.add_scalar("epoch", epochs_done, step)
            self._epoch_written_at = step

    def close(self) -> None:
        if self.writer is not None:
            with writing(self.event_file()):
                self.writer.close()

    def event_file(self) -> Path:
        """The TensorBoard event file being written (for an error naming it)."""
        writer = getattr(getattr(self.writer, "file_writer", None), "event_writer", None)
        return Path(getattr(writer, "_file_name", self.exp_dir / "tensorboard"))


class Reporting(Hook):
    """The run's reporting as a hook (:mod:`asr.training.hooks`): each logged update and every validation
    (with the attention pictures of a few dev utterances) in ``train.log`` and TensorBoard, through
    :class:`RunLog`, and the closing summary (:func:`end_summary`) when the run ends."""

    def __init__(self, log: RunLog, best_metric: str):
        self.log, self.best_metric = log, best_metric
        self.last_metrics: dict[str, float] = {}  # of the latest validation, for the summary

    def detailed(self, step: int) -> bool:
        return self.log.logs_step(step)

    def on_update(self, trainer, update: Update) -> None:
        self.log.step(update.epoch, update.step, update.loss, update.grad_norm, update.group_norms, update.values,
                      update.epochs_done, update.timing)

    def on_validation(self, trainer, validated: Validated) -> None:
        epoch, metrics = validated.epoch, validated.metrics
        figures = []
        if self.log.writer is not None and metrics:
            when = f"after epoch {epoch}" if validated.at_epoch_end else f"step {validated.step} (in epoch {epoch})"
            figures = alignment_figures(trainer.raw_model, trainer.data.valid_set, trainer.tokenizer, trainer.device,
                                        when=when)
        self.log.validation(epoch, trainer.progress, metrics, figures, validated.epochs_done)
        self.last_metrics = metrics

    def on_run_end(self, trainer, end: RunEnd) -> None:
        self.log.summary(end_summary(trainer.exp_dir, trainer.progress, end.why, self.best_metric, self.last_metrics,
                                     end.epochs_done))

    def close(self, trainer) -> None:
        self.log.close()


class RunRecord(Hook):
    """``config.yaml``: the run's settings (the resolved recipe, with the ``history`` of its resumes:
    :func:`asr.training.resume.settings_record`) and under ``runtime:`` which code computes its model
    (:func:`asr.models.runtime.describe`). :meth:`write` writes it once, when the run is built (a resumed
    run's start writes it again, its resume added to the history), and nothing writes it after: a run
    stopped at any point leaves the record its start wrote. What ran (:func:`asr.models.runtime.ran`:
    backends, fallbacks, CUDA graphs recorded) is known only when the run ends, and goes into
    ``train.log`` then, one line (every entry with ``--verbose``). Loading config.yaml as a recipe ignores
    the runtime record and the history."""

    def __init__(self, path: Path, settings: dict, described: dict, device, main: bool, verbose: bool = False):
        self.path, self.settings, self.runtime, self.device = path, settings, described, device
        self.main, self.verbose = main, verbose
        self._before = runtime.snapshot()  # "what ran" is this run's, not this process's

    def write(self) -> None:
        if self.main:
            record = dict(self.settings)
            history = record.pop("history", None)
            record["runtime"] = self.runtime
            if history:
                record["history"] = history
            atomic_write(self.path, yaml.safe_dump(record, sort_keys=False))

    def on_run_end(self, trainer, end: RunEnd) -> None:
        """What ran, into ``train.log``: one line, or with ``--verbose`` every entry."""
        ran = runtime.ran(since=self._before, device=self.device)
        if self.verbose:
            runtime.log(logger, ran)
        else:
            logger.info("%s", runtime.ran_summary(ran))


def write_epoch_summaries(writer, exp_dir: Path, progress: Progress, metrics: dict[str, float], figures) -> None:
    """TensorBoard after a validation, at optimizer step ``progress.step``: the epoch's skip count, the
    validation metrics with the minutes so far, and the attention ``figures`` ((utterance id, figure)
    pairs), which also go to ``exp_dir/alignment_<utterance>.png``."""
    step = progress.step
    writer.add_scalar("train/skipped_utterances", sum(progress.skipped_in_epoch.values()), step)
    for name, value in metrics.items():
        writer.add_scalar(name.replace("valid_", "valid/", 1), value, step)
    if metrics:
        writer.add_scalar("valid/minutes", progress.seconds / 60, step)
    for utt_id, figure in figures:
        picture = io.BytesIO()
        figure.savefig(picture, format="png", dpi=100)
        atomic_write(exp_dir / alignment_file_name(utt_id), picture.getvalue())  # whole or not at all
        writer.add_figure(f"alignment/{utt_id}", figure, step)  # closes the figure
    writer.flush()


def end_summary(exp_dir: Path, progress: Progress, why: str, best_metric: str, last_metrics: dict[str, float],
                epochs_done: float) -> list[str]:
    """What a finished run says last: why and where it stopped, the best checkpoint and its ``best_metric``
    (from ``progress.best``), the ``last_metrics`` validated (as computed: shares as fractions), the files
    in ``exp_dir``, and the next commands (average the last epochs, evaluate, compare)."""
    folder = shlex.quote(str(exp_dir))
    epochs = epochs_text(epochs_done)
    lines = [f"training finished ({why}) after {progress.step} steps, {epochs}, {progress.seconds / 60:.1f} min"]
    kept = sorted(number for path in exp_dir.glob("epoch*.pt") if (number := epoch_of(path, "epoch")) is not None)
    best_files = {epoch_of(path, "best_epoch") for path in exp_dir.glob("best_epoch*.pt")}
    if progress.best:
        value, epoch = progress.best[0]
        where = f"best_epoch{epoch}.pt" if epoch in best_files else f"epoch {epoch}"
        lines.append(f"best: epoch {epoch}, {best_metric} {format_value(best_metric, value)} ({exp_dir / where})")
    else:
        lines.append(f"best: no epoch ranked by {best_metric} (train.best_metric) yet")
    if last_metrics:
        lines.append(f"last validation, at step {progress.step}: {format_metrics(as_shown(last_metrics))}")
    epochs_kept = f"epoch{kept[0]}.pt .. epoch{kept[-1]}.pt" if len(kept) > 1 else ", ".join(f"epoch{e}.pt" for e in kept)
    lines.append(f"in {exp_dir}: last.pt" + (f", {epochs_kept}" if kept else "") +
                 (f", best_epoch*.pt ({len(best_files)})" if best_files else "") + ", config.yaml, train.log, "
                 f"TensorBoard events (tensorboard --logdir {shlex.quote(str(exp_dir.parent))})")
    if len(kept) > 1:
        count = min(len(kept), 5)
        model = exp_dir / f"avg_last{count}.pt"
        lines.append(f"next: python -m asr.average {folder} --last {count}")
        lines.append(f"      python -m asr.evaluate --checkpoint {shlex.quote(str(model))} --split dev  "
                     "(or --split test, or --data DIR)")
    else:
        model = exp_dir / (f"best_epoch{progress.best[0][1]}.pt" if progress.best and progress.best[0][1] in best_files
                           else "last.pt")
        lines.append(f"next: python -m asr.evaluate --checkpoint {shlex.quote(str(model))} --split dev  "
                     "(or --split test, or --data DIR)")
    lines.append(f"      python -m asr.compare {folder} OTHER_RUN --tag valid/loss --tag train/loss")
    return lines


def epochs_text(epochs_done: float) -> str:
    """Epochs done as the log names them, numbered from 1: ``4 epochs``, or inside one, ``37% into epoch 1``
    (not ``0.377358 epochs``)."""
    whole = math.floor(epochs_done)
    if epochs_done == whole:
        return f"{whole} epoch" + ("" if whole == 1 else "s")
    return f"{math.floor(100 * (epochs_done - whole))}% into epoch {whole + 1}"


# Charts of several tags each, for TensorBoard's CUSTOM SCALARS tab (every run writes the same layout).
# The tags are regular expressions there: anchored, so valid/loss is not also valid/loss_without_context.
OVERLAYS = {"train and valid": {
    "loss: train/loss and valid/loss": ["Multiline", ["^train/loss$", "^valid/loss$"]],
    "error rates (%): valid/wer, valid/cer, valid/ctc_cer": ["Multiline", ["^valid/wer$", "^valid/cer$", "^valid/ctc_cer$"]],
}}


def event_folder(exp_dir: Path) -> Path:
    """Where a run's TensorBoard events go: ``exp_dir`` itself, so the run is named after its folder;
    ``exp_dir/tensorboard`` for a run begun there by an older version, so it stays one run."""
    older = exp_dir / "tensorboard"
    return older if any(older.glob("events.out.tfevents.*")) else exp_dir


def hparam_value(value) -> str | int | float | bool:
    """A config value as TensorBoard's hparams take it: numbers, strings and booleans as they are (a
    boolean as a boolean; an integer as TensorBoard's one kind of number, which has no integer type),
    anything else (None, lists, mappings) as its JSON text."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value)


class held_records:
    """Hold what ``logger`` logs inside the ``with`` block until :meth:`release`, for messages written
    before the file they belong in may be opened (a resumed run's, before its settings are checked).
    Leaving the block with an error writes the warnings among them to stderr alone: the handlers there are
    then may be an earlier run's, in the same process, and its train.log is not this run's."""

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        self.records: list[logging.LogRecord] = []
        self._handler = logging.Handler()
        self._handler.emit = self.records.append

    def __enter__(self) -> "held_records":
        self._propagate = self.logger.propagate
        self.logger.propagate = False
        self.logger.addHandler(self._handler)
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.logger.removeHandler(self._handler)
        self.logger.propagate = self._propagate
        if kind is not None:
            for record in self.records:
                if record.levelno >= logging.WARNING:
                    sys.stderr.write(f"{record.levelname.lower()}: {record.getMessage()}\n")
            self.records.clear()

    def release(self) -> None:
        """Log the held records now, in their order."""
        records, self.records[:] = list(self.records), []
        for record in records:
            self.logger.handle(record)


def setup_logging(log_file: Path | None) -> None:
    """Log INFO and up to stderr (and to ``log_file``), replacing the handlers an earlier Trainer set."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        if getattr(handler, "_asr_handler", False):
            root.removeHandler(handler)
            handler.close()
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    handlers = [ProgressBarHandler(sys.stderr)]
    if log_file is not None:
        handlers.append(_LogFileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler._asr_handler = True
        root.addHandler(handler)


class _LogFileHandler(logging.FileHandler):
    """``train.log``: when a record cannot be written (a full disk), say so once on stderr and stop
    writing the file, instead of logging's traceback for every record; stderr still gets them all."""

    def handleError(self, record) -> None:
        if not getattr(self, "_failed", False):
            self._failed = True
            err = sys.exc_info()[1]
            sys.stderr.write(f"warning: cannot write {self.baseFilename}: {getattr(err, 'strerror', None) or err}; "
                             "the log goes on on stderr only\n")

    def emit(self, record) -> None:
        if not getattr(self, "_failed", False):
            super().emit(record)
