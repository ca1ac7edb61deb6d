"""Triton's logging extension: the deployment's log settings, changed at run time.

``GET /v2/logging`` (gRPC ``LogSettings`` with no settings) answers the settings of the
process that answers, ``POST /v2/logging`` changes the ones it names (a null value, as in
Triton, leaves its setting as it is). A change is the deployment's, as in Triton it is the
server's: the gateway that takes it stores each setting it names in Redis (one hash,
``Names.log_settings_key``: a field per setting, its value and the Redis ``TIME`` of the
change) and every Plaza process (workers, hosts, ensemble runners, the other gateway
processes) reads the hash on its heartbeat. A process logs as its own start settings (its
``log_level``) with, on top, each stored change made since it started (``effective``): a
change names only its own settings, so a worker started with ``--log-level DEBUG`` keeps
DEBUG when another setting changes, and a process started (or restarted) after a change
starts from its flags, as Triton starts from its command line, while the processes that
were running keep the change. Changes of different settings made at once by several
gateways all land (one ``HSET`` a setting); of one setting the last one stored wins. The
hash holds one field a setting, so it stays bounded with no TTL. A worker's Python model
process logs at its worker's level and drops the severities its worker drops
(``log_state``, ``copy_log``, ``severity_filter``: each batch sent to it says how).
Applying sets the level of the process's root logger, a filter on the handlers
``configure_logging`` installed, and their time format:

- ``log_verbose_level`` >= 1: DEBUG; else ``log_info``: INFO; else ``log_warnings``:
  WARNING; else ``log_errors``: ERROR; else nothing is logged;
- ``log_warnings`` false drops WARNING records and ``log_errors`` false ERROR records, each
  on its own as in Triton (``SeverityFilter``; CRITICAL records are always kept);
- ``log_format`` ``default`` (local time, as Plaza always logged) or ``ISO8601`` (UTC,
  ``2026-12-06T17:00:00Z``).

``log_file`` is refused when set to anything but "": every Plaza process logs to its own
standard error, which its supervisor (``plaza up``, compose, Kubernetes) collects.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from plaza.errors import InvalidInput

if TYPE_CHECKING:
    import redis.asyncio as aioredis

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Every Plaza process's log line."""
ISO8601 = "%Y-%m-%dT%H:%M:%SZ"
_OFF = logging.CRITICAL + 10
MAX_VERBOSE_LEVEL = 2**32 - 1
"""The largest ``log_verbose_level``: gRPC's ``LogSettings`` carries it as a uint32."""
LogFormat = Literal["default", "ISO8601"]
_STORE_CHANGES = """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  redis.call('DEL', KEYS[1])
end
local now = redis.call('TIME')
local at = now[1] .. string.format('%06d', tonumber(now[2]))
for i = 1, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], '{"at":' .. at .. ',"value":' .. ARGV[i + 1] .. '}')
end
return at
"""
"""Store each named setting (ARGV: name, JSON value, ...) with the Redis time of the change
in microseconds; a key of another type (the whole settings, as stored before) is replaced."""


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Triton's log settings, with their names and types on the wire."""

    log_file: str = ""
    log_info: bool = True
    log_warnings: bool = True
    log_errors: bool = True
    log_verbose_level: int = 0
    log_format: LogFormat = "default"

    @classmethod
    def from_level(cls, level: str) -> LogSettings:
        """The settings a process starts with: its ``log_level`` setting."""
        return cls(
            log_info=level in ("DEBUG", "INFO"),
            log_warnings=level != "ERROR",
            log_verbose_level=1 if level == "DEBUG" else 0,
        )

    @property
    def level(self) -> int:
        """The root logger's level these settings mean."""
        if self.log_verbose_level > 0:
            return logging.DEBUG
        if self.log_info:
            return logging.INFO
        if self.log_warnings:
            return logging.WARNING
        return logging.ERROR if self.log_errors else _OFF

    def changed(self, changes: Mapping[str, Any]) -> LogSettings:
        """These settings with ``changes`` (a log settings request) applied, a None value
        skipped (Triton's null: no change); InvalidInput for an unknown name, a value of
        the wrong type or out of its range (a ``log_verbose_level`` past
        ``MAX_VERBOSE_LEVEL``), or a log file."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        updates: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in fields:
                raise InvalidInput(f"unknown log setting {name!r} (known: {sorted(fields)})")
            if value is None:
                continue  # as Triton: a null value leaves the setting as it is
            default = fields[name].default
            if type(value) is not type(default):
                kind = {bool: "true or false", int: "an integer"}.get(type(default), "a string")
                raise InvalidInput(f"log setting {name!r} must be {kind}, got {value!r}")
            updates[name] = value
        if not 0 <= updates.get("log_verbose_level", 0) <= MAX_VERBOSE_LEVEL:
            raise InvalidInput(
                f"log setting 'log_verbose_level' must be >= 0 and <= {MAX_VERBOSE_LEVEL} "
                "(gRPC carries it as a uint32)"
            )
        if updates.get("log_format", "default") not in ("default", "ISO8601"):
            raise InvalidInput("log setting 'log_format' must be 'default' or 'ISO8601'")
        if updates.get("log_file", ""):
            raise InvalidInput(
                "log setting 'log_file' is not supported by Plaza: each process logs to its "
                "standard error, which its supervisor collects"
            )
        return dataclasses.replace(self, **updates)

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> LogSettings:
        """Settings stored by ``to_json``; InvalidInput when they do not read back."""
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"stored log settings are not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidInput("stored log settings are not a JSON object")
        return cls().changed(doc)


class PlazaFormatter(logging.Formatter):
    """The formatter of a Plaza process's log handler (``configure_logging``): the one
    ``apply`` changes, leaving handlers that others installed as they are."""

    def __init__(self, log_format: LogFormat = "default") -> None:
        iso = log_format == "ISO8601"
        super().__init__(LOG_FORMAT, datefmt=ISO8601 if iso else None)
        if iso:
            self.converter = time.gmtime


def configure_logging(level: str) -> None:
    """A Plaza process's logging: its ``log_level``, one line a record on standard error,
    aiokafka's repeated warnings and errors thinned out (``RepeatThrottle``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(PlazaFormatter())
    handler.addFilter(RepeatThrottle())
    logging.basicConfig(level=level, handlers=[handler])


