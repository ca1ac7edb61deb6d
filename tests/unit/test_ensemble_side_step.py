"""``until_failed``: a decoupled step's responses read while the steps beside it run; one of
those that fails ends the reading at once (pure asyncio, no services)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from plaza.workers.ensemble_responses import until_failed

BOUND_S = 10.0
"""Each test's bound: one that hangs fails instead."""


async def test_a_task_that_fails_ends_the_items_at_once_and_stops_the_wait() -> None:
    """The second item never comes: only the task's error ends the reading."""
    failing = asyncio.Event()
    stopped: list[str] = []

    async def items() -> AsyncIterator[int]:
        try:
            yield 1
            failing.set()
            await asyncio.Event().wait()  # never set: a step that never answers again
            yield 2
        except asyncio.CancelledError:
            stopped.append("cancelled")
            raise

    async def beside() -> None:
        await failing.wait()
        raise ValueError("the side step failed")

    task = asyncio.create_task(beside())
    got: list[int] = []
    async with asyncio.timeout(BOUND_S):
        with pytest.raises(ValueError, match="the side step failed"):
            async for item in until_failed(items(), task):
                got.append(item)
    assert got == [1]
    assert stopped == ["cancelled"]  # the wait for the next item did not go on


async def test_a_task_failed_before_the_first_item_is_raised_before_it() -> None:
    async def items() -> AsyncIterator[int]:
        await asyncio.Event().wait()
        yield 1

    async def beside() -> None:
        raise ValueError("failed at once")

    task = asyncio.create_task(beside())
    await asyncio.wait([task])
    async with asyncio.timeout(BOUND_S):
        with pytest.raises(ValueError, match="failed at once"):
            _ = [item async for item in until_failed(items(), task)]


async def test_a_task_that_succeeds_while_an_item_is_awaited_changes_nothing() -> None:
    waiting = asyncio.Event()
    release = asyncio.Event()

    async def items() -> AsyncIterator[int]:
        yield 1
        waiting.set()
        await release.wait()  # set by the task, as it succeeds
        yield 2
        yield 3

    async def beside() -> str:
        await waiting.wait()
        release.set()
        return "done"

    task = asyncio.create_task(beside())
    async with asyncio.timeout(BOUND_S):
        got = [item async for item in until_failed(items(), task)]
    assert got == [1, 2, 3]
    assert task.result() == "done"


async def test_an_items_error_is_raised_as_it_is() -> None:
    async def items() -> AsyncIterator[int]:
        yield 1
        raise KeyError("the step's own error")

    async def beside() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(beside())
    got: list[int] = []
    try:
        async with asyncio.timeout(BOUND_S):
            with pytest.raises(KeyError, match="the step's own error"):
                async for item in until_failed(items(), task):
                    got.append(item)
    finally:
        task.cancel()
        await asyncio.wait([task])
    assert got == [1]
