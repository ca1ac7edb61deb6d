"""``plaza.retry.until_done``: a call retried until it succeeds, or raised once stopping."""

from __future__ import annotations

import asyncio

import pytest

from plaza.retry import until_done


def test_a_failing_call_is_retried_until_it_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("Redis is away")
        return "written"

    assert asyncio.run(until_done(flaky, "writing 2 results")) == "written"
    assert len(calls) == 3
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "writing 2 results failed"
    ] * 2


def test_a_failure_after_stop_is_raised() -> None:
    async def failing() -> None:
        raise ConnectionError("Redis is away")

    async def main() -> None:
        stop = asyncio.Event()
        stop.set()
        await until_done(failing, "reading", stop)

    with pytest.raises(ConnectionError):
        asyncio.run(main())
