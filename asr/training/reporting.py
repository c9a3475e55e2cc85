"""What a run tells its reader: ``train.log`` lines and TensorBoard scalars, figures and files.

:class:`RunLog` is the trainer's one place for output. Per logged optimiser update (every
``train.log_every_steps``, and the first): ``train/loss``, ``train/lr``, ``train/grad_norm`` and
``grad_norm/<group>`` (before clipping, :func:`asr.training.step.gradient_groups`), and the value of
every other schedule in force (``train/ctc_weight``, ``train/max_duration``, ...; a model's scheduled
regularisers, e.g. ``train/drophead_encoder``). Per validation, at x = epoch + 1: every validation
metric the model has (``valid/loss``, ``valid/wer``, ``valid/ctc_cer``, ``valid/attention_spearman``,
... :mod:`asr.training.metrics`), ``valid/step`` and ``valid/minutes`` (so curves can be drawn against
either), ``train/skipped_utterances``, and for models that expose their attention
``alignment/<utterance>`` images of a few dev utterances, also written as
``alignment_<utterance>.png`` (the files hold the last validation's).
"""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

from asr.training.state import Progress
from asr.training.validation import alignment_file_name
from asr.writing import atomic_write, writing

logger = logging.getLogger("asr.train")

# train.log's epoch line shows these first (in this order), then any other metric the run has
_HEADLINE = ("valid_loss", "valid_wer", "valid_cer")
_PERCENT = ("wer", "cer", "at_end")


def format_metrics(metrics: dict[str, float]) -> str:
    """``"valid loss 1.2345, WER 12.30%, CER 5.10%, ctc_cer 7.00%, attention_spearman 0.912"``."""
    names = [n for n in _HEADLINE if n in metrics] + sorted(n for n in metrics if n not in _HEADLINE)
    parts = []
    for name in names:
        short = name.removeprefix("valid_")
        value = metrics[name]
        if short in ("wer", "cer"):
            parts.append(f"{short.upper()} {100 * value:.2f}%")
        elif short.endswith(_PERCENT):
            parts.append(f"{short} {100 * value:.2f}%")
        elif short == "loss":
            parts.append(f"valid loss {value:.4f}")
        else:
            parts.append(f"{short} {value:.4f}")
    return ", ".join(parts)


class RunLog:
    """``train.log`` (through the ``asr.train`` logger) and, on the main rank, TensorBoard in ``exp_dir``."""

    def __init__(self, exp_dir: Path, log_every_steps: int, main: bool):
        self.exp_dir = exp_dir
        self.log_every_steps = log_every_steps
        self.writer = None
        if main:
            from torch.utils.tensorboard import SummaryWriter

            with writing(exp_dir / "tensorboard"):  # it writes its first event file at once
                self.writer = SummaryWriter(log_dir=str(exp_dir / "tensorboard"))

    def logs_step(self, step: int) -> bool:
        """Whether optimiser update ``step`` is logged to TensorBoard."""
        return self.writer is not None and (step % self.log_every_steps == 0 or step == 1)

    def step(self, epoch: int, step: int, loss: float, grad_norm: float | None, group_norms: dict | None,
             values: dict[str, float]) -> None:
        """The update ``step`` just made, with the schedules' ``values`` it was made with."""
        if not self.logs_step(step):
            return
        lr = values.get("lr", float("nan"))
        with writing(self.event_file()):
            self.writer.add_scalar("train/loss", loss, step)
            if grad_norm is not None:
                self.writer.add_scalar("train/grad_norm", grad_norm, step)
            for group, norm in (group_norms or {}).items():
                self.writer.add_scalar(f"grad_norm/{group}", norm, step)
            for name, value in values.items():
                self.writer.add_scalar(f"train/{name}", value, step)
        logger.info("epoch %d step %d loss %.4f lr %.3g", epoch, step, loss, lr)

    def validation(self, epoch: int, progress: Progress, metrics: dict[str, float], figures) -> None:
        """The end of ``epoch``: its metrics in ``train.log`` and, with the skip count and the attention
        ``figures`` ((utterance id, figure) pairs), in TensorBoard at step epoch + 1."""
        skipped_text = progress.skipped_text()
        if metrics:
            logger.info("epoch %d: %s; %s", epoch, format_metrics(metrics), skipped_text)
        else:
            logger.info("epoch %d done; %s", epoch, skipped_text)
        if self.writer is not None:
            with writing(self.event_file()):
                write_epoch_summaries(self.writer, self.exp_dir, epoch, progress, metrics, figures)

    def close(self) -> None:
        if self.writer is not None:
            with writing(self.event_file()):
                self.writer.close()

    def event_file(self) -> Path:
        """The TensorBoard event file being written (for an error naming it)."""
        writer = getattr(getattr(self.writer, "file_writer", None), "event_writer", None)
        return Path(getattr(writer, "_file_name", self.exp_dir / "tensorboard"))


def write_epoch_summaries(writer, exp_dir: Path, epoch: int, progress: Progress, metrics: dict[str, float],
                          figures) -> None:
    """TensorBoard at the end of an epoch, at step epoch + 1: the skip count, the validation metrics
    with the optimizer steps and minutes so far, and the attention ``figures`` ((utterance id,
    figure) pairs), which also go to ``exp_dir/alignment_<utterance>.png``."""
    writer.add_scalar("train/skipped_utterances", sum(progress.skipped_in_epoch.values()), epoch + 1)
    for name, value in metrics.items():
        writer.add_scalar(name.replace("valid_", "valid/", 1), value, epoch + 1)
    if metrics:
        writer.add_scalar("valid/step", progress.step, epoch + 1)
        writer.add_scalar("valid/minutes", progress.seconds / 60, epoch + 1)
    for utt_id, figure in figures:
        picture = io.BytesIO()
        figure.savefig(picture, format="png", dpi=100)
        atomic_write(exp_dir / alignment_file_name(utt_id), picture.getvalue())  # whole or not at all
        writer.add_figure(f"alignment/{utt_id}", figure, epoch + 1)  # closes the figure
    writer.flush()


def setup_logging(log_file: Path | None) -> None:
    """Log INFO and up to stderr (and to ``log_file``), replacing the handlers an earlier Trainer set."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        if getattr(handler, "_asr_handler", False):
            root.removeHandler(handler)
            handler.close()
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    handlers = [logging.StreamHandler(sys.stderr)]
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
