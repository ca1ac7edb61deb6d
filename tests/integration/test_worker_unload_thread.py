"""A worker's stop unloads its backends off the event loop, on real Kafka and Redis.

A Python model's unload may wait seconds (a process that ``model.py`` forked ignores
SIGTERM); the host's other models, on the same loop, must go on answering meanwhile. The
backends below stand in for such a model at the backend seam (load / infer / unload): one
whose unload waits until the test lets it go, one whose unload raises, one that records
that its unload ran. They serve no version that requests name.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import pytest

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from plaza.workers.backends.base import Arrays
from plaza.workers.worker import Worker
from tests.support import running_worker, wait_for, with_model

HELD_S = 10.0
"""How long the slow unload waits for the test to let it go: only a loop blocked in that
unload keeps the test from doing so in time."""


class _Unload:
    """A backend whose unload is all that is asked of it."""

    def __init__(self) -> None:
        self.unloaded = threading.Event()

    def load(self) -> None:
        pass

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        raise AssertionError("no request names this backend's version")

    def unload(self) -> None:
        self.unloaded.set()


class _SlowUnload(_Unload):
    """Its unload waits until ``release`` is set (at most ``HELD_S``)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.released_in_time: bool | None = None

    def unload(self) -> None:
        self.unloaded.set()
        self.released_in_time = self.release.wait(HELD_S)


class _BrokenUnload(_Unload):
    def unload(self) -> None:
        raise RuntimeError("the model's finalize raised")


async def test_a_slow_unload_leaves_the_other_models_serving(
    settings: PlazaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="plaza.workers.worker")
    slow, broken, after = _SlowUnload(), _BrokenUnload(), _Unload()
    async with PlazaClient(settings) as client, running_worker(settings, "add_sub"):
        stopped = Worker(with_model(settings, "identity"))
        await stopped.start()
        # In this order: a loop that ran the unloads one by one would block in the slow
        # one, then stop at the broken one before the last.
        stopped.runner.backends.update({97: slow, 98: broken, 99: after})  # type: ignore[dict-item]
        stopping = asyncio.create_task(stopped.stop())
        try:
            await wait_for(slow.unloaded.is_set, 30, "the slow unload to begin")
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            result = await client.infer("add_sub", {"INPUT0": a, "INPUT1": a})
            np.testing.assert_array_equal(result.as_numpy()["OUTPUT0"], a + a)
        finally:
            slow.release.set()
            await stopping
    assert slow.released_in_time  # the loop answered while the unload waited
    assert after.unloaded.is_set()  # the broken unload stopped no other
    assert not any(runner.backends for runner in stopped.instances)
    assert "unloading version 98 failed" in caplog.text
    assert "the model's finalize raised" in caplog.text
