"""plaza.tasks.cancel_and_wait: tasks that lose a cancellation still end."""

from __future__ import annotations

import asyncio
import contextlib

from plaza.tasks import cancel_and_wait


async def _loses_cancellations(times: int, absorbed: list[int]) -> None:
    """Swallows the first ``times`` cancellations, the way Python 3.11's wait_for loses one
    (the inner call finished in the same turn) inside a redis-py command."""
    for _ in range(times):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            absorbed.append(1)
    await asyncio.sleep(10)


async def test_a_task_that_loses_cancellations_is_cancelled_again_until_it_ends() -> None:
    absorbed: list[int] = []
    task = asyncio.create_task(_loses_cancellations(3, absorbed))
    await asyncio.sleep(0)
    left = await cancel_and_wait([task], limit_s=5)
    assert left == set()
    assert task.cancelled()
    assert len(absorbed) == 3


async def test_a_task_that_does_not_end_is_returned_after_the_limit() -> None:
    give_up = asyncio.Event()

    async def stubborn() -> None:
        while not give_up.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
        await asyncio.sleep(10)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert await cancel_and_wait([task], limit_s=0.3) == {task}
    assert not task.done()
    give_up.set()
    assert await cancel_and_wait([task]) == set()
    assert task.cancelled()


async def test_finished_and_failed_tasks_are_collected_without_warnings() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    failed = asyncio.create_task(fails())
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.wait([failed, done])
    assert await cancel_and_wait([failed, done]) == set()
    assert isinstance(failed.exception(), ValueError)
