"""Training-time waveform augmentation: rooms, noise, microphones and band limits.

Synthetic speech (the eSpeak NG demo corpus) comes out of the synthesiser with
no room, no microphone, no noise and energy up to the Nyquist frequency. Real
recordings have all four. These transforms give a training utterance each of
them, so that a model trained on synthetic speech has heard the channel of a
recording before it meets one:

    waveform -> reverberate (simulated room) -> add noise -> microphone -> band limit

:func:`augment_waveform` runs that chain as :class:`~features.config.AugmentConfig`
says, drawing every random choice (whether a step applies, and its parameters)
from the caller's ``torch.Generator``; :class:`features.pipeline.FeaturePipeline`
calls it in training only, with the per-item generator of
:class:`asr.data.dataset.SpeechDataset`, so an item's augmentation is a
function of (seed, epoch, index) like its dither and SpecAugment. A step whose
probability is 0 draws nothing, so recipes that do not use a step get exactly
the random streams they got before it existed.

Every transform keeps the length ``N`` of its ``(N,)`` input and does not move
it in time (see each function), so frame counts stay those of the clean utterance.

Libraries: room impulse responses come from pyroomacoustics (a maintained
image-source simulator); resampling is torchaudio's; the microphone's filters
and the rooms' convolution are scipy's (its ``sosfilt`` and ``fftconvolve`` were
10x faster here than torchaudio's ``lfilter`` biquads and ``fftconvolve`` on one
CPU core); the band limit's low-pass is a product on the FFT (see :func:`lowpass`).
Bundles such as ``audiomentations`` were not used: they draw from Python's and
numpy's global random state, which cannot follow the per-item generator, and
would add five packages for what is a few calls to the libraries above.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from features.audio import resample
from features.config import AugmentConfig, BandLimitConfig, MicrophoneConfig, NoiseConfig, ReverbConfig


def augment_waveform(
    waveform: Tensor, sample_rate: int, config: AugmentConfig, generator: torch.Generator | None = None
) -> Tensor:
    """``waveform (N,)`` float -> ``(N,)``: the enabled steps of ``config``, each applied with its probability."""
    if _happens(config.reverb.probability, generator):
        rooms = room_impulse_responses(sample_rate, config.reverb)
        waveform = reverberate(waveform, rooms[_uniform_int(len(rooms), generator)])
    if _happens(config.noise.probability, generator):
        waveform = add_noise(
            waveform, _uniform(config.noise.snr_db, generator), _uniform(config.noise.colour, generator), generator
        )
    if _happens(config.microphone.probability, generator):
        waveform = microphone(waveform, sample_rate, config.microphone, generator)
    if _happens(config.band_limit.probability, generator):
        waveform = band_limit(waveform, sample_rate, config.band_limit, generator)
    return waveform


def _happens(probability: float, generator: torch.Generator | None) -> bool:
    # Nothing is drawn for a disabled step, so enabling none leaves the generator's stream untouched.
    return probability > 0 and float(torch.rand((), generator=generator)) < probability


def _uniform(bounds: list[float], generator: torch.Generator | None) -> float:
    low, high = bounds
    return low + (high - low) * float(torch.rand((), generator=generator))


def _uniform_int(count: int, generator: torch.Generator | None) -> int:
    return int(torch.randint(count, (1,), generator=generator))


# --- noise ---------------------------------------------------------------------------------------------


def coloured_noise(num_samples: int, colour: float, generator: torch.Generator | None = None) -> Tensor:
    """``(num_samples,)`` Gaussian noise of unit mean power whose power spectrum falls as ``1 / f^colour``.

    0 is white, 1 pink (-3 dB per octave), 2 brown (-6 dB per octave). White
    noise is shaped in the frequency domain, over a length the FFT is fast for,
    then cut to ``num_samples``; the DC bin is zeroed.
    """
    if colour == 0.0:
        noise = torch.randn(num_samples, generator=generator)
    else:
        import scipy.fft

        length = scipy.fft.next_fast_len(num_samples, real=True)
        spectrum = torch.fft.rfft(torch.randn(length, generator=generator))
        gain = torch.arange(spectrum.numel(), dtype=torch.float32).clamp(min=1.0) ** (-colour / 2)
        gain[0] = 0.0
        noise = torch.fft.irfft(spectrum * gain, n=length)[:num_samples]
    return noise / noise.pow(2).mean().sqrt().clamp(min=1e-12)


def add_noise(waveform: Tensor, snr_db: float, colour: float = 0.0, generator: torch.Generator | None = None) -> Tensor:
    """``waveform (N,)`` plus :func:`coloured_noise` at ``snr_db``: ``10 log10(mean(x^2) / mean(noise^2))``.

    The signal power is the mean over the whole waveform, pauses included (the
    utterance has no speech-activity marks to do better). Silent input is
    returned unchanged.
    """
    power = waveform.pow(2).mean()
    if power == 0:
        return waveform
    noise = coloured_noise(waveform.numel(), colour, generator).to(waveform.dtype)
    return waveform + noise * (power / 10 ** (snr_db / 10)).sqrt()


# --- microphone and band limits ------------------------------------------------------------------------


def microphone(
    waveform: Tensor, sample_rate: int, config: MicrophoneConfig, generator: torch.Generator | None = None
) -> Tensor:
    """``waveform (N,)`` through a random microphone response: a 2nd-order Butterworth high-pass at a
    cutoff uniform in ``config.highpass_hz``, then ``config.bands`` peaking filters (centre log-uniform
    from 150 Hz to 0.8 x Nyquist, gain uniform in ``config.gain_db``, Q uniform in [0.7, 2]). Causal IIR
    filters, as a real capsule is: a few samples of group delay, no change of length."""
    import scipy.signal

    sections = [scipy.signal.butter(2, _uniform(config.highpass_hz, generator), "high", fs=sample_rate, output="sos")]
    low, high = math.log(150.0), math.log(0.8 * sample_rate / 2)
    for _ in range(config.bands):
        centre = math.exp(_uniform([low, high], generator))
        gain_db = _uniform(config.gain_db, generator)
        sections.append(peaking_filter(centre, gain_db, _uniform([0.7, 2.0], generator), sample_rate))
    filtered = scipy.signal.sosfilt(np.concatenate(sections), waveform.double().numpy())
    return torch.from_numpy(filtered).to(waveform.dtype)


def peaking_filter(centre_hz: float, gain_db: float, q: float, sample_rate: int) -> np.ndarray:
    """One second-order section ``(1, 6)`` (scipy's ``sos`` layout) of a peaking equaliser: gain
    ``gain_db`` at ``centre_hz``, 0 dB far from it, bandwidth set by ``q``. The coefficients are those
    of R. Bristow-Johnson's "Audio EQ Cookbook" (also what ``torchaudio.functional.equalizer_biquad`` uses)."""
    amplitude = 10 ** (gain_db / 40)
    omega = 2 * math.pi * centre_hz / sample_rate
    alpha = math.sin(omega) / (2 * q)
    b = [1 + alpha * amplitude, -2 * math.cos(omega), 1 - alpha * amplitude]
    a = [1 + alpha / amplitude, -2 * math.cos(omega), 1 - alpha / amplitude]
    return np.array([[*(x / a[0] for x in b), 1.0, a[1] / a[0], a[2] / a[0]]])


def band_limit(
    waveform: Tensor, sample_rate: int, config: BandLimitConfig, generator: torch.Generator | None = None
) -> Tensor:
    """``waveform (N,)`` with the energy above a drawn cutoff removed: through ``config.narrow_rate`` (share
    ``config.narrow_share``) or a low-pass at a cutoff uniform in ``config.cutoff_hz``. A cutoff at or above
    the Nyquist frequency leaves the waveform as it is."""
    if float(torch.rand((), generator=generator)) < config.narrow_share:
        return narrowband(waveform, sample_rate, config.narrow_rate)
    return lowpass(waveform, sample_rate, _uniform(config.cutoff_hz, generator))


def narrowband(waveform: Tensor, sample_rate: int, narrow_rate: int) -> Tensor:
    """``waveform (N,)`` resampled to ``narrow_rate`` and back: what a recording stored at that rate and
    played at ``sample_rate`` contains. Band-limited (sinc) resampling is zero-phase; the result is cut or
    zero-padded to ``N`` samples (the round trip can gain or lose one)."""
    if narrow_rate >= sample_rate:
        return waveform
    out = resample(resample(waveform, sample_rate, narrow_rate), narrow_rate, sample_rate)
    return _fit(out, waveform.numel())


def lowpass(waveform: Tensor, sample_rate: int, cutoff_hz: float, order: int = 8) -> Tensor:
    """``waveform (N,)`` through a Butterworth low-pass of ``order`` at ``cutoff_hz``, run forward and
    backward: zero phase, so nothing moves in time; the attenuation in dB is twice the filter's own.

    Running the digital Butterworth filter forward and backward (scipy's ``butter`` + ``sosfiltfilt``)
    multiplies the spectrum by the filter's squared magnitude, ``1 / (1 + r^(2 order))`` with
    ``r = tan(pi f / rate) / tan(pi cutoff / rate)`` (the bilinear transform's frequency warping).
    That product is taken here on the FFT of the waveform, about twice as fast as ``sosfiltfilt``;
    the two differ only near the ends, where ``sosfiltfilt`` pads. The FFT is zero-padded by
    20 ms, so the filter's ringing does not wrap from one end to the other.
    """
    import scipy.fft  # scipy comes with librosa; imported here to keep inference's imports light

    if cutoff_hz >= sample_rate / 2:
        return waveform
    length = waveform.numel()
    size = scipy.fft.next_fast_len(length + sample_rate // 50, real=True)
    half_angle = np.arange(size // 2 + 1, dtype=np.float32) * np.float32(math.pi / size)  # pi f / rate
    ratio = np.abs(np.tan(half_angle)) / np.float32(math.tan(math.pi * cutoff_hz / sample_rate))
    gain = 1.0 / (1.0 + np.minimum(ratio, 100.0) ** (2 * order))  # 100^16 still fits a float32
    filtered = scipy.fft.irfft(scipy.fft.rfft(waveform.numpy(), n=size) * gain, n=size)[:length]
    return torch.from_numpy(np.ascontiguousarray(filtered)).to(waveform.dtype)


def _fit(waveform: Tensor, length: int) -> Tensor:
    if waveform.numel() >= length:
        return waveform[:length]
    return torch.nn.functional.pad(waveform, (0, length - waveform.numel()))


# --- rooms ---------------------------------------------------------------------------------------------


def reverberate(waveform: Tensor, rir: Tensor) -> Tensor:
    """``waveform (N,)`` convolved with the room impulse response ``rir (K,)``, aligned on its direct path.

    The direct path is the largest sample of ``rir``, at index ``d``; the result is
    ``(waveform * rir)[d : d + N]``: ``N`` samples in which the direct sound stays
    where it was (no propagation delay) and the reverberation follows it. The
    tail that would ring past the end is cut. The response is scaled so that the
    direct path has gain 1, so the level rises by the reflected energy.
    """
    import scipy.signal

    direct = int(rir.abs().argmax())
    full = scipy.signal.fftconvolve(waveform.numpy(), (rir / rir[direct]).numpy())
    return torch.from_numpy(full[direct : direct + waveform.numel()].copy()).to(waveform.dtype)


def room_impulse_responses(sample_rate: int, config: ReverbConfig) -> tuple[Tensor, ...]:
    """The bank of ``config.rooms`` simulated room impulse responses ``(K_i,)`` at ``sample_rate``.

    Simulated once per process and kept (call it before DataLoader workers are
    forked, as :class:`asr.data.dataset.SpeechDataset` does, and they inherit it).
    The bank depends only on its arguments: room ``i`` is drawn from a numpy
    generator seeded by ``i``, so the same options give the same rooms everywhere.
    """
    return _simulate_rooms(sample_rate, config.rooms, tuple(config.rt60), tuple(config.distance_m))


@functools.lru_cache(maxsize=4)
def _simulate_rooms(
    sample_rate: int, count: int, rt60: tuple[float, float], distance_m: tuple[float, float]
) -> tuple[Tensor, ...]:
    return tuple(torch.from_numpy(simulate_room(sample_rate, rt60, distance_m, seed=i)) for i in range(count))


# Image-source reflections are simulated up to this order at most: the cost grows with its cube, and
# beyond it the late tail of the most reverberant rooms is cut short (docs/results.md gives the RT60s reached).
MAX_REFLECTION_ORDER = 20


def simulate_room(
    sample_rate: int, rt60: tuple[float, float], distance_m: tuple[float, float], seed: int
) -> np.ndarray:
    """One room impulse response ``(K,)`` float32 from pyroomacoustics' image-source method.

    A shoebox room of 3-8 m x 3-7 m x 2.4-3.5 m whose walls absorb what Sabine's
    formula needs for an RT60 uniform in ``rt60``; a talker at 1.2-1.9 m height
    and a microphone at a distance uniform in ``distance_m`` from it, both at least
    0.3 m from every wall. Everything is drawn from ``numpy.random.default_rng(seed)``.
    """
    import pyroomacoustics  # only training with reverb needs it

    rng = np.random.default_rng(seed)
    margin = 0.3
    while True:  # redraw the (rare) rooms where the wanted RT60 or distance cannot be met
        size = rng.uniform([3.0, 3.0, 2.4], [8.0, 7.0, 3.5])
        target_rt60 = rng.uniform(*rt60)
        try:
            absorption, order = pyroomacoustics.inverse_sabine(target_rt60, size)
        except ValueError:  # a room too large for so short an RT60: walls would absorb more than everything
            continue
        talker = rng.uniform([margin, margin, 1.2], [size[0] - margin, size[1] - margin, min(1.9, size[2] - margin)])
        direction = rng.normal(size=3)
        mic = talker + rng.uniform(*distance_m) * direction / np.linalg.norm(direction)
        if np.all(mic >= margin) and np.all(mic <= size - margin):
            break
    room = pyroomacoustics.ShoeBox(
        size,
        fs=sample_rate,
        materials=pyroomacoustics.Material(absorption),
        max_order=min(order, MAX_REFLECTION_ORDER),
    )
    room.add_source(talker)
    room.add_microphone(mic)
    room.compute_rir()
    return np.asarray(room.rir[0][0], dtype=np.float32)
