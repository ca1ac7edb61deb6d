"""The models a gateway serves, and Triton's model control over them.

In mode ``none`` the registry is read once from the repository. In ``explicit`` and
``poll`` it follows the deployment's model table (``plaza.model_control``): a load or
unload made through any gateway is written there, and every gateway re-reads the table
every ``FOLLOW_INTERVAL_S`` and re-reads each model whose generation there differs from the
one it serves (a load through another gateway, a reload after a config edit or a new version
folder), so they all serve the same models. A model that cannot be read then (its folder
still being copied to a shared disk, say) is read again on later rounds, at growing intervals,
until it is read or its generation changes; meanwhile it keeps the config it was served
with (if any) and is reported failed. A generation that the model hosts refused
(``ModelTable.fail``: its worker could not be made) leaves the previous one's unit serving,
as Triton keeps the old model after a failed reload: the gateway then serves the config of
the generation a live worker still names (metadata, config and validation; the index says
READY, with the refusal as its reason), if it read that one (it keeps the last
``KEPT_GENERATIONS`` of each model). Likewise, while no live worker names the table's new
generation of a model served at another one (a reload: the new unit starts beside the old),
the gateway serves the config of the generation a live worker names, as Triton serves the
old model until the new one is loaded (``_pending``); a first load is served at once (its
requests wait in Kafka). Whoever runs the workers watches the same table
(model hosts with ``host.follow_model_table``, or ``plaza up``'s supervisor with
``--process-per-model``).

Within one gateway, loads, unloads and the following of one model run one at a time (a lock
per model), in the order they came: an unload sent while a load reads the model waits for
it, then unloads. Across gateways the table's own check does it (``ModelControl.mark_loaded``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from plaza.errors import ConfigError, PlazaError, Unavailable
from plaza.model_control import (
    ALL_MODELS,
    MODEL_CONTROL_DISABLED,
    DesiredModel,
    LoadedModel,
    ModelControl,
    check_load,
    dependents,
    folder_fingerprint,
    live_generations,
    read_load,
    read_model,
)
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings

log = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 1.0
"""How often a gateway re-reads the model table (loads made through other gateways)."""

FOLLOW_RETRY_MAX_S = 30.0
"""The longest wait before a model that could not be read as the table says is read again
(the wait doubles from ``FOLLOW_INTERVAL_S`` after each failed read)."""

KEPT_GENERATIONS = 4
"""The configs of a model's latest generations that a gateway keeps: when the hosts refuse
the newest, the one a live worker still runs is served again."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of Triton's repository index."""

    name: str
    version: str = ""
    state: str = ""
    """READY, LOADING (loaded, no worker serves it yet), UNAVAILABLE, or "" (never loaded)."""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class FollowRetry:
    """A model whose generation in the table could not be read: when to read it again."""

    generation: int
    """The table's generation that failed (a new one is read at once)."""
    error: str
    """The last failure's message (a new message is logged, a repeated one is not)."""
    delay_s: float
    """The wait after the last failure; doubled after the next one, up to the maximum."""
    due: float
    """When (``time.monotonic``) the next read may be made."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A model whose generation in the table the model hosts refused, as a gateway settled it."""

    generation: int
    """The generation refused (settled once: a new one is settled anew)."""
    serving: int | None
    """The older generation whose config is served instead (a live worker of it answers);
    None: none that this gateway read."""


