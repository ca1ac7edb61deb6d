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
loaded, starts a new generation's beside the old ones and stops those once it serves (a
new config or version folder), and drains then stops them when it is unloaded. The table has
one field per model ever loaded, so it is bounded by the repository.

``ModelControl`` is Triton's load and unload over that table, the one path that both the
gateway's repository API and a Python model's ``pb_utils.load_model`` / ``unload_model`` /
``is_model_ready`` (``workers/backends/pb_model_loader.py``) run: read the model
(``read_load``), mark it loaded (an ensemble's step models first, those not loaded yet, as
Triton's explicit mode loads an ensemble's composing models), create its request topics,
wait for a live worker of the generation it wrote (the worker registry's heartbeats,
``serves_generation``; a host that refuses it says why in the table, ``ModelTable.fail``,
which ends the wait at once); and unload
as Triton's model repository manager does (``unload_plan``: an ensemble whose step model is
unloaded goes too, and ``unload_dependents`` takes an ensemble's steps that were loaded only
along with it, which the table remembers as not ``explicit``). The later
request wins: a load writes its entry only if the model's generation in the table is still
the one it saw before reading the model (``ModelTable.load_if_unchanged``, one atomic Redis
script), so an unload sent through any gateway while the load was reading is never undone.

A load's entry also keeps the configs its previous generations were served with
(``DesiredModel.previous``, the latest ``MAX_PREVIOUS``: the table stays bounded), so that a
gateway started after the hosts refused the new one serves the config their workers still
run: that of the newest of them a live worker names (a generation superseded before any
worker ran it, by a quick second reload, is among them but runs nowhere). It also records
what its own load read (``DesiredModel.pinned``: the complete config and the versions
selected), which every unit of that generation starts from however late (``unit_config``),
and which readiness (``ModelControl.ready``) reads with the versions live workers report,
never the folder as it is now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from plaza.ensembles import EnsembleStep, check_nesting, check_tensors, nested_models
from plaza.errors import ConfigError, ModelNotFound, PlazaError, Unavailable
from plaza.modelconfig import ModelSpec, parse_model_config_json
from plaza.naming import Names
from plaza.repository import CONFIG_FILENAME, ModelRepository
from plaza.settings import KafkaSettings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

ControlMode = Literal["none", "explicit", "poll"]
ALL_MODELS = "*"
"""In explicit mode, ``gateway.models: "*"`` loads every model of the repository at start."""
MODEL_CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"
"""Triton's answer to a load or unload when the model control mode does not allow it."""
FILE_OVERRIDES_REFUSED = (
    "file overrides are not supported by Plaza (put the files in the model repository)"
)
"""Why a load's ``file:<path>`` overrides (Triton's ``files``) are refused: a model's files
must be in the repository every worker reads."""
LOAD_POLL_S = 0.2
"""How often a load checks whether a worker serves the model yet."""

_WRITE_IF_GENERATION = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local generation = ''
if current then
  generation = string.match(current, '"generation": *(%-?%d+)') or '?'
end
if generation ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""
"""Write a model's field (ARGV[3]) only while its generation is still ARGV[2] ("": no field
yet). Generations are compared as text: they are nanoseconds, past a Lua number's precision."""


MAX_PREVIOUS = 3
"""Previous generations' configs a model table entry keeps (``DesiredModel.previous``)."""


@dataclass(frozen=True, slots=True)
class ServedConfig:
    """The config a model's earlier generation was loaded with, as a gateway served it."""

    generation: int
    config: str
    """Its config in Triton's JSON form, complete (a load's override reads it back)."""
    versions: tuple[int, ...] = ()
    """The versions it served; () where unknown (read from the repository then)."""

    def encode(self) -> dict[str, Any]:
        return {"generation": self.generation, "config": self.config, "versions": self.versions}

    def unit_config(self) -> str:
        """The config a unit of this generation starts from: complete, its version policy
        narrowed to ``versions`` (when known), whatever the model's folder holds now."""
        if not self.versions:
            return self.config
        doc = json.loads(self.config)
        doc["version_policy"] = {"specific": {"versions": list(self.versions)}}
        return json.dumps(doc)

    @classmethod
    def decode_all(cls, doc: Mapping[str, Any]) -> tuple[ServedConfig, ...]:
        """An entry's previous configs (its ``previous`` list of ``encode``'s; one entry
        written before that list keeps one, as ``previous_*``), newest first."""
        if "previous" not in doc:
            prefix = "previous_"
            legacy = {k[len(prefix) :]: v for k, v in doc.items() if k.startswith(prefix)}
            return tuple(c for c in [cls._decode(legacy)] if c is not None)
        return tuple(c for c in map(cls._decode, doc["previous"]) if c is not None)

    @classmethod
    def _decode(cls, doc: Mapping[str, Any]) -> ServedConfig | None:
        generation = doc.get("generation")
        if not isinstance(generation, int) or not doc.get("config"):
            return None
        return cls(generation, str(doc["config"]), tuple(int(v) for v in doc.get("versions", ())))


