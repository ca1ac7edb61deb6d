"""plaza.single_flight: one run per key for the callers that overlap it."""

from __future__ import annotations

import asyncio

import pytest

from plaza.errors import Unavailable
from plaza.single_flight import SingleFlight


class Work:
    """Work that counts its runs and ends when told, with a value or an error."""

    def __init__(self) -> None:
        self.runs = 0
        self.release = asyncio.Event()
        self.error: Exception | None = None

    async def __call__(self) -> int:
        self.runs += 1
        run = self.runs
        await self.release.wait()
        if self.error is not None:
            raise self.error
        return run


async def test_overlapping_callers_share_one_run_and_its_result() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    work = Work()
    callers = [asyncio.create_task(flights.run("a", work)) for _ in range(10)]
    await asyncio.sleep(0)
    assert len(flights) == 1
    work.release.set()
    assert await asyncio.gather(*callers) == [1] * 10
    assert work.runs == 1 and len(flights) == 0


async def test_a_call_after_the_run_ended_starts_another() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    work = Work()
    work.release.set()
    assert await flights.run("a", work) == 1
    assert await flights.run("a", work) == 2


async def test_keys_run_apart() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    a, b = Work(), Work()
    first = asyncio.create_task(flights.run("a", a))
    second = asyncio.create_task(flights.run("b", b))
    await asyncio.sleep(0)
    assert len(flights) == 2
    b.release.set()
    assert await second == 1
    assert not first.done()
    a.release.set()
    assert await first == 1


async def test_a_failed_run_is_every_waiters_error_and_the_next_call_runs_again() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    work = Work()
    work.error = ConnectionError("away")
    callers = [asyncio.create_task(flights.run("a", work)) for _ in range(4)]
    await asyncio.sleep(0)
    work.release.set()
    outcomes = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(o, ConnectionError) for o in outcomes)
    work.error = None
    assert await flights.run("a", work) == 2


async def test_a_cancelled_caller_leaves_the_run_to_the_others() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    work = Work()
    gone = asyncio.create_task(flights.run("a", work))
    stays = asyncio.create_task(flights.run("a", work))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    work.release.set()
    assert await stays == 1
    assert gone.cancelled() and work.runs == 1


async def test_close_cancels_the_runs_going_and_their_callers_are_told_why() -> None:
    """The callers were not cancelled themselves: they get Unavailable, which a caller
    handles as a failure, not a CancelledError that reads as its own cancellation."""
    flights: SingleFlight[str, int] = SingleFlight()
    work = Work()
    caller = asyncio.create_task(flights.run("a", work))
    await asyncio.sleep(0)
    await flights.close()
    assert len(flights) == 0
    with pytest.raises(Unavailable, match="stopped"):
        await caller
    assert not caller.cancelled()


async def test_a_cancelled_caller_of_a_closed_run_stays_cancelled() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    work = Work()
    caller = asyncio.create_task(flights.run("a", work))
    await asyncio.sleep(0)
    caller.cancel()
    await flights.close()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()
