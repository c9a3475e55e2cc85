"""Study tooling: what ``python -m asr.study`` and ``python -m asr.compare`` run, as a library.

- :mod:`asr.studies.grid`: grid studies planned, trained, scored and tabulated (``asr.study``);
- :mod:`asr.studies.curves`: TensorBoard curves read, smoothed, banded over seeds and plotted (``asr.compare``);
- :mod:`asr.studies.convergence`: how fast a run converged, and its mean over seeds;
- :mod:`asr.studies.diagnosis`: a LAS's convergence diagnostics (``--diagnose``);
- :mod:`asr.studies.tether`: the study's processes started so that they stop when it dies, even of SIGKILL.

Nothing here imports :mod:`asr.cli`: the commands import the library, never the other way.
"""
