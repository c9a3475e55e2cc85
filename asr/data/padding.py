"""How far a batch's frames are padded (``data.pad_frames_to``): the rule alone, free of torch, so that the
config can check its value and a benchmark can count shapes from durations."""

from __future__ import annotations

PadFramesTo = int | list[int]  # data.pad_frames_to: a multiple, or the lengths of the buckets


def padded_frames(frames: int, pad_to: PadFramesTo = 1) -> int:
    """The length a batch whose longest utterance has ``frames`` frames is padded to.

    ``pad_to`` an int N: the next multiple of N (1: ``frames`` itself). A list of increasing
    lengths (buckets): the first at least ``frames``; past the last, a multiple of the last, so that
    a longer utterance still meets one of a few shapes.
    """
    if isinstance(pad_to, int):
        return -(-frames // pad_to) * pad_to
    for bucket in pad_to:
        if bucket >= frames:
            return bucket
    return -(-frames // pad_to[-1]) * pad_to[-1]


def check_pad_frames_to(pad_to: PadFramesTo) -> None:
    """ValueError unless ``pad_to`` is a positive int or a non-empty list of increasing positive ints."""
    if isinstance(pad_to, int) and not isinstance(pad_to, bool):
        if pad_to < 1:
            raise ValueError(f"pad_frames_to must be a positive multiple (1 = no padding), got {pad_to}")
        return
    if (not isinstance(pad_to, list) or not pad_to or any(isinstance(b, bool) or not isinstance(b, int) for b in pad_to)
            or pad_to[0] < 1 or any(b >= c for b, c in zip(pad_to, pad_to[1:]))):
        raise ValueError(f"pad_frames_to must be a positive int or a list of increasing positive frame counts, got {pad_to!r}")
