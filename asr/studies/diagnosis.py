"""Why a LAS does or does not converge, in one figure: its diagnostics over updates, run against run.

A LAS that "stops converging" can fail in several places, and its loss curve does not say which. The
trainer logs what tells them apart (:mod:`asr.training.metrics`, :mod:`asr.training.reporting`); this
module draws it for several runs at once, coloured by setting, so that a failing configuration and a
converging one sit side by side:

- the CTC head's dev CER (``valid/ctc_cer``): whether the listener learns anything the audio says;
- the attention's Spearman correlation between output step and peak frame
  (``valid/attention_spearman``) and its share of steps on the last frames (``valid/attention_at_end``):
  whether it moves along the utterance or sits at the end;
- the speller's dev loss with its context (``valid/attention_loss``) and with the context zeroed
  (``valid/loss_without_context``): where the two meet, the speller has become a language model that
  ignores the audio;
- the gradient norms of the listener, the speller and the attention before clipping
  (``grad_norm/<group>``, every ``train.log_every_steps``): which stack the loss reaches.

A run has **aligned** at the first validation where the Spearman is at least :data:`ALIGNED_SPEARMAN`
and at most :data:`ALIGNED_AT_END` percent of steps sit on the last frames (the measure of
``benchmarks/rehearsal_proof.py``). ``python -m asr.compare RUN... --diagnose`` and ``python -m
asr.study ... --diagnose`` draw the figure and print :func:`diagnosis_table`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from asr.studies.curves import CompareError, Curve, run_curves

ALIGNED_SPEARMAN = 0.9
ALIGNED_AT_END = 10.0  # percent of output steps whose attention peak is on the last frames
EARLY_UPDATES = 300  # "the first updates" of the gradient-norm columns: those logged at steps 1..this

CTC_CER, SPEARMAN, AT_END = "valid/ctc_cer", "valid/attention_spearman", "valid/attention_at_end"
WITH_CONTEXT, WITHOUT_CONTEXT = "valid/attention_loss", "valid/loss_without_context"
GRADIENT_GROUPS = ("listener", "speller", "attention", "ctc")


@dataclass(frozen=True)
class Panel:
    """One panel: its title, the tags it draws (each with a line style), a reference line, log y."""

    title: str
    tags: tuple[tuple[str, str], ...]
    reference: float | None = None
    log: bool = False


PANELS = (
    Panel("CTC head: dev CER (%)", ((CTC_CER, "-"),)),
    Panel(f"attention: Spearman of its peaks (aligned: >= {ALIGNED_SPEARMAN:g})", ((SPEARMAN, "-"),), ALIGNED_SPEARMAN),
    Panel(f"attention: steps on the last frames (%) (aligned: <= {ALIGNED_AT_END:g})", ((AT_END, "-"),), ALIGNED_AT_END),
    Panel("speller: dev loss with its context (solid), without (dashed)", ((WITH_CONTEXT, "-"), (WITHOUT_CONTEXT, "--"))),
    Panel("gradient norm before clipping: listener", (("grad_norm/listener", "-"),), log=True),
    Panel("gradient norm before clipping: speller (solid), attention (dotted)",
          (("grad_norm/speller", "-"), ("grad_norm/attention", ":")), log=True),
)


@dataclass(frozen=True)
class Diagnosed:
    """One run's curves, under its label, in the setting that colours it."""

    label: str
    setting: str
    curves: dict[str, Curve]


def read_diagnosed(exp_dir: str | Path, label: str, setting: str | None = None) -> Diagnosed:
    """The run in ``exp_dir`` (its TensorBoard events); ``setting`` defaults to ``label``."""
    return Diagnosed(label, label if setting is None else setting, run_curves(exp_dir, label))


def aligned_at(curves: dict[str, Curve]) -> int | None:
    """The step of the first validation at which the attention counts as aligned, or None."""
    if SPEARMAN not in curves or AT_END not in curves:
        return None
    at_end = dict(zip(curves[AT_END].steps, curves[AT_END].values))
    for step, spearman in zip(curves[SPEARMAN].steps, curves[SPEARMAN].values):
        share = at_end.get(step)
        if share is not None and spearman >= ALIGNED_SPEARMAN and share <= ALIGNED_AT_END:
            return step
    return None


def first_at_most(curve: Curve | None, target: float) -> int | None:
    """The step of the first value at or below ``target``, or None."""
    if curve is None:
        return None
    return next((s for s, v in zip(curve.steps, curve.values) if v <= target), None)


