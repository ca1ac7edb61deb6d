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
names the new generation the old worker stops, answering what it holds.

A worker that exits, before it serves or after, is started again after a back-off
(:class:`RestartBackoff`: 1 s doubling up to 60 s, afresh once a worker served 60 s), as
Kubernetes restarts a container, unless ``plaza worker`` exited 1 (or 2) with its one
error line (:data:`ERROR_PREFIX`), which says it refused the model (a config its backend
refuses, a model file it cannot load; :func:`start_failure`): that generation is reported
in the table (``ModelTable.fail``: the waiting load answers with the reason) and not tried
again until the next load, the old worker serving on. A failed start on Kafka or Redis
(exit status ``plaza.errors.EXIT_RETRIABLE``), a crash, a kill or a start slower than
``start_limit_s`` is retried (a load waiting for it times out meanwhile); after
:data:`START_TIMEOUTS` too slow starts in a row the generation is given up as if refused.
While the table's generation is given up, the generation that served before it is the one
kept running: started again after the back-off if its worker exits, so gateways, serving
its config after a refusal, are still answered. Such a worker is started with what that
generation served (its complete config, its versions named: :func:`pinned_config`), not with
the repository as it is now (the refused reload's new version folder or config.pbtxt), and
its failed start, whatever the cause, is retried after the back-off: never the table's
generation's refusal. A refusal is
remembered by this supervisor only: a restarted one (``plaza up`` again, say after the
model's files were fixed) clears the table's marks as it starts and tries each such
generation once more. The workers are the supervisor's own, never members of ``plaza
up``'s process group, so their exits are its to handle, never the end of the whole ``plaza up``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import redis.asyncio

from plaza.errors import PlazaError
from plaza.model_control import DesiredModel, ModelTable, live_generations, model_spec
from plaza.modelconfig import ModelSpec
from plaza.queueing import BacklogProbe
from plaza.repository import ModelRepository
from plaza.stack.deployment import Deployment
from plaza.stack.errors import ServiceError
from plaza.stack.members import WorkerProcess
from plaza.stack.process import ProcessGroup

log = logging.getLogger(__name__)

DRAIN_LIMIT_S = 60.0
"""A retiring model's workers serve its queue this long at most before they are stopped."""
DRAIN_POLL_S = 0.25
STOP_TIMEOUT_S = 40.0
START_LIMIT_S = 420.0
"""A new worker that does not serve within this long is stopped, and tried again later.
Above the Python backend's ``LOAD_TIMEOUT_S`` (300 s for ``initialize``,
``workers/backends/python_backend.py``; not imported: ``plaza`` imports no worker code),
with time left to reach Kafka and Redis and join the consumer group."""
START_TIMEOUTS = 3
"""A generation whose worker did not serve within the start limit this many times in a row
is given up, the reason written to the model table for the load waiting for it."""
EXITS_KEPT = 32
"""The unasked worker exits a supervisor remembers for :meth:`ModelSupervisor.check`."""
ERROR_PREFIX = "plaza worker: error: "
"""How ``plaza worker`` begins the one line it prints for a failed start."""
RESTART_FIRST_S = 1.0
"""The wait before a model's worker is started again after its first exit; it doubles with
each exit that follows ..."""
RESTART_MAX_S = 60.0
"""... up to this."""
RESTART_RESET_S = 60.0
"""A worker that served this long before it exited is started again after RESTART_FIRST_S."""


@dataclass(frozen=True, slots=True)
class StartFailure:
    """Why a worker exited before it served."""

    reason: str
    """Its error line (without :data:`ERROR_PREFIX`), else its exit status."""
    refused: bool
    """The worker refused the model itself: retrying will not help until the next load."""


def start_failure(exit_code: int | None, output: str) -> StartFailure:
    """Classify a worker's exit before it served from its exit status and what it printed
    since it started (``output``). ``plaza worker`` ends a failed start with one error line
    (:data:`ERROR_PREFIX`) and exit status 1 or 2 when it refused the model (a bad config,
    a model file its backend cannot load, ...), ``EXIT_RETRIABLE`` when Kafka or Redis
    failed it. Any other end (retriable, killed, crashed, out of memory) is transient."""
    lines = output.strip().splitlines()
    last = lines[-1].strip() if lines else ""
    if last.startswith(ERROR_PREFIX):
        message = last.removeprefix(ERROR_PREFIX)
        return StartFailure(message, refused=exit_code in (1, 2))
    why = f"its worker exited with code {exit_code} before it served"
    return StartFailure(f"{why} (its last line: {last})" if last else why, refused=False)


def pinned_config(spec: ModelSpec, versions: Sequence[int]) -> str:
    """``spec``'s config in Triton's JSON form, complete, with its version policy narrowed to
    ``versions``: what a worker started again for a generation that served loads, whatever
    the model's folder holds now (a refused reload's new version folder, say)."""
    doc = spec.config_json()
    doc["version_policy"] = {"specific": {"versions": list(versions)}}
    return json.dumps(doc)


@dataclass(slots=True)
class _Retry:
    tries: int
    due: float
    timeouts: int
    """How many starts in a row did not serve within the start limit."""


class RestartBackoff:
    """When each model's worker may be started again after one exited: RESTART_FIRST_S
    after the first exit, doubling with each further exit of the same generation up to
    RESTART_MAX_S; afresh after a worker that served RESTART_RESET_S or more, and for a new
    generation. One entry per model and generation: an old generation's exit never cuts a
    new one's wait short. The supervisor drops the entries of generations it no longer
    wants (:meth:`keep`), so a model has two at most."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        first_s: float = RESTART_FIRST_S,
        max_s: float = RESTART_MAX_S,
        reset_s: float = RESTART_RESET_S,
    ) -> None:
        self._clock = clock
        self._first_s = first_s
        self._max_s = max_s
        self._reset_s = reset_s
        self._retries: dict[tuple[str, int], _Retry] = {}

    def exited(
        self, name: str, generation: int, served_s: float = 0.0, *, timed_out: bool = False
    ) -> float:
        """Record that ``name``'s worker of ``generation`` exited after serving ``served_s``
        seconds (0: before it served; ``timed_out``: stopped as it did not serve within the
        start limit); the seconds until it may be started again."""
        retry = self._retries.get((name, generation))
        again = retry is not None and served_s < self._reset_s
        tries = retry.tries + 1 if retry is not None and again else 1
        timeouts = (retry.timeouts if retry is not None and again else 0) + 1 if timed_out else 0
        delay = min(self._max_s, self._first_s * 2.0 ** min(tries - 1, 32))
        self._retries[(name, generation)] = _Retry(tries, self._clock() + delay, timeouts)
        return delay

    def timeouts(self, name: str, generation: int) -> int:
        """How many starts of ``name``'s ``generation`` in a row did not serve in time."""
        retry = self._retries.get((name, generation))
        return 0 if retry is None else retry.timeouts

    def due(self, name: str, generation: int) -> bool:
        """Whether a worker of ``name``'s ``generation`` may be started now."""
        retry = self._retries.get((name, generation))
        return retry is None or self._clock() >= retry.due

    def keep(self, name: str, generations: Collection[int]) -> None:
        """Drop ``name``'s entries but those of ``generations`` (the ones still wanted)."""
        for key in [k for k in self._retries if k[0] == name and k[1] not in generations]:
            del self._retries[key]

    def forget(self, name: str) -> None:
        """The model was unloaded: its next load starts afresh."""
        self.keep(name, ())


async def forget_refusals(table: ModelTable) -> None:
    """Clear the refusals the model table holds, as a supervisor starts: it tries each
    refused generation once more (the model's files may have been fixed meanwhile). Run
    before a gateway starts (``plaza up`` does), gateways then serve such a model (its
    requests wait in Kafka) until its worker serves, or refuses it again (marked anew).
    Redis away: the marks stay (the generation is tried all the same)."""
    try:
        for desired in (await table.read()).values():
            if desired.loaded and desired.failed:
                await table.fail(desired, "")  # the same generation-checked write, no reason
                log.info(
                    "supervisor: %s's generation %d, refused before, is tried once more",
                    desired.name, desired.generation,
                )  # fmt: skip
    except Exception as exc:
        log.warning("supervisor: the model table's refusals stay marked: %s", exc)


@dataclass(slots=True)
class _Running:
    desired: DesiredModel
    """The table's entry its workers were started from (their generation and config)."""
    workers: list[WorkerProcess] = field(default_factory=list)
    since: float = 0.0
    """When it began to serve (the supervisor's clock)."""

    @property
    def generation(self) -> int:
        return self.desired.generation


class UnaskedExit(NamedTuple):
    """A worker that exited without being asked to (:meth:`ModelSupervisor.check`)."""

    worker: str
    """The worker process's name."""
    code: int | None
    """Its exit status (negative: the signal that ended it)."""
    tail: str
    """The end of its log."""


@dataclass(slots=True)
class _Starting:
    """A generation's worker started and not serving yet."""

    desired: DesiredModel
    worker: WorkerProcess
    since: float
    log_from: int = 0
    """The size of its log file when it started: what it printed since is its own."""
    pinned: str = ""
    """What it loads (:func:`pinned_config`), for a start again of its generation once it
    served; "": unknown (the repository is read as it is then)."""
    relaunch: bool = False
    """A generation that served before, started again while the table's is given up: its
    failed start is retried, never reported as the table's generation's refusal."""


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
        clock: Callable[[], float] = time.monotonic,
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
        self._clock = clock
        self._settings = deployment.settings()
        self._redis = redis.asyncio.Redis.from_url(deployment.redis_url)
        self._table = ModelTable(self._redis, deployment.names)
        self._backlog = BacklogProbe(self._settings.kafka, deployment.names)
        self.running: dict[str, _Running] = {}
        """Per model, the workers serving it (this supervisor's, not the process group's:
        the group only lends its log folder and its way of stopping processes)."""
        self.starting: dict[str, _Starting] = {}
        """Per model, a new generation's worker not serving yet."""
        self.backoff = RestartBackoff(clock)
        """When a model whose worker exited may be started again."""
        self._given_up: dict[str, int] = {}
        """Per model, the generation whose worker refused it: not started again (by this
        supervisor: a restarted one tries it once more)."""
        self._served: dict[str, DesiredModel] = {}
        """Per model, the generation that served last (its worker may have exited since),
        its config pinned to what it served (:attr:`_Starting.pinned`). While the table's
        generation is given up, that one is started again, as gateways serve its config
        after a refusal (``DesiredModel.previous``)."""
        self.exits: deque[UnaskedExit] = deque(maxlen=EXITS_KEPT)
        """The latest workers that exited unasked (crashed, killed, a failed start other
        than a refusal), the oldest first."""

    async def start(self) -> None:
        """Connect, once the table's refusals are forgotten (:func:`forget_refusals`)."""
        await forget_refusals(self._table)
        await self._backlog.start()

    async def close(self) -> None:
        """Stop every worker (each answers what it holds and commits) and disconnect."""
        workers = [s.worker for s in self.starting.values()]
        workers += [w for r in self.running.values() for w in r.workers]
        for worker in workers:  # exited unasked, not reaped yet: stopping it hides that
            if worker.crashed:
                self._exited(worker)
        self.starting.clear()
        self.running.clear()
        await asyncio.to_thread(self._group.stop, workers, STOP_TIMEOUT_S)
        await self._backlog.stop()
        await self._redis.aclose()

    def check(self, *, killed_ok: bool = False) -> None:
        """Raise :class:`ServiceError` naming the workers that exited unasked since this
        supervisor started (:attr:`exits`), as ``ProcessGroup.check`` does for its members;
        ``killed_ok``: not those ended by SIGKILL (a test that kills a worker on purpose)."""
        exits = [e for e in self.exits if not (killed_ok and e.code == -signal.SIGKILL)]
        if exits:
            raise ServiceError(
                "\n".join(f"{e.worker} exited unasked with code {e.code}\n{e.tail}" for e in exits)
            )

    async def reconcile(self) -> None:
        """One round: make the running workers match the table."""
        for name, desired in sorted((await self._table.read()).items()):
            await self._reap(name)
            wanted = self._wanted(name, desired)
            self.backoff.keep(name, {d.generation for d in (desired, wanted) if d is not None})
            if name in self.starting:
                await self._settle(name, wanted)
            running = self.running.get(name)
            if wanted is not None and (running is None or running.generation != wanted.generation):
                if name not in self.starting and self._may_start(name, wanted):
                    relaunch = wanted.generation != desired.generation
                    await self._launch(name, wanted, relaunch=relaunch)
            elif not desired.loaded:
                self.backoff.forget(name)
                self._served.pop(name, None)
                if running is not None:
                    await self._retire(name, running, drain=True)

    def _wanted(self, name: str, desired: DesiredModel) -> DesiredModel | None:
        """The generation of ``name`` whose worker should run: the table's, or, while that
        one is given up, the one that served before it (None: none)."""
        if not desired.loaded:
            return None
        if self._given_up.get(name) != desired.generation:
            return desired
        served = self._served.get(name)
        return served if served is not None and served.generation != desired.generation else None

    def _may_start(self, name: str, desired: DesiredModel) -> bool:
        """Not refused by a worker of this supervisor, and not backing off. The table's
        ``failed`` alone does not stop it: a restarted supervisor tries that generation once
        more (the model's files may have been fixed meanwhile)."""
        if self._given_up.get(name) == desired.generation:
            return False
        return self.backoff.due(name, desired.generation)

    async def _reap(self, name: str) -> None:
        """A serving worker that exited unasked (crashed, killed, out of memory): the model
        has no worker; it is started again after the back-off."""
        running = self.running.get(name)
        if running is None or not any(w.crashed for w in running.workers):
            return
        del self.running[name]
        crashed = [w for w in running.workers if w.crashed]
        for worker in crashed:
            self._exited(worker)
        alive = [w for w in running.workers if w.alive]  # one worker per model: none
        await asyncio.to_thread(self._group.stop, alive, STOP_TIMEOUT_S)
        served_s = self._clock() - running.since
        delay = self.backoff.exited(name, running.generation, served_s)
        codes = [w.exit_code for w in crashed]
        log.error(
            "supervisor: the worker of %s (generation %d) exited with code %s after serving "
            "%.0f s; started again in %.0f s",
            name, running.generation, codes[0], served_s, delay,
        )  # fmt: skip

    async def _launch(self, name: str, desired: DesiredModel, *, relaunch: bool = False) -> None:
        """Start a worker of ``desired``'s generation beside the one serving, if any
        (``relaunch``: one that served before, the table's given up: :attr:`_Starting.relaunch`)."""
        try:
            spec = await asyncio.to_thread(model_spec, self._repo, name, desired.config)
        except PlazaError as exc:  # the gateway checked it; the repository changed since
            if relaunch:
                self._retry(name, desired.generation, exc.message)
            else:
                await self._fail(name, desired, exc.message)
            return
        pinned = await asyncio.to_thread(self._pin, name, spec)
        env = {
            **self._env,
            "PLAZA_WORKER__MODEL_CONFIG_JSON": desired.config,
            "PLAZA_WORKER__GENERATION": str(desired.generation),
        }
        worker_name = f"worker-{name}-{desired.generation % 100_000}-0"
        worker = WorkerProcess(
            self._deployment, name, self._group.log_dir, name=worker_name, env=env
        )
        log_from = _log_size(worker.log_file)
        started = _Starting(desired, worker.start(), self._clock(), log_from, pinned, relaunch)
        self.starting[name] = started
        log.info("supervisor: starting a worker of %s (generation %d)", name, desired.generation)

    def _pin(self, name: str, spec: ModelSpec) -> str:
        """:func:`pinned_config` of the versions ``spec`` selects in the repository now (as
        the worker started with it reads them); "" when it selects none it can serve (the
        worker fails, and says why)."""
        try:
            versions = [v.version for v in self._repo.served_versions(name, spec)]
        except PlazaError:
            return ""
        return pinned_config(spec, versions)

    async def _settle(self, name: str, wanted: DesiredModel | None) -> None:
        """A starting worker: serving (the old one stops), failed, or no longer ``wanted``
        (:meth:`_wanted`)."""
        item = self.starting[name]
        generation = item.desired.generation
        moved_on = wanted is None or wanted.generation != generation
        if moved_on and not (wanted is not None and await self._serves(name, item)):
            # unloaded, or loaded again before this worker served: the table moved on
            del self.starting[name]
            await asyncio.to_thread(self._group.stop, [item.worker], STOP_TIMEOUT_S)
        elif moved_on:  # it serves already (its load may have answered): it takes over
            await self._serving(name, item)  # and the next round starts the newer one
        elif not item.worker.alive:  # exited (even after its first heartbeat): it failed
            del self.starting[name]
            output = _log_since(item.worker.log_file, item.log_from)
            failure = start_failure(item.worker.exit_code, output)
            if failure.refused and not item.relaunch:
                await self._fail(name, item.desired, failure.reason)
            else:
                self._exited(item.worker)
                self._retry(name, generation, failure.reason)
        elif await self._serves(name, item):
            await self._serving(name, item)
        elif self._clock() - item.since > self._start_limit_s:
            await self._too_slow(name, item)

    async def _too_slow(self, name: str, item: _Starting) -> None:
        """A worker that did not serve within the start limit: stopped, and tried again,
        unless that was the START_TIMEOUTS-th time in a row: then the generation is given
        up, and the load waiting for it answers why instead of timing out."""
        del self.starting[name]
        await asyncio.to_thread(self._group.stop, [item.worker], STOP_TIMEOUT_S)
        generation = item.desired.generation
        why = f"its worker did not serve within {self._start_limit_s:g} s"
        delay = self.backoff.exited(name, generation, timed_out=True)
        times = self.backoff.timeouts(name, generation)
        if times >= START_TIMEOUTS and not item.relaunch:
            await self._fail(name, item.desired, f"{why}, {times} starts in a row")
        else:
            self._log_retry(name, generation, why, delay)

    def _retry(self, name: str, generation: int, why: str) -> None:
        """A start that failed for a reason other than the model (Kafka or Redis away, a
        crash): tried again after the back-off."""
        self._log_retry(name, generation, why, self.backoff.exited(name, generation))

    def _log_retry(self, name: str, generation: int, why: str, delay: float) -> None:
        log.error(
            "supervisor: a worker of %s (generation %d) did not start: %s; tried again in %.0f s",
            name, generation, why, delay,
        )  # fmt: skip

    async def _serves(self, name: str, item: _Starting) -> bool:
        """Whether ``item``'s worker is alive and its generation has a live registry entry."""
        generation = item.desired.generation
        live = await live_generations(self._redis, self._deployment.names, name)
        return item.worker.alive and generation in live

    async def _serving(self, name: str, item: _Starting) -> None:
        """The new generation serves: the old workers stop."""
        del self.starting[name]
        old = self.running.get(name)
        self.running[name] = _Running(item.desired, [item.worker], self._clock())
        pinned = item.pinned or item.desired.config
        self._served[name] = dataclasses.replace(item.desired, config=pinned)
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
        served = self._served.get(name)
        if served is not None and served.generation == desired.generation:
            del self._served[name]  # what served before is refused now: nothing to fall back on
        if self._given_up.get(name, -1) < desired.generation:  # not an older one's refusal
            self._given_up[name] = desired.generation
        await self._table.fail(desired, why)  # nothing once the table moved past it

    def _exited(self, worker: WorkerProcess) -> None:
        """Remember a worker that exited unasked, for :meth:`check`."""
        self.exits.append(UnaskedExit(worker.name, worker.exit_code, worker.tail()))

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


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _log_since(path: Path, offset: int) -> str:
    """What a log file holds past ``offset`` (a restarted worker appends to its log)."""
    try:
        with path.open("rb") as log_file:
            log_file.seek(offset)
            return log_file.read().decode(errors="replace")
    except OSError:
        return ""
