"""A model host: one worker process serving several models (and their versions) on one device.

Each model gets a ``Worker`` of its own: its own consumer-group membership (the group
``plaza.naming`` names for the model), batcher, instances (``instance_group`` count, each
with its own backends and executor thread), intake and writer. What the process has once is
shared (``HostServices``): the device, the device scheduler that grants executions fairly
between the models (``plaza.workers.device_scheduler``), one /metrics port whose samples
carry a ``model`` label, the Redis client and the dead-letter producer.

An ensemble (``platform: "ensemble"``) runs no backend: its unit on the host is an
``EnsembleRunner`` (``workers/ensemble.py``) instead of a ``Worker``, with the same
lifecycle, sharing the host's /metrics.

``plaza worker --worker.model M`` is a host of one model (its worker id is the host's);
``plaza worker --host.models a,b,c`` (or ``'*'``: the whole repository) serves several, and
each model's worker id is ``<host id>.<model>``.

With ``host.follow_model_table`` the host starts with no unit and serves what the model
table says is loaded, among ``host.models`` (``'*'``: any model), within
``host.memory_budget_bytes``: ``workers/model_watch.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
import uuid
from collections.abc import Sequence

from plaza.errors import ConfigError
from plaza.model_control import ModelTable, model_spec
from plaza.modelconfig import PLATFORM_TORCH
from plaza.queueing import BacklogProbe
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from plaza.workers.host_services import HostServices
from plaza.workers.memory_budget import MemoryBudget, meter_for
from plaza.workers.metrics import HostMetrics
from plaza.workers.model_watch import ModelFollower
from plaza.workers.worker import Worker

Unit = Worker | EnsembleRunner
"""What serves one model on a host."""

log = logging.getLogger(__name__)

ALL_MODELS = "*"


def host_models(settings: PlazaSettings) -> list[str]:
    """The models a host serves: ``host.models`` ('*': the repository's, without the torch
    ones when torch is missing), else ``worker.model``; ConfigError when neither is set."""
    names = settings.host.model_names()
    if names == [ALL_MODELS]:
        repo = ModelRepository.of(settings)
        torch_ok = importlib.util.find_spec("torch") is not None
        names = []
        for name in repo.model_names():
            if repo.spec(name).platform == PLATFORM_TORCH and not torch_ok:
                log.warning("host: skipping %s: needs the torch extra", name)
                continue
            names.append(name)
    elif not names and settings.worker.model:
        names = [settings.worker.model]
    if not names:
        raise ConfigError("a host needs models: --host.models A,B (or '*') or --worker.model M")
    if len(set(names)) != len(names):
        raise ConfigError(f"host.models names a model twice: {names}")
    return names


def worker_id(host_id: str, model: str, models: Sequence[str]) -> str:
    """A model's worker id on a host: the host's own when it serves one model."""
    return host_id if len(models) == 1 else f"{host_id}.{model}"


class Host:
    """Serves ``models`` (default: ``host_models(settings)``) in this process until stopped."""

    def __init__(self, settings: PlazaSettings, models: Sequence[str] | None = None) -> None:
        self.settings = settings
        self.follows = settings.host.follow_model_table
        if self.follows:
            if not settings.host.model_names():
                raise ConfigError(
                    "host.follow_model_table needs host.models: the models it may serve "
                    "('*': any model of the repository)"
                )
            self.models = []
        else:
            if settings.host.memory_budget_bytes:
                raise ConfigError(
                    "host.memory_budget_bytes needs host.follow_model_table (a host with a "
                    "fixed list of models loads them all)"
                )
            self.models = list(models) if models is not None else host_models(settings)
        self.id = settings.worker.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.services = HostServices.create(settings)
        self._repo = ModelRepository.of(settings)
        self.workers = [self._unit(self._repo, settings, model) for model in self.models]
        self._started: list[Unit] = []
        self.follower: ModelFollower | None = None
        self._probe: BacklogProbe | None = None
        self._handovers: dict[str, int] = {}
        """Per model, the reloads whose unit started beside the one serving."""

    def make_unit(self, model: str, config: str = "") -> Unit:
        """A unit for ``model`` (following the table: with ``config``, what its generation's
        load pinned, ``plaza.model_control.unit_config``, so a unit started late serves what
        the load read, not the folder as it is then), its worker id ``<host id>.<model>``.
        A reload's unit, made while the model's unit still serves (the hand-over,
        ``workers/model_watch.py``), takes an id of its own, ``<host id>.<model>~<n>``, and
        under it its own device-scheduler entry: the two share the model's consumer group,
        never a registry entry."""
        unit_id, device_key = f"{self.id}.{model}", None
        if self.follower is not None and model in self.follower.state.running:
            self._handovers[model] = n = self._handovers.get(model, 0) + 1
            unit_id = device_key = f"{unit_id}~{n}"
        update = {"model": model, "worker_id": unit_id, "model_config_json": config}
        mine = self.settings.model_copy(
            update={"worker": self.settings.worker.model_copy(update=update)}
        )
        if model_spec(self._repo, model, config).is_ensemble:
            return EnsembleRunner(mine, hub=self.services.metrics)
        return Worker(mine, self.services, device_key=device_key)

    def _unit(self, repo: ModelRepository, settings: PlazaSettings, model: str) -> Unit:
        mine = self._settings_of(settings, model)
        if repo.spec(model).is_ensemble:
            return EnsembleRunner(mine, hub=self.services.metrics)
        return Worker(mine, self.services)

    def _settings_of(self, settings: PlazaSettings, model: str) -> PlazaSettings:
        update = {"model": model, "worker_id": worker_id(self.id, model, self.models)}
        if len(self.models) > 1:  # a load's config override names one model
            update["model_config_json"] = ""
        return settings.model_copy(update={"worker": settings.worker.model_copy(update=update)})

    async def start(self) -> None:
        """Load every model and join every group; on a failure, stop what started.
        Following the table: connect to it and run the first round."""
        if self.follows:
            try:
                await self._start_following()
            except BaseException:  # the units the first round started are stopped too
                await self.stop()
                raise
            return
        try:
            for worker in self.workers:
                await worker.start()
                self._started.append(worker)
        except BaseException:
            await self.stop()
            raise
        log.info(
            "host %s serving %s on %s (%d execution slots)",
            self.id,
            self.models,
            self.services.device,
            self.services.scheduler.slots,
        )

    async def _start_following(self) -> None:
        hs = self.settings.host
        await self.services.start()
        self.services.metrics.serve(f"host {self.id}")
        metrics = HostMetrics(hs.memory_budget_bytes)
        self.services.metrics.registry.register(metrics)
        self._probe = BacklogProbe(self.settings.kafka, self.settings.names)
        await self._probe.start()
        device = self.services.device
        self.follower = ModelFollower(
            self,
            ModelTable(self.services.redis, self.settings.names),
            self._probe,
            MemoryBudget(hs.memory_budget_bytes),
            meter_for(device),
            metrics,
        )
        log.info(
            "host %s follows the model table (models %s, memory budget %s) on %s",
            self.id,
            hs.models,
            hs.memory_budget_bytes or "none",
            device,
        )
        await self.follower.step()

    async def _follow(self, stop: asyncio.Event) -> None:
        assert self.follower is not None
        interval = self.settings.host.follow_interval_s
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                break
            try:
                await self.follower.step()
            except Exception as exc:  # Redis or Kafka restarting: the next round tries again
                log.warning("host %s: model table round failed: %s", self.id, exc)

    async def run_until_stopped(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set or a worker fails; then stop them all (re-raise)."""
        if self.follows:
            try:
                await self._follow(stop)
            finally:
                await self.stop()
            return
        inner = asyncio.Event()
        tasks = [asyncio.create_task(w.run_until_stopped(inner)) for w in self._started]
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        inner.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        self._started = []
        await self.stop()
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]

    async def stop(self) -> None:
        """Drain and stop every worker (together), then close what they shared."""
        started, self._started = self._started, []
        await asyncio.gather(*(w.stop() for w in started), return_exceptions=True)
        if self.follower is not None:
            with contextlib.suppress(Exception):
                await self.follower.close()
            self.follower = None
        if self._probe is not None:
            with contextlib.suppress(Exception):
                await self._probe.stop()
            self._probe = None
        with contextlib.suppress(Exception):
            await self.services.close()
        log.info("host %s stopped", self.id)