def early_mean(curve: Curve | None, until: int = EARLY_UPDATES) -> float | None:
    """The mean of a curve's finite values logged at steps up to ``until``, or None."""
    if curve is None:
        return None
    values = [v for s, v in zip(curve.steps, curve.values) if s <= until and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _last(curve: Curve | None) -> float | None:
    return curve.values[-1] if curve is not None and curve.values else None


def _cell(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits + 1}g}"


def diagnosis_table(runs: list[Diagnosed], ctc_cer_target: float | None = None) -> str:
    """A markdown table, a row per run: where it aligned, its last diagnostics, its early gradients."""
    header = ["run", "setting", "last step", "aligned at"]
    if ctc_cer_target is not None:
        header.append(f"CTC CER <= {ctc_cer_target:g}% at")
    header += ["CTC CER (%)", "Spearman", "at end (%)", "loss with / without context"]
    header += [f"grad {g}, steps <= {EARLY_UPDATES}" for g in GRADIENT_GROUPS]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---", "---"] + ["---:"] * (len(header) - 2)) + " |"]
    for run in runs:
        c = run.curves
        steps = [curve.steps[-1] for tag, curve in c.items() if tag.startswith("valid/") and curve.steps]
        row = [run.label, run.setting, _cell(max(steps) if steps else None), _cell(aligned_at(c)) if aligned_at(c) else "no"]
        if ctc_cer_target is not None:
            row.append(_cell(first_at_most(c.get(CTC_CER), ctc_cer_target)) if first_at_most(c.get(CTC_CER), ctc_cer_target) else "no")
        with_context, without = _last(c.get(WITH_CONTEXT)), _last(c.get(WITHOUT_CONTEXT))
        row += [_cell(_last(c.get(CTC_CER))), _cell(_last(c.get(SPEARMAN))), _cell(_last(c.get(AT_END))),
                f"{_cell(with_context)} / {_cell(without)}"]
        row += [_cell(early_mean(c.get(f"grad_norm/{g}"))) for g in GRADIENT_GROUPS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def diagnosis_figure(runs: list[Diagnosed], out: Path, title: str | None = None) -> None:
    """The panels of :data:`PANELS` in a grid, every run a line in its setting's colour, its aligned
    validation marked with a dot on the Spearman panel; written as a PNG to ``out``."""
    if not runs:
        raise CompareError("no runs to diagnose")
    import matplotlib

    matplotlib.use("Agg")  # no display needed; must precede pyplot
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r.setting for r in runs))
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(settings)}
    counts = {s: sum(r.setting == s for r in runs) for s in settings}
    columns = 2
    rows = math.ceil(len(PANELS) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(13, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, PANELS):
        drawn = False
        for run in runs:
            for tag, style in panel.tags:
                curve = run.curves.get(tag)
                if curve is None or not curve.steps:
                    continue
                marker = "o" if len(curve.steps) <= 40 else None
                ax.plot(curve.steps, curve.values, linestyle=style, color=colours[run.setting], linewidth=1.1,
                        alpha=0.85, marker=marker, markersize=2.5)
                drawn = True
            step = aligned_at(run.curves) if panel.tags[0][0] == SPEARMAN else None
            if step is not None:
                value = dict(zip(run.curves[SPEARMAN].steps, run.curves[SPEARMAN].values))[step]
                ax.plot([step], [value], "o", color=colours[run.setting], markersize=8, markerfacecolor="none")
        if panel.reference is not None:
            ax.axhline(panel.reference, color="grey", linewidth=0.8, linestyle="--")
        if panel.log and drawn:
            ax.set_yscale("log")
        ax.set_title(panel.title if drawn else panel.title + " (no run logged it)", fontsize="medium")
        ax.set_xlabel("optimizer step")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(PANELS):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], color=colours[s], label=f"{s} ({counts[s]} run{'s' if counts[s] > 1 else ''})")
               for s in settings]
    handles.append(plt.Line2D([], [], color="grey", marker="o", markerfacecolor="none", linestyle="",
                              label="aligned: first validation with both attention measures past their lines"))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize="small", frameon=False)
    if title:
        fig.suptitle(title, fontsize="small")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":  # a library module: say which command uses it rather than exit in silence
    from asr.console import not_a_command

    not_a_command("asr.studies.diagnosis", "asr.compare")
