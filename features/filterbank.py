"""Kaldi-compatible log-mel filterbanks and MFCCs: what ``torchaudio.compliance.kaldi``'s ``fbank`` and
``mfcc`` compute (the tests compare them), with its mel filters, built once per warp and kept.

Scaling. Kaldi reads audio as 16-bit integers, so its dither (``--dither=1.0``
means Gaussian noise of one least-significant bit) and its log energies are in
int16 units. Waveforms here are float in [-1, 1]; they are multiplied by
``INT16_SCALE`` (32768) before framing, so the features, and the ``dither``
value of :class:`~features.config.FeatureConfig`, mean exactly what they mean
in Kaldi. (Without the scaling every log-mel value would be shifted by
``2 * log(32768) ~= 20.8`` and a dither of 1.0 would be deafening.)

Dither. ``torchaudio``'s own dither draws from the global RNG, per frame. We
instead add the noise once to the whole waveform, from a caller-supplied
``torch.Generator``, so that training runs are reproducible. Each frame still
sees independent N(0, dither^2) noise on every sample, as in Kaldi; only
overlapping frames now share their noise on the overlap.

The other options are Kaldi's defaults: povey window, pre-emphasis 0.97,
per-frame DC removal, power spectrum, mel filters from 20 Hz to Nyquist,
``snip_edges=True`` (only whole frames: ``T = 1 + (N - window) // shift``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor
from torchaudio.compliance import kaldi

from features.audio import AudioError, ShortAudioError
from features.config import FeatureConfig

INT16_SCALE = 32768.0
# Kaldi's VTLN breakpoints (Hz; a negative high is an offset from Nyquist). Between them a warp
# factor w makes a tone at f Hz show in the filter that shows f * w Hz unwarped; outside them the
# piecewise-linear warp bends so that 20 Hz and Nyquist stay where they are.
VTLN_LOW = 100.0
VTLN_HIGH = -500.0
PREEMPHASIS = 0.97
CEPSTRAL_LIFTER = 22.0


def frame_sizes(config: FeatureConfig) -> tuple[int, int]:
    """(window, shift) in samples at ``config.sample_rate``, rounded down as Kaldi does."""
    # Same expression as torchaudio's kaldi module, so float rounding agrees with it.
    window = int(config.sample_rate * config.frame_length_ms * 0.001)
    shift = int(config.sample_rate * config.frame_shift_ms * 0.001)
    return window, shift


def num_frames(num_samples: int, config: FeatureConfig) -> int:
    """Frames produced from ``num_samples`` samples at ``config.sample_rate`` (0 if shorter than a window)."""
    window, shift = frame_sizes(config)
    return 0 if num_samples < window else 1 + (num_samples - window) // shift


def check_mel_filters(config: FeatureConfig, test_warps: Iterable[float] = ()) -> None:
    """Raise ``ValueError`` if some mel filter covers no FFT bin (too many bins for the rate and window).

    Such a filter's output is a constant log(epsilon) column: harmless-looking
    but pure noise after MVN, so it is refused up front. With VTLP both ends
    of the warp range are checked too, and so are ``test_warps`` (test-time VTLN).
    """
    window, _ = frame_sizes(config)
    test_warps = set(test_warps)
    for warp in sorted({1.0, *config.vtlp, *test_warps}):
        # The filters extract() uses: 20 Hz to Nyquist, Kaldi's VTLN breakpoints.
        banks = _mel_filters(config.num_mel_bins, _fft_size(window), float(config.sample_rate), warp)
        empty = int((banks.sum(dim=1) == 0).sum())
        if empty:
            source = "test-time VTLN" if warp in test_warps else "features.vtlp"
            warped = "" if warp == 1.0 else f" warped by {warp:g} ({source})"
            raise ValueError(
                f"num_mel_bins={config.num_mel_bins} is too many for sample_rate={config.sample_rate} with "
                f"frame_length_ms={config.frame_length_ms:g}: {empty} mel filters{warped} contain no FFT bin"
            )


def add_dither(waveform: Tensor, amount: float, generator: torch.Generator | None = None) -> Tensor:
    """``waveform (N,)`` in int16 units plus N(0, amount^2) noise drawn from ``generator``."""
    if amount == 0.0:
        return waveform
    noise = torch.randn(waveform.shape, generator=generator, dtype=waveform.dtype, device=waveform.device)
    return waveform + amount * noise


def log_mel_fbank(waveform: Tensor, config: FeatureConfig, warp: float = 1.0) -> Tensor:
    """``waveform (N,)`` in int16 units -> log-mel filterbank ``(T, num_mel_bins)``; ``warp``: VTLN factor.

    What ``kaldi.fbank`` computes with the options in the module docstring (the tests hold the two
    together), but with the window and the mel filters built once (:func:`_mel_filters`) instead of
    on every call, where they cost as much as the rest of the computation. ``warp`` is rounded to
    0.001 for that: VTLP draws a new one for every utterance. :func:`log_mel_fbank_batch` on a batch of one.
    """
    return log_mel_fbank_batch(waveform.unsqueeze(0), config, [warp]).squeeze(0)


def log_mel_fbank_batch(waveforms: Tensor, config: FeatureConfig, warps: Sequence[float]) -> Tensor:
    """``waveforms (B, N)`` in int16 units, zero-padded -> log-mel filterbanks ``(B, T, num_mel_bins)``,
    T = :func:`num_frames` of N; row b's mel filters are warped by ``warps[b]``.

    Each frame is computed from its own samples only, so row b's first ``num_frames(length_b)``
    frames are exactly the features of that utterance alone; the frames after them read padding.
    Runs wherever ``waveforms`` is (a DataLoader worker's CPU or the model's GPU).
    """
    window, shift = frame_sizes(config)
    fft_size = _fft_size(window)
    frames = waveforms.unfold(-1, window, shift)  # (B, T, window): whole frames only (snip_edges)
    frames = frames - frames.mean(dim=-1, keepdim=True)  # DC removal per frame
    previous = torch.cat([frames[..., :1], frames[..., :-1]], dim=-1)  # the first sample is its own predecessor
    frames = (frames - PREEMPHASIS * previous) * _povey_window(window, frames.dtype, frames.device)
    power = torch.fft.rfft(frames, n=fft_size).abs().pow(2)  # (B, T, fft_size // 2 + 1)
    rounded = [round(float(w), 3) for w in warps]

    def filters(warp: float) -> Tensor:
        return _mel_filters_on(config.num_mel_bins, fft_size, float(config.sample_rate), warp, frames.device, frames.dtype)

    if len(set(rounded)) == 1:  # the usual case (no VTLP): one product for the whole batch
        mel = power @ filters(rounded[0]).T
    else:  # one set of warped filters per row
        mel = power @ torch.stack([filters(w) for w in rounded]).transpose(1, 2)
    return mel.clamp_min(torch.finfo(frames.dtype).eps).log()


def mfcc(waveform: Tensor, config: FeatureConfig, warp: float = 1.0) -> Tensor:
    """``waveform (N,)`` in int16 units -> MFCC ``(T, num_ceps)`` (C0 included, liftered by 22 as in Kaldi).

    The DCT runs over ``config.num_mel_bins`` filters, so ``num_ceps=40`` over
    40+ filters gives Kaldi's "hires" MFCC, an invertible rotation of the fbank.
    """
    return mfcc_batch(waveform.unsqueeze(0), config, [warp]).squeeze(0)


def mfcc_batch(waveforms: Tensor, config: FeatureConfig, warps: Sequence[float]) -> Tensor:
    """``waveforms (B, N)`` in int16 units -> MFCC ``(B, T, num_ceps)``, as :func:`log_mel_fbank_batch`."""
    fbank = log_mel_fbank_batch(waveforms, config, warps)
    return fbank @ _liftered_dct(config.num_mel_bins, config.num_ceps).to(fbank.device, fbank.dtype)


def base_features_batch(waveforms: Tensor, config: FeatureConfig, warps: Sequence[float]) -> Tensor:
    """``waveforms (B, N)`` in int16 units -> ``(B, T, config.base_dim)``: fbank or MFCC as ``config.kind`` says."""
    if config.kind == "fbank":
        return log_mel_fbank_batch(waveforms, config, warps)
    return mfcc_batch(waveforms, config, warps)


def _fft_size(window: int) -> int:
    """The FFT length for frames of ``window`` samples: Kaldi rounds the window up to a power of two."""
    return 1 << (window - 1).bit_length()


@functools.lru_cache(maxsize=8)
def _povey_window(size: int, dtype: torch.dtype, device: torch.device = torch.device("cpu")) -> Tensor:
    """Kaldi's default window: a Hann window to the power 0.85, ``(size,)``, kept on ``device``."""
    return torch.hann_window(size, periodic=False, dtype=dtype).pow(0.85).to(device)


