"""The channel between a worker and its Python model's process: msgpack frames over pipes.

A frame is an 8-byte little-endian length, then a msgpack map. Requests and results inside
travel as Plaza's own envelopes (``plaza.codec``), so tensors are raw bytes, never pickles.
Exchanges are one question, one answer, so neither side can block the other on a full
pipe; a decoupled model's batch is answered in many frames (its responses, then the answer).
While any batch runs the worker may send cancel frames, which the model's process reads
when the model asks (``readable``: without waiting); the worker sends one only where the
pipe has room (``writable``), so a model that never asks cannot stall it. A frame is
written whole under a lock: any thread may send.
A closed pipe (the other process exited) is ``ChannelClosed``; a wait past its limit is
``ChannelTimeout``. A pipe's close alone does not tell the worker that its model's process
died: a process that process forked keeps the pipes open as long as it lives. So the worker's
end waits on its pipes in slices of ``LIVENESS_SLICE_S`` and asks between them whether the
process is alive (``alive``); a dead one is ``ChannelClosed`` too, once what it wrote is read.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack

HEADER = struct.Struct("<Q")
MAX_FRAME_BYTES = 1 << 32
"""The largest frame either side accepts (a batch's tensors, and their answers)."""
_CHUNK = 1 << 20
LIVENESS_SLICE_S = 0.2
"""How long a wait on the pipes goes between two looks at the other process's liveness."""


class ChannelClosed(Exception):
    """The other end closed its pipe: the process exited or was killed."""


class ChannelTimeout(Exception):
    """No whole frame arrived within the limit."""


class Channel:
    """One end: frames are written to ``write_fd`` and read from ``read_fd``."""

    def __init__(
        self, read_fd: int, write_fd: int, alive: Callable[[], bool] | None = None
    ) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._alive = alive
        """Whether the other process still runs (None: its pipe's close tells)."""
        self._writing = threading.Lock()
        """One frame at a time on the write end, whichever thread sends it."""
        if alive is not None:  # a full pipe is then waited on in slices, never in os.write
            os.set_blocking(write_fd, False)

    def send(self, message: dict[str, Any]) -> None:
        data = msgpack.packb(message, use_bin_type=True)
        if len(data) > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {len(data)} bytes is over {MAX_FRAME_BYTES}")
        view = memoryview(HEADER.pack(len(data)) + data)
        try:
            with self._writing:
                while view:
                    try:
                        written = os.write(self.write_fd, view[:_CHUNK])
                    except BlockingIOError:  # full: the other process reads, or is gone
                        self._wait(self.write_fd, select.POLLOUT, None)
                        continue
                    view = view[written:]
        except (BrokenPipeError, OSError) as exc:
            raise ChannelClosed(f"pipe closed while writing: {exc}") from exc

    def recv(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The next frame; waits at most ``timeout_s`` for all of it (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        (size,) = HEADER.unpack(self._read_exact(HEADER.size, deadline))
        if size > MAX_FRAME_BYTES:
            raise ChannelClosed(f"frame header announces {size} bytes: the stream is corrupt")
        message = msgpack.unpackb(self._read_exact(size, deadline), raw=False)
        if not isinstance(message, dict):
            raise ChannelClosed("a frame is not a msgpack map: the stream is corrupt")
        return message

    def readable(self) -> bool:
        """A frame (or the other end's close) waits to be read: ``recv`` returns or raises
        at once, as the other end writes a frame whole."""
        return self._ready(self.read_fd, select.POLLIN)

    def writable(self) -> bool:
        """The pipe has room: a small frame (``select.PIPE_BUF`` bytes) goes without
        waiting; a closed other end counts too (``send`` then raises at once)."""
        return self._ready(self.write_fd, select.POLLOUT)

    @staticmethod
    def _ready(fd: int, event: int) -> bool:
        poller = select.poll()
        poller.register(fd, event)
        return bool(poller.poll(0))

    def _read_exact(self, size: int, deadline: float | None) -> bytearray:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            self._wait_readable(deadline)
            try:
                chunk = os.readv(self.read_fd, [view[got : got + _CHUNK]])
            except OSError as exc:
                raise ChannelClosed(f"pipe closed while reading: {exc}") from exc
            if chunk == 0:
                raise ChannelClosed("the other end closed the pipe")
            got += chunk
        return buf

    def _wait_readable(self, deadline: float | None) -> None:
        if deadline is not None or self._alive is not None:
            self._wait(self.read_fd, select.POLLIN, deadline)

    def _wait(self, fd: int, event: int, deadline: float | None) -> None:
        """Until ``fd`` is ready (or closed); ChannelTimeout past ``deadline``,
        ChannelClosed once the other process is dead and ``fd`` still not ready."""
        poller = select.poll()  # not select.select: it fails on descriptors past 1024
        poller.register(fd, event)
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._alive is not None:
                wait = LIVENESS_SLICE_S if wait is None else min(wait, LIVENESS_SLICE_S)
            if poller.poll(None if wait is None else math.ceil(wait * 1000)):
                return
            if self._alive is not None and not self._alive():
                if poller.poll(0):  # what it wrote before it exited is read first
                    return
                raise ChannelClosed("the other process exited (a process it forked holds its pipe)")
            if deadline is not None and time.monotonic() >= deadline:
                raise ChannelTimeout("no answer within the time limit")

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