def pin(generation: int, model: LoadedModel) -> ServedConfig:
    """The record of what a load of ``generation`` read (``DesiredModel.pinned``): its
    complete config and the versions it selected."""
    return ServedConfig(generation, json.dumps(model.spec.config_json()), model.versions)


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
    explicit: bool = True
    """Loaded by a load that named it (or at start), not only along with an ensemble that
    runs it in a step: an unload with ``unload_dependents`` of that ensemble leaves it."""
    folder: str = ""
    """The model folder's fingerprint when this generation was loaded (``folder_fingerprint``;
    "": unknown): a load of the same config and folder keeps the generation."""
    failed: str = ""
    """Why a host could not load this generation (a bad config its worker refused); "" none.
    Written by hosts (``ModelTable.fail``), read by a load waiting for a worker."""
    previous: tuple[ServedConfig, ...] = ()
    """The configs of the last generations before this one that no host refused, newest
    first, at most ``MAX_PREVIOUS`` (a load records them, ``previous_served``): their
    workers may still run while this one is refused or not up yet, and a gateway that never
    read them serves the newest one a live worker names. (): unknown."""
    pinned: ServedConfig | None = None
    """What the load of this generation read (``pin``): its complete config and versions.
    Every unit of the generation starts from it (``unit_config``), however late (a lazy
    model, one evicted and back on demand), not from the folder as it is then. None:
    unknown (an entry written without a read, as a gateway's start writes)."""

    def encode(self) -> str:
        doc: dict[str, Any] = {
            "loaded": self.loaded,
            "generation": self.generation,
            "config": self.config,
            "explicit": self.explicit,
            "folder": self.folder,
            "failed": self.failed,
        }
        # after the generation: the table's script reads the first
        if self.previous:
            doc["previous"] = [served.encode() for served in self.previous]
        if self.pinned is not None:
            doc["pinned"] = self.pinned.encode()
        return json.dumps(doc)

    @classmethod
    def decode(cls, name: str, raw: bytes | str) -> DesiredModel:
        doc = json.loads(raw)
        return cls(
            name,
            bool(doc["loaded"]),
            int(doc["generation"]),
            str(doc.get("config", "")),
            bool(doc.get("explicit", True)),  # an entry written before the field: explicit
            str(doc.get("folder", "")),
            str(doc.get("failed", "")),
            ServedConfig.decode_all(doc),
            ServedConfig._decode(doc["pinned"]) if isinstance(doc.get("pinned"), dict) else None,
        )

    def same_load(self, config: str, folder: str) -> bool:
        """Whether a load of ``config`` with the model folder at ``folder`` would load what
        this entry already loads (and no host failed it): it keeps its generation."""
        unchanged = (self.config, self.folder) == (config, folder)
        return self.loaded and not self.failed and bool(folder) and unchanged


def previous_served(
    seen: DesiredModel | None, served: LoadedModel | None
) -> tuple[ServedConfig, ...]:
    """What a new generation's entry keeps as its previous configs (``DesiredModel.previous``),
    ``seen`` being the entry it replaces: ``served``, the config its loader served at
    ``seen``'s generation (else ``seen``'s own override, if any), then ``seen``'s own previous
    ones, the latest ``MAX_PREVIOUS``. ``seen``'s may never have run (a reload superseded
    before a worker of it came up): the older ones are kept for that, and a gateway serves
    the newest that a live worker names. A refused ``seen`` never ran: only the ones before
    it are kept. () for a model not loaded before."""
    if seen is None or not seen.loaded:
        return ()
    if seen.failed:
        return seen.previous
    own: tuple[ServedConfig, ...] = ()
    if served is not None:
        own = (pin(seen.generation, served),)
    elif seen.pinned is not None:
        own = (seen.pinned,)
    elif seen.config:
        own = (ServedConfig(seen.generation, seen.config),)
    return (own + seen.previous)[:MAX_PREVIOUS]


def unit_config(repo: ModelRepository, desired: DesiredModel) -> str:
    """The config a unit of ``desired``'s generation starts from: its load's record
    (``DesiredModel.pinned``, ``ServedConfig.unit_config``) when there is one, else the
    entry's override ("" : the folder's config.pbtxt). ConfigError when a version the load
    served is gone from the repository (a load failure, never a switch to another
    version); ModelNotFound for a model gone."""
    if desired.pinned is None:
        return desired.config
    gone = sorted(set(desired.pinned.versions) - set(repo.available_versions(desired.name)))
    if gone:
        folder = repo.root / desired.name
        raise ConfigError(
            f"{folder}: version folder(s) {', '.join(map(str, gone))} of model "
            f"'{desired.name}' are gone, but its generation {desired.generation} was loaded "
            "with them (load the model again to serve what the folder holds now)",
            file=str(folder),
            model=desired.name,
        )
    return desired.pinned.unit_config()


