"""Calls retried with backoff until they succeed: work that waits for Redis to come back
rather than failing (the offsets of what it carries are held meanwhile)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0


async def until_done(
    call: Callable[[], Awaitable[T]], what: str, stop: asyncio.Event | None = None
) -> T:
    """``call()``'s result, calling again after each failure (connection errors, Redis
    LOADING its AOF) with a delay doubling from 50 ms to 1 s; a failure once ``stop`` is
    set is raised. ``what`` names the call in the warning each failure logs."""
    delay = FIRST_DELAY_S
    while True:
        try:
            return await call()
        except Exception as exc:
            if stop is not None and stop.is_set():
                raise
            log.warning("%s failed (%s); retrying in %.2fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)
