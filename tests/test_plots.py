"""asr/plots.py: the attention pictures, readable at the size TensorBoard shows them."""

import numpy as np

from asr.training.validation import alignment_title


def _diagonal(steps: int, frames: int) -> np.ndarray:
    weights = np.full((steps, frames), 0.01)
    weights[np.arange(steps), np.linspace(0, frames - 1, steps).astype(int)] = 1.0
    return weights / weights.sum(axis=1, keepdims=True)


def test_the_attention_picture_fits_a_tensorboard_card_with_its_tokens_readable():
    # Imported here, not at the top: matplotlib and librosa.display take 0.75 s that every test worker would
    # pay while collecting.
    from asr.plots import FONT_SIZE, MAX_TOKEN_LABELS, alignment_figure

    tokens = list("SEVEN FIVE TWO NINE THREE ONE EIGHT FOUR") + ["<eos>"]
    title = alignment_title("9000-1-0003", "after epoch 3")
    figure = alignment_figure(np.zeros((300, 40)), _diagonal(len(tokens), 75), 0.01, title, tokens)
    width, height = figure.get_size_inches() * figure.dpi
    assert width <= 640 and height <= 360  # scaled into a card about 200 pixels high, its text stays readable
    bottom = figure.axes[1]
    labels = [label.get_text() for label in bottom.get_yticklabels()]
    # Long transcripts name every k-th token, so the labels never overlap; a space is drawn, not blank.
    assert 7 <= len(labels) <= MAX_TOKEN_LABELS and labels[0] == "S"
    assert all(label.get_fontsize() >= FONT_SIZE - 1 >= 10 for label in bottom.get_yticklabels())
    assert figure.axes[0].get_title() == "9000-1-0003: teacher-forced attention, after epoch 3"
    short = alignment_figure(np.zeros((100, 40)), _diagonal(6, 25), 0.01, "", ["O", "N", " ", "T", "O", "<eos>"])
    assert [label.get_text() for label in short.axes[1].get_yticklabels()] == ["O", "N", "\u2423", "T", "O", "<eos>"]
