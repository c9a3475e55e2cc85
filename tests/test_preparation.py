"""Preparation at scale: the duration manifest, BPE and global MVN statistics computed in parallel
(the same results as in one process, bad files skipped and counted the same) and cached by the
corpus' content (a second start computes nothing; a changed file or option computes again; a
damaged cache entry, or one that still loads but is wrong, is ignored with one warning and never
runs code)."""

import dataclasses
import io
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

import asr.data.dataset as dataset_module
from asr.config import ConfigError, from_dict
from asr.data.config import DataConfig
import asr.data.librispeech as librispeech_module
from asr.data import report as reasons
from asr.data.cache import read_entry, write_entry
from asr.data.dataset import (
    cached_global_stats, compute_global_stats, global_stats_key, global_stats_path, utterance_features,
)
from asr.data.librispeech import manifest_key, manifest_path, read_subset
from asr.data.parallel import map_chunks
from asr.data.report import DataError, SkipReport
from asr.data.tokenizer import BPETokenizer, bpe_cache_key, bpe_cache_path, cached_bpe
from asr.data.utterance import InMemoryAudio, Utterance
from asr.experiment import experiment_config_from_dict
from asr.training.data import build_training_data
from features.config import FeatureConfig, SpecAugmentConfig
from features.mvn import GlobalStats
from features.pipeline import FeaturePipeline

FOLDER = Path("9000") / "1"
TRANS = FOLDER / "9000-1.trans.txt"
NAN_ID, CUT_ID = "9000-1-9901", "9000-1-9902"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Nothing goes to the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def writable_copy(source: Path, target: Path) -> Path:
    copy = Path(shutil.copytree(source, target))
    for path in [copy, *copy.rglob("*")]:  # the shared originals are read-only
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


@pytest.fixture
def dev_copy(fsdd_dev, tmp_path) -> Path:
    """A writable copy of the connected-digit dev set: 200 utterances of 4 speakers."""
    return writable_copy(fsdd_dev, tmp_path / "fsdd-dev")


def damage(subset: Path) -> dict[str, int]:
    """Every kind of problem the reader and the statistics meet, among the good files; the counts expected."""
    folder = subset / FOLDER
    (folder / "9000-1-0003.flac").write_bytes(b"")                     # empty audio
    (folder / "9000-1-0004.flac").write_bytes(os.urandom(3000))        # a header that does not read
    (folder / "9000-1-0005.flac").unlink()                             # a transcript line without audio
    lines = (subset / TRANS).read_text().splitlines()
    lines = [line for line in lines if not line.startswith("9000-1-0006 ")]  # audio without a transcript
    lines.append("9000-1-0007 A SECOND LINE")                          # a repeated id
    # The header reads but the samples do not (a FLAC cut in the middle), and a float WAV with NaN samples:
    # found only by the statistics, which decode the audio.
    good = folder / "9000-1-0000.flac"
    (folder / f"{CUT_ID}.flac").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    audio, rate = soundfile.read(str(good), dtype="float32")
    audio[100:200] = np.nan
    soundfile.write(str(folder / f"{NAN_ID}.wav"), audio, rate, subtype="FLOAT")
    lines += [f"{CUT_ID} ONE", f"{NAN_ID} ONE"]
    (subset / TRANS).write_text("\n".join(lines) + "\n")
    return {
        reasons.EMPTY_AUDIO: 1, reasons.UNREADABLE_AUDIO: 1, reasons.MISSING_AUDIO: 1,
        reasons.MISSING_TRANSCRIPT: 1, reasons.DUPLICATE_ID: 1,
    }


