"""plaza up starts Kafka or Redis again when it exits, backing off; gives up after 5 in a row."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import redis.asyncio

from plaza.cli import up
from plaza.cli.up import RESTART_MAX_S, RESTART_TRIES, ServiceRestarts
from plaza.stack import RedisServer, free_port
from plaza.stack.errors import ServiceError
from tests.support import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class FakeService:
    """Exits when told; ``refuse`` makes each start raise."""

    def __init__(self) -> None:
        self.name = "Redis"
        self.exited = False
        self.refuse = False
        self.dies_at_once = False
        self.starts = 0

    def check(self) -> None:
        if self.exited:
            raise ServiceError("redis-server exited with code -9\nlog tail")

    def restart(self) -> None:
        self.starts += 1
        if self.refuse:
            raise ServiceError("port 6379 in use")
        self.exited = self.dies_at_once


def _setup() -> tuple[FakeService, Clock, list[str], ServiceRestarts]:
    service, clock, said = FakeService(), Clock(), list[str]()
    return service, clock, said, ServiceRestarts(service, clock=clock, say=said.append)


def _run_until(restarts: ServiceRestarts, clock: Clock, until: float) -> None:
    while clock.now < until:
        restarts.watch()
        clock.now += 0.5


def test_an_exited_service_is_started_again_after_a_second() -> None:
    service, clock, said, restarts = _setup()
    restarts.watch()
    service.exited = True
    _run_until(restarts, clock, clock.now + 0.9)
    assert service.starts == 0
    _run_until(restarts, clock, clock.now + 0.5)
    assert service.starts == 1 and not service.exited
    assert said[0].startswith("plaza up: redis-server exited with code -9")
    assert said[1:] == ["plaza up: restarting Redis in 1 s", "plaza up: Redis started again"]


def test_back_off_doubles_then_gives_up_after_five_failed_starts() -> None:
    service, clock, said, restarts = _setup()
    service.exited = service.refuse = True
    with pytest.raises(ServiceError, match="failed to start 5 times in a row") as caught:
        _run_until(restarts, clock, clock.now + 3600)
    assert service.starts == RESTART_TRIES
    delays = [line.rsplit(" in ", 1)[1] for line in said if "restarting" in line]
    assert delays == ["1 s", "2 s", "4 s", "8 s", "16 s"]
    assert "port 6379 in use" in caught.value.message


def test_exits_soon_after_each_restart_count_as_failed_starts() -> None:
    service, clock, said, restarts = _setup()
    service.exited = service.dies_at_once = True
    with pytest.raises(ServiceError, match="failed to start 5 times"):
        _run_until(restarts, clock, clock.now + 3600)
    assert service.starts == RESTART_TRIES
    delays = [line.rsplit(" in ", 1)[1] for line in said if "restarting" in line]
    assert delays == ["1 s", "2 s", "4 s", "8 s", "16 s"]


def test_a_restart_that_stays_up_resets_the_back_off() -> None:
    service, clock, said, restarts = _setup()
    for _ in range(3 * RESTART_TRIES):
        service.exited = True
        _run_until(restarts, clock, clock.now + 40 + RESTART_MAX_S)  # up for > RESTART_MAX_S
    assert service.starts == 3 * RESTART_TRIES
    assert {line for line in said if "restarting" in line} == {"plaza up: restarting Redis in 1 s"}


async def test_watch_restarts_services_instead_of_stopping(monkeypatch: pytest.MonkeyPatch) -> None:
    service = FakeService()
    stopping = threading.Event()

    class Group:
        def check(self) -> None:
            if service.starts:
                stopping.set()

    clock = Clock()
    monkeypatch.setattr(up, "WATCH_S", 0)
    monkeypatch.setattr(
        up, "_restarts", lambda _services: [ServiceRestarts(service, clock=clock, say=print)]
    )
    service.exited = True
    original = ServiceRestarts.watch

    def watch(self: ServiceRestarts) -> None:
        clock.now += 0.5
        original(self)

    monkeypatch.setattr(ServiceRestarts, "watch", watch)

    class Services:  # what plaza up used to stop on
        def check(self) -> None:
            service.check()

    assert await up._watch(Group(), Services(), stopping) == 0  # type: ignore[arg-type]
    assert service.starts == 1


@pytest.mark.integration
async def test_a_killed_redis_comes_back_on_its_data_dir(tmp_path: Path) -> None:
    """A Redis of this test's own (not the shared one), SIGKILLed: started again on the
    same port and data dir, with what it had stored."""
    redis_dir = tmp_path / "redis"
    with RedisServer(redis_dir, port=free_port(), appendfsync="always") as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            await client.set("kept", b"yes")
            restarts = ServiceRestarts(up._Redis(server), say=lambda _line: None)
            assert server.pid is not None
            os.kill(server.pid, signal.SIGKILL)
            await wait_for(lambda: _restarted(restarts, server), 30.0, "Redis started again")
            await server.wait_ready_async()
            assert await client.get("kept") == b"yes"
        finally:
            await client.aclose()


def _restarted(restarts: ServiceRestarts, server: RedisServer) -> bool:
    restarts.watch()
    return server.running and restarts.started is not None