class ModelRegistry:
    """What one gateway serves; loads and unloads in modes ``explicit`` and ``poll``."""

    def __init__(
        self, settings: PlazaSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.mode = settings.gateway.model_control_mode
        self.repo = ModelRepository.of(settings)
        self._names = settings.names
        self._kafka = settings.kafka
        self._load_timeout_s = settings.gateway.load_timeout_s
        self._start_names = settings.gateway.model_names()
        self.models: dict[str, LoadedModel] = {}
        self.failed: dict[str, str] = {}
        """Models that could not be read, with the reason (one still served at an older
        config included, when the table's newer one could not be read)."""
        self.unloaded: set[str] = set()
        self.refused: dict[str, str] = {}
        """Models loaded whose current generation a model host could not load (the model
        table's ``failed``), with the host's reason: no worker will serve them."""
        self._along: set[str] = set()
        """Explicit mode: start models served only as steps of the ensembles named at start
        (marked loaded along with them, not ``explicit``, in the model table)."""
        self._generations: dict[str, int] = {}
        """The model table's generation each model is served at (or was dropped at):
        ``follow`` re-reads a model whose generation in the table differs (one that failed
        is not recorded here, but in ``_retries``)."""
        self._locks: dict[str, asyncio.Lock] = {}
        """One per model: its loads, unloads and following run one at a time."""
        self._retries: dict[str, FollowRetry] = {}
        """Models whose generation in the table could not be read (``follow`` backs off)."""
        self._kept: dict[str, dict[int, LoadedModel]] = {}
        """The configs of each model's latest generations served (``KEPT_GENERATIONS``; a
        refused one is dropped): one of them may still run when the newest is refused."""
        self._refusals: dict[str, Refusal] = {}
        """Models whose generation served here the hosts refused, and what serves instead."""
        self._pending: dict[str, int] = {}
        """Models reloaded to a generation (the table's, recorded in ``_generations``) that
        no live worker names yet: the config of an older one that a live worker names is
        served until one does (``_hold_older``, ``_settle_pending``)."""
        self._redis: aioredis.Redis | None = None
        self._clock = clock
        self._seen: dict[str, str] = {}
        """Poll mode: a fingerprint of each model's folder as last read."""
        self._control: ModelControl | None = None
        """Loads and unloads for the deployment (``plaza.model_control``); None in mode none."""
        self.on_refused: Callable[[str], None] | None = None
        """Told the name of a model that stops being served because the hosts refused its
        load with no worker of it live at all (``_refusal_settled``): none will answer the
        requests of it that wait (the gateway's service answers them)."""

    # -- start -----------------------------------------------------------------------------
    def read_start_models(self) -> None:
        """The models served from the start (a ConfigError for a name not in the repository).

        none: ``gateway.models`` or every model; explicit: ``gateway.models`` (``*``: all);
        poll: every model.
        """
        present = self.repo.model_names()
        names = self._start_names
        if self.mode == "poll" or names == [ALL_MODELS] or (self.mode == "none" and not names):
            chosen = present
        else:
            chosen = names
        missing = sorted(set(chosen) - set(present))
        if missing:
            raise ConfigError(
                f"gateway.models names {missing}, not in the repository {self.repo.root} "
                f"(it has {present})"
            )
        self.models, self.failed = {}, {}
        for name in chosen:
            self._read(name)
        self._along = set()
        if self.mode == "explicit":
            self._read_steps()

    def _read_steps(self) -> None:
        """Explicit mode: serve the step models of the ensembles served from the start (and
        theirs), as Triton loads an ensemble's composing models with it."""
        present = set(self.repo.model_names())
        while True:
            steps = {
                step.model_name
                for model in self.models.values()
                for step in model.spec.ensemble_steps
            }
            new = sorted((steps & present) - set(self.models) - set(self.failed))
            if not new:
                return
            for name in new:
                self._along.add(name)
                self._read(name)

    async def start(self, redis: aioredis.Redis) -> None:
        """Modes explicit and poll: announce the start models in the model table (those
        not loaded there yet) and take over what other gateways loaded."""
        if self.mode == "none":
            return
        self._redis = redis
        self._control = ModelControl(
            redis, self._names, self._kafka, self.repo, self._load_timeout_s
        )
        table = await self._control.table.read()
        for name in list(self.models):
            desired = table.get(name)
            if desired is None or not desired.loaded:
                folder = folder_fingerprint(self.repo, name)
                explicit = name not in self._along
                desired = await self._control.table.load(
                    name, explicit=explicit, folder=folder, model=self.models[name]
                )  # pinned as read: a unit started later serves what this gateway read
            if desired.config == "":  # as read from the repository just now
                self._followed(name, desired.generation)
        if self.mode == "poll":
            self._seen = {name: self._fingerprint(name) for name in self.repo.model_names()}
        await self.follow()

    # -- following the table ---------------------------------------------------------------
    async def follow(self) -> None:
        """Serve what the model table says is loaded, as it says (loads and reloads made
        through other gateways): a model whose generation there differs from the one served
        is read again, or dropped when unloaded."""
        if self._control is None:
            return
        known = dict(self._generations)
        for name, desired in (await self._control.table.read()).items():
            self._note_refusal(desired)
            async with self._lock(name):
                if self._generations.get(name) != known.get(name):
                    continue  # loaded or unloaded through this gateway since the table was read
                await self._follow_one(desired)

    async def _follow_one(self, desired: DesiredModel) -> None:
        name, generation = desired.name, desired.generation
        served = self._generations.get(name)
        if served == generation:
            await self._settle_refusal(desired)
            await self._settle_pending(name, generation)
            return
        if not desired.loaded:
            if name in self.models or name in self._retries:
                self._drop(name)
            self._followed(name, generation)
            return
        retry = self._retries.get(name)
        if retry is not None and retry.generation == generation and self._clock() < retry.due:
            return  # it failed a moment ago: wait before reading it again
        try:
            model = await self._parse_off_loop(name, desired.config)
        except PlazaError as exc:
            if self._generations.get(name) == served:
                self._follow_failed(desired, exc.message, retry)
            return
        older = await self._older_serving(desired)  # before serving: not a moment on a refused one
        if self._generations.get(name) != served:
            return  # a load or unload through this gateway wrote it meanwhile: it stands
        self._serve(name, model)
        self._followed(name, generation)
        if desired.failed:
            self._refusal_settled(desired, older, await self._idle(desired, older))
        else:
            self._hold_older(name, generation, older)

    def _follow_failed(self, desired: DesiredModel, error: str, retry: FollowRetry | None) -> None:
        """Record that ``desired`` could not be read: a model served keeps its config (as a
        failed load leaves it), and is read again after a wait that doubles each time."""
        name = desired.name
        if retry is not None and retry.generation != desired.generation:
            retry = None  # a new load: its failure is news, and its wait starts short
        delay = FOLLOW_INTERVAL_S if retry is None else min(retry.delay_s * 2, FOLLOW_RETRY_MAX_S)
        if retry is None or retry.error != error:
            kept = " (its previous config still served)" if name in self.models else ""
            log.error(
                "model %s could not be read as the model table loads it (generation %d)%s; "
                "reading it again at growing intervals: %s",
                name, desired.generation, kept, error,
            )  # fmt: skip
        self._retries[name] = FollowRetry(desired.generation, error, delay, self._clock() + delay)
        self.failed[name] = error

    def _followed(self, name: str, generation: int) -> None:
        """``name`` is served (or dropped) at the table's ``generation``: no retry is due."""
        self._generations[name] = generation
        self._pending.pop(name, None)
        model = self.models.get(name)
        if model is not None:
            self._keep(name, generation, model)
        refusal = self._refusals.get(name)
        if refusal is not None and refusal.generation != generation:
            del self._refusals[name]
        if self._retries.pop(name, None) is not None:
            self.failed.pop(name, None)
            log.info("model %s follows the model table again (generation %d)", name, generation)

    # -- load / unload ---------------------------------------------------------------------
    async def load(self, name: str, config: str = "", *, wait: bool = False) -> LoadedModel:
        """Serve ``name`` (with a config override in Triton's JSON form, if given) and load
        it for the deployment (``ModelControl.mark_loaded``: an ensemble's step models not
        loaded yet, then the model, in the table, with their topics; with ``wait``, a live
        worker). ModelNotFound or ConfigError when it cannot be read (a model still served
        keeps its old config); Unavailable when an unload (or another load) of it came
        through another gateway while it was read (the later request stands)."""
        control = self._changes_allowed()
        check_load(self.repo, name, config)
        async with self._lock(name):
            seen = await control.table.get(name)
            try:
                model = await asyncio.to_thread(read_load, self.repo, name, config)
                served = None if seen is None else self._kept.get(name, {}).get(seen.generation)
                marked = await control.mark_loaded(name, config, model, seen, served)
            except ConfigError as exc:
                if name not in self.models and "reason" in exc.details:
                    self.failed[name] = exc.details["reason"]
                raise
            for each in marked:
                step, generation = each.desired.name, each.desired.generation
                self.refused.pop(step, None)  # a new generation, not failed yet
                older = await self._older_serving(each.desired)
                self._serve(step, each.model)
                self._followed(step, generation)
                self._hold_older(step, generation, older)
                log.info("model %s loaded (versions %s)", step, each.model.versions)
        if wait:
            try:
                await control.wait_served(marked[-1])
            except ConfigError as exc:  # a host refused it: the previous unit (if any) serves
                self.refused[name] = str(exc.details.get("reason", exc.message))
                await self._refused_now(control, name)
                raise
            for each in marked:  # a live worker runs the new config: it is served from now
                async with self._lock(each.desired.name):
                    await self._settle_pending(each.desired.name, each.desired.generation)
        return model

    async def _refused_now(self, control: ModelControl, name: str) -> None:
        """A load of ``name`` was refused by a host: serve the config that still runs at
        once (``_settle_refusal``), not from the next ``follow``, which does it otherwise."""
        try:
            desired = await control.table.get(name)
            if desired is not None:
                async with self._lock(name):
                    await self._settle_refusal(desired)
        except (RedisError, OSError) as exc:
            log.warning("model %s: its refusal is settled on the next follow: %s", name, exc)

    def _note_refusal(self, desired: DesiredModel) -> None:
        """Follow the table's word that no host could load ``desired``'s generation."""
        if desired.loaded and desired.failed:
            self.refused[desired.name] = desired.failed
        else:
            self.refused.pop(desired.name, None)

    async def _settle_refusal(self, desired: DesiredModel) -> None:
        """Once for each generation the hosts refused (``desired``'s, served here): serve
        the config of the older generation a live worker still runs (``_older_serving``)."""
        name = desired.name
        if not (desired.loaded and desired.failed):
            return
        settled = self._refusals.get(name)
        if settled is not None and settled.generation == desired.generation:
            return
        older = await self._older_serving(desired)
        idle = await self._idle(desired, older)
        if self._generations.get(name) == desired.generation and name in self.models:
            self._refusal_settled(desired, older, idle)

    async def _idle(self, desired: DesiredModel, older: tuple[int, LoadedModel] | None) -> bool:
        """Whether no live worker serves ``desired``'s model at all (none of an older
        generation either): its refused generation leaves nothing to answer it."""
        if older is not None or self._redis is None:
            return False
        return not await live_generations(self._redis, self._names, desired.name)

    async def _older_serving(self, desired: DesiredModel) -> tuple[int, LoadedModel] | None:
        """While no live worker runs ``desired``'s generation (the hosts refused it, or its
        worker is not up yet): the newest other generation of the model kept here that a
        live worker names in its registry entry, with its config; None when there is none,
        or when a live worker names ``desired``'s (or none: ``serves_generation``)."""
        await self._recall_previous(desired)
        kept = self._kept.get(desired.name, {})
        older = sorted((g for g in kept if g != desired.generation), reverse=True)
        if not (desired.loaded and older) or self._redis is None:
            return None
        live = await live_generations(self._redis, self._names, desired.name)
        if not desired.failed and ({desired.generation, None} & live):
            return None
        return next(((g, kept[g]) for g in older if g in live), None)

    async def _recall_previous(self, desired: DesiredModel) -> None:
        """Keep the configs of ``desired``'s previous generations as the table holds them
        (``DesiredModel.previous``) where this gateway did not read them itself (it started
        later): the workers of one may run on while ``desired``'s is refused or not up, and
        ``_older_serving`` picks the newest that a live worker names (not always the last
        one: a reload superseded before any worker ran it runs nowhere)."""
        if not desired.loaded:
            return
        for previous in desired.previous:
            if previous.generation in self._kept.get(desired.name, {}):
                continue
            try:
                model = await asyncio.to_thread(self._parse, desired.name, previous.config)
            except PlazaError as exc:
                log.warning(
                    "model %s: the config of its generation %d, kept in the model table, "
                    "does not read: %s", desired.name, previous.generation, exc.message,
                )  # fmt: skip
                continue
            if previous.versions:  # as it was served, not as the folder reads now
                model = LoadedModel(model.spec, previous.versions)
            self._keep(desired.name, previous.generation, model)

    def _hold_older(
        self, name: str, generation: int, older: tuple[int, LoadedModel] | None
    ) -> None:
        """``name`` is loaded at ``generation``, which no live worker names yet: serve
        ``older``'s config (``_older_serving``) until one does (``_settle_pending``)."""
        if older is None:
            return  # a first load, or the new generation serves already: served at once
        self._pending[name] = generation
        self.models[name] = older[1]
        log.info(
            "model %s: generation %d is served once a worker of it serves; until then the "
            "config of generation %d, which a live worker runs",
            name, generation, older[0],
        )  # fmt: skip

    async def _settle_pending(self, name: str, generation: int) -> None:
        """Serve ``name``'s config at ``generation`` (the table's, held by ``_hold_older``)
        once a live worker names it (a refusal is ``_settle_refusal``'s)."""
        if self._pending.get(name) != generation or self._redis is None:
            return
        live = await live_generations(self._redis, self._names, name)
        model = self._kept.get(name, {}).get(generation)
        if self._pending.get(name) != generation or model is None:
            return
        if {generation, None} & live:
            del self._pending[name]
            self.models[name] = model
            log.info(
                "model %s: a worker of generation %d serves; its config is served", name, generation
            )

    def _refusal_settled(
        self, desired: DesiredModel, older: tuple[int, LoadedModel] | None, idle: bool = False
    ) -> None:
        """``desired``'s generation was refused: ``older`` (``_older_serving``) is served;
        with no worker of the model live at all (``idle``: a first load refused), nothing
        is, as Triton serves no model that failed to load: its requests are refused at once
        (model_not_found, naming the refusal) rather than left to wait in Kafka."""
        name = desired.name
        self._refusals[name] = Refusal(desired.generation, None if older is None else older[0])
        self._kept.get(name, {}).pop(desired.generation, None)  # no worker will run it
        self._pending.pop(name, None)
        if older is None:
            if idle:
                self.models.pop(name, None)
                self.failed[name] = f"a model host could not load it: {desired.failed}"
                if self.on_refused is not None:
                    self.on_refused(name)
            return
        self.models[name] = older[1]
        log.warning(
            "model %s: the model hosts refused its generation %d (%s); the config of "
            "generation %d, which a live worker runs, is served",
            name, desired.generation, desired.failed, older[0],
        )  # fmt: skip

    async def unload(self, name: str, dependents: bool = False) -> None:
        """Stop serving ``name`` and mark it unloaded (its workers drain, then stop), with
        what Triton unloads with it (``ModelControl.unload``): the served ensembles that
        call it, directly or through other ensembles; with ``dependents`` (Triton's
        ``unload_dependents``), first its step models loaded only along with it."""
        control = self._changes_allowed()
        async with self._lock(name):
            specs = self._specs()
            for desired in await control.unload(name, with_dependents=dependents, specs=specs):
                self._drop(desired.name)
                self._followed(desired.name, desired.generation)
                log.info("model %s unloaded", desired.name)

    def dependents(self, name: str) -> list[str]:
        """The served ensembles that run ``name`` in a step, or run one that does (an unload
        of ``name`` unloads them too)."""
        return dependents(name, self._specs())

    def _specs(self) -> dict[str, ModelSpec]:
        """The config of each model served."""
        return {m: loaded.spec for m, loaded in self.models.items()}

    async def poll(self) -> None:
        """Poll mode: load what appeared or changed in the repository, unload what left.

        A model unloaded because a step it runs left (or one that failed to load) is read
        again on the round after any load: the model that came back may be what it needs."""
        present = set(self.repo.model_names())
        loaded = False
        for name in sorted(present):
            fingerprint = self._fingerprint(name)
            if self._seen.get(name) != fingerprint:
                self._seen[name] = fingerprint
                try:
                    await self.load(name)
                    loaded = True
                except PlazaError as exc:
                    log.error("poll: model %s not loaded: %s", name, exc.message)
        for name in sorted(set(self._seen) - present):
            del self._seen[name]
            await self.unload(name)
        if loaded:
            for name in present - set(self.models):
                self._seen.pop(name, None)

    # -- index -----------------------------------------------------------------------------
    def index(self, live: dict[str, int], ready_only: bool = False) -> list[IndexEntry]:
        """Triton's repository index; ``live`` holds the live worker count per served model."""
        rows: list[IndexEntry] = []
        for name in sorted(set(self.repo.model_names()) | set(self.models)):
            model = self.models.get(name)
            if model is not None:
                state = "READY" if live.get(name, 0) > 0 else "LOADING"
                reason = "" if state == "READY" else "no worker serves it yet"
                if name in self.refused:
                    state, reason = self._refused_row(name, state)
                if name in self.failed:  # the table's newer config could not be read here
                    reason = f"serves its previous config; the new one failed: {self.failed[name]}"
                rows += [IndexEntry(name, str(v), state, reason) for v in model.versions]
            elif name in self.failed:
                rows.append(IndexEntry(name, "", "UNAVAILABLE", self.failed[name]))
            elif name in self.unloaded:
                rows.append(IndexEntry(name, "", "UNAVAILABLE", "unloaded"))
            else:
                rows.append(IndexEntry(name))
        return [r for r in rows if r.state == "READY"] if ready_only else rows

    def _refused_row(self, name: str, state: str) -> tuple[str, str]:
        """State and reason of a model whose generation in the table the hosts refused:
        READY while a worker of an older one answers (Triton's, after a failed reload)."""
        why = self.refused[name]
        if state == "LOADING":
            return "UNAVAILABLE", f"a model host could not load it: {why}"
        refusal = self._refusals.get(name)
        if refusal is None or refusal.serving is None:  # this gateway knows no older config
            return state, f"reload refused, an older config serves (unknown here): {why}"
        return state, f"reload refused, the previous config serves: {why}"

    # -- helpers ---------------------------------------------------------------------------
    def _changes_allowed(self) -> ModelControl:
        if self._control is None:
            raise Unavailable(MODEL_CONTROL_DISABLED)
        return self._control

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _parse(self, name: str, config: str = "") -> LoadedModel:
        return read_model(self.repo, name, config)

    def _serve(self, name: str, model: LoadedModel) -> None:
        self.failed.pop(name, None)
        self.unloaded.discard(name)
        self.models[name] = model

    def _read(self, name: str) -> LoadedModel | None:
        """Serve ``name`` as the repository says; a failure is recorded."""
        try:
            model = self._parse(name)
        except PlazaError as exc:
            self._not_served(name, exc)
            return None
        self._serve(name, model)
        return model

    async def _parse_off_loop(self, name: str, config: str = "") -> LoadedModel:
        """``_parse`` on a thread: completing a config may take a while (a Python model's
        ``auto_complete_config`` runs in a child process), and the loop serves meanwhile."""
        return await asyncio.to_thread(self._parse, name, config)

    def _not_served(self, name: str, exc: PlazaError) -> None:
        log.error("model %s is not served: %s", name, exc.message)
        self.failed[name] = exc.message
        self.models.pop(name, None)

    def _keep(self, name: str, generation: int, model: LoadedModel) -> None:
        """Keep ``model`` as ``name``'s config at ``generation`` (the latest few)."""
        kept = self._kept.setdefault(name, {})
        kept[generation] = model
        for old in sorted(kept)[:-KEPT_GENERATIONS]:
            del kept[old]

    def _drop(self, name: str) -> None:
        self.models.pop(name, None)
        self.refused.pop(name, None)
        self._kept.pop(name, None)
        self._refusals.pop(name, None)
        self._pending.pop(name, None)
        self.unloaded.add(name)

    def _fingerprint(self, name: str) -> str:
        """What poll mode compares (``folder_fingerprint``)."""
        return folder_fingerprint(self.repo, name)
