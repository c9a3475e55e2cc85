"""asr/training/state.py: what last.pt keeps of where a run is, and runs saved by older versions."""

from dataclasses import asdict

from asr.training.state import Progress, restore_progress


def test_progress_round_trips_and_a_run_of_an_older_version_is_recognised():
    saved = asdict(Progress(epoch=3, step=120, best=[[1.5, 3], [1.75, 2]]))
    progress, from_zero = restore_progress(saved)
    assert not from_zero and progress.step == 120 and progress.best == [(1.5, 3), (1.75, 2)]
    # A last.pt of a version that numbered epochs from 0 has no epochs_from_one: its best entries keep
    # naming its files (best_epoch2.pt is its third epoch), and the run is told apart to say so.
    old = {k: v for k, v in saved.items() if k != "epochs_from_one"}
    progress, from_zero = restore_progress(old)
    assert from_zero and progress.best == [(1.5, 3), (1.75, 2)] and progress.epochs_from_one
    assert restore_progress(asdict(progress)) == (progress, False)  # saved again, it reads as today's