class Counting:
    """Wraps ``owner.name`` and counts its calls."""

    def __init__(self, monkeypatch, owner, name: str):
        self.calls = 0
        self.real = getattr(owner, name)
        monkeypatch.setattr(owner, name, self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


# ---------------------------------------------------------------- processes


def _square_all(chunk: list[int]) -> list[int]:
    return [x * x for x in chunk]


@pytest.mark.slow  # worker processes
def test_map_chunks_gives_results_in_order_whatever_the_number_of_processes():
    items = list(range(103))
    expected = [[x * x for x in items[i : i + 10]] for i in range(0, 103, 10)]
    for jobs in (1, 2, 0):
        assert list(map_chunks(_square_all, items, jobs, 10, "test")) == expected
    assert list(map_chunks(_square_all, [], 2, 10, "test")) == []


@pytest.mark.slow  # worker processes
def test_map_chunks_in_processes_leaves_the_global_random_state_alone():
    # Training seeds the global RNG before it prepares its data; preparation that draws from it
    # (the worker processes' seeds) would make a run that computes its MVN statistics train
    # differently from the same run that finds them cached.
    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert list(map_chunks(_square_all, list(range(30)), 2, 10, "test")) == [[i * i for i in range(j, j + 10)] for j in (0, 10, 20)]
    assert torch.equal(torch.get_rng_state(), before)


# ---------------------------------------------------------------- the duration manifest


@pytest.mark.slow  # worker processes
def test_headers_read_in_processes_give_the_serial_reader_s_utterances_and_skips(dev_copy, tmp_path, monkeypatch):
    expected_counts = damage(dev_copy)
    monkeypatch.setattr(librispeech_module, "_HEADERS_PER_CHUNK", 7)  # many chunks from 200 files
    serial_report, parallel_report = SkipReport(), SkipReport()
    serial = read_subset(dev_copy, serial_report, tmp_path / "serial", jobs=1)
    parallel = read_subset(dev_copy, parallel_report, tmp_path / "parallel", jobs=2)
    assert parallel == serial  # ids, files, transcripts and durations to the last bit, in the same order
    assert parallel_report.skips == serial_report.skips  # the same messages in the same order
    assert serial_report.counts() == expected_counts
    assert len(serial) == 200 - 4 + 2  # four of the originals lost, the cut FLAC and the NaN WAV added
    for utt in serial[::17]:
        info = soundfile.info(str(utt.audio))
        assert utt.duration == info.frames / info.samplerate
    assert (
        manifest_path(dev_copy, tmp_path / "serial").read_bytes()
        == manifest_path(dev_copy, tmp_path / "parallel").read_bytes()
    )


def test_a_second_read_opens_no_header_and_a_new_file_is_the_only_one_read(dev_copy, tmp_path, monkeypatch):
    first = read_subset(dev_copy, cache_dir=tmp_path / "cache")
    info = Counting(monkeypatch, soundfile, "info")
    assert read_subset(dev_copy, cache_dir=tmp_path / "cache") == first
    assert info.calls == 0
    shutil.copyfile(dev_copy / FOLDER / "9000-1-0000.flac", dev_copy / FOLDER / "9000-1-9999.flac")
    with open(dev_copy / TRANS, "a") as f:
        f.write("9000-1-9999 ONE FIVE EIGHT\n")
    again = {u.id: u for u in read_subset(dev_copy, cache_dir=tmp_path / "cache")}
    assert info.calls == 1
    assert [again[u.id] for u in first] == first
    assert again["9000-1-9999"].duration == again["9000-1-0000"].duration


@pytest.mark.parametrize("content", [b"\x00\xff garbage", b"# lnasr duration manifest v0\n9000/1/x.flac\t1\t2\t3.0\n",
                                     None], ids=["garbage", "other-version", "bad-duration"])
def test_a_damaged_manifest_is_ignored_with_a_warning_and_rebuilt(dev_copy, tmp_path, monkeypatch, caplog, content):
    cache = tmp_path / "cache"
    first = read_subset(dev_copy, cache_dir=cache)
    path = manifest_path(dev_copy, cache)
    if content is None:  # a whole entry with its checksum, but for one duration that makes no sense
        lines = read_entry(path, "manifests", manifest_key(dev_copy)).content.decode().splitlines()
        key, size, mtime, _ = lines[1].split("\t")
        lines[1] = "\t".join([key, size, mtime, "nan"])
        write_entry(path, "manifests", manifest_key(dev_copy), ("\n".join(lines) + "\n").encode(), "manifest")
    else:
        path.write_bytes(content)
    info = Counting(monkeypatch, soundfile, "info")
    with caplog.at_level(logging.WARNING):
        assert read_subset(dev_copy, cache_dir=cache) == first
    assert "ignoring cached duration manifest" in caplog.text and str(path) in caplog.text
    assert info.calls == 200
    assert read_subset(dev_copy, cache_dir=cache) == first  # rebuilt: nothing read this time
    assert info.calls == 200


# ---------------------------------------------------------------- BPE


@pytest.fixture
def transcripts(dev_copy, librivox_mini, tmp_path) -> list[str]:
    texts = [u.text for u in read_subset(librivox_mini, cache_dir=tmp_path / "cache")]
    return texts + [u.text for u in read_subset(dev_copy, cache_dir=tmp_path / "cache")]


def pieces(tokenizer: BPETokenizer) -> list[tuple[str, float]]:
    sp = tokenizer._sp
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]


