"""One run of a piece of work for every concurrent caller that needs it.

A producer core takes many requests at once, and the first ones for a model all need the
same thing before they can go: its topic made (``plaza.publisher``), or its backlog
measured when the cached figure has expired (``plaza.queueing``). Left alone, each of
them would do that work itself: 64 clients starting together made 64 admin clients, each
reading the whole cluster's metadata (40 ms of CPU each with 1,300 topics in the cluster).
:class:`SingleFlight` runs the work once per key and lets every caller that comes while
it runs wait for that run:

- its result is every waiting caller's result, and its exception every one's exception;
  the next call after it ended (either way) starts a new run;
- a caller that is cancelled, or times out, stops waiting, and the run goes on for the
  others (it is shielded);
- :meth:`close` cancels the runs still going (a stopping client); their callers, who were
  not cancelled themselves, get Unavailable.

One instance per owner (a publisher, a probe); nothing is shared between them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Generic, TypeVar

from plaza.errors import Unavailable
from plaza.tasks import cancel_and_wait

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """Runs ``work`` once per key for all the callers that overlap it."""

    def __init__(self) -> None:
        self._running: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        """Runs going now (at most one per key)."""
        return len(self._running)

    async def run(self, key: K, work: Callable[[], Awaitable[V]]) -> V:
        """``work()``'s outcome, from the run for ``key`` going now or from a new one."""
        task = self._running.get(key)
        if task is None:
            task = asyncio.ensure_future(work())
            self._running[key] = task
            task.add_done_callback(partial(self._ended, key))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                raise Unavailable("stopped while the work this call waited for ran") from None
            raise  # the caller's own cancellation

    def _ended(self, key: K, task: asyncio.Future[V]) -> None:
        # (an exception that no caller waits for any more is retrieved by ``shield``)
        if self._running.get(key) is task:
            del self._running[key]

    async def close(self) -> None:
        """Cancel the runs going now and wait until they end."""
        await cancel_and_wait(list(self._running.values()))
