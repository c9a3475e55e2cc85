"""Kaldi-compatible log-mel filterbanks and MFCCs, built on ``torchaudio.compliance.kaldi``.

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

from collections.abc import Iterable

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
    fft_size = 1 << (window - 1).bit_length()  # Kaldi rounds the window up to a power of two
    test_warps = set(test_warps)
    for warp in sorted({1.0, *config.vtlp, *test_warps}):
        # low_freq=20, high_freq=Nyquist and the VTLN breakpoints: the defaults extract() uses.
        banks, _ = kaldi.get_mel_banks(
            config.num_mel_bins, fft_size, float(config.sample_rate), 20.0, 0.0, VTLN_LOW, VTLN_HIGH, warp
        )
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
    """``waveform (N,)`` in int16 units -> log-mel filterbank ``(T, num_mel_bins)``; ``warp``: VTLN factor."""
    return kaldi.fbank(waveform.unsqueeze(0), num_mel_bins=config.num_mel_bins, **_kaldi_options(config, warp))


def mfcc(waveform: Tensor, config: FeatureConfig, warp: float = 1.0) -> Tensor:
    """``waveform (N,)`` in int16 units -> MFCC ``(T, num_ceps)`` (C0 included, liftered by 22 as in Kaldi).

    The DCT runs over ``config.num_mel_bins`` filters, so ``num_ceps=40`` over
    40+ filters gives Kaldi's "hires" MFCC, an invertible rotation of the fbank.
    """
    return kaldi.mfcc(
        waveform.unsqueeze(0),
        num_ceps=config.num_ceps,
        num_mel_bins=config.num_mel_bins,
        **_kaldi_options(config, warp),
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
    window, _ = frame_sizes(config)
    if waveform.dim() != 1:
        raise AudioError(f"expected a mono waveform of shape (N,), got {tuple(waveform.shape)}")
    if waveform.shape[0] < window:
        raise ShortAudioError(
            f"waveform of {waveform.shape[0]} samples is shorter than one {config.frame_length_ms:g} ms frame "
            f"({window} samples at {config.sample_rate} Hz)"
        )
    scaled = add_dither(waveform.float() * INT16_SCALE, dither, generator)
    if config.kind == "fbank":
        return log_mel_fbank(scaled, config, warp)
    return mfcc(scaled, config, warp)


def _kaldi_options(config: FeatureConfig, warp: float) -> dict:
    # dither=0 here: the dither, if any, was already added with a reproducible generator.
    return dict(
        sample_frequency=float(config.sample_rate),
        frame_length=config.frame_length_ms,
        frame_shift=config.frame_shift_ms,
        dither=0.0,
        snip_edges=True,
        vtln_low=VTLN_LOW,
        vtln_high=VTLN_HIGH,
        vtln_warp=warp,
    )
