"""What Kafka and Redis share as services: start, wait until ready, stop, as a context."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from plaza.stack.waiting import run_sync, until_stopped

READY_TIMEOUT_S = 60.0


class ManagedService(ABC):
    """A server run as child process(es): ``with service:`` = start, wait ready, then stop.

    A subclass says how to start, stop and ask "ready?" (:meth:`wait_ready_async`); the
    sync :meth:`wait_ready` and the context manager are written once here.
    """

    @abstractmethod
    def start(self) -> Self:
        """Start what is not running (a no-op for what is)."""

    @abstractmethod
    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL whatever outlives ``timeout``."""

    @abstractmethod
    async def wait_ready_async(self, timeout: float = READY_TIMEOUT_S) -> None:  # noqa: ASYNC109
        """Wait until the service answers over its own protocol; ServiceError if not."""

    def wait_ready(
        self, timeout: float = READY_TIMEOUT_S, stop: threading.Event | None = None
    ) -> None:
        """Block until ready (safe to call inside a running event loop).

        Raises :class:`~plaza.stack.errors.Interrupted` as soon as ``stop`` is set (a
        Ctrl-C while the service starts); what was started keeps running: stop it.
        """
        what = f"{type(self).__name__} to be ready"
        run_sync(lambda: until_stopped(self.wait_ready_async(timeout), stop, what))

    def __enter__(self) -> Self:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
