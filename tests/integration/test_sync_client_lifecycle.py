"""The blocking SDK client's start and close, on real Kafka and Redis.

- A client that cannot start (no Kafka where it looks) leaves no loop thread, producer or
  Redis pool behind: a retry loop used to leak one of each per try.
- ``close`` from one thread ends the calls another thread still waits in with Unavailable:
  a job being polled used to wait for ever on a loop that had stopped. A call after
  ``close`` is Unavailable at once.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from plaza.client import SyncPlazaClient
from plaza.errors import Unavailable
from plaza.settings import PlazaSettings
from plaza.stack import free_port
from tests.support import REPOSITORY, model_variant, wait_for

JOIN_S = 60.0
"""Bound on a thread's end (a hang is what the test catches), never a speed."""


def loop_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "plaza-client" and t.is_alive())


def test_a_client_that_cannot_start_leaves_no_thread(settings: PlazaSettings) -> None:
    away = settings.kafka.model_copy(update={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    before = loop_threads()
    for _ in range(2):
        with pytest.raises(Exception):  # noqa: B017  (aiokafka's connection error)
            SyncPlazaClient(settings.model_copy(update={"kafka": away}))
    assert loop_threads() == before


async def test_close_ends_a_call_waiting_in_another_thread(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    config = (REPOSITORY / "identity" / "config.pbtxt").read_text()
    s = settings.model_copy(update={"repository": model_variant(tmp_path, "identity", config)})
    client = SyncPlazaClient(s)
    job = client.submit("identity", {"INPUT0": np.ones((1, 2), np.float32)})  # no worker runs
    outcome: list[BaseException | None] = []

    def poll() -> None:
        try:
            client.result(job, timeout_s=600)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    def polling() -> bool:  # the call is on the client's loop, waiting for the job
        return any("result" in repr(t.get_coro()) for t in asyncio.all_tasks(client._loop))

    poller = threading.Thread(target=poll)
    poller.start()
    await wait_for(polling, 30, "the poll to be under way")
    await asyncio.to_thread(client.close)
    await asyncio.to_thread(poller.join, JOIN_S)
    assert not poller.is_alive(), "the polling call still waits after close"
    [ended] = outcome
    assert isinstance(ended, Unavailable) and "before the call ended" in str(ended)
    with pytest.raises(Unavailable, match="is closed"):
        client.poll(job)
