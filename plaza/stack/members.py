"""Plaza's own processes: a host (or worker) and a gateway of a deployment, with readiness.

Both run ``python -m plaza.cli.main worker|gateway`` with :meth:`Deployment.env`; the stack
never imports the workers or the gateway. A host serves several models in one process
(``--host.models``), a worker is a host of one; either is ready when the heartbeat of each
of its models is in that model's registry (it is consuming by then); a gateway when
``/v2/health/live`` (or ``/ready``) answers 200.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import redis.asyncio

from plaza.stack.deployment import Deployment
from plaza.stack.ports import HOST, free_port
from plaza.stack.process import ChildProcess, ProcessGroup
from plaza.stack.waiting import wait_for

READY_LIMIT_S = 120.0
PLAZA_MAIN = ("-m", "plaza.cli.main")

_ASSIGNED = re.compile(r": assigned \[(.*)\]$")
_REVOKED = re.compile(r": revoked \d+ partitions")
_PARTITION = re.compile(r":(\d+)'")


def plaza_argv(*args: str) -> list[str]:
    """``python -m plaza.cli.main <args>`` with this interpreter."""
    return [sys.executable, *PLAZA_MAIN, *args]


class HostProcess(ChildProcess):
    """``plaza worker --host.models A,B,...`` of a deployment: one process, several models.

    Its id (default ``<name>``) names it; each model's worker id is ``<id>.<model>``
    (``unit_id``), found in the model's registry and in result entries. ``env`` adds
    settings (``PLAZA_HOST__EXECUTION_SLOTS``); the id set here wins over it.
    """

    def __init__(
        self,
        deployment: Deployment,
        models: Sequence[str],
        log_dir: Path,
        *,
        name: str | None = None,
        host_id: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not models:
            raise ValueError("a host serves at least one model")
        name = name or f"{deployment.prefix}-host"
        self.deployment = deployment
        self.models = list(models)
        self.host_id = host_id or name
        own = {"PLAZA_WORKER__WORKER_ID": self.host_id}
        full_env = deployment.env(**{**(env or {}), **own})
        argv = plaza_argv("worker", *self._model_args())
        super().__init__(name, argv, log_dir / f"{name}.log", env=full_env)

    def _model_args(self) -> list[str]:
        return ["--host.models", ",".join(self.models)]

    def unit_id(self, model: str) -> str:
        """The worker id of ``model`` in this host (the host's own when it serves one)."""
        return self.host_id if len(self.models) == 1 else f"{self.host_id}.{model}"

    async def wait_registered(self, limit_s: float = READY_LIMIT_S) -> None:
        """Until every model's heartbeat is in its registry; fails at once if it exits."""
        client = _redis(self.deployment)
        names = self.deployment.names

        async def registered() -> bool:
            self.check()
            for model in self.models:
                key = names.worker_registry_key(model)
                score = await client.zscore(key, self.unit_id(model))
                if score is None or score <= time.time():
                    return False
            return True

        try:
            what = f"{self.host_id} in the registries of {self.models}"
            await wait_for(registered, limit_s, what, self.tail)
        finally:
            await client.aclose()


class WorkerProcess(HostProcess):
    """``plaza worker --worker.model M`` of a deployment, with a worker id chosen here.

    The id (default ``<name>``) is how the worker is found in the registry and in result
    entries. ``env`` adds settings (``PLAZA_WORKER__INTRA_OP_THREADS``) to the deployment's;
    the worker id set here wins over it.
    """

    def __init__(
        self,
        deployment: Deployment,
        model: str,
        log_dir: Path,
        *,
        name: str | None = None,
        worker_id: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        name = name or f"{deployment.prefix}-worker-{model}"
        self.model = model
        self.worker_id = worker_id or name
        super().__init__(deployment, [model], log_dir, name=name, host_id=self.worker_id, env=env)

    def _model_args(self) -> list[str]:
        return ["--worker.model", self.model]

    def assignment(self) -> set[int] | None:
        """Partitions it owns now, read from its log; None while it is rebalancing."""
        current: set[int] | None = None
        for line in self.log_text().splitlines():
            if match := _ASSIGNED.search(line):
                current = {int(p) for p in _PARTITION.findall(match.group(1))}
            elif _REVOKED.search(line):
                current = None
        return current


class GatewayProcess(ChildProcess):
    """``plaza gateway`` of a deployment on 127.0.0.1:``port``.

    The metrics and gRPC ports are free ones unless given: the defaults (8001, 8002) may be
    held by another gateway on this machine. ``env`` adds settings; the ports set here win.
    """

    def __init__(
        self,
        deployment: Deployment,
        port: int,
        log_dir: Path,
        *,
        name: str = "gateway",
        metrics_port: int | None = None,
        grpc_port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.deployment = deployment
        self.port = port
        own = {
            "PLAZA_GATEWAY__HTTP_PORT": str(port),
            "PLAZA_GATEWAY__METRICS_PORT": str(metrics_port or free_port()),
            "PLAZA_GATEWAY__GRPC_PORT": str(grpc_port or free_port()),
        }
        full_env = deployment.env(**{**(env or {}), **own})
        super().__init__(name, plaza_argv("gateway"), log_dir / f"{name}.log", env=full_env)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return http_url(self.port)

    async def wait_live(self, limit_s: float = READY_LIMIT_S) -> None:
        """Until ``/v2/health/live`` answers 200 (it serves; models may still load)."""
        await wait_http_ok(f"{self.url}/v2/health/live", [self], limit_s)

    async def wait_ready(self, limit_s: float = READY_LIMIT_S) -> None:
        """Until ``/v2/health/ready`` answers 200 (every model it serves is ready)."""
        await wait_http_ok(f"{self.url}/v2/health/ready", [self], limit_s)


def http_url(port: int) -> str:
    """``http://127.0.0.1:<port>``."""
    return f"http://{HOST}:{port}"


async def wait_http_ok(
    url: str, watch: Sequence[ChildProcess] | ProcessGroup = (), limit_s: float = READY_LIMIT_S
) -> None:
    """Until a GET of ``url`` answers 200; fails at once if a watched process crashed."""
    procs = watch.started if isinstance(watch, ProcessGroup) else watch

    async def ok() -> bool:
        for proc in procs:
            proc.check()
        return await asyncio.to_thread(http_ok, url)

    await wait_for(ok, limit_s, f"{url} to answer 200", lambda: _tails(procs), poll_s=0.2)


async def wait_http_ready(
    url: str, watch: Sequence[ChildProcess] | ProcessGroup = (), limit_s: float = READY_LIMIT_S
) -> None:
    """Until ``url``/v2/health/ready answers 200 (a gateway, or any KServe v2 server)."""
    await wait_http_ok(f"{url}/v2/health/ready", watch, limit_s)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_ok(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 now (blocking, at most about 2 s; no proxy)."""
    try:
        with _NO_PROXY.open(url, timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):  # not listening yet, or 503 while loading
        return False


async def wait_workers(
    deployment: Deployment,
    model: str,
    count: int,
    watch: Sequence[ChildProcess] | ProcessGroup = (),
    limit_s: float = READY_LIMIT_S,
) -> None:
    """Until ``count`` workers of ``model`` heartbeat in its registry."""
    procs = watch.started if isinstance(watch, ProcessGroup) else watch
    key = deployment.names.worker_registry_key(model)
    client = _redis(deployment)

    async def up() -> bool:
        for proc in procs:
            proc.check()
        return int(await client.zcount(key, time.time(), "+inf")) >= count

    try:
        what = f"{count} workers of {model} in {key}"
        await wait_for(up, limit_s, what, lambda: _tails(procs), poll_s=0.2)
    finally:
        await client.aclose()


async def wait_assignment(
    workers: Sequence[WorkerProcess], partitions: int, limit_s: float = 60.0
) -> None:
    """Until the workers own every partition between them, each some, none twice."""

    def settled() -> bool:
        owned = []
        for worker in workers:
            worker.check()
            got = worker.assignment()
            if not got:
                return False
            owned.append(got)
        return sorted(p for got in owned for p in got) == list(range(partitions))

    await wait_for(
        settled,
        limit_s,
        "a settled partition assignment",
        lambda: "\n".join(w.tail(10) for w in workers),
    )


def _tails(procs: Sequence[ChildProcess]) -> str:
    return "\n".join(proc.tail(10) for proc in procs)


def _redis(deployment: Deployment) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(
        deployment.redis_url, socket_timeout=5, socket_connect_timeout=1
    )
