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


def alignment_figure(
    features: np.ndarray, weights: np.ndarray, frame_seconds: float, title: str = "", tokens: list[str] | None = None
):
    """A matplotlib figure: features ``(T, D)`` above attention ``weights`` ``(L, T')``.

    ``frame_seconds`` is the feature frame shift; the attention's ``T'`` encoder
    frames span the same audio (``T / T'`` feature frames each). ``tokens``, when
    given, label the output steps.
    """
    features = np.asarray(features, dtype=np.float32)
    weights = np.asarray(weights, dtype=np.float32)
    duration = features.shape[0] * frame_seconds
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True, height_ratios=[1, 1.4])
    librosa.display.specshow(
        features.T, x_axis="time", sr=1.0 / frame_seconds, hop_length=1, ax=top, cmap="magma"
    )
    top.set(ylabel="feature", title=title)
    encoder_seconds = duration / max(weights.shape[1], 1)
    librosa.display.specshow(
        weights, x_axis="time", sr=1.0 / encoder_seconds, hop_length=1, ax=bottom, cmap="viridis", vmin=0.0
    )
    bottom.set(ylabel="output step")
    if tokens is not None and len(tokens) == weights.shape[0]:
        bottom.set_yticks(np.arange(len(tokens)) + 0.5, labels=tokens, fontsize=6)
    figure.tight_layout()
    return figure


def save_figure(figure, path) -> None:
    figure.savefig(path, dpi=100)
    plt.close(figure)
