"""What Kafka and Redis share as services: start, wait until ready, stop, as a context."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from plaza.stack.waiting import run_sync

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

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Block until ready (safe to call inside a running event loop)."""
        run_sync(lambda: self.wait_ready_async(timeout))

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
