"""A host that follows the model table: units start, reload, drain and stop as it says.

With ``host.follow_model_table`` a host serves what the deployment's model table
(``plaza.model_control``) says is loaded, among its scope (``host.models``; ``*``: any model
of the repository). Every ``host.follow_interval_s`` one round (:meth:`ModelFollower.step`):

- a model unloaded in the table: its unit serves what is already queued for it (the
  gateway takes no new requests), bounded by ``host.drain_limit_s``, then stops; loaded
  again meanwhile (a new generation), its drain ends and the unit restarts at once;
- a model whose generation changed (a new load: config override or version folders): as
  Triton's reload, the model stays available: the new generation's unit starts beside the
  one serving (both members of the model's consumer group; Kafka's rebalance hands the
  partitions over, the old unit committing what it answered), and once it serves (its
  ``start`` returned: its registry entry names the new generation, what a load waits for)
  the old unit stops, answering what it holds. A new generation that fails to start
  leaves the old unit serving (the failure is reported as any load's, below). When the
  memory budget has no room for both without evicting anything, the old unit stops first
  and the new one then loads as any model (meanwhile requests wait in Kafka; a refusal
  gives it up, and the generation before it starts again, below);
- a model loaded and not running: its unit starts, unless the model is *lazy* (config
  parameter ``lazy: "true"``) or was evicted: then it starts once requests wait in its
  topics (their consumer group's lag), and those requests are answered when it is up,
  each within its own deadline. Meanwhile the host keeps the model in its worker registry
  as a *standby* entry, so the gateway counts it ready (it is servable).

Every unit of a generation starts from what its load read (``DesiredModel.pinned``,
``plaza.model_control.unit_config``), never from the folder as it is when the unit starts;
a version of it gone is a refusal. While the table's generation is given up, the one whose
unit served last here (``FollowerState.served``) is the one started again (back on demand
after an eviction, or after its unit failed), its failures retried after the back-off.

Memory budget (``host.memory_budget_bytes``, ``workers/memory_budget.py``): before a load
the model's estimated bytes are reserved; when they do not fit, the least recently used
idle units (nothing held, nothing queued) are drained and unloaded first (evictions); when
even that does not free enough, the load waits for a later round, and after
``host.load_wait_s`` backs off. A model whose estimate alone exceeds the budget is given up
at once (lazy or not). After a load the reservation becomes ``max(estimate, measured
growth)`` (the estimate alone when a reading is unknown).

Failures: a load that finds no room in time, or fails to start for any reason but a bad
config (Kafka restarting, ...), is tried again on a later round, after a back-off that
doubles from ``host.follow_interval_s`` up to ``RETRY_MAX_S``; a bad config
(``ConfigError``) gives the model up until its next load (a new generation), and so does
a model larger than the whole budget: those are reported in the model table
(``ModelTable.fail``), which ends a load waiting for that generation with the reason. Either
way the model has no standby entry meanwhile. A unit (a worker, or an ensemble's runner)
names the table's generation it serves in its registry entry (a load waits for a worker of
its own generation, and an ensemble's load for a runner of its own). Every
load, unload and eviction is a log line and a counter on the host's /metrics
(``HostMetrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from plaza.errors import ConfigError, PlazaError
from plaza.model_control import (
    DesiredModel,
    ModelTable,
    ServedConfig,
    model_spec,
    unit_config,
)
from plaza.modelconfig import ModelSpec
from plaza.queueing import BacklogProbe
from plaza.repository import ModelRepository
from plaza.workers.memory_budget import MemoryBudget, MemoryMeter, estimate_bytes, is_lazy
from plaza.workers.metrics import HostMetrics
from plaza.workers.worker import Worker

if TYPE_CHECKING:
    from plaza.workers.host import Host, Unit

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.25
STANDBY_SUFFIX = "~standby"
STANDBY_TTL_S = 15.0
"""How long a standby entry counts without being refreshed."""
RETRY_MAX_S = 30.0
"""The longest back-off between two tries of a model's load."""
RELOAD_SUFFIX = "~reload"
"""The budget's account of a reload's unit while it loads beside the one serving, then
of the old unit while it stops."""