@functools.lru_cache(maxsize=1024)
def _mel_filters_on(
    num_bins: int, fft_size: int, sample_rate: float, warp: float, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """:func:`_mel_filters`, kept on ``device`` in ``dtype``: a batch on the GPU copies none from the host."""
    return _mel_filters(num_bins, fft_size, sample_rate, warp).to(device, dtype)


@functools.lru_cache(maxsize=1024)
def _mel_filters(num_bins: int, fft_size: int, sample_rate: float, warp: float) -> Tensor:
    """The mel filters ``(num_bins, fft_size // 2 + 1)`` over the power spectrum, from 20 Hz to Nyquist,
    warped by ``warp`` between Kaldi's VTLN breakpoints; the Nyquist bin gets no weight, as in Kaldi."""
    filters, _ = kaldi.get_mel_banks(num_bins, fft_size, sample_rate, 20.0, 0.0, VTLN_LOW, VTLN_HIGH, warp)
    return torch.nn.functional.pad(filters, (0, 1))


@functools.lru_cache(maxsize=8)
def _liftered_dct(num_bins: int, num_ceps: int) -> Tensor:
    """``(num_bins, num_ceps)``: Kaldi's MFCC as one product, the orthonormal DCT-II of the log-mel
    energies times the sine lifter with Q = 22."""
    bins = torch.arange(num_bins, dtype=torch.float64)[:, None]
    ceps = torch.arange(num_ceps, dtype=torch.float64)
    dct = math.sqrt(2.0 / num_bins) * torch.cos(math.pi / num_bins * (bins + 0.5) * ceps)
    dct[:, 0] = math.sqrt(1.0 / num_bins)
    lifter = 1.0 + (CEPSTRAL_LIFTER / 2) * torch.sin(math.pi * ceps / CEPSTRAL_LIFTER)
    return (dct * lifter).float()


def check_frame(waveform: Tensor, config: FeatureConfig) -> None:
    """Raise :class:`AudioError` unless ``waveform`` is mono ``(N,)`` and holds at least one frame."""
    window, _ = frame_sizes(config)
    if waveform.dim() != 1:
        raise AudioError(f"expected a mono waveform of shape (N,), got {tuple(waveform.shape)}")
    if waveform.shape[0] < window:
        raise ShortAudioError(
            f"waveform of {waveform.shape[0]} samples is shorter than one {config.frame_length_ms:g} ms frame "
            f"({window} samples at {config.sample_rate} Hz)"
        )


def extract(
    waveform: Tensor,
    config: FeatureConfig,
    dither: float = 0.0,
    generator: torch.Generator | None = None,
    warp: float = 1.0,
) -> Tensor:
    """Mono ``waveform (N,)`` float in [-1, 1] at ``config.sample_rate`` -> ``(T, base_dim)`` float32.

    ``dither`` is in int16 units (Kaldi's convention); pass 0 for inference.
    ``warp`` is the VTLN factor of the mel filters (1.0 = none; VTLP draws it in training).
    Raises :class:`AudioError` if the waveform is shorter than one frame.
    """
    check_frame(waveform, config)
    scaled = add_dither(waveform.float() * INT16_SCALE, dither, generator)
    return base_features_batch(scaled.unsqueeze(0), config, [warp]).squeeze(0)
