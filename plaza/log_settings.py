"""Triton's logging extension: the deployment's log settings, changed at run time.

``GET /v2/logging`` (gRPC ``LogSettings`` with no settings) answers them, ``POST
/v2/logging`` changes the ones it names (a null value, as in Triton, leaves its setting as it
is). A change is the deployment's, as in Triton it is the server's: the gateway that takes it
stores the settings in Redis (one key, ``Names.log_settings_key``) and applies them to
itself; every other Plaza process (workers, hosts, ensemble runners, the other gateway
processes) reads the key on its heartbeat and applies what changed. The change is stored
with a compare-and-set (``change_stored``), so changes made at once by several gateways
all land; a worker's Python model process logs as its worker (``log_state``, ``copy_log``:
each batch sent to it says how). Applying sets the level of the process's root logger and
its handlers' time format:

- ``log_verbose_level`` >= 1: DEBUG; else ``log_info``: INFO; else ``log_warnings``:
  WARNING; else ``log_errors``: ERROR; else nothing is logged;
- ``log_format`` ``default`` (local time, as Plaza always logged) or ``ISO8601`` (UTC,
  ``2026-12-06T17:00:00Z``).

``log_file`` is refused when set to anything but "": every Plaza process logs to its own
standard error, which its supervisor (``plaza up``, compose, Kubernetes) collects.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from plaza.errors import InvalidInput, Unavailable

if TYPE_CHECKING:
    import redis.asyncio as aioredis

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Every Plaza process's log line."""
ISO8601 = "%Y-%m-%dT%H:%M:%SZ"
_OFF = logging.CRITICAL + 10
MAX_VERBOSE_LEVEL = 2**32 - 1
"""The largest ``log_verbose_level``: gRPC's ``LogSettings`` carries it as a uint32."""
LogFormat = Literal["default", "ISO8601"]
STORE_TRIES = 16
"""Compare-and-set rounds a change may take while other changes keep landing first."""
_SET_IF_UNCHANGED = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""
"""Store ARGV[2] only while the key still holds ARGV[1] ("": nothing stored yet)."""


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
    """A Plaza process's logging: its ``log_level``, one line a record on standard error."""
    handler = logging.StreamHandler()
    handler.setFormatter(PlazaFormatter())
    logging.basicConfig(level=level, handlers=[handler])


def apply(settings: LogSettings, root: logging.Logger | None = None) -> None:
    """Make this process log as ``settings`` say: its root logger's level, and the time
    format of the handlers ``configure_logging`` installed."""
    copy_log((settings.level, settings.log_format), root)


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


class Store(Protocol):
    """The part of a Redis client the follower reads with."""

    def get(self, name: str) -> Awaitable[Any]: ...


class LogFollower:
    """Applies the deployment's stored log settings to this process when they change."""

    def __init__(self, initial: LogSettings, logger: logging.Logger | None = None) -> None:
        """``logger``: the logger to set (None: the root logger, the process's)."""
        self.current = initial
        self.logger = logger
        self._applied: bytes | None = None

    def follow(self, raw: bytes | str | None) -> bool:
        """Apply ``raw`` (the stored settings; None: none stored) if it is new; True when
        something was applied. Settings that do not read back are logged and skipped."""
        if raw is None:
            return False
        stored = raw.encode() if isinstance(raw, str) else raw
        if stored == self._applied:
            return False
        self._applied = stored
        try:
            settings = LogSettings.from_json(stored)
        except InvalidInput as exc:
            logging.getLogger(__name__).warning("log settings not applied: %s", exc.message)
            return False
        if settings != self.current:
            self.current = settings
            apply(settings, self.logger)
            return True
        return False

    async def change_stored(
        self, redis: aioredis.Redis, key: str, changes: Mapping[str, Any]
    ) -> LogSettings:
        """Apply ``changes`` to the stored settings (``Names.log_settings_key``) and to
        this process; the settings now. Read, change, then a compare-and-set that writes
        only if no other change was stored since the read, else read again: two gateways
        changing different settings at once both land. InvalidInput for a bad change;
        Unavailable past ``STORE_TRIES`` rounds; Redis's own errors pass through."""
        store = redis.register_script(_SET_IF_UNCHANGED)
        for _ in range(STORE_TRIES):
            raw = await redis.get(key)
            self.follow(raw)  # change the deployment's settings, not this process's
            settings = self.current.changed(changes)
            stored = settings.to_json()
            if int(await store(keys=[key], args=[raw or b"", stored])) == 1:
                self.follow(stored)
                return settings
        raise Unavailable(
            f"the log settings were changed {STORE_TRIES} times while this change was being "
            "stored: try again"
        )

    async def follow_stored(self, redis: Store, key: str) -> None:
        """Read the stored settings (``Names.log_settings_key``) and apply them if new; a
        Redis that does not answer leaves them as they are (the next beat reads again)."""
        try:
            raw = await redis.get(key)
        except Exception as exc:
            logging.getLogger(__name__).debug("log settings not read: %s", exc)
            return
        self.follow(raw)