@dataclass(slots=True)
class Running:
    """One model's unit on the host."""

    desired: DesiredModel
    spec: ModelSpec
    unit: Unit
    task: asyncio.Task[None]
    stop: asyncio.Event
    executions: int = 0


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a unit of one generation starts from (``ModelFollower._plan``)."""

    desired: DesiredModel
    """The generation, its record pinned (``DesiredModel.pinned``; read now if it had none)."""
    spec: ModelSpec
    need: int
    """The bytes it is expected to take."""
    config: str
    """The config its unit starts with (``plaza.model_control.unit_config``)."""


@dataclass(slots=True)
class _Waiting:
    generation: int
    since: float
    logged: bool = False


@dataclass(slots=True)
class Retry:
    """A model whose load failed or found no room in time: tried again at ``due``."""

    generation: int
    tries: int
    due: float
    """When the next try may run (the follower's clock)."""


@dataclass(slots=True)
class _Drain:
    task: asyncio.Task[None]
    cut: asyncio.Event
    """Set when the model is loaded again: the drain ends at once."""


@dataclass(slots=True)
class FollowerState:
    """What the follower knows between rounds (read by tests and /metrics)."""

    running: dict[str, Running] = field(default_factory=dict)
    evicted: set[str] = field(default_factory=set)
    """Models unloaded to make room: they come back on demand, as lazy ones."""
    given_up: dict[str, int] = field(default_factory=dict)
    """Models with a bad config (or bigger than the whole budget), per generation."""
    retrying: dict[str, Retry] = field(default_factory=dict)
    """Models whose load failed or found no room in time: tried again later."""
    waiting: dict[str, _Waiting] = field(default_factory=dict)
    served: dict[str, DesiredModel] = field(default_factory=dict)
    """Per model, the generation its unit served last here, with its record pinned: while
    the table's generation is given up, the one started again (evicted and back on demand,
    or its unit failed), as the old unit serves on after a refused reload."""


class ModelFollower:
    """Makes one host's units match the model table; ``step`` is one round."""

    def __init__(
        self,
        host: Host,
        table: ModelTable,
        probe: BacklogProbe,
        budget: MemoryBudget,
        meter: MemoryMeter,
        metrics: HostMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host = host
        self._clock = clock
        self._settings = host.settings
        self._table = table
        self._probe = probe
        self.budget = budget
        self._meter = meter
        self.metrics = metrics
        self._repo = ModelRepository.of(host.settings)
        scope = host.settings.host.model_names()
        self._scope = None if scope in ([], ["*"]) else set(scope)
        self.state = FollowerState()
        self._standby: set[str] = set()
        self._draining: dict[str, _Drain] = {}
        """Units of unloaded models serving their queues before they stop."""
        self._now: dict[str, DesiredModel] = {}
        """The table as the current round read it."""
        self._failures: dict[str, tuple[DesiredModel, str]] = {}
        """Generations given up this round, with why: reported in the model table."""
        self.memory_samples: list[int] = []
        """The accounted bytes after every change of the budget (bounded)."""

    # -- one round -------------------------------------------------------------------------
    async def step(self) -> None:
        table = {
            n: d
            for n, d in (await self._table.read()).items()
            if self._scope is None or n in self._scope
        }
        self._now = table
        running = self.state.running
        for name, item in list(running.items()):
            desired = table.get(name)
            reloaded = (
                desired is not None
                and desired.loaded
                and desired.generation != item.desired.generation
            )
            if name in self._draining:
                if reloaded:  # loaded again while draining: as any new generation
                    await self._end_drain(name)
                continue
            if item.task.done():  # the unit failed on its own
                await self._forget(name, item, why="failed")
                continue
            if desired is None or not desired.loaded:
                self._start_drain(name)  # drains in the background: rounds go on
            elif reloaded:
                assert desired is not None  # reloaded says so
                await self._try(name, desired, self._reload)
        for name in [*self.state.evicted, *self.state.retrying, *self.state.served]:
            if name not in table or not table[name].loaded:
                self.state.evicted.discard(name)
                self.state.retrying.pop(name, None)
                self.state.served.pop(name, None)
        self._touch_used()
        for name, drain in list(self._draining.items()):
            if drain.task.done():
                del self._draining[name]
        for name, desired in sorted(table.items()):
            if not desired.loaded or name in running or name in self._draining:
                continue
            await self._try(name, self._target(name, desired), self._consider)
        await self._report_failures()
        await self._beat_standby(table)
        self.metrics.memory_bytes = self.budget.total

    def _target(self, name: str, desired: DesiredModel) -> DesiredModel:
        """The generation to run for ``name``: the table's (``desired``), unless that one
        is given up: then the one its unit served last here, if any (``FollowerState.served``)."""
        served = self.state.served.get(name)
        if self.state.given_up.get(name) != desired.generation or served is None:
            return desired
        return served

    def _fallback(self, name: str, desired: DesiredModel) -> bool:
        """Whether ``desired`` is an older generation run while the table's is given up."""
        now = self._now.get(name)
        return now is not None and now.generation != desired.generation

    async def _report_failures(self) -> None:
        """Tell a load waiting for a generation given up this round why it failed
        (``ModelTable.fail``: 400 at once, not a timeout)."""
        failures, self._failures = self._failures, {}
        for desired, why in failures.values():
            try:
                await self._table.fail(desired, why)
            except Exception as exc:  # Redis restarting: the load times out instead
                log.warning("host: could not report %s's failure: %s", desired.name, exc)

    async def _try(
        self,
        name: str,
        desired: DesiredModel,
        load: Callable[[str, DesiredModel], Awaitable[None]],
    ) -> None:
        """``load`` (``_consider`` or ``_reload``) unless the generation was given up or its
        load backs off."""
        if self.state.given_up.get(name) == desired.generation or not self._due(name, desired):
            return
        try:
            await load(name, desired)
        except Exception as exc:  # one model's failure must not stop the round for the others
            self._failed(name, desired, exc)

    def _due(self, name: str, desired: DesiredModel) -> bool:
        """Whether a model's load may be tried this round (not backing off)."""
        retry = self.state.retrying.get(name)
        if retry is None or retry.generation != desired.generation:
            self.state.retrying.pop(name, None)  # a new load starts afresh
            return True
        return self._clock() >= retry.due

    def _backing_off(self, name: str, desired: DesiredModel) -> bool:
        retry = self.state.retrying.get(name)
        return retry is not None and retry.generation == desired.generation

    def _failed(self, name: str, desired: DesiredModel, exc: Exception) -> None:
        """A load that raised: a bad config gives the model up until its next load; any
        other error (Kafka restarting, ...) is tried again after a back-off, and so is any
        failure of an older generation run while the table's is given up (``_target``)."""
        refused = isinstance(exc, PlazaError) and exc.code == ConfigError.code
        if isinstance(exc, PlazaError) and refused and not self._fallback(name, desired):
            log.error(
                "host: model %s given up until its next load (generation %d): %s",
                name,
                desired.generation,
                exc.message,
            )
            self.state.given_up[name] = desired.generation
            self.state.retrying.pop(name, None)
            self._failures[name] = (desired, exc.message)
            return
        text = str(exc)
        if type(exc).__name__ not in text:
            text = f"{type(exc).__name__}: {text}"
        self._back_off(name, desired, f"failed to load: {text}")

    def _back_off(self, name: str, desired: DesiredModel, why: str) -> None:
        """Try ``name`` again later: after follow_interval_s, doubling up to RETRY_MAX_S."""
        retry = self.state.retrying.get(name)
        again = retry is not None and retry.generation == desired.generation
        tries = retry.tries + 1 if retry is not None and again else 1
        delay = min(RETRY_MAX_S, self._settings.host.follow_interval_s * 2 ** min(tries - 1, 16))
        self.state.retrying[name] = Retry(desired.generation, tries, self._clock() + delay)
        self.state.waiting.pop(name, None)
        log.error(
            "host: model %s not loaded (try %d): %s; next try in %.1f s", name, tries, why, delay
        )

    def _plan(self, name: str, desired: DesiredModel) -> _Plan:
        """What a unit of ``desired`` starts from: its load's record (``unit_config``: not
        the folder as it is now; ConfigError for a version of it gone), or for an entry with
        none, the folder now, pinned from here on (``FollowerState.served``)."""
        config = unit_config(self._repo, desired)
        spec = model_spec(self._repo, name, config)
        if desired.pinned is None:
            versions = tuple(v.version for v in self._repo.served_versions(name, spec))
            pinned = ServedConfig(desired.generation, json.dumps(spec.config_json()), versions)
            desired = dataclasses.replace(desired, pinned=pinned)
        return _Plan(desired, spec, estimate_bytes(self._repo, spec), config)

    async def _consider(self, name: str, desired: DesiredModel) -> None:
        try:  # on a thread: a Python model's auto_complete_config runs in a child process
            plan = await asyncio.to_thread(self._plan, name, desired)
        except PlazaError as exc:
            self._failed(name, desired, exc)
            return
        spec, need = plan.spec, plan.need
        if not self._fits_at_all(name, desired, need):  # lazy or not: it could never load
            return
        on_demand = is_lazy(spec) or name in self.state.evicted
        if on_demand and not await self._waiting_requests(name, spec):
            self.state.waiting.pop(name, None)  # demand that comes back waits afresh
            self.state.retrying.pop(name, None)
            return
        victims = self.budget.plan(name, need, await self._busy())
        if victims is None:
            self._wait_for_room(name, desired, need)
            return
        for victim in victims:
            await self._retire(victim, drain=True, why="evicted")
        self.state.waiting.pop(name, None)
        await self._load(name, plan)

    async def _reload(self, name: str, desired: DesiredModel) -> None:
        """A running model's new generation: loaded beside the unit serving, which stops once
        the new one serves (``_load``); with no room for both, the old unit stops first and
        the round loads the new generation as any model (``_consider``)."""
        try:  # a bad config (or, below, one too big): given up, the old unit serves on
            plan = await asyncio.to_thread(self._plan, name, desired)
        except PlazaError as exc:
            self._failed(name, desired, exc)
            return
        need = plan.need
        if not self._fits_at_all(name, desired, need):
            return
        if self.budget.fits_now(need):
            await self._load(name, plan)
            return
        log.info(
            "host: no room in the memory budget for both generations of %s (%d more bytes, "
            "%d of %d accounted): its unit stops before the new one starts",
            name,
            need,
            self.budget.total,
            self.budget.limit,
        )
        await self._retire(name, drain=False, why="reloaded")

    def _fits_at_all(self, name: str, desired: DesiredModel, need: int) -> bool:
        """Whether ``need`` bytes could ever fit; if not, the generation is given up (an
        older one run while the table's is given up: tried again after a back-off)."""
        if self.budget.fits_alone(need):
            return True
        if self._fallback(name, desired):
            self._back_off(name, desired, f"it needs {need} bytes, more than the budget")
            return False
        log.error(
            "host: model %s given up until its next load: it needs %d bytes, more than "
            "the whole memory budget (%d)",
            name,
            need,
            self.budget.limit,
        )
        self.state.given_up[name] = desired.generation
        why = f"it needs {need} bytes, more than the host's whole memory budget"
        self._failures[name] = (desired, f"{why} ({self.budget.limit})")
        return False

    def _wait_for_room(self, name: str, desired: DesiredModel, need: int) -> None:
        if self._backing_off(name, desired):  # it waited its load_wait_s already
            self._back_off(name, desired, "still no room in the memory budget")
            return
        waiting = self.state.waiting.get(name)
        if waiting is None or waiting.generation != desired.generation:
            waiting = self.state.waiting[name] = _Waiting(desired.generation, self._clock())
        if not waiting.logged:
            waiting.logged = True
            log.info(
                "host: model %s waits for room: needs %d bytes, %d of %d held by busy models",
                name,
                need,
                self.budget.total,
                self.budget.limit,
            )
        wait_s = self._settings.host.load_wait_s
        if self._clock() - waiting.since > wait_s:
            why = (
                f"no room in the memory budget ({self.budget.limit} bytes) after {wait_s:.0f} s; "
                "evicting every idle model would not free enough"
            )
            self._back_off(name, desired, why)

    # -- load and unload -------------------------------------------------------------------
    async def _load(self, name: str, plan: _Plan) -> None:
        """Start the model's unit from ``plan``; a reload's (``_reload``) beside the one
        serving, which stops once the new one serves (a new one that fails leaves it
        serving)."""
        desired, spec, need = plan.desired, plan.spec, plan.need
        serving = self.state.running.get(name)
        account = name if serving is None else f"{name}{RELOAD_SUFFIX}"
        self.budget.add(account, need)  # reserved while it loads
        self._sample()
        before = await asyncio.to_thread(self._meter.used)  # RSS scans /proc: off the loop
        try:
            unit = self._host.make_unit(name, plan.config)
            # its registry entry names the generation it serves (a worker or a runner)
            unit.generation = desired.generation
            await unit.start()  # returns once it serves: its registry entry is written
        except Exception as exc:
            self.budget.remove(account)
            self._sample()
            self._failed(name, desired, exc)
            return
        self.state.retrying.pop(name, None)
        stop = asyncio.Event()
        task = asyncio.create_task(unit.run_until_stopped(stop), name=f"unit-{name}")
        # Counted before the unit shows as running: whoever sees it running sees the load.
        # Both before the measuring below yields: the started unit may answer meanwhile.
        HostMetrics.count(self.metrics.loads, name)
        self.state.running[name] = Running(desired, spec, unit, task, stop, self._executions(unit))
        self.state.served[name] = desired
        self.state.evicted.discard(name)
        after = await asyncio.to_thread(self._meter.used)  # before the old unit frees its own
        if serving is not None:  # the new generation serves: the old unit goes
            self.budget.swap(name, account)  # the model's account is the new unit's now
            await self._stop(name, serving, drain=False, why="reloaded", account=account)
        await self._measured(name, need, before, after)
        self.metrics.memory_bytes = self.budget.total
        await self._drop_standby(name)
        log.info(
            "host: loaded %s (generation %d, %d bytes; %d of %d accounted)",
            name,
            desired.generation,
            self.budget.held.get(name, 0),
            self.budget.total,
            self.budget.limit,
        )

    async def _measured(self, name: str, need: int, before: int | None, after: int | None) -> None:
        """Correct a load's reservation with the growth measured around it."""
        if before is None or after is None:
            log.warning(
                "host: model %s: memory reading unknown (%s); its estimate of %d bytes stands",
                name,
                self._meter.kind,
                need,
            )
            return
        grown = after - before
        if grown > need:
            log.info("host: model %s measured %d bytes (estimated %d)", name, grown, need)
            self.budget.add(name, grown)
            self._sample()
            await self._shed(name)

    async def _shed(self, loaded: str) -> None:
        """After a load measured more than its estimate: evict idle models until it fits."""
        if self.budget.limit <= 0 or self.budget.total <= self.budget.limit:
            return
        busy = await self._busy()
        held = self.budget.held[loaded]
        victims = self.budget.plan(loaded, held, busy)
        for victim in victims or []:
            await self._retire(victim, drain=True, why="evicted")
        if self.budget.total <= self.budget.limit:
            return
        if held > self.budget.limit:
            why = f"{loaded} alone measured {held} bytes, more than the whole budget"
        else:
            others = sorted(set(self.budget.held) - {loaded})
            idle = [m for m in others if m not in busy]
            why = (
                f"{loaded} measured {held} bytes; evicting every idle model "
                f"({', '.join(idle) or 'none'}) would not free enough, busy: "
                f"{', '.join(m for m in others if m in busy) or 'none'}"
            )
        log.warning(
            "host: %d bytes accounted, over the budget of %d (%s)",
            self.budget.total,
            self.budget.limit,
            why,
        )

    def _start_drain(self, name: str) -> None:
        if name not in self._draining:
            cut = asyncio.Event()
            task = asyncio.create_task(
                self._retire(name, drain=True, why="unloaded", cut=cut), name=f"drain-{name}"
            )
            self._draining[name] = _Drain(task, cut)

    async def _end_drain(self, name: str) -> None:
        """A draining model loaded again: its unit stops now (answering what it holds), and
        the round starts the new generation."""
        drain = self._draining.pop(name)
        log.info("host: %s loaded again while draining: its unit restarts", name)
        drain.cut.set()
        with contextlib.suppress(Exception):
            await drain.task

    async def _retire(
        self, name: str, *, drain: bool, why: str, cut: asyncio.Event | None = None
    ) -> None:
        item = self.state.running.get(name)
        if item is not None:
            await self._stop(name, item, drain=drain, why=why, cut=cut)

    async def _stop(
        self,
        name: str,
        item: Running,
        *,
        drain: bool,
        why: str,
        cut: asyncio.Event | None = None,
        account: str | None = None,
    ) -> None:
        """Stop ``item``, a unit of ``name`` accounted under ``account`` (default: the
        model's own account)."""
        if drain:
            await self._drain(name, item.spec, cut or asyncio.Event())
        item.stop.set()
        with contextlib.suppress(Exception):
            await item.task
        await self._forget(name, item, why=why, account=account)

    async def _forget(
        self, name: str, item: Running, *, why: str, account: str | None = None
    ) -> None:
        # Counted before it leaves ``running``: whoever sees it gone sees the unload.
        if why == "evicted":
            self.state.evicted.add(name)
            HostMetrics.count(self.metrics.evictions, name)
        HostMetrics.count(self.metrics.unloads, name)
        if self.state.running.get(name) is item:  # a reload's old unit: the new one stays
            del self.state.running[name]
        freed = self.budget.remove(account or name)
        self.metrics.memory_bytes = self.budget.total
        self._sample()
        if why == "failed":
            exc = item.task.exception() if not item.task.cancelled() else None
            log.error("host: unit of %s stopped on its own: %s", name, exc)
            with contextlib.suppress(Exception):
                await item.unit.stop()
        log.info(
            "host: unloaded %s (generation %d, %s; %d bytes freed)",
            name,
            item.desired.generation,
            why,
            freed,
        )

    async def _drain(self, name: str, spec: ModelSpec, cut: asyncio.Event) -> None:
        """Until the model's queues are committed (every request answered), bounded; or
        until ``cut`` is set."""
        limit_s = self._settings.host.drain_limit_s
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not cut.is_set():
            if not await self._queued(name, spec):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cut.wait(), DRAIN_POLL_S)
        if cut.is_set():
            return
        log.warning("host: %s still had queued requests after %.0f s", name, limit_s)

    # -- what is busy ----------------------------------------------------------------------
    async def _queued(self, name: str, spec: ModelSpec) -> bool:
        topics = self._settings.names.request_topics(name, spec.batching.priority_levels)
        try:
            return sum([await self._probe.lag(name, t) for t in topics]) > 0
        except Exception as exc:  # Kafka away: count it as busy
            log.warning("host: lag of %s unknown: %s", name, exc)
            return True

    async def _waiting_requests(self, name: str, spec: ModelSpec) -> bool:
        return await self._queued(name, spec)

    async def _busy(self) -> set[str]:
        """Running models holding or owing work: never evicted."""
        busy = set(self._draining)
        for name, item in list(self.state.running.items()):
            if self._pending(item.unit) > 0 or await self._queued(name, item.spec):
                busy.add(name)
        return busy

    def _touch_used(self) -> None:
        """Models that executed or hold work since the last round become most recent."""
        for name, item in self.state.running.items():
            executions = self._executions(item.unit)
            if executions != item.executions or self._pending(item.unit) > 0:
                item.executions = executions
                self.budget.touch(name)

    @staticmethod
    def _pending(unit: Unit) -> int:
        return unit._pending() if isinstance(unit, Worker) else 0

    @staticmethod
    def _executions(unit: Unit) -> int:
        return unit.metrics.executions() if isinstance(unit, Worker) else 0

    def _sample(self) -> None:
        self.memory_samples.append(self.budget.total)
        del self.memory_samples[:-1000]
        self.metrics.memory_bytes = self.budget.total

    # -- standby entries -------------------------------------------------------------------
    def standby_id(self, name: str) -> str:
        return f"{self._host.id}.{name}{STANDBY_SUFFIX}"

    async def _beat_standby(self, table: dict[str, DesiredModel]) -> None:
        """Keep a registry entry for each model this host would load on demand (so the
        gateway counts it ready), and drop those of models it no longer would."""
        given_up = self.state.given_up
        targets = {n: self._target(n, d) for n, d in table.items() if d.loaded}
        waiting = {
            n
            for n, d in targets.items()
            if n not in self.state.running
            and given_up.get(n) != d.generation
            and not self._backing_off(n, d)
        }
        for name in self._standby - waiting:
            await self._drop_standby(name)
        if not waiting:
            return
        s = self._settings
        # Outlives a round that loads a model (seconds); a dead host's entry goes after it.
        ttl = max(STANDBY_TTL_S, 3 * s.host.follow_interval_s)
        now = time.time()
        pipe = self._host.services.redis.pipeline(transaction=False)
        for name in sorted(waiting):
            key = s.names.worker_registry_key(name)
            pipe.zadd(key, {self.standby_id(name): now + ttl})
            pipe.expire(key, int(ttl) + 1)
            info = {
                "model": name,
                "generation": targets[name].generation,
                "standby": True,
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }
            info_key = s.names.worker_info_key(self.standby_id(name))
            pipe.set(info_key, json.dumps(info), ex=int(ttl) + 1)
        try:
            await pipe.execute()
        except Exception as exc:  # Redis restarting: the next round tries again
            log.warning("host: standby heartbeat failed: %s", exc)
        self._standby |= waiting

    async def _drop_standby(self, name: str) -> None:
        self._standby.discard(name)
        with contextlib.suppress(Exception):
            key = self._settings.names.worker_registry_key(name)
            await self._host.services.redis.zrem(key, self.standby_id(name))

    async def close(self) -> None:
        """Stop every unit (draining what each holds) and drop the standby entries."""
        for drain in list(self._draining.values()):
            with contextlib.suppress(Exception):
                await drain.task
        self._draining.clear()
        for name in list(self.state.running):
            await self._retire(name, drain=False, why="host stopping")
        for name in list(self._standby):
            await self._drop_standby(name)
