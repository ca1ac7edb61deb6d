"""The one bounded wait: poll a condition until it holds, fail after a time limit.

Every readiness check of the stack (a broker answering, Redis answering PING, a worker's
heartbeat, a gateway's health endpoint) and every wait of the fault suite goes through
:func:`wait_for`, so nothing sleeps to synchronise and nothing waits forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from plaza.stack.errors import WaitTimeout

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


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even inside a running event loop.

    It runs on a helper thread with its own loop, so a sync ``wait_ready`` can be called
    from an async test or fixture without blocking on the caller's own loop.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()
