"""Running the workers the model table asks for (``plaza up --process-per-model`` in modes
explicit and poll; without the flag ``plaza up`` runs one host that follows the table
itself, ``workers/model_watch.py``).

The gateway decides what is loaded and writes it to the deployment's model table
(``plaza.model_control``); the supervisor makes it so on this machine. Each round
(:meth:`ModelSupervisor.reconcile`) it starts a worker process for a model that is loaded
and has none (a host of that one model: its ``instance_group`` count of executions run in
parallel inside it, docs/hosts.md), and retires the workers of an unloaded model: they keep
serving until the model's queue is drained (the gateway accepts no new requests for it),
then get SIGTERM, so requests already queued are answered.

Each worker is told the table's generation it serves (``worker.generation``) and names it in
its registry entry, so a load waits for a worker of its own generation
(``plaza.model_control.serves_generation``). A reload (a new generation: a new config or
version folder) is a hand-over, as a model host's: the new generation's worker starts beside
the one serving (both members of the model's consumer group), and once its registry entry
names the new generation the old worker stops, answering what it holds. A new worker that
exits before it serves (a config its backend refuses, ...), or does not serve within
``start_limit_s``, is reported in the table (``ModelTable.fail``: the waiting load answers
with the reason, its log's last line) and the old worker serves on; that generation is not
tried again until the next load. A worker still starting joins the process group only once
it serves, so its failure is the load's, never the whole ``plaza up``'s.
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
from plaza.model_control import DesiredModel, ModelTable, live_generations, model_spec
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
START_LIMIT_S = 120.0
"""A new worker that does not serve within this long is stopped and its generation failed."""
ERROR_PREFIX = "plaza worker: error: "
"""How ``plaza worker`` begins the one line it prints for a failed start."""


@dataclass(slots=True)
class _Running:
    generation: int
    workers: list[WorkerProcess] = field(default_factory=list)


@dataclass(slots=True)
class _Starting:
    """A generation's worker started and not serving yet (not in the process group)."""

    desired: DesiredModel
    worker: WorkerProcess
    since: float


