"""plaza.due_timer: an event set at a moment, by a timerfd or by the loop's call_at."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from plaza.due_timer import DueTimer
from plaza.event_loop import run

MODES = [pytest.param(True, id="timerfd"), pytest.param(False, id="call_at")]


async def _set_within(event: asyncio.Event, limit_s: float = 5.0) -> bool:
    try:
        async with asyncio.timeout(limit_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
async def test_linux_gets_a_timerfd() -> None:
    timer = DueTimer(asyncio.Event())
    try:
        assert timer.precise
    finally:
        timer.close()


async def test_the_fallback_says_so() -> None:
    timer = DueTimer(asyncio.Event(), use_timerfd=False)
    assert not timer.precise
    timer.close()


@pytest.mark.parametrize("use_timerfd", MODES)
async def test_sets_the_event_at_the_moment(use_timerfd: bool) -> None:
    event = asyncio.Event()
    timer = DueTimer(event, use_timerfd=use_timerfd)
    try:
        due = time.monotonic() + 0.02
        timer.arm(due)
        assert not event.is_set()
        assert await _set_within(event)
        if timer.precise:  # an absolute kernel timer never fires before its moment
            assert time.monotonic() >= due
    finally:
        timer.close()


@pytest.mark.parametrize("use_timerfd", MODES)
async def test_a_moment_already_past_sets_it_at_once(use_timerfd: bool) -> None:
    event = asyncio.Event()
    timer = DueTimer(event, use_timerfd=use_timerfd)
    try:
        timer.arm(time.monotonic() - 1.0)
        assert await _set_within(event)
        event.clear()
        timer.arm(0.0)  # the clock's very start: still a moment, not "disarm"
        assert await _set_within(event)
    finally:
        timer.close()


@pytest.mark.parametrize("use_timerfd", MODES)
async def test_none_disarms(use_timerfd: bool) -> None:
    event = asyncio.Event()
    timer = DueTimer(event, use_timerfd=use_timerfd)
    try:
        timer.arm(time.monotonic() + 0.01)
        timer.arm(None)
        assert not await _set_within(event, 0.1)
    finally:
        timer.close()


@pytest.mark.parametrize("use_timerfd", MODES)
async def test_arming_again_replaces_the_moment(use_timerfd: bool) -> None:
    event = asyncio.Event()
    timer = DueTimer(event, use_timerfd=use_timerfd)
    try:
        timer.arm(time.monotonic() + 0.01)
        later = time.monotonic() + 0.08
        timer.arm(later)
        assert await _set_within(event)
        if timer.precise:
            assert time.monotonic() >= later
        # and a moment moved earlier than the one armed is kept too
        event.clear()
        timer.arm(time.monotonic() + 60)
        timer.arm(time.monotonic() + 0.01)
        assert await _set_within(event)
    finally:
        timer.close()


async def test_a_fired_moment_that_was_moved_sets_nothing() -> None:
    """Fired, then re-armed before the loop read it: that firing is dropped, the new
    moment stands (the waiter would otherwise wake for a moment that no longer holds)."""
    event = asyncio.Event()
    timer = DueTimer(event)
    try:
        timer.arm(time.monotonic() - 1.0)  # fires in the kernel now
        timer.arm(time.monotonic() + 60)  # re-armed before the loop's next turn
        assert not await _set_within(event, 0.1)
    finally:
        timer.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
async def test_close_releases_the_descriptor_once() -> None:
    before = len(os.listdir("/proc/self/fd"))
    timer = DueTimer(asyncio.Event())
    assert len(os.listdir("/proc/self/fd")) == before + (1 if timer.precise else 0)
    timer.close()
    timer.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert not timer.precise


def test_works_on_uvloop() -> None:
    async def main() -> bool:
        event = asyncio.Event()
        timer = DueTimer(event)
        try:
            due = time.monotonic() + 0.01
            timer.arm(due)
            return await _set_within(event) and (not timer.precise or time.monotonic() >= due)
        finally:
            timer.close()

    assert run(main(), loop="uvloop")
