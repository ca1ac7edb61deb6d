"""plaza.stack's checks before and around a start: stop requests end readiness waits, the
data dir is checked and cleared of Plaza's own only, ports and passwords are checked, and
a service that dies is reported with its exit code and log.

Nothing here needs Kafka; a few tests run a real redis-server (it starts in milliseconds).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
from pathlib import Path

import pytest
import redis

from plaza.stack import (
    Interrupted,
    RedisServer,
    ServiceError,
    ServiceOptionError,
    Services,
    free_port,
    until_stopped,
    wait_for,
)
from plaza.stack.data_dir import prepare_data_dir
from plaza.stack.managed import ManagedService
from plaza.stack.ports import check_ports

# -- a stop request ends a readiness wait ---------------------------------------------------


async def test_a_stop_request_ends_a_wait_that_would_never_end() -> None:
    stop = threading.Event()
    looks = 0
    cleaned_up = asyncio.Event()

    async def stuck() -> None:  # as a metadata request to a broker that never answers
        nonlocal looks
        looks += 1
        try:  # bounded, so that without a working stop the test fails rather than hangs
            await asyncio.wait_for(asyncio.Event().wait(), 30)
        finally:
            cleaned_up.set()

    waiting = asyncio.create_task(until_stopped(stuck(), stop, "a broker"))
    await wait_for(lambda: looks == 1, 30, "the wait to begin")
    stop.set()  # as the SIGINT handler does, from the main thread
    with pytest.raises(Interrupted, match="a broker"):
        await waiting
    assert cleaned_up.is_set()  # the inner wait was cancelled, not left running


async def test_without_a_stop_request_the_wait_gives_its_own_result() -> None:
    assert await until_stopped(asyncio.sleep(0, "ready"), threading.Event()) == "ready"
    assert await until_stopped(asyncio.sleep(0, "ready"), None) == "ready"


class NeverReady(ManagedService):
    """A service that never answers (pure: starts nothing)."""

    def start(self) -> NeverReady:
        return self

    def stop(self, timeout: float = 30.0) -> None:
        pass

    async def wait_ready_async(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        await wait_for(lambda: False, 30, "an answer that never comes")  # bounded: see above


def test_a_services_readiness_wait_ends_once_stop_is_set() -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(Interrupted):
        NeverReady().wait_ready(3600, stop)


def test_services_start_ends_on_a_stop_request_and_stop_ends_what_started(
    tmp_path: Path,
) -> None:
    services = Services(tmp_path, bootstrap="127.0.0.1:1", redis_port=free_port())
    stop = threading.Event()
    stop.set()
    try:
        with pytest.raises(Interrupted):
            services.start(stop)
        assert services.redis is not None and services.redis.pid is not None  # it had started
    finally:
        services.stop()
    assert not services.redis.running


# -- the data dir -------------------------------------------------------------------------


def plaza_made(data_dir: Path) -> None:
    """What a Services start leaves in a data dir (a few representative entries)."""
    (data_dir / "kafka" / "node-0" / "data").mkdir(parents=True)
    (data_dir / "kafka" / "cluster.id").write_text("abc\n")
    (data_dir / "redis" / "appendonlydir").mkdir(parents=True)
    for name in ("redis.conf", "redis.log", "stdout.log"):
        (data_dir / "redis" / name).write_text("x")


def test_a_fresh_start_clears_what_plaza_made(tmp_path: Path) -> None:
    plaza_made(tmp_path)
    Services.clear_data_dir(tmp_path)
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("foreign", "named"),
    [
        ("notes.txt", "notes.txt"),
        ("kafka/mine.txt", "kafka/mine.txt"),
        ("redis/backup", "redis/backup"),
        ("logs/a.log", "logs"),  # a folder of its own: named as a whole
    ],
)
def test_a_fresh_start_refuses_a_folder_holding_anything_else(
    tmp_path: Path, foreign: str, named: str
) -> None:
    plaza_made(tmp_path)
    (tmp_path / foreign).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / foreign).write_text("precious")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ServiceOptionError, match=re.escape(f"holds {named},")):
        Services.clear_data_dir(tmp_path)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_fresh_start_never_follows_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cluster.id").write_text("not plaza's to delete")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "kafka").symlink_to(elsewhere)
    with pytest.raises(ServiceOptionError, match="kafka"):
        Services.clear_data_dir(data_dir)
    assert (elsewhere / "cluster.id").exists()


def test_a_data_dir_is_made_or_refused_clearly(tmp_path: Path) -> None:
    assert prepare_data_dir(tmp_path / "a" / "b") == (tmp_path / "a" / "b").resolve()
    assert (tmp_path / "a" / "b").is_dir()
    plain = tmp_path / "plain"
    plain.write_text("a file")
    with pytest.raises(ServiceOptionError, match="not a folder"):
        prepare_data_dir(plain)
    with pytest.raises(ServiceOptionError, match="cannot create"):
        prepare_data_dir(plain / "below")


def test_redis_start_turns_a_bad_data_dir_into_a_service_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("a file")
    with pytest.raises(ServiceError, match="Redis data dir"):
        RedisServer(plain / "redis", port=free_port()).start()


# -- ports and the password -----------------------------------------------------------------


def test_ports_used_twice_or_out_of_range_are_named() -> None:
    services = Services(Path("unused"), kafka_port=20000, kafka_nodes=2, redis_port=20002)
    ports = services.ports()
    assert ports == {
        "kafka": [20000, 20001],
        "kafka controller": [20002, 20003],
        "redis": [20002],
    }
    with pytest.raises(ServiceOptionError, match="controller and --redis-port both use port 20002"):
        check_ports({"controller": ports["kafka controller"], "--redis-port": ports["redis"]})
    with pytest.raises(ServiceOptionError, match="--redis-port 99999"):
        check_ports({"--kafka-port": [9092], "--redis-port": [99999]})
    check_ports({"--kafka-port": [9092, 9093], "--redis-port": [6379]})  # all fine


def test_the_redis_url_carries_any_password(tmp_path: Path) -> None:
    password = "p@ss/w#rd?:%20 x"
    with RedisServer(tmp_path, port=free_port(), password=password) as server:
        client = redis.Redis.from_url(server.url)
        try:
            assert client.connection_pool.connection_kwargs["password"] == password
            assert client.ping()
        finally:
            client.close()


@pytest.mark.parametrize("password", ['a"b', "a\nb", "a\\b", "a\rb", "a\x00b"])
def test_a_password_redis_conf_cannot_hold_is_refused(tmp_path: Path, password: str) -> None:
    with pytest.raises(ServiceOptionError, match=r"redis\.conf"):
        RedisServer(tmp_path / "redis", password=password)
    assert list(tmp_path.iterdir()) == []


# -- a service that dies -------------------------------------------------------------------


async def test_a_dead_service_is_reported_with_its_exit_code_and_log(tmp_path: Path) -> None:
    with Services(tmp_path, bootstrap="127.0.0.1:1", redis_port=free_port()) as services:
        server = services.redis
        assert server is not None and server.pid is not None
        services.check()  # all well
        os.kill(server.pid, signal.SIGKILL)  # our own child
        await wait_for(lambda: not server.running, 30, "redis-server to exit")
        with pytest.raises(ServiceError) as failed:
            services.check()
    assert "exited with code -9" in failed.value.message
    assert str(server.log_file) in failed.value.message  # the tail's header names the log
