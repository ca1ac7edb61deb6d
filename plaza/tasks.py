"""Stopping asyncio tasks for certain: cancel, and cancel again until they end.

One ``task.cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for`` returns
the result of an inner awaitable that finished in the same loop turn as the cancellation
of its caller, and the cancellation is lost (CPython gh-86296, fixed in 3.12 where
``wait_for`` is built on ``asyncio.timeout``). redis-py sends every command through
``wait_for`` when a socket timeout is set (its default is 5 s), so a task cancelled while it
sends a Redis command can go on as if nothing happened: a heartbeat loop cancelled mid-beat
keeps beating, and a stop that cancels once and then gathers waits for ever (a CI run hung
300 s so). Every stop in Plaza ends its tasks through :func:`cancel_and_wait`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

RECANCEL_S = 0.1
"""How long a cancelled task gets before it is cancelled again."""
CANCEL_LIMIT_S = 10.0
"""How long :func:`cancel_and_wait` keeps at it by default."""


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any]], limit_s: float = CANCEL_LIMIT_S
) -> set[asyncio.Future[Any]]:
    """Cancel ``tasks`` and wait until each has ended, cancelling the ones still running
    again every :data:`RECANCEL_S`; the ones still running after ``limit_s`` are returned
    (and logged). Their results and exceptions are retrieved: nothing is left "never
    retrieved". A cancellation of the caller itself is not absorbed."""
    every = list(tasks)
    pending = {t for t in every if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    for task in every:
        if task.done() and not task.cancelled():
            with contextlib.suppress(BaseException):
                task.exception()
    if pending:
        log.warning("%d tasks still running %.1f s after their cancellation", len(pending), limit_s)
    return pending
