"""Helpers shared by integration tests: settings for a test's own prefixes, a running worker."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import shutil
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from plaza.connections import kafka_admin
from plaza.gateway.main import Serving, serving
from plaza.settings import (
    GatewaySettings,
    KafkaSettings,
    PlazaSettings,
    RedisSettings,
    WorkerSettings,
)
from plaza.stack import Deployment
from plaza.stack import wait_for as wait_for  # the one bounded wait, for the tests
from plaza.workers.backends import Backend
from plaza.workers.backends.base import Arrays
from plaza.workers.worker import Worker

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"


def make_settings(
    bootstrap: str,
    redis_url: str,
    prefix: str,
    *,
    model: str = "",
    repository: Path = REPOSITORY,
    kafka: dict[str, Any] | None = None,
    redis: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
) -> PlazaSettings:
    """Settings whose topics and keys belong to this test alone (``prefix``)."""
    return PlazaSettings(
        repository=repository,
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap, topic_prefix=f"{prefix}.", partitions=2, **(kafka or {})
        ),
        redis=RedisSettings(url=redis_url, key_prefix=f"{prefix}:", **(redis or {})),
        worker=WorkerSettings(
            model=model, intra_op_threads=1, heartbeat_interval_s=0.5, **(worker or {})
        ),
        gateway=GatewaySettings(**(gateway or {})),
    )


def with_model(settings: PlazaSettings, model: str, **worker: Any) -> PlazaSettings:
    """The same settings for a worker of ``model``."""
    section = settings.worker.model_copy(update={"model": model, **worker})
    return settings.model_copy(update={"worker": section})


def model_variant(root: Path, name: str, config: str, base: str = "identity") -> Path:
    """A repository under ``root`` holding ``base``'s model files under ``name`` with
    ``config`` as its config.pbtxt (for tests of batching, priority and queue policies)."""
    target = root / name
    shutil.copytree(REPOSITORY / base / "1", target / "1")
    (target / "config.pbtxt").write_text(config)
    return root


@asynccontextmanager
async def running_worker(
    settings: PlazaSettings, model: str, **worker: Any
) -> AsyncIterator[Worker]:
    """A started worker of ``model``, stopped (drained, committed) on exit."""
    w = Worker(with_model(settings, model, **worker))
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


@asynccontextmanager
async def running_workers(settings: PlazaSettings, *models: str) -> AsyncIterator[list[Worker]]:
    """A started worker of each of ``models``, started at once rather than one after
    another (each start spawns and loads its own model process); all stopped on exit,
    and those that started are stopped when another fails to start."""
    workers = [Worker(with_model(settings, model)) for model in models]
    starts = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
    started = [w for w, got in zip(workers, starts, strict=True) if got is None]
    try:
        for got in starts:
            if isinstance(got, BaseException):
                raise got
        yield workers
    finally:
        await asyncio.gather(*(w.stop() for w in started))


def loopback_socket() -> socket.socket:
    """A TCP socket bound to a free 127.0.0.1 port (not listening yet), for a test server."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def gateway_fronts(settings: PlazaSettings) -> AsyncIterator[Serving]:
    """Both fronts of one gateway (``plaza.gateway.main.serving``) on free 127.0.0.1 ports."""
    sock = loopback_socket()
    try:
        async with serving(settings, http_socket=sock, grpc_port=0) as running:
            yield running
    finally:
        sock.close()


def task_stacks() -> str:
    """Every asyncio task of the running loop with the line it waits on (for a hang's report:
    pytest-timeout's dump shows threads, and a hung test's main thread is only the loop)."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=12, file=out)
    return out.getvalue()


@asynccontextmanager
async def phase(name: str, limit_s: float) -> AsyncIterator[None]:
    """Fail the test, naming ``name``, when the block takes longer than ``limit_s``: a hang
    reports where it is (every task's stack, taken while it still hangs, in the captured
    output) instead of running into pytest's timeout."""
    stacks: list[str] = []
    dump = asyncio.get_running_loop().call_later(limit_s, lambda: stacks.append(task_stacks()))
    try:
        async with asyncio.timeout(limit_s + 0.5):
            yield
    except TimeoutError:
        print("".join(stacks))
        pytest.fail(f"{name} did not finish in {limit_s:g} s (task stacks in the captured output)")
    finally:
        dump.cancel()


KILLED_SESSION_TIMEOUT_MS = 3000
"""The consumer group session timeout of the worker processes a test kills. A killed
worker holds its partitions until its session times out (the group cannot tell a dead
member from a slow one sooner), so this is a wait every such test makes. 3 s: the least
Plaza allows (``kafka.session_timeout_ms``; the dev and CI brokers allow 1 s), still
three of a live member's heartbeats (one a second)."""


