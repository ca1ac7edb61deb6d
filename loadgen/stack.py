"""A Plaza deployment for benchmarks and tests: services, workers and a gateway, all local.

``Services`` starts Kafka and Redis (``plaza.stack.local_services``) on free loopback ports, or
wraps ones that already run. A ``Deployment`` is one isolated Plaza on them (its own topic
and key prefix, its own repository folder); ``Processes`` runs its workers
(``python -m plaza.cli.main worker``) and gateway as child processes, logs to files, and
stops them all (SIGTERM, then SIGKILL). Children die with this process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from plaza.loadgen.inputs import InputSet
from plaza.repository import CONFIG_FILENAME
from plaza.settings import KafkaSettings, PlazaSettings, RedisSettings, WorkerSettings
from plaza.stack.local_services import KafkaCluster, RedisServer, free_port

ConfigEdit = Callable[[mc.ModelConfig], None]


class Services:
    """Kafka + Redis: started here (under ``data_dir``) unless addresses are given."""

    def __init__(
        self,
        data_dir: Path,
        *,
        bootstrap: str | None = None,
        redis_url: str | None = None,
        fast_start: bool = False,
    ) -> None:
        self.kafka: KafkaCluster | None = None
        self.redis: RedisServer | None = None
        if bootstrap is None:
            self.kafka = KafkaCluster(
                data_dir / "kafka", port=free_port(count=2), fast_start=fast_start
            )
        if redis_url is None:
            self.redis = RedisServer(data_dir / "redis", port=free_port())
        self._bootstrap = bootstrap
        self._redis_url = redis_url

    @property
    def bootstrap(self) -> str:
        return self._bootstrap or (self.kafka.bootstrap_servers if self.kafka else "")

    @property
    def redis_url(self) -> str:
        return self._redis_url or (self.redis.url if self.redis else "")

    def start(self) -> Services:
        if self.kafka:
            self.kafka.start()
        if self.redis:
            self.redis.start()
        if self.kafka:
            self.kafka.wait_ready(120)
        if self.redis:
            self.redis.wait_ready()
        return self

    def stop(self) -> None:
        if self.redis:
            self.redis.stop()
        if self.kafka:
            self.kafka.stop()

    def __enter__(self) -> Services:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass(frozen=True, slots=True)
class Deployment:
    """One Plaza on shared services: its prefix keeps its topics and keys apart."""

    bootstrap: str
    redis_url: str
    repository: Path
    prefix: str
    partitions: int = 4

    def env(self) -> dict[str, str]:
        """What a worker or gateway process of this deployment is started with."""
        return {
            **os.environ,
            "PLAZA_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "PLAZA_KAFKA__TOPIC_PREFIX": f"{self.prefix}.",
            "PLAZA_KAFKA__PARTITIONS": str(self.partitions),
            "PLAZA_REDIS__URL": self.redis_url,
            "PLAZA_REDIS__KEY_PREFIX": f"{self.prefix}:",
            "PLAZA_REPOSITORY": str(self.repository),
            "PLAZA_LOG_LEVEL": "WARNING",
            "PLAZA_WORKER__HEARTBEAT_INTERVAL_S": "0.5",
        }

    def settings(self) -> PlazaSettings:
        """Settings for a client (SDK) of this deployment."""
        return PlazaSettings(
            repository=self.repository,
            kafka=KafkaSettings(
                bootstrap_servers=self.bootstrap,
                topic_prefix=f"{self.prefix}.",
                partitions=self.partitions,
            ),
            redis=RedisSettings(url=self.redis_url, key_prefix=f"{self.prefix}:"),
            worker=WorkerSettings(),
        )


def new_prefix(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


def copy_model(source: Path, target_repo: Path, model: str, edit: ConfigEdit | None = None) -> Path:
    """``source/model`` into ``target_repo`` (model files linked, not copied), the config
    edited by ``edit``; a version folder ``1/`` is made when the source has none."""
    src, dst = source / model, target_repo / model
    dst.mkdir(parents=True, exist_ok=True)
    versions = [p for p in src.iterdir() if p.is_dir() and p.name.isdigit()]
    for version in versions:
        (dst / version.name).mkdir(exist_ok=True)
        for f in version.iterdir():
            link = dst / version.name / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    if not versions:
        (dst / "1").mkdir(exist_ok=True)
    config = mc.ModelConfig()
    text_format.Parse((src / CONFIG_FILENAME).read_text(encoding="utf-8"), config)
    if edit is not None:
        edit(config)
    (dst / CONFIG_FILENAME).write_text(text_format.MessageToString(config), encoding="utf-8")
    return dst


def set_parameters(**values: str | int | float) -> ConfigEdit:
    """An edit that sets config ``parameters`` (string values)."""

    def edit(config: mc.ModelConfig) -> None:
        for key, value in values.items():
            config.parameters[key].string_value = str(value)

    return edit


def chain(*edits: ConfigEdit) -> ConfigEdit:
    def edit(config: mc.ModelConfig) -> None:
        for e in edits:
            e(config)

    return edit


# -- processes -------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Not Linux: no prctl, and children may outlive a parent killed with -9.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


class Processes:
    """Child processes of a benchmark; ``stop_all`` ends each one by its own pid."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        self.procs.append(proc)
        return proc

    def worker(self, dep: Deployment, model: str, index: int = 0) -> subprocess.Popen[bytes]:
        return self.spawn(
            f"{dep.prefix}-worker-{model}-{index}",
            ["-m", "plaza.cli.main", "worker", "--worker.model", model],
            dep.env(),
        )

    def gateway(self, dep: Deployment, port: int) -> subprocess.Popen[bytes]:
        return self.spawn(
            f"{dep.prefix}-gateway",
            ["-m", "plaza.cli.main", "gateway", "--gateway.http_port", str(port)],
            dep.env(),
        )

    def check(self) -> None:
        dead = [p for p in self.procs if p.poll() is not None]
        if dead:
            commands = [str(p.args) for p in dead]
            raise RuntimeError(f"child process(es) exited: {commands} (logs in {self.log_dir})")

    def stop(self, procs: Sequence[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p in self.procs:
                self.procs.remove(p)

    def stop_all(self, timeout: float = 30.0) -> None:
        self.stop(list(self.procs), timeout)


# -- readiness -------------------------------------------------------------------------------


async def wait_workers(
    dep: Deployment, model: str, count: int, procs: Processes, timeout_s: float = 120.0
) -> None:
    """Until ``count`` workers of ``model`` are in the registry (they heartbeat there)."""
    from plaza.connections import redis_client

    settings = dep.settings()
    redis = redis_client(settings.redis)
    key = settings.names.worker_registry_key(model)
    deadline = time.monotonic() + timeout_s
    try:
        while await redis.zcount(key, time.time(), "+inf") < count:
            procs.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} workers of {model} not up after {timeout_s:.0f}s")
            await asyncio.sleep(0.2)
    finally:
        await redis.aclose()


async def wait_http_ready(url: str, procs: Processes, timeout_s: float = 120.0) -> None:
    """Until ``url``/v2/health/ready answers 200."""
    from plaza.loadgen.http_client import open_transport

    transport = open_transport(1, 2.0)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            procs.check()
            try:
                if (await transport.get(f"{url}/v2/health/ready")).status == 200:
                    return
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s")
            await asyncio.sleep(0.2)
    finally:
        await transport.close()


async def warm_up(
    dep: Deployment,
    model: str,
    pool: Sequence[InputSet],
    workers: int = 1,
    timeout_s: float = 120.0,
) -> None:
    """Send requests until answers came from ``workers`` distinct workers: every worker has
    its partitions (the group settled) and has run the model once."""
    from plaza.client import PlazaClient

    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    async with PlazaClient(dep.settings()) as client:
        while len(seen) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"answers from {len(seen)} of {workers} workers of {model}")
            batch = [client.infer(model, pool[i % len(pool)], timeout_s=30) for i in range(16)]
            for result in await asyncio.gather(*batch):
                seen.add(result.worker)


def http_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