def test_bpe_pieces_do_not_depend_on_the_number_of_threads(transcripts):
    one, two = BPETokenizer.train(transcripts, 120, threads=1), BPETokenizer.train(transcripts, 120, threads=2)
    assert pieces(one) == pieces(two) and len(pieces(one)) > 40
    assert [one.encode(t) for t in transcripts] == [two.encode(t) for t in transcripts]


def test_a_bpe_model_is_trained_once_per_transcripts_and_vocabulary(transcripts, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    train = Counting(monkeypatch, BPETokenizer, "train")
    first = cached_bpe(transcripts, 120, cache)
    assert train.calls == 1
    again = cached_bpe(transcripts, 120, cache)
    assert train.calls == 1 and again.model == first.model
    assert pieces(first) == pieces(BPETokenizer.train(transcripts, 120))  # the cached model is the trained one
    assert train.calls == 2
    cached_bpe(transcripts, 100, cache)  # another vocabulary size
    assert train.calls == 3
    changed = transcripts[:-1] + [transcripts[-1] + " ONE"]
    cached_bpe(changed, 120, cache)  # one transcript changed
    assert train.calls == 4
    assert len({bpe_cache_path(t, v, cache) for t, v in ((transcripts, 120), (transcripts, 100), (changed, 120))}) == 3


@pytest.mark.parametrize("content", [b"", b"\x08\x96\x01 not a model", "half"])
def test_a_damaged_bpe_model_is_ignored_with_a_warning_and_trained_again(transcripts, tmp_path, caplog, content):
    cache = tmp_path / "cache"
    first = cached_bpe(transcripts, 120, cache)
    path = bpe_cache_path(transcripts, 120, cache)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2] if content == "half" else content)
    with caplog.at_level(logging.WARNING):
        again = cached_bpe(transcripts, 120, cache)
    assert "ignoring cached BPE model" in caplog.text and str(path) in caplog.text
    assert pieces(again) == pieces(first)
    assert read_entry(path, "bpe", bpe_cache_key(transcripts, 120)).content == again.model  # written again, whole


