"""``ordered``: a decoupled step's branches run side by side, at most a window of them, and
come out in the step's order (pure asyncio, no services)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from plaza.workers.ensemble_responses import ordered


async def _items(values: list[int], fail_after: int | None = None) -> AsyncIterator[int]:
    for i, value in enumerate(values):
        if fail_after is not None and i == fail_after:
            raise ValueError("the step failed")
        yield value
        await asyncio.sleep(0)


async def test_results_come_in_the_items_order_however_the_runs_finish() -> None:
    finished: list[int] = []
    gates = {v: asyncio.Event() for v in range(5)}

    async def run(value: int) -> int:
        if value < 4:
            await gates[value].wait()  # opened by the run after it: the later finish first
        finished.append(value)
        if value > 0:
            gates[value - 1].set()
        return value * 10

    got = [pair async for pair in ordered(_items([0, 1, 2, 3, 4]), run)]
    assert got == [(0, 0), (1, 10), (2, 20), (3, 30), (4, 40)]
    assert finished == [4, 3, 2, 1, 0]  # they ran side by side


async def test_at_most_a_window_of_runs_at_once() -> None:
    running = 0
    most = 0

    async def run(value: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        for _ in range(5):  # a few turns of the loop, in which others may start
            await asyncio.sleep(0)
        running -= 1
        return value

    got = [v async for _, v in ordered(_items(list(range(20))), run, window=3)]
    assert got == list(range(20))
    assert most == 3


async def test_a_failed_run_is_raised_in_its_place_after_the_ones_before_it() -> None:
    async def run(value: int) -> int:
        if value == 2:
            raise RuntimeError("branch 2 failed")
        return value

    got: list[int] = []
    with pytest.raises(RuntimeError, match="branch 2 failed"):
        async for _, value in ordered(_items([0, 1, 2, 3]), run):
            got.append(value)
    assert got == [0, 1]


async def test_a_failing_source_is_raised_after_the_runs_it_started() -> None:
    async def run(value: int) -> int:
        return value

    got: list[int] = []
    with pytest.raises(ValueError, match="the step failed"):
        async for _, value in ordered(_items([5, 6, 7], fail_after=2), run):
            got.append(value)
    assert got == [5, 6]


async def test_stopping_early_cancels_the_runs_and_closes_the_source() -> None:
    cancelled: list[int] = []
    closed = asyncio.Event()

    async def source() -> AsyncIterator[int]:
        try:
            for i in range(100):
                yield i
        finally:
            closed.set()

    async def run(value: int) -> int:
        if value == 0:
            return value
        try:
            await asyncio.Event().wait()  # never set: only a cancellation ends it
        except asyncio.CancelledError:
            cancelled.append(value)
            raise
        return value

    async with contextlib.aclosing(ordered(source(), run, window=4)) as pairs:
        async for _, value in pairs:
            assert value == 0
            break
    assert closed.is_set()
    assert cancelled and all(v > 0 for v in cancelled)
