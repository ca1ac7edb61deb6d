"""The models a gateway serves, and Triton's model control over them.

In mode ``none`` the registry is read once from the repository. In ``explicit`` and
``poll`` it follows the deployment's model table (``plaza.model_control``): a load or
unload made through any gateway is written there, and every gateway re-reads the table
every ``FOLLOW_INTERVAL_S``, so they all serve the same models. Whoever runs the workers
watches the same table (model hosts with ``host.follow_model_table``, or ``plaza up``'s
supervisor with ``--process-per-model``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass

import redis.asyncio as aioredis

from plaza.errors import ConfigError, PlazaError, Unavailable
from plaza.model_control import (
    ALL_MODELS,
    MODEL_CONTROL_DISABLED,
    LoadedModel,
    ModelControl,
    dependents,
    read_load,
    read_model,
)
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings

log = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 1.0
"""How often a gateway re-reads the model table (loads made through other gateways)."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of Triton's repository index."""

    name: str
    version: str = ""
    state: str = ""
    """READY, LOADING (loaded, no worker serves it yet), UNAVAILABLE, or "" (never loaded)."""
    reason: str = ""


class ModelRegistry:
    """What one gateway serves; loads and unloads in modes ``explicit`` and ``poll``."""

    def __init__(self, settings: PlazaSettings) -> None:
        self.mode = settings.gateway.model_control_mode
        self.repo = ModelRepository.of(settings)
        self._names = settings.names
        self._kafka = settings.kafka
        self._load_timeout_s = settings.gateway.load_timeout_s
        self._start_names = settings.gateway.model_names()
        self.models: dict[str, LoadedModel] = {}
        self.failed: dict[str, str] = {}
        """Models that could not be read, with the reason."""
        self.unloaded: set[str] = set()
        self._configs: dict[str, str] = {}
        """The config override each loaded model was loaded with ("" for none)."""
        self._seen: dict[str, str] = {}
        """Poll mode: a fingerprint of each model's folder as last read."""
        self._control: ModelControl | None = None
        """Loads and unloads for the deployment (``plaza.model_control``); None in mode none."""

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

    async def start(self, redis: aioredis.Redis) -> None:
        """Modes explicit and poll: announce the start models in the model table (those
        not loaded there yet) and take over what other gateways loaded."""
        if self.mode == "none":
            return
        self._control = ModelControl(
            redis, self._names, self._kafka, self.repo, self._load_timeout_s
        )
        table = await self._control.table.read()
        for name in list(self.models):
            if name not in table or not table[name].loaded:
                await self._control.table.load(name)
        if self.mode == "poll":
            self._seen = {name: self._fingerprint(name) for name in self.repo.model_names()}
        await self.follow()

    # -- following the table ---------------------------------------------------------------
    async def follow(self) -> None:
        """Serve what the model table says is loaded (loads made through other gateways)."""
        if self._control is None:
            return
        for name, desired in (await self._control.table.read()).items():
            if desired.loaded and (
                name not in self.models or self._configs.get(name, "") != desired.config
            ):
                await self._read_off_loop(name, desired.config)
            elif not desired.loaded and name in self.models:
                self._drop(name)

    # -- load / unload ---------------------------------------------------------------------
    async def load(self, name: str, config: str = "", *, wait: bool = False) -> LoadedModel:
        """Serve ``name`` (with a config override in Triton's JSON form, if given) and load
        it for the deployment (``ModelControl.load``: the table, its topics and, with
        ``wait``, a live worker); ModelNotFound or ConfigError when it cannot be read (a
        model still served keeps its old config)."""
        control = self._changes_allowed()
        try:
            model = await asyncio.to_thread(read_load, self.repo, name, config)
        except ConfigError as exc:
            if name not in self.models and "reason" in exc.details:
                self.failed[name] = exc.details["reason"]
            raise
        self._serve(name, model, config)
        log.info("model %s loaded (versions %s)", name, list(model.versions))
        return await control.load(name, config, model=model, wait=wait)

    async def unload(self, name: str, dependents: bool = False) -> None:
        """Stop serving ``name`` and mark it unloaded (its workers drain, then stop); with
        ``dependents`` (Triton's ``unload_dependents``), the served ensembles that call it,
        directly or through other ensembles, too."""
        control = self._changes_allowed()
        specs = self._specs()
        for model in await control.unload(name, with_dependents=dependents, specs=specs):
            self._drop(model)
            log.info("model %s unloaded", model)

    def dependents(self, name: str) -> list[str]:
        """The served ensembles that run ``name`` in a step, or run one that does."""
        return dependents(name, self._specs())

    def _specs(self) -> dict[str, ModelSpec]:
        """The config of each model served."""
        return {m: loaded.spec for m, loaded in self.models.items()}

    async def poll(self) -> None:
        """Poll mode: load what appeared or changed in the repository, unload what left."""
        present = set(self.repo.model_names())
        for name in sorted(present):
            fingerprint = self._fingerprint(name)
            if self._seen.get(name) != fingerprint:
                self._seen[name] = fingerprint
                try:
                    await self.load(name)
                except PlazaError as exc:
                    log.error("poll: model %s not loaded: %s", name, exc.message)
        for name in sorted(set(self._seen) - present):
            del self._seen[name]
            await self.unload(name)

    # -- index -----------------------------------------------------------------------------
    def index(self, live: dict[str, int], ready_only: bool = False) -> list[IndexEntry]:
        """Triton's repository index; ``live`` holds the live worker count per served model."""
        rows: list[IndexEntry] = []
        for name in sorted(set(self.repo.model_names()) | set(self.models)):
            model = self.models.get(name)
            if model is not None:
                state = "READY" if live.get(name, 0) > 0 else "LOADING"
                reason = "" if state == "READY" else "no worker serves it yet"
                rows += [IndexEntry(name, str(v), state, reason) for v in model.versions]
            elif name in self.failed:
                rows.append(IndexEntry(name, "", "UNAVAILABLE", self.failed[name]))
            elif name in self.unloaded:
                rows.append(IndexEntry(name, "", "UNAVAILABLE", "unloaded"))
            else:
                rows.append(IndexEntry(name))
        return [r for r in rows if r.state == "READY"] if ready_only else rows

    # -- helpers ---------------------------------------------------------------------------
    def _changes_allowed(self) -> ModelControl:
        if self._control is None:
            raise Unavailable(MODEL_CONTROL_DISABLED)
        return self._control

    def _parse(self, name: str, config: str = "") -> LoadedModel:
        return read_model(self.repo, name, config)

    def _serve(self, name: str, model: LoadedModel, config: str) -> None:
        self.failed.pop(name, None)
        self.unloaded.discard(name)
        self._configs[name] = config
        self.models[name] = model

    def _read(self, name: str, config: str = "") -> LoadedModel | None:
        """Serve ``name`` as the repository (or ``config``) says; a failure is recorded."""
        try:
            model = self._parse(name, config)
        except PlazaError as exc:
            self._not_served(name, exc)
            return None
        self._serve(name, model, config)
        return model

    async def _read_off_loop(self, name: str, config: str = "") -> LoadedModel | None:
        """``_read`` with the reading on a thread: completing a config may take a while (a
        Python model's ``auto_complete_config`` runs in a child process), and the loop
        serves requests meanwhile."""
        try:
            model = await asyncio.to_thread(self._parse, name, config)
        except PlazaError as exc:
            self._not_served(name, exc)
            return None
        self._serve(name, model, config)
        return model

    def _not_served(self, name: str, exc: PlazaError) -> None:
        log.error("model %s is not served: %s", name, exc.message)
        self.failed[name] = exc.message
        self.models.pop(name, None)

    def _drop(self, name: str) -> None:
        self.models.pop(name, None)
        self._configs.pop(name, None)
        self.unloaded.add(name)

    def _fingerprint(self, name: str) -> str:
        """What poll mode compares: the config text (none for a model whose config is made
        from its ONNX file) and the version folders' contents."""
        folder = self.repo.root / name
        digest = hashlib.sha256()
        try:
            config = self.repo.config_path(folder)
            digest.update(config.read_bytes() if config.exists() else b"no config")
            for item in sorted(folder.glob("*/*")):
                stat = item.stat()
                digest.update(
                    f"{item.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}".encode()
                )
        except OSError:
            digest.update(b"unreadable")
        return digest.hexdigest()