def model_spec(repo: ModelRepository, name: str, config: str = "") -> ModelSpec:
    """The model's spec: the override ``config`` (Triton JSON) when given, else its
    config.pbtxt; completed either way as the repository completes (``plaza.autocomplete``).
    ConfigError or ModelNotFound."""
    if not config:
        return repo.spec(name)
    repo.available_versions(name)  # ModelNotFound for a model that is not in the repository
    source = f"{repo.root / name / CONFIG_FILENAME} (overridden by the load request)"
    folder = repo.root / name
    return parse_model_config_json(
        config,
        source=source,
        default_name=name,
        complete=lambda c: repo.complete(c, folder, source),
    )


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model as a load serves it: its config and the versions its policy selects."""

    spec: ModelSpec
    versions: tuple[int, ...]


def read_model(
    repo: ModelRepository,
    name: str,
    config: str = "",
    loaded: Mapping[str, ServedConfig] | None = None,
) -> LoadedModel:
    """``name``'s spec (``model_spec``) and the versions its policy selects, each with its
    model file checked; ModelNotFound or ConfigError (an ensemble's: ``step_specs``, with
    ``loaded``, the records of the step models loaded already)."""
    spec = model_spec(repo, name, config)
    step_specs(repo, spec, loaded)
    return LoadedModel(spec, tuple(v.version for v in repo.served_versions(name, spec)))


def step_specs(
    repo: ModelRepository, spec: ModelSpec, loaded: Mapping[str, ServedConfig] | None = None
) -> dict[str, ModelSpec]:
    """The config of each model the ensemble ``spec`` runs in a step ({} for a model that
    is no ensemble), checked as Triton checks an ensemble at load: a step model in
    ``loaded`` (the records of those loaded already, ``loaded_records``) as it is loaded
    (``pinned_spec``: its config, its policy narrowed to the versions it serves), any
    other as the repository reads it (a load loads it along). ConfigError naming the step
    for a step model that cannot be read, a tensor it does not have, a datatype or shape
    that differs along an edge, a maximum batch size above a step's (``check_tensors``),
    ensembles that call each other (``check_nesting``), and a nested ensemble that fails
    these checks."""
    if not spec.is_ensemble:
        return {}
    loaded = {} if loaded is None else loaded
    source = str(repo.config_path(repo.root / spec.name))
    specs: dict[str, ModelSpec] = {}
    for step in spec.ensemble_steps:
        if step.model_name not in specs:
            specs[step.model_name] = _step_spec(repo, step, source, loaded)
    check_nesting(spec.name, _steps_reader(repo, spec, specs, loaded), source=source)
    check_tensors(spec, specs, source=source)
    for step in spec.ensemble_steps:
        try:
            step_specs(repo, specs[step.model_name], loaded)
        except ConfigError as exc:
            raise _step_failed(source, step, exc) from exc
    return specs


def step_models(repo: ModelRepository, spec: ModelSpec) -> dict[str, ModelSpec]:
    """The repository's config of each model the ensemble ``spec`` runs in a step ({} for
    a model that is no ensemble), checked only where what the steps are loaded with does
    not matter: ConfigError naming the step for ensembles that call each other
    (``check_nesting``) or a step model that cannot be read. ``step_specs`` checks the
    rest."""
    if not spec.is_ensemble:
        return {}
    source = str(repo.config_path(repo.root / spec.name))
    specs: dict[str, ModelSpec] = {}
    for step in spec.ensemble_steps:
        if step.model_name not in specs:
            specs[step.model_name] = _step_spec(repo, step, source, {})
    check_nesting(spec.name, _steps_reader(repo, spec, specs, {}), source=source)
    return specs


def pinned_spec(name: str, record: ServedConfig) -> ModelSpec:
    """The spec a model is loaded with, from its load's record (``DesiredModel.pinned``):
    its complete config, its version policy narrowed to the versions it serves
    (``ServedConfig.unit_config``). ConfigError for a record that does not parse."""
    source = f"the model table's record of '{name}'"
    return parse_model_config_json(record.unit_config(), source=source, default_name=name)


def loaded_records(table: Mapping[str, DesiredModel]) -> dict[str, ServedConfig]:
    """The load records (``DesiredModel.pinned``) of the models ``table`` serves: loaded,
    not failed, with a record. ``step_specs`` checks an ensemble against these."""
    return {
        name: desired.pinned
        for name, desired in table.items()
        if desired.loaded and not desired.failed and desired.pinned is not None
    }


def _spec_of(repo: ModelRepository, name: str, loaded: Mapping[str, ServedConfig]) -> ModelSpec:
    record = loaded.get(name)
    return repo.spec(name) if record is None else pinned_spec(name, record)


def _step_spec(
    repo: ModelRepository, step: EnsembleStep, source: str, loaded: Mapping[str, ServedConfig]
) -> ModelSpec:
    """The step model's config (as loaded, else the repository's); ConfigError naming the
    step (ModelNotFound's message for a model not in the repository)."""
    try:
        return _spec_of(repo, step.model_name, loaded)
    except PlazaError as exc:
        raise _step_failed(source, step, exc) from exc


def _step_failed(source: str, step: EnsembleStep, exc: PlazaError) -> ConfigError:
    """The step's model cannot be used: the cause alone in ``details["step_reason"]``."""
    field = f"ensemble_scheduling.step[{step.index}].model_name"
    error = ConfigError.at(source, field, f"{step.label}: {exc.message}")
    error.details.update(step_model=step.model_name, step_reason=exc.message)
    return error


def _steps_reader(
    repo: ModelRepository,
    spec: ModelSpec,
    specs: dict[str, ModelSpec],
    loaded: Mapping[str, ServedConfig],
) -> Callable[[str], tuple[EnsembleStep, ...]]:
    """A model's ensemble steps, read once (as loaded, else from the repository; ``spec``
    for its own name; () for a model that cannot be read: its own check names what is
    wrong with it)."""
    known = {**specs, spec.name: spec}

    def steps_of(name: str) -> tuple[EnsembleStep, ...]:
        if name not in known:
            try:
                known[name] = _spec_of(repo, name, loaded)
            except PlazaError:
                return ()
        return known[name].ensemble_steps

    return steps_of


def read_load(repo: ModelRepository, name: str, config: str = "") -> LoadedModel:
    """What a load of ``name`` (with the override ``config``, if any) would serve, checked
    before anything is written: ModelNotFound for a model not in the repository; ConfigError
    for an override that is not a JSON object, or a model that cannot be read (naming the
    model; ``details["reason"]`` holds the cause alone). An ensemble's steps are checked
    here for cycles only: the rest needs what they are loaded with, the model table's,
    which ``mark_loaded`` checks them against (``check_steps``) before it writes."""
    check_load(repo, name, config)
    try:
        spec = model_spec(repo, name, config)
        if spec.is_ensemble:
            source = str(repo.config_path(repo.root / name))
            check_nesting(name, _steps_reader(repo, spec, {}, {}), source=source)
        return LoadedModel(spec, tuple(v.version for v in repo.served_versions(name, spec)))
    except PlazaError as exc:
        raise _load_failed(name, exc) from exc


def check_steps(
    repo: ModelRepository, name: str, model: LoadedModel, loaded: Mapping[str, ServedConfig]
) -> None:
    """``step_specs`` of what a load of ``name`` read, its step models as ``loaded`` records
    them (``loaded_records``) or else as the repository reads them; ConfigError as
    ``read_load``'s."""
    try:
        step_specs(repo, model.spec, loaded)
    except PlazaError as exc:
        raise _load_failed(name, exc) from exc


def _load_failed(name: str, exc: PlazaError) -> ConfigError:
    """A load of ``name`` that cannot read it: ``details["reason"]`` holds the cause alone."""
    reason = exc.message
    if "step_model" in exc.details:  # as a load of the step model itself says it
        reason = f"step model '{exc.details['step_model']}': {exc.details['step_reason']}"
    return ConfigError(f"failed to load '{name}': {reason}", model=name, reason=reason)


def check_load(repo: ModelRepository, name: str, config: str = "") -> None:
    """What a load checks before anything else (the model table included): ModelNotFound
    for a model not in the repository, ConfigError for an override that is not a JSON
    object."""
    if name not in repo.model_names():
        raise ModelNotFound(f"failed to load '{name}': no such model", model=name)
    if config:
        check_config_override(config)


def serving_models(
    name: str, spec: ModelSpec | None, spec_of: Callable[[str], ModelSpec | None] | None = None
) -> list[str]:
    """Whose workers serve ``name``: itself, and for an ensemble its steps' models and,
    through nested ensembles, theirs (each nested ensemble's runner included): an ensemble
    serves only while each of them has a live worker. ``spec_of``: the spec of a model
    served (None: unknown); without it only ``spec``'s own steps are known."""
    if spec is None or not spec.is_ensemble:
        return [name]

    def steps_of(model: str) -> tuple[EnsembleStep, ...]:
        found = spec if model == name else (spec_of(model) if spec_of is not None else None)
        return () if found is None else found.ensemble_steps

    return [name, *nested_models(name, steps_of)]


def repository_specs(repo: ModelRepository) -> Callable[[str], ModelSpec | None]:
    """``serving_models``'s ``spec_of`` from the repository (None: a model it cannot read)."""

    def spec_of(name: str) -> ModelSpec | None:
        try:
            return repo.spec(name)
        except PlazaError:
            return None

    return spec_of


async def live_workers(
    redis: aioredis.Redis, names: Names, groups: Sequence[Sequence[str]], *, ping: bool = False
) -> list[int]:
    """Live worker counts (heartbeat expiry in the future), one per group, in one round trip.

    A group is a model and the models that serve it with it (``serving_models``): it counts
    as the first one's live workers while each of them has one, and as 0 while one has
    none. With ``ping`` the round trip starts with a PING (a readiness check's)."""
    pipe = redis.pipeline(transaction=False)
    if ping:
        pipe.ping()
    now = time.time()  # registry scores are epoch seconds
    for group in groups:
        for name in group:
            pipe.zcount(names.worker_registry_key(name), now, "+inf")
    replies = iter(await pipe.execute())
    if ping:
        next(replies)
    counts = []
    for group in groups:
        live = [int(next(replies)) for _ in group]
        counts.append(live[0] if all(live) else 0)
    return counts


def _generation_of(raw: bytes | str | None) -> int | None:
    """The generation a worker's entry (``worker_info_key``) names; None: none named, or
    no entry."""
    if raw is None:
        return None
    try:
        generation = json.loads(raw).get("generation")
    except (ValueError, AttributeError):
        return None
    return generation if isinstance(generation, int) else None


async def serves_generation(
    redis: aioredis.Redis, names: Names, group: Sequence[str], generation: int
) -> bool:
    """Whether a live worker of ``generation`` (the model table's) serves ``group[0]``,
    and each other model of the group (``serving_models``) has a live worker. A worker
    started by a model host, or by ``plaza up --process-per-model``'s supervisor
    (``worker.generation``), names its generation in its entry (``worker_info_key``); one
    whose entry names none (started otherwise: a plain ``plaza worker``) counts for any
    generation."""
    now = time.time()  # registry scores are epoch seconds
    pipe = redis.pipeline(transaction=False)
    for name in group:
        pipe.zrangebyscore(names.worker_registry_key(name), now, "+inf")
    members = await pipe.execute()
    if not all(members):
        return False
    named = await _named_generations(redis, names, members[0])
    return any(each in (None, generation) for each in named)


async def live_generations(redis: aioredis.Redis, names: Names, name: str) -> set[int | None]:
    """The model table's generations that the live workers of ``name`` name in their
    entries (None for one that names none: ``serves_generation``)."""
    members = await redis.zrangebyscore(names.worker_registry_key(name), time.time(), "+inf")
    return set(await _named_generations(redis, names, members))


async def _named_generations(
    redis: aioredis.Redis, names: Names, members: Sequence[object]
) -> list[int | None]:
    """The generation each of the workers ``members`` (a registry's) names in its entry,
    for those whose entry is still there."""
    if not members:
        return []
    ids = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
    # One GET per key in a non-transactional pipeline, never an MGET: on a Redis Cluster the
    # entries lie in different hash slots (redis-py splits the pipeline by node).
    pipe = redis.pipeline(transaction=False)
    for each in ids:
        pipe.get(names.worker_info_key(each))
    infos: list[Any] = await pipe.execute()
    return [_generation_of(raw) for raw in infos if raw is not None]


async def _entries(
    redis: aioredis.Redis, names: Names, members: Sequence[object]
) -> list[dict[str, Any]]:
    """The entries (``worker_info_key``) of the workers ``members`` (a registry's), for
    those still there and readable."""
    if not members:
        return []
    ids = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
    pipe = redis.pipeline(transaction=False)  # one GET per key: see _named_generations
    for each in ids:
        pipe.get(names.worker_info_key(each))
    found = []
    for raw in await pipe.execute():
        try:
            doc = json.loads(raw) if raw is not None else None
        except ValueError:
            continue
        if isinstance(doc, dict):
            found.append(doc)
    return found


def _records(desired: DesiredModel) -> dict[int, ServedConfig]:
    """Per generation, the records ``desired``'s entry keeps (its own and its previous)."""
    records = {served.generation: served for served in desired.previous}
    if desired.pinned is not None:
        records[desired.generation] = desired.pinned
    return records


def dependents(names: str | Collection[str], specs: Mapping[str, ModelSpec]) -> list[str]:
    """The ensembles among ``specs`` (the loaded models) that run one of ``names`` in a step,
    or run one that does, directly or through other ensembles: those an unload of ``names``
    unloads with them (Triton unloads an ensemble whose composing model is unloaded)."""
    start = {names} if isinstance(names, str) else set(names)
    found: list[str] = []
    callees = set(start)
    while True:
        more = [
            m
            for m, spec in sorted(specs.items())
            if m not in found
            and m not in start
            and any(step.model_name in callees for step in spec.ensemble_steps)
        ]
        if not more:
            return found
        found += more
        callees.update(more)


def _steps(spec: ModelSpec | None) -> list[str]:
    """The step models an ensemble runs (none for another model, or one not read)."""
    return [] if spec is None else list(dict.fromkeys(s.model_name for s in spec.ensemble_steps))


def loaded_along(
    name: str, specs: Mapping[str, ModelSpec], table: Mapping[str, DesiredModel]
) -> list[str]:
    """What Triton's ``unload_dependents`` unloads with ``name``: the step models it runs
    (through nested ensembles too) that were loaded only along with an ensemble (not
    ``explicit``) and that no other loaded ensemble runs once these are unloaded. ``specs``:
    the loaded models' specs; ``table``: the model table."""
    loaded = {m for m, desired in table.items() if desired.loaded}
    gone, found, queue = {name}, [], [name]
    while queue:
        for step in _steps(specs.get(queue.pop(0))):
            desired = table.get(step)
            if step in gone or desired is None or not desired.loaded or desired.explicit:
                continue
            if any(step in _steps(specs.get(m)) for m in loaded - gone):
                continue  # another loaded ensemble runs it (checked again if that one goes)
            gone.add(step)
            found.append(step)
            queue.append(step)
    return found


def unload_plan(
    name: str,
    specs: Mapping[str, ModelSpec],
    table: Mapping[str, DesiredModel],
    *,
    with_dependents: bool,
) -> list[str]:
    """Every model an unload of ``name`` unloads, ``name`` first, as Triton's model
    repository manager does: with ``with_dependents``, the step models loaded only along
    with it (``loaded_along``); then, always, the loaded ensembles that run one of those,
    directly or through other ensembles (``dependents``: they could serve nothing)."""
    chosen = [name, *(loaded_along(name, specs, table) if with_dependents else [])]
    loaded = {m: spec for m, spec in specs.items() if m in table and table[m].loaded}
    return chosen + [m for m in dependents(chosen, loaded) if m not in chosen]


def folder_fingerprint(repo: ModelRepository, name: str) -> str:
    """What tells two states of a model's folder apart: the config text (none for a model
    whose config is made from its ONNX file), every file of the folder at any depth (a
    version's model file, a label file beside the config, a module a model.py imports), by
    size and time, and every folder by name (a new version folder, even empty); Python's
    bytecode caches are left out (loading a model writes them)."""
    folder = repo.root / name
    digest = hashlib.sha256()
    try:
        config = repo.config_path(folder)
        digest.update(config.read_bytes() if config.exists() else b"no config")
        for item in sorted(folder.rglob("*")):
            relative = item.relative_to(folder)
            if "__pycache__" in relative.parts:
                continue
            if item.is_dir():
                digest.update(f"{relative}/".encode())
            elif item.is_file():
                stat = item.stat()
                digest.update(f"{relative}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    except OSError:
        digest.update(b"unreadable")
    return digest.hexdigest()


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
        self._write_if_generation = redis.register_script(_WRITE_IF_GENERATION)

    async def read(self) -> dict[str, DesiredModel]:
        """Every model the table knows, loaded or not."""
        fields = await self._redis.hgetall(self._key)
        return {
            (k.decode() if isinstance(k, bytes) else k): DesiredModel.decode(
                k.decode() if isinstance(k, bytes) else k, v
            )
            for k, v in fields.items()
        }

    async def get(self, name: str) -> DesiredModel | None:
        """What the table says of ``name`` (None: never loaded)."""
        raw = await self._redis.hget(self._key, name)
        return None if raw is None else DesiredModel.decode(name, raw)

    async def get_many(self, names: Sequence[str]) -> list[DesiredModel | None]:
        """``get`` for each of ``names``, in one round trip."""
        raws = await self._redis.hmget(self._key, list(names))
        return [
            None if r is None else DesiredModel.decode(n, r)
            for n, r in zip(names, raws, strict=True)
        ]

    async def loaded(self) -> dict[str, DesiredModel]:
        """The models that should be served."""
        return {name: m for name, m in (await self.read()).items() if m.loaded}

    async def load(
        self,
        name: str,
        config: str = "",
        *,
        explicit: bool = True,
        folder: str = "",
        model: LoadedModel | None = None,
    ) -> DesiredModel:
        """Mark ``name`` loaded, with a new generation (its workers restart if running);
        ``explicit`` False: only along with an ensemble that runs it; ``folder``: the model
        folder's fingerprint; ``model``: what the load read (pinned in the entry), if it did."""
        generation = time.time_ns()
        pinned = None if model is None else pin(generation, model)
        desired = DesiredModel(name, True, generation, config, explicit, folder, pinned=pinned)
        await self._redis.hset(self._key, name, desired.encode())
        return desired

    async def load_if_unchanged(
        self,
        name: str,
        seen: DesiredModel | None,
        config: str = "",
        *,
        explicit: bool = True,
        folder: str = "",
        served: LoadedModel | None = None,
        model: LoadedModel | None = None,
    ) -> DesiredModel | None:
        """``load``, in one atomic step with the check that the table still holds ``seen``
        for ``name`` (its generation; None: nothing yet). None, and nothing written, when a
        load or unload of ``name`` came in between. A load of what ``seen`` loads already
        (``DesiredModel.same_load``) keeps its generation, so hosts keep its workers (only
        ``explicit`` is raised on it). A new generation keeps ``seen``'s config as its
        previous one (``previous_served``; ``served``: the config served at ``seen``'s).
        ``model``: what this load read, pinned in a new generation's entry
        (``DesiredModel.pinned``; kept by a load of the same)."""
        if seen is not None and seen.same_load(config, folder):
            pinned = seen.pinned
            if pinned is None and model is not None:  # the folder is as it was read then
                pinned = pin(seen.generation, model)
            explicit = seen.explicit or explicit
            desired = dataclasses.replace(seen, explicit=explicit, pinned=pinned)
        else:
            previous = previous_served(seen, served)
            generation = time.time_ns()
            pinned = None if model is None else pin(generation, model)
            desired = DesiredModel(
                name, True, generation, config, explicit, folder, previous=previous, pinned=pinned
            )
        return desired if await self._write_if(seen, desired) else None

    async def fail(self, desired: DesiredModel, reason: str) -> bool:
        """Record that a host could not load ``desired`` (its generation; ``reason``: why),
        for the load waiting on it; nothing when the table has moved past that generation."""
        now = await self.get(desired.name)
        if now is None or now.generation != desired.generation or not now.loaded:
            return False
        return await self._write_if(now, dataclasses.replace(now, failed=reason))

    async def _write_if(self, seen: DesiredModel | None, desired: DesiredModel) -> bool:
        """Write ``desired`` if the table's generation for its model is still ``seen``'s."""
        expected = "" if seen is None else str(seen.generation)
        written = await self._write_if_generation(
            keys=[self._key], args=[desired.name, expected, desired.encode()]
        )
        return int(written) == 1

    async def unload(self, name: str) -> DesiredModel:
        """Mark ``name`` unloaded: its workers drain and stop."""
        desired = DesiredModel(name, False, time.time_ns())
        await self._redis.hset(self._key, name, desired.encode())
        return desired


def _raise_failed(name: str, entries: Sequence[DesiredModel | None]) -> None:
    """ConfigError when a host could not load the current generation of ``name`` or of
    one of its step models (``entries``: theirs in the model table, ``name``'s first)."""
    for entry in entries:
        if entry is None or not entry.loaded or not entry.failed:
            continue
        reason = (
            entry.failed if entry.name == name else f"step model '{entry.name}': {entry.failed}"
        )
        raise ConfigError(f"failed to load '{name}': {reason}", model=name, reason=reason)


@dataclass(frozen=True, slots=True)
class Marked:
    """A model that a load marked loaded in the table."""

    model: LoadedModel
    """What the load read of it."""
    desired: DesiredModel
    """The table's entry the load wrote (or found: the same load, made meanwhile)."""


class ModelControl:
    """Triton's load and unload for one deployment (its model table, topics and worker
    registries). Each caller checks its own control mode first: the gateway allows modes
    explicit and poll, a Python model's ``pb_utils`` only explicit (Triton's rule)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        names: Names,
        kafka: KafkaSettings,
        repo: ModelRepository,
        load_timeout_s: float,
    ) -> None:
        self.table = ModelTable(redis, names)
        self.repo = repo
        self._redis = redis
        self._names = names
        self._kafka = kafka
        self._load_timeout_s = load_timeout_s

    async def load(self, name: str, config: str = "", *, wait: bool = True) -> LoadedModel:
        """Triton's load of ``name`` (with the override ``config``, Triton's JSON form):
        read it (``read_load``, on a thread: a Python model's ``auto_complete_config`` runs
        in a child process), mark it loaded (``mark_loaded``: an ensemble's steps first) and,
        with ``wait``, wait until a live worker serves it (``wait_served``). Requests sent
        meanwhile wait in Kafka."""
        check_load(self.repo, name, config)
        seen = await self.table.get(name)
        model = await asyncio.to_thread(read_load, self.repo, name, config)
        marked = await self.mark_loaded(name, config, model, seen)
        if wait:
            await self.wait_served(marked[-1])
        return model

    async def mark_loaded(
        self,
        name: str,
        config: str,
        model: LoadedModel,
        seen: DesiredModel | None,
        served: LoadedModel | None = None,
    ) -> list[Marked]:
        """Mark ``name`` loaded in the table (a new generation: hosts start it, or restart
        it; a load of the config and model folder it is loaded with already keeps its
        generation, and hosts keep its workers) and create its request topics; ``model`` is
        what the load read, ``seen`` what the table held for ``name`` before that read.

        An ensemble's steps come first, as Triton's explicit mode loads an ensemble's
        composing models with it: each step model not loaded yet is read and marked loaded
        along with it (not ``explicit``; its own steps first, through nested ensembles); a
        step that cannot be read fails the load (ConfigError naming the ensemble) before the
        ensemble is marked. An ensemble's steps are checked first (``check_steps``): those
        loaded already as the table records them, the others as the repository reads them.
        ``name`` itself is marked ``explicit``.

        The later request wins: when the table's entry for ``name`` moved past ``seen``
        while the load read it (an unload, or a load with another config, through any
        gateway or model), nothing is written for ``name`` and the load fails with
        Unavailable; the steps it marked stay loaded, as Triton's unload leaves them.
        ``served``: the config the caller serves ``name`` with at ``seen``'s generation,
        kept in the entry as its previous one (``previous_served``).
        Returns the models marked, ``name`` last."""
        chain = frozenset({name})
        return await self._mark(name, config, model, seen, chain, explicit=True, served=served)

    async def _mark(
        self,
        name: str,
        config: str,
        model: LoadedModel,
        seen: DesiredModel | None,
        chain: frozenset[str],
        *,
        explicit: bool,
        served: LoadedModel | None = None,
    ) -> list[Marked]:
        # Kafka's client is imported here, not above: a Python model's process imports this
        # module for its checks at start, and needs Kafka only if the model loads something.
        from plaza.connections import ensure_topics

        if model.spec.is_ensemble:
            loaded = loaded_records(await self.table.read())
            await asyncio.to_thread(check_steps, self.repo, name, model, loaded)
        marked = await self._mark_steps(name, model.spec, chain)
        folder = await asyncio.to_thread(folder_fingerprint, self.repo, name)
        desired = await self.table.load_if_unchanged(
            name, seen, config, explicit=explicit, folder=folder, served=served, model=model
        )
        if desired is None:
            desired = await self._superseded(name, config)
        levels = model.spec.batching.priority_levels
        await ensure_topics(self._kafka, self._names.request_topics(name, levels))
        return [*marked, Marked(model, desired)]

    async def _superseded(self, name: str, config: str) -> DesiredModel:
        """The table's entry for ``name`` when another request changed it during a load:
        a load of the same config made meanwhile counts as this one; else Unavailable."""
        now = await self.table.get(name)
        if now is not None and now.loaded and now.config == config:
            return now
        what = "unloaded" if now is None or not now.loaded else "loaded with another config"
        raise Unavailable(
            f"failed to load '{name}': it was {what} while this load read it (the later "
            "request stands)",
            model=name,
        )

    async def _mark_steps(self, name: str, spec: ModelSpec, chain: frozenset[str]) -> list[Marked]:
        """``mark_loaded`` for each step model of the ensemble ``spec`` not loaded yet."""
        marked: list[Marked] = []
        for step in dict.fromkeys(s.model_name for s in spec.ensemble_steps):
            if step in chain:
                continue  # a cycle, which read_load's check_nesting refuses before this
            seen = await self.table.get(step)
            if seen is not None and seen.loaded:
                continue
            try:
                model = await asyncio.to_thread(read_load, self.repo, step)
            except PlazaError as exc:
                reason = f"step model '{step}': {exc.details.get('reason', exc.message)}"
                raise ConfigError(
                    f"failed to load '{name}': {reason}", model=name, reason=reason
                ) from exc
            marked += await self._mark(step, "", model, seen, chain | {step}, explicit=False)
        return marked

    async def wait_served(self, marked: Marked) -> None:
        """Wait until a live worker of the generation ``marked`` holds serves the model (an
        ensemble: a runner, and a worker of each step's model; ``serves_generation``): a
        reload answers once its new config runs, not on the old workers' heartbeats.

        ConfigError at once, with the host's reason, when a host could not load that
        generation (or a step model's: ``DesiredModel.failed``); Unavailable when no worker
        comes within ``load_timeout_s`` (the model stays loaded, and is ready when one
        comes), or when the model is unloaded meanwhile. A load of the model made meanwhile
        is waited for instead (the later request stands)."""
        name, spec = marked.desired.name, marked.model.spec
        generation = marked.desired.generation
        deadline = time.monotonic() + self._load_timeout_s
        group = await asyncio.to_thread(serving_models, name, spec, repository_specs(self.repo))
        while not await serves_generation(self._redis, self._names, group, generation):
            entries = await self.table.get_many(group)
            now = entries[0]
            if now is None or not now.loaded:
                raise Unavailable(
                    f"failed to load '{name}': it was unloaded before a worker served it",
                    model=name,
                )
            generation = now.generation
            _raise_failed(name, entries)
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"model '{name}' is loaded but no worker serves it after "
                    f"{self._load_timeout_s:g} s (who runs the workers? plaza up does in "
                    "modes explicit and poll)",
                    model=name,
                )
            await asyncio.sleep(LOAD_POLL_S)

    async def unload(
        self,
        name: str,
        *,
        with_dependents: bool = False,
        specs: Mapping[str, ModelSpec] | None = None,
    ) -> list[DesiredModel]:
        """Triton's unload: mark ``name`` unloaded (its workers answer what is queued, then
        stop), with what Triton unloads with it (``unload_plan``): ``with_dependents``, its
        step models that were loaded only along with it; always, the loaded ensembles that
        run one of the models unloaded (directly or through other ensembles), which could
        serve nothing. ``specs``: the loaded models' specs (read from the table when not
        given). ModelNotFound for a model neither in the repository nor in the table.
        Returns the table's entries written, ``name``'s first."""
        table = await self.table.read()
        if name not in table and name not in self.repo.model_names():
            raise ModelNotFound(f"failed to unload '{name}': no such model", model=name)
        if specs is None:
            specs = await asyncio.to_thread(self._specs, table)
        chosen = unload_plan(name, specs, table, with_dependents=with_dependents)
        return [await self.table.unload(model) for model in chosen]

    def _specs(self, table: Mapping[str, DesiredModel]) -> dict[str, ModelSpec]:
        """The specs of the models ``table`` says are loaded (one that cannot be read, left
        out: it serves nothing to depend on)."""
        specs = {}
        for name, desired in table.items():
            if desired.loaded:
                try:
                    specs[name] = model_spec(self.repo, name, desired.config)
                except PlazaError:
                    continue
        return specs

    async def ready(self, name: str, version: int | None = None, *, mode: ControlMode) -> bool:
        """Whether ``name`` (``version``; None: any it serves) is ready, read from the
        deployment as the gateway's index reads it, never from the folder as it is now (a
        config mid-edit, a version folder renamed: the live workers serve on): loaded (mode
        none: in the repository; else in the table) and served by a live worker (an
        ensemble: a runner, and a worker of each step), one that serves ``version`` (the
        versions live workers report; a standby entry's, its generation's record)."""
        desired = await self.table.get(name)
        if mode == "none":
            if name not in self.repo.model_names():
                return False
        elif desired is None or not desired.loaded:
            return False
        spec = await asyncio.to_thread(self._recorded_spec, name, desired)
        group = await asyncio.to_thread(serving_models, name, spec, repository_specs(self.repo))
        if (await live_workers(self._redis, self._names, [group]))[0] < 1:
            return False
        if version is None:
            return True
        return version in await self._live_versions(name, desired)

    def _recorded_spec(self, name: str, desired: DesiredModel | None) -> ModelSpec | None:
        """``name``'s spec as its load read it (its record, not completed again), else the
        repository's; None where neither reads (it serves alone then, as a non-ensemble)."""
        source = f"the model table's record of '{name}'"
        try:
            if desired is not None and desired.pinned is not None:
                config = desired.pinned.config
                return parse_model_config_json(config, source=source, default_name=name)
            return model_spec(self.repo, name, desired.config if desired is not None else "")
        except PlazaError:
            return None

    async def _live_versions(self, name: str, desired: DesiredModel | None) -> set[int]:
        """The versions ``name``'s live workers serve: those each reports in its entry; for
        an entry that reports none (a standby entry), its generation's record, else the
        repository's selection (an entry with no record)."""
        members = await self._redis.zrangebyscore(
            self._names.worker_registry_key(name), time.time(), "+inf"
        )
        infos = await _entries(self._redis, self._names, members)
        records = {} if desired is None else _records(desired)
        found: set[int] = set()
        for info in infos:
            reported = info.get("versions")
            if isinstance(reported, list) and reported:
                found.update(v for v in reported if isinstance(v, int))
                continue
            generation = info.get("generation")
            record = records.get(generation) if isinstance(generation, int) else None
            if record is not None and record.versions:
                found.update(record.versions)
            elif desired is not None:
                found.update(await asyncio.to_thread(self._folder_versions, name, desired))
        return found

    def _folder_versions(self, name: str, desired: DesiredModel) -> tuple[int, ...]:
        try:
            return read_model(self.repo, name, desired.config).versions
        except PlazaError:
            return ()