class ModelSupervisor:
    """Starts, hands over and retires workers to match the model table."""

    def __init__(
        self,
        deployment: Deployment,
        repository: Path,
        group: ProcessGroup,
        *,
        env: Mapping[str, str] | None = None,
        drain_limit_s: float = DRAIN_LIMIT_S,
        start_limit_s: float = START_LIMIT_S,
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
        self._start_limit_s = start_limit_s
        self._settings = deployment.settings()
        self._redis = redis.asyncio.Redis.from_url(deployment.redis_url)
        self._table = ModelTable(self._redis, deployment.names)
        self._backlog = BacklogProbe(self._settings.kafka, deployment.names)
        self.running: dict[str, _Running] = {}
        """Per model, the workers serving it (members of the process group)."""
        self.starting: dict[str, _Starting] = {}
        """Per model, a new generation's worker not serving yet."""
        self._given_up: dict[str, int] = {}
        """Per model, the generation whose worker failed: not started again."""

    async def start(self) -> None:
        await self._backlog.start()

    async def close(self) -> None:
        """Stop the workers still starting (the group stops the others) and disconnect."""
        starting = [s.worker for s in self.starting.values()]
        self.starting.clear()
        await asyncio.to_thread(self._group.stop, starting, STOP_TIMEOUT_S)
        await self._backlog.stop()
        await self._redis.aclose()

    async def reconcile(self) -> None:
        """One round: make the running workers match the table."""
        for name, desired in sorted((await self._table.read()).items()):
            if name in self.starting:
                await self._settle(name, desired)
            running = self.running.get(name)
            if desired.loaded and (running is None or running.generation != desired.generation):
                if name not in self.starting and not self._failed(name, desired):
                    await self._launch(name, desired)
            elif not desired.loaded and running is not None:
                await self._retire(name, running, drain=True)

    def _failed(self, name: str, desired: DesiredModel) -> bool:
        """Whether a worker of this generation failed already (here or before a restart)."""
        return bool(desired.failed) or self._given_up.get(name) == desired.generation

    async def _launch(self, name: str, desired: DesiredModel) -> None:
        """Start a worker of ``desired``'s generation beside the one serving, if any."""
        try:
            await asyncio.to_thread(model_spec, self._repo, name, desired.config)
        except PlazaError as exc:  # the gateway checked it; the repository changed since
            await self._fail(name, desired, exc.message)
            return
        env = {
            **self._env,
            "PLAZA_WORKER__MODEL_CONFIG_JSON": desired.config,
            "PLAZA_WORKER__GENERATION": str(desired.generation),
        }
        worker_name = f"worker-{name}-{desired.generation % 100_000}-0"
        worker = WorkerProcess(
            self._deployment, name, self._group.log_dir, name=worker_name, env=env
        )
        self.starting[name] = _Starting(desired, worker.start(), time.monotonic())
        log.info("supervisor: starting a worker of %s (generation %d)", name, desired.generation)

    async def _settle(self, name: str, desired: DesiredModel) -> None:
        """A starting worker: serving (the old one stops), failed, or no longer wanted."""
        item = self.starting[name]
        generation = item.desired.generation
        moved_on = not desired.loaded or desired.generation != generation
        if moved_on and not (desired.loaded and await self._serves(name, item)):
            # unloaded, or loaded again before this worker served: the table moved on
            del self.starting[name]
            await asyncio.to_thread(self._group.stop, [item.worker], STOP_TIMEOUT_S)
        elif moved_on:  # it serves already (its load may have answered): it takes over
            await self._serving(name, item)  # and the next round starts the newer one
        elif not item.worker.alive:  # exited (even after its first heartbeat): it failed
            del self.starting[name]
            await self._fail(name, item.desired, _exit_reason(item.worker))
        elif await self._serves(name, item):
            await self._serving(name, item)
        elif time.monotonic() - item.since > self._start_limit_s:
            del self.starting[name]
            await asyncio.to_thread(self._group.stop, [item.worker], STOP_TIMEOUT_S)
            why = f"its worker did not serve within {self._start_limit_s:g} s"
            await self._fail(name, item.desired, why)

    async def _serves(self, name: str, item: _Starting) -> bool:
        """Whether ``item``'s worker is alive and its generation has a live registry entry."""
        generation = item.desired.generation
        live = await live_generations(self._redis, self._deployment.names, name)
        return item.worker.alive and generation in live

    async def _serving(self, name: str, item: _Starting) -> None:
        """The new generation serves: it joins the group, and the old workers stop."""
        del self.starting[name]
        self._group.started.append(item.worker)
        old = self.running.get(name)
        self.running[name] = _Running(item.desired.generation, [item.worker])
        log.info("supervisor: %s serves generation %d", name, item.desired.generation)
        if old is not None:
            await asyncio.to_thread(self._group.stop, old.workers, STOP_TIMEOUT_S)
            log.info("supervisor: stopped the workers of %s's generation %d", name, old.generation)

    async def _fail(self, name: str, desired: DesiredModel, why: str) -> None:
        """Give the generation up, and tell the load waiting for it why."""
        log.error(
            "supervisor: %s's generation %d given up until its next load: %s",
            name,
            desired.generation,
            why,
        )
        self._given_up[name] = desired.generation
        await self._table.fail(desired, why)

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


def _exit_reason(worker: WorkerProcess) -> str:
    """Why a worker exited before it served: its log's last line (``plaza worker`` prints
    a failed start's error there), else its exit status."""
    lines = worker.log_text().strip().splitlines()
    last = lines[-1].strip() if lines else ""
    if last:
        return last.removeprefix(ERROR_PREFIX)
    return f"its worker exited with code {worker.exit_code} before it served"
