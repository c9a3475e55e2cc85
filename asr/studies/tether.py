"""A process that ends with the study that started it, however the study ends.

``asr.study`` forwards the stop signals it receives to the runs it started (:mod:`asr.studies.grid`), but
SIGKILL (``kill -9``, the out-of-memory killer, a scheduler's hard limit) cannot be caught: nothing in
the study runs, and its ``asr.train`` children went on training, orphaned, holding their runs' locks.
So on Linux the study starts each of them through this module::

    python -m asr.studies.tether STUDY_PID PROGRAM [ARG ...]

which asks the kernel to send it SIGUSR2 when its parent dies (``prctl(PR_SET_PDEATHSIG)``), checks that
its parent is still ``STUDY_PID`` (the study may have died before the request was made), and then
becomes ``PROGRAM`` (``exec``: the same process, whose death signal the kernel keeps). A run then stops
as on a first SIGTERM, writing ``last.pt``, and the same study command resumes it.

The signal is SIGUSR2 (:data:`asr.training.signals.PARENT_DIED`), not SIGTERM, because the kernel sends it
at every step of the orphan's reparenting: once for each thread of the dead study that the orphan is
handed to before it reaches a live process. A study killed with SIGKILL mostly gives one, but sometimes
two, and a second SIGTERM means "stop at once" to ``asr.train``; repeats of SIGUSR2 count once.

The request is made in the child after it starts, not in a ``preexec_fn`` between fork and exec, which is
unsafe in a process with threads (the study starts its runs from worker threads). The kernel sends the
signal when the *thread* that started the child ends, not the process; the study's worker thread waits
for its child to end (:meth:`asr.studies.grid._Processes.run`), so it outlives it unless the whole study
dies. Elsewhere than on Linux there is no such request: :func:`tethered` leaves the command as it is, and
a study killed with SIGKILL leaves its runs to be stopped by hand.
"""

from __future__ import annotations

import ctypes
import os
import sys

from asr.training.signals import PARENT_DIED

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def available() -> bool:
    """Whether this system can tie a child's life to its parent's (Linux only)."""
    return sys.platform.startswith("linux")


def tethered(command: list[str]) -> list[str]:
    """``command`` started so that it receives :data:`PARENT_DIED` when this process dies (on Linux; elsewhere as it is)."""
    if not available():
        return command
    return [sys.executable, "-m", __name__, str(os.getpid()), *command]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m asr.studies.tether PARENT_PID PROGRAM [ARG ...]", file=sys.stderr)
        raise SystemExit(2)
    parent, command = int(argv[0]), argv[1:]
    if available():
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, PARENT_DIED, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            print(f"asr.studies.tether: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(error)}", file=sys.stderr)
            raise SystemExit(2)
        if os.getppid() != parent:  # the parent died before the request: nothing would stop the child
            raise SystemExit(128 + PARENT_DIED)  # as if the signal had come, before anything was written
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"asr.studies.tether: cannot run {command[0]}: {err.strerror or err}", file=sys.stderr)
        raise SystemExit(127) from None


if __name__ == "__main__":
    main(sys.argv[1:])
