"""Model control: which models a deployment should serve, shared through Redis.

Triton's model control modes, for a deployment of many processes:

- ``none``: every model of the repository is served from the start; load and unload are
  refused.
- ``explicit``: the models named at start (``gateway.models``, ``*`` for all) are served;
  the repository API loads and unloads the others.
- ``poll``: the gateway re-reads the repository every ``gateway.repository_poll_s`` and
  loads what appeared or changed, unloads what disappeared.

The decision lives in one Redis hash, the *model table* (``Names.model_table_key``): a field
per model holding what should happen to it (loaded or not, an optional config override, a
generation that changes with every load). Gateways write it and read it back (so several
gateways agree), and whoever runs workers watches it: a model host with
``host.follow_model_table`` (``workers/model_watch.py``; what ``plaza up`` runs) or, with
``plaza up --process-per-model``, its supervisor starts a model's workers when it is
loaded, restarts them when its generation changes (a new config or version folder), and
drains then stops them when it is unloaded. The table has
one field per model ever loaded, so it is bounded by the repository.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

from plaza.autocomplete import complete
from plaza.errors import ConfigError
from plaza.modelconfig import ModelSpec, parse_model_config_json
from plaza.naming import Names
from plaza.repository import CONFIG_FILENAME, ModelRepository

ControlMode = Literal["none", "explicit", "poll"]
ALL_MODELS = "*"
"""In explicit mode, ``gateway.models: "*"`` loads every model of the repository at start."""


@dataclass(frozen=True, slots=True)
class DesiredModel:
    """What should happen to one model."""

    name: str
    loaded: bool
    generation: int
    """Changes with every load: workers of an older generation are restarted."""
    config: str = ""
    """A config override in Triton's JSON form (a load's ``parameters.config``); "" uses
    the repository's config.pbtxt."""

    def encode(self) -> str:
        doc = {"loaded": self.loaded, "generation": self.generation, "config": self.config}
        return json.dumps(doc)

    @classmethod
    def decode(cls, name: str, raw: bytes | str) -> DesiredModel:
        doc = json.loads(raw)
        return cls(name, bool(doc["loaded"]), int(doc["generation"]), str(doc.get("config", "")))


def model_spec(repo: ModelRepository, name: str, config: str = "") -> ModelSpec:
    """The model's spec: the override ``config`` (Triton JSON) when given, else its
    config.pbtxt; an ONNX model's completed from its file either way (``plaza.autocomplete``).
    ConfigError or ModelNotFound."""
    if not config:
        return repo.spec(name)
    repo.available_versions(name)  # ModelNotFound for a model that is not in the repository
    source = f"{repo.root / name / CONFIG_FILENAME} (overridden by the load request)"
    folder = repo.root / name
    return parse_model_config_json(
        config, source=source, default_name=name, complete=lambda c: complete(c, folder, source)
    )


def check_config_override(config: str) -> str:
    """A load's ``parameters.config`` must be a JSON object (as a string)."""
    try:
        doc = json.loads(config)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"parameters.config is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError("parameters.config must be a JSON object (a model config)")
    return config


class ModelTable:
    """The model table of one deployment (its Redis key prefix)."""

    def __init__(self, redis: aioredis.Redis, names: Names) -> None:
        self._redis = redis
        self._key = names.model_table_key()

    async def read(self) -> dict[str, DesiredModel]:
        """Every model the table knows, loaded or not."""
        fields = await self._redis.hgetall(self._key)
        return {
            (k.decode() if isinstance(k, bytes) else k): DesiredModel.decode(
                k.decode() if isinstance(k, bytes) else k, v
            )
            for k, v in fields.items()
        }

    async def loaded(self) -> dict[str, DesiredModel]:
        """The models that should be served."""
        return {name: m for name, m in (await self.read()).items() if m.loaded}

    async def load(self, name: str, config: str = "") -> DesiredModel:
        """Mark ``name`` loaded, with a new generation (its workers restart if running)."""
        desired = DesiredModel(name, True, time.time_ns(), config)
        await self._redis.hset(self._key, name, desired.encode())
        return desired

    async def unload(self, name: str) -> DesiredModel:
        """Mark ``name`` unloaded: its workers drain and stop."""
        desired = DesiredModel(name, False, time.time_ns())
        await self._redis.hset(self._key, name, desired.encode())
        return desired
