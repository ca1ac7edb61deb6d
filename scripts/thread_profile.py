"""Run a Plaza process under cProfile that counts its main thread's CPU time, not wall
time, over a window chosen by signals.

    python scripts/thread_profile.py OUT.prof worker --worker.model identity &
    kill -USR2 $!    # start of the window: what was counted so far is dropped
    kill -USR1 $!    # end: the profile goes to OUT.prof and the process exits at once

``python -m cProfile`` counts wall time, so a coroutine that waits on a socket, or a
thread that waits for a core the broker holds, reads as busy; and it counts start-up
and warm-up with the load. Here the timer is ``time.thread_time`` (the event loop's
thread, where a worker's and a gateway's Python runs; an executor thread is not
profiled) and only the window between the two signals is kept. Read the dump with
``scripts/profile_by_package.py`` or ``pstats``. Reading a thread's CPU clock is a system
call, made twice per profiled call, so the process runs several times slower under it
and small, frequent functions are inflated most: compare shares and call counts between
runs, not times with runs made without it. ``scripts/profile_stack.sh`` uses it with
``PROF=thread``.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
import time
from types import FrameType


def main() -> None:
    out = sys.argv[1]
    profile = cProfile.Profile(time.thread_time)

    def restart(signum: int, frame: FrameType | None) -> None:
        profile.disable()
        profile.clear()
        profile.enable()

    def dump(signum: int, frame: FrameType | None) -> None:
        profile.disable()
        profile.dump_stats(out)
        os._exit(0)  # the window is over; a clean stop would profile the shutdown too

    signal.signal(signal.SIGUSR2, restart)
    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["plaza", *sys.argv[2:]]
    profile.enable()
    runpy.run_module("plaza.cli.main", run_name="__main__")


if __name__ == "__main__":
    main()
