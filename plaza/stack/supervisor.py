"""Running the workers the model table asks for (``plaza up --process-per-model`` in modes
explicit and poll; without the flag ``plaza up`` runs one host that follows the table
itself, ``workers/model_watch.py``).

The gateway decides what is loaded and writes it to the deployment's model table
(``plaza.model_control``); the supervisor makes it so on this machine. Each round
(:meth:`ModelSupervisor.reconcile`) it starts a worker process for a model that is loaded
and has none (a host of that one model: its ``instance_group`` count of executions run in
parallel inside it, docs/hosts.md), restarts them when the model's generation changed (a
reload: a new config or version folder), and retires the workers of an unloaded model:
they keep serving until the model's queue is drained (the gateway accepts no new requests
for it), then get SIGTERM, so requests already queued are answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio

from plaza.errors import PlazaError
from plaza.model_control import DesiredModel, ModelTable, model_spec
from plaza.queueing import BacklogProbe
from plaza.repository import ModelRepository
from plaza.stack.deployment import Deployment
from plaza.stack.members import WorkerProcess
from plaza.stack.process import ProcessGroup

log = logging.getLogger(__name__)

DRAIN_LIMIT_S = 60.0
"""A retiring model's workers serve its queue this long at most before they are stopped."""
DRAIN_POLL_S = 0.25
STOP_TIMEOUT_S = 40.0


@dataclass(slots=True)
class _Running:
    generation: int
    workers: list[WorkerProcess] = field(default_factory=list)


class ModelSupervisor:
    """Starts, restarts and retires workers to match the model table."""

    def __init__(
        self,
        deployment: Deployment,
        repository: Path,
        group: ProcessGroup,
        *,
        env: Mapping[str, str] | None = None,
        drain_limit_s: float = DRAIN_LIMIT_S,
    ) -> None:
        self._deployment = deployment
        self._repo = ModelRepository(
            repository,
            deployment.model_config_name,
            auto_complete=not deployment.disable_auto_complete_config,
        )
        self._group = group
        self._env = dict(env or {})
        self._drain_limit_s = drain_limit_s
        self._settings = deployment.settings()
        self._redis = redis.asyncio.Redis.from_url(deployment.redis_url)
        self._table = ModelTable(self._redis, deployment.names)
        self._backlog = BacklogProbe(self._settings.kafka, deployment.names)
        self.running: dict[str, _Running] = {}

    async def start(self) -> None:
        await self._backlog.start()

    async def close(self) -> None:
        await self._backlog.stop()
        await self._redis.aclose()

    async def reconcile(self) -> None:
        """One round: make the running workers match the table."""
        for name, desired in sorted((await self._table.read()).items()):
            running = self.running.get(name)
            if desired.loaded and (running is None or running.generation != desired.generation):
                if running is not None:
                    await self._retire(name, running, drain=False)  # a reload: restart now
                self._launch(name, desired)
            elif not desired.loaded and running is not None:
                await self._retire(name, running, drain=True)

    def _launch(self, name: str, desired: DesiredModel) -> None:
        try:
            count = model_spec(self._repo, name, desired.config).instance_count
        except PlazaError as exc:  # the gateway checked it; the repository changed since
            log.error("supervisor: not starting %s: %s", name, exc.message)
            return
        env = {**self._env, "PLAZA_WORKER__MODEL_CONFIG_JSON": desired.config}
        running = _Running(desired.generation)
        worker_name = f"worker-{name}-{desired.generation % 100_000}-0"
        worker = WorkerProcess(
            self._deployment, name, self._group.log_dir, name=worker_name, env=env
        )
        running.workers.append(self._group.start(worker))
        self.running[name] = running
        log.info("supervisor: started a worker of %s (%d instances)", name, count)

    async def _retire(self, name: str, running: _Running, *, drain: bool) -> None:
        if drain:
            await self._drain(name)
        await asyncio.to_thread(self._group.stop, running.workers, STOP_TIMEOUT_S)
        self.running.pop(name, None)
        log.info("supervisor: stopped the workers of %s", name)

    async def _drain(self, name: str) -> None:
        """Until the model's queues are committed (every request answered), bounded."""
        try:
            spec = model_spec(self._repo, name)
            levels = spec.batching.priority_levels
        except PlazaError:
            levels = 0
        topics = self._deployment.names.request_topics(name, levels)
        deadline = time.monotonic() + self._drain_limit_s
        while time.monotonic() < deadline:
            try:
                lags = [await self._backlog.lag(name, topic) for topic in topics]
            except Exception as exc:  # Kafka away: stop anyway once the limit passes
                log.warning("supervisor: lag of %s unknown: %s", name, exc)
                lags = [1]
            if sum(lags) == 0:
                return
            await asyncio.sleep(DRAIN_POLL_S)
        log.warning(
            "supervisor: %s still had queued requests after %.0f s", name, self._drain_limit_s
        )