class _ShortSessionDeployment(Deployment):
    """A deployment whose worker processes (and ensemble runners) join their groups with
    ``KILLED_SESSION_TIMEOUT_MS``; a variable the caller sets wins."""

    def env(self, **extra: str) -> dict[str, str]:
        session = {"PLAZA_KAFKA__SESSION_TIMEOUT_MS": str(KILLED_SESSION_TIMEOUT_MS)}
        return super().env(**{**session, **extra})


def short_session(deployment: Deployment) -> Deployment:
    """``deployment``, its processes with a short group session (``KILLED_SESSION_TIMEOUT_MS``):
    for a test that kills a worker and waits for the group to hand its partitions on."""
    fields = {f.name: getattr(deployment, f.name) for f in dataclasses.fields(deployment)}
    return _ShortSessionDeployment(**fields)


def sim_deployment(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> Deployment:
    """A deployment (two partitions a topic) of ``sim`` (simulated, 16 values a row) in a
    repository of its own (``explicit_sim_settings``'s), for supervisor tests."""
    made = explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)
    return Deployment(kafka_bootstrap, redis_url, made.repository, prefix=unique_id, partitions=2)


def explicit_sim_settings(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> PlazaSettings:
    """Model control mode explicit on a test's prefixes, with a repository of its own under
    ``tmp_path`` holding ``sim`` (the simulated sample, every version served); nothing is
    loaded at start, and a load waits 1 s at most for a worker."""
    root = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "simulated", root / "sim")
    config = (root / "sim" / "config.pbtxt").read_text().replace('"simulated"', '"sim"')
    (root / "sim" / "config.pbtxt").write_text(config + "\nversion_policy { all { } }\n")
    gateway = {"model_control_mode": "explicit", "load_timeout_s": 1}
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root, gateway=gateway)


@contextlib.asynccontextmanager
async def serving_worker(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """``worker`` started and serving as a host runs it (``run_until_stopped``, which ends
    and raises when one of its tasks fails); the task is yielded, and the worker stopped on
    exit."""
    stop = asyncio.Event()
    await worker.start()
    watch = asyncio.create_task(worker.run_until_stopped(stop))
    try:
        yield watch
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await watch
        await worker.stop()


def still_serving(watch: asyncio.Task[None]) -> None:
    """Fail at once, with the worker's own error, if the worker (``serving_worker``) stopped."""
    if watch.done():
        watch.result()
        raise AssertionError("the worker stopped")


async def group_offsets(
    settings: PlazaSettings, model: str, tps: list[TopicPartition]
) -> dict[TopicPartition, tuple[int, int]]:
    """Per partition of ``tps``: the model's worker group's committed offset (-1: none) and
    the partition's end offset."""
    admin = kafka_admin(settings.kafka)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers, group_id=None)
    try:
        await admin.start()
        await consumer.start()
        group = settings.names.consumer_group(model)
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        ends = await consumer.end_offsets(tps)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await admin.close()
    return {tp: (committed[tp].offset if tp in committed else -1, ends[tp]) for tp in tps}


def set_bls_environment(settings: PlazaSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PLAZA_* environment a worker's model process reads for its BLS calls (Kafka and
    Redis, with the test's prefixes), as ``plaza up`` and the stack set it for the workers
    they start."""
    env = {
        "PLAZA_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "PLAZA_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "PLAZA_KAFKA__PARTITIONS": str(settings.kafka.partitions),
        "PLAZA_REDIS__URL": settings.redis.url,
        "PLAZA_REDIS__KEY_PREFIX": settings.redis.key_prefix,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)


class GatedBackend:
    """A model's own backend whose executions wait until the test opens ``gate``
    (``entered`` is set as one begins): what a busy instance looks like."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.device = inner.device
        self.entered = threading.Event()
        self.gate = threading.Event()

    def load(self) -> None:
        self.inner.load()

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        self.entered.set()
        self.gate.wait(60)
        return self.inner.infer(inputs, outputs)

    def unload(self) -> None:
        self.inner.unload()


def gated(worker: Worker) -> GatedBackend:
    """Gate ``worker``'s version 1 backend (``GatedBackend``); the gate, to open."""
    gate = GatedBackend(worker.runner.backends[1])
    worker.runner.backends[1] = gate
    return gate


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The command's exit status (argparse's usage errors included), stdout and stderr."""
    from plaza.cli.main import main

    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err
