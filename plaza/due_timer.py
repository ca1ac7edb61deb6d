"""Setting an ``asyncio.Event`` at a moment, to within tens of microseconds.

The worker's scheduler sleeps until its batcher's next due time (the oldest request's
``max_queue_delay_microseconds``, a deadline). uvloop keeps its timers in whole
milliseconds of a clock it reads once per loop turn, so a wait of 0.2 to 2 ms ended
anywhere from 0.9 ms early to 0.6 ms late (``scripts/due_timer_cost.py``), and at
concurrency 1 a batch launched, at the median, a quarter of a millisecond after it was
due; an early wake-up only meant another round of the scheduler and a shorter wait
rounded the same way. asyncio's own loop rounds up to the millisecond.

On Linux a ``timerfd`` (``timerfd_create(2)``, called through ctypes) is armed at the
absolute moment on ``CLOCK_MONOTONIC``, the clock of :func:`time.monotonic`, and the
loop watches its descriptor like a socket: the kernel wakes the loop at that moment, never
before. Elsewhere, or if the call is refused, the timer falls back to the loop's
``call_at``. Either way the timer only sets an event; the waiter wakes for that or for
anything else that sets it, and re-reads its state, so a wake-up for a moment that was
moved since costs one extra round, never a missed one.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import sys
import time

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    """The C library with ``timerfd_create``, or None (not Linux, not found)."""
    if not sys.platform.startswith("linux"):
        return None
    if time.get_clock_info("monotonic").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.c_void_p,
        ]
    except (OSError, AttributeError):
        return None
    return libc


class DueTimer:
    """Sets ``event`` when the monotonic clock reaches the moment last given to :meth:`arm`.

    Create it inside the running loop whose event it sets; :meth:`close` it when done.
    """

    def __init__(self, event: asyncio.Event, *, use_timerfd: bool = True) -> None:
        self._event = event
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._fd = -1
        self._libc = _libc() if use_timerfd else None
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd < 0:
                log.info(
                    "timerfd_create failed (errno %d): using the loop's timer", ctypes.get_errno()
                )
                self._libc = None
            else:
                self._fd = fd
                self._spec = _Itimerspec()
                self._loop.add_reader(fd, self._fired)

    @property
    def precise(self) -> bool:
        """Whether a ``timerfd`` serves the timer (rather than the loop's ``call_at``)."""
        return self._fd >= 0

    def arm(self, due: float | None) -> None:
        """Set the event at ``due`` (a :func:`time.monotonic` reading), replacing the moment
        given before; None disarms. A moment already past sets it on the loop's next turn."""
        if self._fd >= 0:
            assert self._libc is not None
            value = self._spec.it_value
            if due is None:
                value.tv_sec = value.tv_nsec = 0  # all zero: disarmed
            else:
                # A zero it_value would disarm: a moment at or before the clock's start
                # becomes its first nanosecond, which has passed.
                ns = max(1, int(due * 1e9))
                value.tv_sec, value.tv_nsec = divmod(ns, 1_000_000_000)
            if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, self._spec, None) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if due is not None:
            self._handle = self._loop.call_at(self._loop_time(due), self._event.set)

    def _loop_time(self, due: float) -> float:
        """``due`` on the loop's clock (the same clock on asyncio's loop; uvloop's differs)."""
        return self._loop.time() + (due - time.monotonic())

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed or disarmed after it fired: that moment is gone
            return
        self._event.set()

    def close(self) -> None:
        """Stop watching and release the descriptor (idempotent)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
