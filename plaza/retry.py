"""Calls retried with backoff until they succeed: work that waits for Redis to come back
rather than failing (the offsets of what it carries are held meanwhile); and which of
Redis' refusals no retry cures (``refused_for_good``), for callers that must not retry those."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import (
    AskError,
    ClusterDownError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0
OOM_LOG_EVERY_S = 10.0
"""How often ``until_done`` says, at error level, that Redis is out of memory."""
OUT_OF_MEMORY = "Redis is out of memory (maxmemory)"

PASSING_CODES = frozenset(
    {
        "OOM",
        "READONLY",
        "LOADING",
        "BUSY",
        "MASTERDOWN",
        "CLUSTERDOWN",
        "TRYAGAIN",
        "MOVED",
        "ASK",
        "MISCONF",
        "NOREPLICAS",
        "NOSCRIPT",
        "NOAUTH",
        "NOPERM",
    }
)
"""Error codes of Redis' replies (the reply's first word) that tell of a state of the
server that passes: memory, a failover, a load, a busy script, a failed save, access."""
_PASSING_ERRORS = (
    OutOfMemoryError,
    ReadOnlyError,
    NoScriptError,
    NoPermissionError,
    ClusterDownError,
    TryAgainError,
    AskError,
)
"""redis-py's classes for such replies (it strips the code from their message)."""


def refused_for_good(exc: BaseException) -> bool:
    """Whether ``exc`` is an error reply that the same call would get again (a value over
    Redis' ``proto-max-bulk-len``, a wrong argument): a ResponseError whose code is not one
    of ``PASSING_CODES``. A lost connection, or a server that is out of memory, read-only or
    loading, is not: a retry may succeed."""
    if not isinstance(exc, ResponseError) or isinstance(exc, _PASSING_ERRORS):
        return False
    return str(exc).split(" ", 1)[0] not in PASSING_CODES


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis' OOM reply (``maxmemory`` reached, nothing to evict)."""
    if isinstance(exc, OutOfMemoryError):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith("OOM ")


def redis_failure(exc: BaseException) -> str:
    """A failed Redis call in words for its caller: out of memory, an error reply (Redis
    answered: it refused), or no answer (a lost connection, a timeout)."""
    if out_of_memory(exc):
        return f"{OUT_OF_MEMORY}: {exc}"
    if isinstance(exc, ResponseError):
        return f"Redis refused the command: {exc}"
    return f"Redis did not answer: {exc}"


class _OomLog:
    """At most one error line per ``OOM_LOG_EVERY_S`` for an out-of-memory Redis."""

    last = -float("inf")

    @classmethod
    def note(cls, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - cls.last < OOM_LOG_EVERY_S:
            return
        cls.last = now
        log.error(
            "%s: %s is held until Redis takes writes again (free memory, raise maxmemory; "
            "see docs/deploy.md on maxmemory-policy): %s",
            OUT_OF_MEMORY,
            what,
            exc,
        )


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
            if out_of_memory(exc):
                _OomLog.note(what, exc)
            log.warning("%s failed (%s); retrying in %.2fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)