class RepeatThrottle(logging.Filter):
    """Thins out the warnings and errors of the ``aiokafka`` loggers: while Kafka is down
    its retry loops log the same few lines hundreds of times a second. Of each message
    template (``record.msg``, before its arguments are filled in) the first record passes,
    then at most one each ``period_s``, ending in how many were dropped since the last one
    passed ("(37 more like this in the last 10 s)"). Records of other loggers, and
    aiokafka's below WARNING, pass untouched.

    It sits on the handler, not on the ``aiokafka`` logger: a logger's filters do not see
    its children's records (``aiokafka.client``, ``aiokafka.consumer.fetcher``, ...).
    At most ``max_templates`` templates are tracked, the one seen least recently forgotten
    first (its dropped count with it)."""

    def __init__(
        self,
        period_s: float = 10.0,
        max_templates: int = 256,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "aiokafka",
    ) -> None:
        super().__init__()
        self.period_s = period_s
        self.max_templates = max_templates
        self.clock = clock
        self.prefix = prefix
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()
        """Per template: when one last passed, and how many were dropped since."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not self._throttled(record.name):
            return True
        template = str(record.msg)
        now = self.clock()
        last = self._seen.pop(template, None)
        if last is not None and now - last[0] < self.period_s:
            self._seen[template] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            since = now - last[0]
            record.msg = f"{template} ({last[1]} more like this in the last {since:.0f} s)"
        self._seen[template] = (now, 0)
        while len(self._seen) > self.max_templates:
            self._seen.popitem(last=False)
        return True

    def _throttled(self, name: str) -> bool:
        return name == self.prefix or name.startswith(self.prefix + ".")


def apply(settings: LogSettings, root: logging.Logger | None = None) -> None:
    """Make this process log as ``settings`` say: its root logger's level, and the time
    format and ``SeverityFilter`` of the handlers ``configure_logging`` installed."""
    root = root or logging.getLogger()
    copy_log((settings.level, settings.log_format), root)
    for handler in root.handlers:
        if _format_of(handler.formatter) is not None:
            severity_filter(handler).keep(settings)


class SeverityFilter(logging.Filter):
    """Drops WARNING records while ``log_warnings`` is off and ERROR records while
    ``log_errors`` is, each on its own (as Triton's flags; the root logger's level, one
    threshold, cannot say "INFO but no WARNING"). CRITICAL records always pass."""

    def __init__(self) -> None:
        super().__init__()
        self.warnings = True
        self.errors = True

    def keep(self, settings: LogSettings) -> None:
        """Keep or drop as ``settings`` say from now on."""
        self.warnings, self.errors = settings.log_warnings, settings.log_errors

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL:
            return True
        if record.levelno >= logging.ERROR:
            return self.errors
        return self.warnings if record.levelno >= logging.WARNING else True


def severity_filter(handler: logging.Handler) -> SeverityFilter:
    """``handler``'s severity filter, added on first use."""
    for each in handler.filters:
        if isinstance(each, SeverityFilter):
            return each
    added = SeverityFilter()
    handler.addFilter(added)
    return added


LogState = tuple[int, LogFormat]
"""How a process logs: its root logger's level, and its handlers' time format."""


def log_state(root: logging.Logger | None = None) -> LogState:
    """How this process logs now, for another to copy (``copy_log``): a worker's Python
    model process logs as its worker, whose settings may change at run time."""
    root = root or logging.getLogger()
    formats = [_format_of(h.formatter) for h in root.handlers]
    return root.getEffectiveLevel(), "ISO8601" if "ISO8601" in formats else "default"


