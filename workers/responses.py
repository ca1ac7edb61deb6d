"""A decoupled model's responses on their way from the executor thread to the writer.

A decoupled model (``model_transaction_policy { decoupled: true }``) sends its responses
one by one while its batch runs. Written one Redis call each, they would cost a round trip
apiece; here they gather instead, and the worker's writer takes all that have gathered
in one call. The executor thread ``add``s; the first response into an empty buffer asks
the writer to come (``wake``: once per batch of them, so the writer's queue holds at
most one such call per take); the writer ``take``s everything gathered, always before
it writes anything else. That is what keeps a request's responses before its final one:
the final one is queued only after the model's batch returned, so its responses are in
the buffer by then, and the writer empties the buffer first. One take may hold thousands
of one request's responses; the writer puts them on the reply stream in entries of at
most ``MAX_ENTRY_RESPONSES`` each (``workers/writer.py``), which a caller's reply reader
can take whole (``plaza.replies``).

Bounded: past ``limit`` responses waiting, ``add`` holds the model's thread until the
writer takes them (a model that sends faster than Redis takes its responses is slowed,
not buffered without end), and gives up with ModelExecutionError once ``closed`` (the
worker stopping) says that no writer will come.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from plaza.contract import InferResult
from plaza.errors import ModelExecutionError

Answer = tuple[InferResult, str | None]
"""A response and the reply stream it goes to (None: its response key alone)."""

DEFAULT_LIMIT = 4096
"""Responses that may wait for the writer before the model's thread is held."""
CLOSED_CHECK_S = 1.0
"""How often a held ``add`` looks whether the worker stopped writing."""


class ResponseBuffer:
    """Responses sent by a decoupled model, waiting for the writer (thread-safe)."""

    def __init__(
        self, wake: Callable[[], None], closed: Callable[[], bool], limit: int = DEFAULT_LIMIT
    ) -> None:
        """``wake`` is called (from the model's thread) when a response arrives in an
        empty buffer: it must make the writer ``take`` soon, without blocking."""
        self._wake = wake
        self._closed = closed
        self._limit = limit
        self._waiting: list[Answer] = []
        self._room = threading.Condition()

    def add(self, answer: Answer) -> None:
        with self._room:
            while len(self._waiting) >= self._limit:
                if self._closed():
                    raise ModelExecutionError(
                        "the worker stopped before the response could be written"
                    )
                self._room.wait(CLOSED_CHECK_S)
            self._waiting.append(answer)
            first = len(self._waiting) == 1
        if first:
            self._wake()

    def take(self) -> list[Answer]:
        """Every response waiting, in the order sent; the buffer is empty after."""
        with self._room:
            taken, self._waiting = self._waiting, []
            self._room.notify_all()
        return taken

    def __len__(self) -> int:
        return len(self._waiting)
