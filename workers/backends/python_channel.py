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
``ChannelTimeout``.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import threading
import time
from typing import Any

import msgpack

HEADER = struct.Struct("<Q")
MAX_FRAME_BYTES = 1 << 32
"""The largest frame either side accepts (a batch's tensors, and their answers)."""
_CHUNK = 1 << 20


class ChannelClosed(Exception):
    """The other end closed its pipe: the process exited or was killed."""


class ChannelTimeout(Exception):
    """No whole frame arrived within the limit."""


class Channel:
    """One end: frames are written to ``write_fd`` and read from ``read_fd``."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._writing = threading.Lock()
        """One frame at a time on the write end, whichever thread sends it."""

    def send(self, message: dict[str, Any]) -> None:
        data = msgpack.packb(message, use_bin_type=True)
        if len(data) > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {len(data)} bytes is over {MAX_FRAME_BYTES}")
        view = memoryview(HEADER.pack(len(data)) + data)
        try:
            with self._writing:
                while view:
                    written = os.write(self.write_fd, view[:_CHUNK])
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
        if deadline is None:
            return
        left_ms = max(0, int((deadline - time.monotonic()) * 1000))
        poller = select.poll()  # not select.select: it fails on descriptors past 1024
        poller.register(self.read_fd, select.POLLIN)
        if not poller.poll(left_ms):
            raise ChannelTimeout("no answer within the time limit")

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
