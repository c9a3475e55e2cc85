"""Attention alignments drawn over the features they attend to, for TensorBoard and study reports.

A LAS user's first question about a run is whether its attention is diagonal:
each output token should look at the stretch of audio that says it, later
tokens further right. :func:`alignment_figure` draws the utterance's features
(``librosa.display.specshow``, time in seconds) above the attention weights
of every output step, on the same time axis, so a reader sees which frames
each token attended to.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display: figures go to files and TensorBoard

import librosa.display  # noqa: E402  (after choosing the backend)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


# TensorBoard's time series shows an image scaled into its card, about 200 pixels high at the default
# card size (seen in Chromium, TensorBoard 2.21): the figure is wide and low, 640 x 340 pixels at
# 100 dpi, with 12-point text, which stays about 10 pixels high there, and at most MAX_TOKEN_LABELS
# output steps named (every k-th beyond that) so the labels never overlap.
FIGURE_INCHES = (6.4, 3.4)
FONT_SIZE = 12
MAX_TOKEN_LABELS = 10


def alignment_figure(
    features: np.ndarray, weights: np.ndarray, frame_seconds: float, title: str = "", tokens: list[str] | None = None
):
    """A matplotlib figure: features ``(T, D)`` above attention ``weights`` ``(L, T')``.

    ``frame_seconds`` is the feature frame shift; the attention's ``T'`` encoder
    frames span the same audio (``T / T'`` feature frames each). ``tokens``, when
    given, label the output steps (at most :data:`MAX_TOKEN_LABELS` of them, evenly spaced).
    """
    features = np.asarray(features, dtype=np.float32)
    weights = np.asarray(weights, dtype=np.float32)
    duration = features.shape[0] * frame_seconds
    with plt.rc_context({"font.size": FONT_SIZE}):
        figure, (top, bottom) = plt.subplots(2, 1, figsize=FIGURE_INCHES, sharex=True, height_ratios=[1, 2.4])
        librosa.display.specshow(
            features.T, x_axis="time", sr=1.0 / frame_seconds, hop_length=1, ax=top, cmap="magma"
        )
        top.set(ylabel="feature", xlabel="")
        top.set_title(title, fontsize=FONT_SIZE)
        encoder_seconds = duration / max(weights.shape[1], 1)
        librosa.display.specshow(
            weights, x_axis="time", sr=1.0 / encoder_seconds, hop_length=1, ax=bottom, cmap="viridis", vmin=0.0
        )
        bottom.set(ylabel="output token", xlabel="seconds")
        if tokens is not None and len(tokens) == weights.shape[0]:
            shown = np.arange(0, len(tokens), -(-len(tokens) // MAX_TOKEN_LABELS))
            # a space token would be an empty label: it is drawn as the open box
            bottom.set_yticks(shown + 0.5, labels=[tokens[i] if tokens[i].strip() else "\u2423" for i in shown])
            bottom.tick_params(axis="y", labelsize=FONT_SIZE - 1)
        figure.tight_layout()
    return figure


def save_figure(figure, path) -> None:
    figure.savefig(path, dpi=100)
    plt.close(figure)


def tile_images(rows: list[list[tuple[str, str | None]]], out) -> None:
    """Tile PNG files into one image: ``rows`` of ``(title, path or None)``; a missing
    picture leaves its cell empty with the title saying so. Written to ``out``."""
    columns = max(len(row) for row in rows)
    figure, axes = plt.subplots(len(rows), columns, figsize=(5 * columns, 3.2 * len(rows)), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for r, row in enumerate(rows):
        for c, (title, path) in enumerate(row):
            ax = axes[r, c]
            if path is None:
                ax.set_title(f"{title}\n(no picture)", fontsize=8)
                continue
            ax.imshow(plt.imread(path))
            ax.set_title(title, fontsize=8)
    figure.tight_layout()
    save_figure(figure, out)
