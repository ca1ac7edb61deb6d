"""The one bounded wait: poll a condition until it holds, fail after a time limit.

Every readiness check of the stack (a broker answering, Redis answering PING, a worker's
heartbeat, a gateway's health endpoint) and every wait of the fault suite goes through
:func:`wait_for`, so nothing sleeps to synchronise and nothing waits forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from plaza.stack.errors import Interrupted, WaitTimeout

POLL_S = 0.02
"""Default interval between two looks at the condition."""

T = TypeVar("T")


async def wait_for(
    predicate: Callable[[], Awaitable[bool] | bool],
    limit_s: float = 30.0,
    what: str = "a condition",
    detail: Callable[[], str] | None = None,
    *,
    poll_s: float = POLL_S,
) -> float:
    """Poll ``predicate`` (sync or async) until it is true; return the seconds it took.

    Raises :class:`WaitTimeout` naming ``what`` (and ``detail()``, e.g. a log's tail) once
    ``limit_s`` has passed. An exception from ``predicate`` propagates at once: that is how
    a check says "this will never hold" (a process died).
    """
    start = time.monotonic()
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return time.monotonic() - start
        if time.monotonic() - start > limit_s:
            extra = f"\n{detail()}" if detail is not None else ""
            raise WaitTimeout(f"timed out after {limit_s:.0f}s waiting for {what}{extra}")
        await asyncio.sleep(poll_s)


async def until_stopped(
    wait: Awaitable[T],
    stop: threading.Event | None,
    what: str = "a condition",
    *,
    poll_s: float = POLL_S,
) -> T:
    """Await ``wait`` unless ``stop`` is set first: then cancel it and raise
    :class:`Interrupted` naming ``what``.

    ``stop`` is a thread event (a signal handler on the main thread sets it), so a Ctrl-C
    ends a readiness wait within ``poll_s`` even while one look at the condition (a
    metadata request, an HTTP GET) is still under way.
    """
    task = asyncio.ensure_future(wait)
    if stop is None:
        return await task
    try:
        while not task.done():
            if stop.is_set():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)  # its cleanup runs now
                raise Interrupted(f"stopped while waiting for {what}")
            await asyncio.wait({task}, timeout=poll_s)
        return task.result()
    finally:
        task.cancel()  # a no-op once done; ends it if we were cancelled ourselves


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even inside a running event loop.

    It runs on a helper thread with its own loop, so a sync ``wait_ready`` can be called
    from an async test or fixture without blocking on the caller's own loop.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()
