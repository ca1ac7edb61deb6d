"""The event loop a Plaza process runs on: uvloop where it is installed (it comes with
``uvicorn[standard]`` on Linux), asyncio's own otherwise or when asked for.

The worker, the gateway and the load generator run on uvloop: its loop, sockets and
timers are C, and on a machine whose cores the whole stack shares, every microsecond a
process spends in its loop is one the others do not get (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")
LoopName = Literal["uvloop", "asyncio"]
LOOPS: tuple[LoopName, ...] = ("uvloop", "asyncio")


def loop_factory(name: LoopName = "uvloop") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None (asyncio's own loop): when ``name`` is "asyncio" or
    uvloop cannot be imported."""
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], loop: LoopName = "uvloop") -> T:
    """``asyncio.run(main)`` on the loop ``loop`` names (see :func:`loop_factory`)."""
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(main)