def test_a_cache_that_cannot_be_written_still_gives_the_tokenizer(transcripts, tmp_path, monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied (simulated)")

    monkeypatch.setattr("asr.data.cache.tempfile.mkstemp", refuse)
    tokenizer = cached_bpe(transcripts, 120, tmp_path / "cache")
    assert pieces(tokenizer) == pieces(BPETokenizer.train(transcripts, 120))
    assert "could not write BPE model" in caplog.text
    assert not bpe_cache_path(transcripts, 120, tmp_path / "cache").exists()


# ---------------------------------------------------------------- global MVN statistics


def reference_stats(utterances, config: FeatureConfig) -> tuple[GlobalStats, int]:
    """Statistics summed utterance by utterance in this process, as before chunks; and the number skipped."""
    pipeline, stats, skipped = FeaturePipeline(config), GlobalStats(config.feature_dim), 0
    for utt in utterances:
        try:
            stats.update(utterance_features(utt, pipeline, raw=True))
        except Exception:  # the bad files; which ones is checked against the report elsewhere
            skipped += 1
    return stats, skipped


@pytest.mark.slow  # worker processes
def test_statistics_from_processes_equal_those_of_one_process(dev_copy, tmp_path, monkeypatch):
    damage(dev_copy)
    # speaker 9000's 46 good utterances, then the cut FLAC and the NaN WAV
    utterances = [u for u in read_subset(dev_copy, cache_dir=tmp_path / "cache") if u.speaker == "9000"]
    monkeypatch.setattr(dataset_module, "_UTTERANCES_PER_CHUNK", 3)
    config = FeatureConfig(mvn="global", num_mel_bins=40)
    serial_report, parallel_report = SkipReport(), SkipReport()
    serial = compute_global_stats(utterances, FeaturePipeline(config), jobs=1, report=serial_report)
    parallel = compute_global_stats(utterances, FeaturePipeline(config), jobs=2, report=parallel_report)
    # The same chunks added in the same order: the same numbers to the last bit.
    assert parallel.count == serial.count
    assert torch.equal(parallel.sum, serial.sum) and torch.equal(parallel.sum_squares, serial.sum_squares)
    assert parallel_report.skips == serial_report.skips
    assert serial_report.counts() == {reasons.UNDECODABLE_AUDIO: 1, reasons.NONFINITE_AUDIO: 1}
    # Against the sum utterance by utterance: equal up to float64 rounding (the order of the additions differs).
    reference, skipped = reference_stats(utterances, config)
    assert skipped == 2 and reference.count == serial.count
    torch.testing.assert_close(serial.sum, reference.sum, rtol=1e-12, atol=0)
    torch.testing.assert_close(serial.sum_squares, reference.sum_squares, rtol=1e-12, atol=0)
    with pytest.raises(DataError, match=CUT_ID):
        compute_global_stats(utterances, FeaturePipeline(config), jobs=2, report=SkipReport(strict=True))


@pytest.fixture
def bad_utterances(dev_copy, tmp_path):
    """Twelve utterances, the last two of them a cut FLAC and a NaN WAV."""
    damage(dev_copy)
    return [u for u in read_subset(dev_copy, cache_dir=tmp_path / "cache") if u.speaker == "9000"][-12:]


def test_statistics_are_computed_once_and_their_skips_reported_every_time(bad_utterances, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    compute = Counting(monkeypatch, dataset_module, "compute_global_stats")
    config = FeatureConfig(mvn="global", num_mel_bins=23)
    results = []
    for _ in range(2):
        pipeline, report = FeaturePipeline(config), SkipReport()
        stats = cached_global_stats(bad_utterances, pipeline, 1, report, cache)
        assert pipeline.stats is stats
        results.append((stats, report))
    assert compute.calls == 1
    (first, first_report), (second, second_report) = results
    assert second.count == first.count and torch.equal(second.sum, first.sum)
    assert torch.equal(second.sum_squares, first.sum_squares)
    assert second_report.skips == first_report.skips and len(first_report) == 2
    with pytest.raises(DataError, match=CUT_ID):  # strict mode stops at a cached skip too
        cached_global_stats(bad_utterances, FeaturePipeline(config), 1, SkipReport(strict=True), cache)


def test_statistics_are_computed_again_when_a_file_or_a_feature_option_changes(bad_utterances, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    compute = Counting(monkeypatch, dataset_module, "compute_global_stats")
    config = FeatureConfig(mvn="global", num_mel_bins=23)

    def run(utterances=bad_utterances, features=config) -> int:
        cached_global_stats(utterances, FeaturePipeline(features), 1, SkipReport(), cache)
        return compute.calls

    assert run() == 1
    # Options that leave the raw features alone: the same statistics.
    assert run(features=dataclasses.replace(config, dither=1.0, spec_augment=SpecAugmentConfig(enabled=True))) == 1
    assert run(features=dataclasses.replace(config, mvn="utterance", speed_perturb=[0.9, 1.0, 1.1])) == 1
    # Options that change them, a file that changed, another list of utterances: computed again.
    assert run(features=dataclasses.replace(config, num_mel_bins=24)) == 2
    assert run(features=dataclasses.replace(config, frame_shift_ms=12.5)) == 3
    audio = bad_utterances[0].audio
    stat = audio.stat()
    os.utime(audio, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert run() == 4
    assert run(utterances=bad_utterances[1:]) == 5
    assert run() == 5


def test_statistics_of_audio_in_memory_are_keyed_by_its_samples(tmp_path, monkeypatch):
    # Connected digits are built in memory from a seed on every run: the same samples, the same key.
    def digits(scale: float) -> list[Utterance]:
        waves = [torch.sin(torch.arange(8000 + 800 * i) * 0.05 * (i + 1)).unsqueeze(0) * scale for i in range(4)]
        return [Utterance(f"u{i}", InMemoryAudio(w, 16000), "ONE", w.shape[1] / 16000, "s") for i, w in enumerate(waves)]

    compute = Counting(monkeypatch, dataset_module, "compute_global_stats")
    config = FeatureConfig(mvn="global", num_mel_bins=23)
    for scale in (0.5, 0.5, 0.25):
        cached_global_stats(digits(scale), FeaturePipeline(config), 1, SkipReport(), tmp_path / "cache")
    assert compute.calls == 2


@dataclasses.dataclass(frozen=True)
class _Span:
    """A span of a file, shaped like the Kaldi/lhotse readers' segments (a ``path`` and where to cut)."""

    path: Path
    start: float
    end: float | None = None


def test_the_statistics_key_tells_spans_of_one_file_apart(librivox_mini):
    audio = next(librivox_mini.rglob("*.flac"))

    def key(*spans) -> Path:
        utterances = [Utterance(f"u{i}", span, "ONE", 1.0, "s") for i, span in enumerate(spans)]
        return global_stats_path(utterances, FeatureConfig(mvn="global"), "cache")

    assert key(_Span(audio, 0.0, 1.0)) == key(_Span(audio, 0.0, 1.0))
    assert len({key(_Span(audio, 0.0, 1.0)), key(_Span(audio, 0.0, 1.5)), key(_Span(audio, 0.5, 1.0)), key(audio)}) == 4


class _Payload:
    """Unpickling this calls os.system: it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("damaged", ["garbage", "truncated", "other-dimension", "code"])
def test_a_damaged_statistics_entry_is_ignored_with_a_warning_and_never_runs_code(
    bad_utterances, tmp_path, monkeypatch, caplog, damaged
):
    cache = tmp_path / "cache"
    config = FeatureConfig(mvn="global", num_mel_bins=23)
    first = cached_global_stats(bad_utterances, FeaturePipeline(config), 1, SkipReport(), cache)
    path = global_stats_path(bad_utterances, config, cache)
    key = global_stats_key(bad_utterances, config)
    marker = tmp_path / "marker"

    def checksummed(entry) -> None:  # a whole entry with its checksum and key: only its content is wrong
        content = io.BytesIO()
        torch.save(entry, content)
        write_entry(path, "mvn", key, content.getvalue(), "MVN statistics")

    if damaged == "garbage":
        path.write_bytes(b"\x00" * 100)
    elif damaged == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    elif damaged == "other-dimension":
        other = GlobalStats(5)
        other.update(torch.ones(3, 5))
        checksummed({"stats": other.state_dict(), "skips": []})
    else:
        checksummed({"stats": _Payload(marker), "skips": []})
    compute = Counting(monkeypatch, dataset_module, "compute_global_stats")
    with caplog.at_level(logging.WARNING):
        again = cached_global_stats(bad_utterances, FeaturePipeline(config), 1, SkipReport(), cache)
    assert "ignoring cached MVN statistics" in caplog.text and str(path) in caplog.text
    assert compute.calls == 1 and not marker.exists()
    assert torch.equal(again.sum, first.sum) and again.count == first.count
    content = read_entry(path, "mvn", key).content  # written again
    assert torch.equal(torch.load(io.BytesIO(content), weights_only=True)["stats"]["sum"], first.sum)


# ---------------------------------------------------------------- entries that load but are wrong (issue 49)


def one_warning_naming(caplog, path: Path) -> str:
    """The one warning logged, on one line, naming ``path``."""
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0] and "\n" not in warnings[0], warnings[0]
    return warnings[0]


def replace_once(path: Path, old: bytes, new: bytes) -> None:
    """Replace the one place where ``path`` holds ``old`` (whatever else the entry holds around it)."""
    data = path.read_bytes()
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))


def test_a_duration_manifest_edited_where_it_still_reads_is_read_again(dev_copy, tmp_path, monkeypatch, caplog):
    cache = tmp_path / "cache"
    first = read_subset(dev_copy, cache_dir=cache)
    path = manifest_path(dev_copy, cache)
    line = next(line for line in path.read_text().splitlines() if line.startswith("9000/1/9000-1-0000.flac\t"))
    key, size, mtime, seconds = line.split("\t")
    edited = "\t".join([key, size, mtime, repr(float(seconds) * 2)])
    replace_once(path, line.encode(), edited.encode())  # a valid line: only the duration is wrong
    info = Counting(monkeypatch, soundfile, "info")
    with caplog.at_level(logging.WARNING):
        assert read_subset(dev_copy, cache_dir=cache) == first
    one_warning_naming(caplog, path)
    assert info.calls == 200
    assert read_subset(dev_copy, cache_dir=cache) == first  # written again, whole
    assert info.calls == 200


def cut_after(model: bytes, count: int) -> bytes:
    """A sentencepiece model of its first ``count`` pieces: still a valid model."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    del proto.pieces[count:]
    return proto.SerializeToString()


@pytest.mark.parametrize("wrong", ["cut-after-30", "another-vocabulary"])
def test_a_bpe_model_that_loads_but_is_not_the_key_s_is_trained_again(
    transcripts, tmp_path, monkeypatch, caplog, wrong
):
    cache = tmp_path / "cache"
    first = cached_bpe(transcripts, 60, cache)
    path = bpe_cache_path(transcripts, 60, cache)
    assert first.vocab_size == 60
    if wrong == "cut-after-30":  # the model cut after its 30th piece, where the file holds it
        cut = cut_after(first.model, 30)
        assert BPETokenizer(cut).vocab_size == 30  # it loads
        data = path.read_bytes()
        assert data.count(first.model) == 1
        path.write_bytes(data.replace(first.model, cut))
    else:  # the entry trained for another vocabulary size, under this one's name
        cached_bpe(transcripts, 120, cache)
        shutil.copyfile(bpe_cache_path(transcripts, 120, cache), path)
    train = Counting(monkeypatch, BPETokenizer, "train")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = cached_bpe(transcripts, 60, cache)
    one_warning_naming(caplog, path)
    assert train.calls == 1 and pieces(again) == pieces(first)
    assert pieces(cached_bpe(transcripts, 60, cache)) == pieces(first) and train.calls == 1  # written again


class _NotStatistics:
    """What a cache entry of the wrong shape holds instead of statistics: ``"stats": 5``."""

    def state_dict(self):
        return 5


@pytest.mark.parametrize("wrong", [
    "flipped-bit", "negative-variance", "another-key", "stats-5",
    "negative-variance-written-by-the-cache", "stats-5-written-by-the-cache",
])
def test_a_statistics_entry_that_loads_but_is_wrong_is_computed_again(
    bad_utterances, tmp_path, monkeypatch, caplog, wrong
):
    cache = tmp_path / "cache"
    config = FeatureConfig(mvn="global", num_mel_bins=23)
    first = cached_global_stats(bad_utterances, FeaturePipeline(config), 1, SkipReport(), cache)
    path = global_stats_path(bad_utterances, config, cache)
    if wrong == "flipped-bit":  # one bit of one dimension's sum, where the file holds it (torch checks no CRC)
        value = first.sum[7].numpy().tobytes()
        flipped = (int.from_bytes(value, "little") ^ (1 << 48)).to_bytes(8, "little")  # a 6% larger sum
        replace_once(path, value, flipped)
    elif wrong == "negative-variance":  # sums of squares of 0: every variance is -mean^2
        squares = first.sum_squares.numpy().tobytes()
        replace_once(path, squares, bytes(len(squares)))
    elif wrong == "another-key":  # the statistics of other utterances (the same dimension) under this key's name
        cached_global_stats(bad_utterances[:6], FeaturePipeline(config), 1, SkipReport(), cache)
        shutil.copyfile(global_stats_path(bad_utterances[:6], config, cache), path)
    elif wrong == "stats-5":
        torch.save({"stats": 5, "skips": []}, path)
    else:  # written by the cache itself, so that whatever it checks of a file holds and only the content is wrong
        real = dataset_module.compute_global_stats

        def wrong_statistics(utterances, pipeline, jobs=1, report=None):
            stats = real(utterances, pipeline, jobs, report)
            if wrong.startswith("stats-5"):
                return _NotStatistics()
            stats.sum_squares = torch.zeros_like(stats.sum_squares)
            return stats

        path.unlink()
        with monkeypatch.context() as patch:
            patch.setattr(dataset_module, "compute_global_stats", wrong_statistics)
            cached_global_stats(bad_utterances, FeaturePipeline(config), 1, SkipReport(), cache)
        assert path.is_file()
    compute = Counting(monkeypatch, dataset_module, "compute_global_stats")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = cached_global_stats(bad_utterances, FeaturePipeline(config), 1, SkipReport(), cache)
    one_warning_naming(caplog, path)
    assert compute.calls == 1
    assert again.count == first.count and torch.equal(again.sum, first.sum)
    assert torch.equal(again.sum_squares, first.sum_squares)
    third = cached_global_stats(bad_utterances, FeaturePipeline(config), 1, SkipReport(), cache)
    assert compute.calls == 1 and torch.equal(third.sum, first.sum)  # written again, whole


# ---------------------------------------------------------------- a run's start


def test_prepare_jobs_is_a_recipe_option_checked_on_load():
    assert from_dict(DataConfig, {"prepare_jobs": 3}, "data").prepare_jobs == 3
    with pytest.raises(ConfigError, match="data: prepare_jobs must be >= 0"):
        from_dict(DataConfig, {"prepare_jobs": -1}, "data")


@pytest.mark.slow  # prepares the dev set and the LibriVox folder twice
def test_a_second_start_on_the_same_corpus_computes_nothing(dev_copy, librivox_mini, tmp_path, monkeypatch):
    train = writable_copy(librivox_mini, tmp_path / "train")
    config = experiment_config_from_dict({
        "features": {"mvn": "global", "num_mel_bins": 23},
        "data": {"train": [str(train), str(dev_copy)], "dev": [str(dev_copy)], "tokenizer": "bpe",
                 "bpe_vocab_size": 60, "cache_dir": str(tmp_path / "cache"), "prepare_jobs": 1},
    })
    first = build_training_data(config, None)
    info = Counting(monkeypatch, soundfile, "info")
    bpe = Counting(monkeypatch, BPETokenizer, "train")
    stats = Counting(monkeypatch, dataset_module, "compute_global_stats")
    second = build_training_data(config, None)
    assert (info.calls, bpe.calls, stats.calls) == (0, 0, 0)
    assert second.tokenizer.model == first.tokenizer.model
    assert torch.equal(second.pipeline.stats.sum, first.pipeline.stats.sum)
    assert second.train_set.utterances == first.train_set.utterances
    # One training file changed: its header and the statistics again, not the tokenizer (same transcripts).
    changed = train / "9999" / "1" / "9999-1-0000.flac"
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**6))
    build_training_data(config, None)
    assert (info.calls, bpe.calls, stats.calls) == (1, 0, 1)


def test_map_chunks_shows_a_bar_on_a_terminal_and_none_for_no_items(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for items, drawn in (([], False), (list(range(20)), True)):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        list(map_chunks(_square_all, items, 0, 10, "audio headers of test"))
        assert ("audio headers of test" in terminal.getvalue()) == drawn  # never an empty "0file" bar