def copy_log(state: LogState, root: logging.Logger | None = None) -> None:
    """Log as ``state`` says (``log_state`` of another process); what is already so is
    left alone (a level set again clears every logger's cache)."""
    level, log_format = state
    root = root or logging.getLogger()
    if root.level != level:
        root.setLevel(level)
    for handler in root.handlers:
        if _format_of(handler.formatter) not in (None, log_format):
            handler.setFormatter(PlazaFormatter(log_format))


def _format_of(formatter: logging.Formatter | None) -> LogFormat | None:
    """The time format of a Plaza formatter; None for any other."""
    if not isinstance(formatter, PlazaFormatter):
        return None
    return "ISO8601" if formatter.datefmt == ISO8601 else "default"


def effective(start: LogSettings, stored: Mapping[str, str], since_us: int) -> LogSettings:
    """The settings of a process that started with ``start`` at ``since_us`` (Redis time,
    microseconds): ``start`` with each stored change (``stored``: the hash, setting name to
    ``{"at": <microseconds>, "value": <value>}``) made since then on top. A change that does
    not read back is logged and skipped, the others still apply."""
    settings = start
    for name, entry in sorted(stored.items()):
        try:
            at, value = _stored_change(name, entry)
            if at >= since_us:
                settings = settings.changed({name: value})
        except InvalidInput as exc:
            logging.getLogger(__name__).warning("log setting not applied: %s", exc.message)
    return settings


def _stored_change(name: str, entry: str) -> tuple[int, Any]:
    """A stored change's time and value; InvalidInput when it does not read back."""
    try:
        doc = orjson.loads(entry)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"stored log setting {name!r} is not JSON: {exc}") from exc
    at = doc.get("at") if isinstance(doc, dict) else None
    if not isinstance(at, int) or "value" not in doc:
        raise InvalidInput(f"stored log setting {name!r} is not a change: {entry[:80]!r}")
    return at, doc["value"]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Store(Protocol):
    """The part of a Redis client the follower reads with."""

    def time(self) -> Awaitable[Any]: ...

    def hgetall(self, name: str) -> Awaitable[Any]: ...


class LogFollower:
    """This process's log settings: its start settings with the deployment's stored changes
    made since it started (``effective``), applied when they change."""

    def __init__(self, initial: LogSettings, logger: logging.Logger | None = None) -> None:
        """``initial``: the settings the process starts with (its ``log_level``);
        ``logger``: the logger to set (None: the root logger, the process's)."""
        self.start = initial
        self.current = initial
        self.logger = logger
        self.started_us: int | None = None
        """When this process started, on Redis's clock (``TIME``, microseconds): set at its
        first read, less the time it ran before it."""
        self._born = time.monotonic()
        self._seen: dict[str, str] | None = None

    def follow(self, stored: Mapping[Any, bytes | str]) -> bool:
        """Apply the stored changes (the hash) made since this process started, if they
        are new; True when the settings changed."""
        seen = {_text(k): _text(v) for k, v in stored.items()}
        if seen == self._seen:
            return False
        self._seen = seen
        settings = effective(self.start, seen, self.started_us or 0)
        if settings == self.current:
            return False
        self.current = settings
        apply(settings, self.logger)
        return True

    async def _started(self, redis: Store) -> int:
        """``started_us``, read from Redis the first time."""
        if self.started_us is None:
            seconds, micros = await redis.time()
            ran_us = int((time.monotonic() - self._born) * 1e6)
            self.started_us = int(seconds) * 1_000_000 + int(micros) - ran_us
        return self.started_us

    async def change_stored(
        self, redis: aioredis.Redis, key: str, changes: Mapping[str, Any]
    ) -> LogSettings:
        """Store the settings ``changes`` names (``Names.log_settings_key``), each with the
        Redis time of the change, and apply them here; this process's settings now.
        InvalidInput for a bad change (nothing is stored); Redis's own errors pass
        through."""
        self.current.changed(changes)  # checked before anything is stored
        named = [(name, orjson.dumps(v)) for name, v in changes.items() if v is not None]
        await self._started(redis)
        if named:
            store = redis.register_script(_STORE_CHANGES)
            await store(keys=[key], args=[part for pair in named for part in pair])
        self.follow(await redis.hgetall(key))
        return self.current

    async def follow_stored(self, redis: Store, key: str) -> None:
        """Read the stored changes (``Names.log_settings_key``) and apply them if new; a
        Redis that does not answer leaves the settings as they are (the next beat reads
        again)."""
        try:
            await self._started(redis)
            stored = await redis.hgetall(key)
        except Exception as exc:
            logging.getLogger(__name__).debug("log settings not read: %s", exc)
            return
        self.follow(stored)
