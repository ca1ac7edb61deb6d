"""Triton's trace extension: sampled requests' timestamps, written to a trace file.

The settings are Triton's (``GET/POST /v2/trace/setting``, per model under
``/v2/models/{model}/trace/setting``, gRPC ``TraceSetting``), in its wire form (numbers as
strings, the level a list): ``trace_level`` OFF or TIMESTAMPS, ``trace_rate`` (one request
in that many is traced), ``trace_count`` (traces left to take; -1: no limit),
``log_frequency`` (write the file every that many traces; 0: when the buffer is full or the
gateway stops; either way, at once when ``trace_count`` is used up), ``trace_file`` and
``trace_mode`` (triton). A model's settings are the global ones with its own on top; a null
value takes a model's setting back to the global one (a global setting back to Triton's
default).

A traced request carries ``trace`` in its envelope; its worker stamps its stages
(``InferResult.trace_ns``: QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END,
COMPUTE_OUTPUT_START, COMPUTE_END) and the gateway adds REQUEST_START and REQUEST_END. A
sampled request that fails (a timeout, Kafka not taking it, an error answer, a stream left
before its final response) is traced all the same, with the stamps it got and its failure's
code under ``error`` (``failure_code``): a request counted against ``trace_count`` always
yields its line. Each trace is one JSON line, appended to ``gateway.trace_dir`` /
``trace_file``: the file is named by its bare name (a client picks no path on the gateway's
host), and it is the one set when the request was sampled (``sample`` answers it, ``record``
takes it), whatever was set by the time it ended. Timestamps are Unix epoch nanoseconds of
each process's clock, so across hosts they are as close as the hosts' clocks. Settings and
files belong to one gateway process; with ``gateway.workers`` above 1 changing them is
refused, as for shared memory.

The file is written off the event loop: a flush hands the buffered lines to one writer
thread (so appends keep their order), and ``close`` waits for what it was handed. At most
``MAX_QUEUED`` lines (by default) wait for a slow disk; past that a flush drops its lines
with a warning (a trace is a diagnostic, and a gateway must not hold memory without bound
for it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from plaza.errors import Cancelled, InvalidInput, PlazaError

log = logging.getLogger(__name__)

LEVELS = ("OFF", "TIMESTAMPS")
MAX_BUFFERED = 10_000
"""Traces held before a write whatever ``log_frequency`` says."""
MAX_QUEUED = 100_000
"""Traces handed to the writer thread and not yet written, at most."""
_FILE = re.compile(r"[A-Za-z0-9._-]{1,255}")
_NUMBERS = {
    "trace_rate": (1, 2**32 - 1),
    "trace_count": (-1, 2**31 - 1),
    "log_frequency": (0, 2**32 - 1),
}
"""The settings that are numbers, and the least and greatest value each takes (Triton's
ranges: a uint32 rate and log frequency, an int32 count)."""
_INTEGER = re.compile(r"-?[0-9]+")
"""A number's text: ASCII digits only (``str.isdigit`` also takes "²", which ``int`` does
not)."""


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """Triton's trace settings, with its defaults."""

    trace_level: tuple[str, ...] = ("OFF",)
    trace_rate: int = 1000
    trace_count: int = -1
    log_frequency: int = 0
    trace_file: str = ""
    trace_mode: str = "triton"

    @property
    def on(self) -> bool:
        return "TIMESTAMPS" in self.trace_level and self.trace_count != 0 and bool(self.trace_file)

    def wire(self) -> dict[str, str | list[str]]:
        """As Triton answers them: the level a list, numbers as strings."""
        return {
            "trace_level": list(self.trace_level),
            "trace_rate": str(self.trace_rate),
            "trace_count": str(self.trace_count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.trace_file,
            "trace_mode": self.trace_mode,
        }


def parse_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A settings request's values, checked and typed (None kept: it clears a setting);
    InvalidInput for an unknown name or a value Plaza cannot take."""
    known = {f.name for f in dataclasses.fields(TraceSettings)}
    typed: dict[str, Any] = {}
    for name, raw in changes.items():
        if name not in known:
            raise InvalidInput(f"unknown trace setting {name!r} (known: {sorted(known)})")
        value = raw[0] if isinstance(raw, list) and len(raw) == 1 and name != "trace_level" else raw
        if value is None:
            typed[name] = None
        elif name == "trace_level":
            levels = tuple(value) if isinstance(value, list) else (value,)
            if not levels or not all(v in LEVELS for v in levels):
                raise InvalidInput(f"trace_level must be OFF or TIMESTAMPS, got {raw!r}")
            typed[name] = levels
        elif name in _NUMBERS:
            typed[name] = _number(name, value)
        elif name == "trace_file":
            bare = isinstance(value, str) and (not value or _FILE.fullmatch(value))
            if not bare or value in (".", ".."):
                raise InvalidInput(f"trace_file must be a bare file name, got {raw!r}")
            typed[name] = value
        elif value != "triton":
            raise InvalidInput(
                f"trace_mode must be 'triton' (Plaza writes no OpenTelemetry), got {raw!r}"
            )
        else:
            typed[name] = value
    return typed


def _number(name: str, value: Any) -> int:
    """A number setting's value (Triton sends them as strings; a JSON integer is taken too),
    checked against its range; InvalidInput for anything else."""
    low, high = _NUMBERS[name]
    if isinstance(value, int) and not isinstance(value, bool):
        number: int | None = value
    elif isinstance(value, str) and _INTEGER.fullmatch(text := value.strip()):
        # Past 10 significant digits it is out of range (and int() refuses 4,300 digits).
        number = int(text) if len(text.lstrip("-").lstrip("0")) <= 10 else None
    else:
        raise InvalidInput(f"trace setting {name!r} must be an integer, got {value!r:.40}")
    if number is None or not low <= number <= high:
        raise InvalidInput(f"trace setting {name!r} must be >= {low} and <= {high}")
    return number


def failure_code(exc: BaseException) -> str:
    """The code a traced request's failure is recorded under: a Plaza error's own code,
    ``cancelled`` for a request its caller left, else the exception's class name."""
    if isinstance(exc, PlazaError):
        return exc.code
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return Cancelled.code
    return type(exc).__name__


class Tracer:
    """One gateway process's trace settings, sampling and trace file."""

    def __init__(self, trace_dir: Path, refusal: str = "", max_queued: int = MAX_QUEUED) -> None:
        """``refusal``: why settings cannot be changed here (several gateway processes).
        ``max_queued``: traces the writer thread may be behind by, at most."""
        self.trace_dir = trace_dir
        self.max_queued = max_queued
        self.refusal = refusal
        self._global = TraceSettings()
        self._models: dict[str, dict[str, Any]] = {}
        """Each model's own settings (what it sets on top of the global ones)."""
        self._seen: dict[str, int] = {}
        self._buffer: list[tuple[str, bytes]] = []
        self._traces = 0
        self._writer: ThreadPoolExecutor | None = None
        self._queued = 0
        """Lines handed to the writer and not yet written (the writer thread lowers it)."""
        self._queued_lock = threading.Lock()
        self.dropped = 0
        """Traces dropped because the writer was ``MAX_QUEUED`` lines behind."""

    def settings(self, model: str = "") -> TraceSettings:
        own = self._models.get(model) if model else None
        return dataclasses.replace(self._global, **own) if own else self._global

    def update(self, model: str, changes: Mapping[str, Any]) -> TraceSettings:
        """Apply a settings request (global where ``model`` is ""); the settings now."""
        if self.refusal:
            raise InvalidInput(self.refusal)
        typed = parse_changes(changes)
        before = self.settings(model).trace_file
        if model:
            own = self._models.setdefault(model, {})
            for name, value in typed.items():
                if value is None:
                    own.pop(name, None)
                else:
                    own[name] = value
            if not own:
                del self._models[model]
        else:
            defaults = TraceSettings()
            values = {k: getattr(defaults, k) if v is None else v for k, v in typed.items()}
            self._global = dataclasses.replace(self._global, **values)
        if self.settings(model).trace_file != before:
            self.flush()  # what was traced so far goes to the file it was traced for
        return self.settings(model)

    def sample(self, model: str) -> str:
        """Whether to trace this request of ``model`` (one in ``trace_rate``, while
        ``trace_count`` lasts; counted down where it was set): the trace file its trace
        goes to, or "" (falsy) for a request not traced. Pass it to ``record``: the trace
        is the file's that was set when the request came, whatever is set when it ends."""
        settings = self.settings(model)
        if not settings.on:
            return ""
        seen = self._seen[model] = self._seen.get(model, 0) + 1
        if seen % settings.trace_rate:
            return ""
        if settings.trace_count > 0:
            own = self._models.get(model)
            if own is not None and "trace_count" in own:
                own["trace_count"] -= 1
            else:
                self._global = dataclasses.replace(
                    self._global, trace_count=settings.trace_count - 1
                )
        return settings.trace_file

    def record(
        self,
        model: str,
        version: str,
        request_id: str,
        start_ns: int,
        end_ns: int,
        worker_ns: Mapping[str, int],
        trace_file: str | None = None,
        error: str = "",
    ) -> None:
        """Keep one trace (its stages in time order) for ``trace_file``, the file ``sample``
        chose (None: the model's trace file now); ``error``: the code of the request's
        failure ("" for none). A trace with no file to go to (tracing turned off by clearing
        the file since) is not kept."""
        settings = self.settings(model)
        trace_file = settings.trace_file if trace_file is None else trace_file
        if not trace_file:
            return
        self._traces += 1
        stamps = {"REQUEST_START": start_ns, **worker_ns, "REQUEST_END": end_ns}
        trace: dict[str, Any] = {
            "id": self._traces,
            "model_name": model,
            "model_version": version,
            "request_id": request_id,
            "timestamps": [
                {"name": n, "ns": ns} for n, ns in sorted(stamps.items(), key=lambda kv: kv[1])
            ],
        }
        if error:
            trace["error"] = error
        self._buffer.append((trace_file, orjson.dumps(trace)))
        every = settings.log_frequency
        limit = min(every, MAX_BUFFERED) if every else MAX_BUFFERED
        # As Triton: once trace_count is used up, what was collected is written whatever
        # log_frequency says (a trace still in flight then flushes as it ends).
        if len(self._buffer) >= limit or settings.trace_count == 0:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered traces to the writer thread, to be appended to their files."""
        if not self._buffer:
            return
        lines, self._buffer = self._buffer, []
        with self._queued_lock:
            if self._queued + len(lines) > self.max_queued:
                self.dropped += len(lines)
                log.warning(
                    "dropped %d traces: %d wait for the disk already (%d dropped in all)",
                    len(lines),
                    self._queued,
                    self.dropped,
                )
                return
            self._queued += len(lines)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="trace-writer")
        self._writer.submit(self._write, lines)

    def close(self) -> None:
        """Flush, and wait until every trace handed to the writer is in its file."""
        self.flush()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def _write(self, lines: list[tuple[str, bytes]]) -> None:
        """Append ``lines`` to their files, each file on its own: one that cannot be written
        loses its own traces only."""
        by_file: dict[str, list[bytes]] = {}
        for name, line in lines:
            by_file.setdefault(name, []).append(line)
        try:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            for name, chunk in by_file.items():
                self._append(name, chunk)
        except OSError as exc:
            log.warning("could not write %d traces to %s: %s", len(lines), self.trace_dir, exc)
        finally:
            with self._queued_lock:
                self._queued -= len(lines)

    def _append(self, name: str, chunk: list[bytes]) -> None:
        try:
            with (self.trace_dir / name).open("ab") as f:
                f.write(b"\n".join(chunk) + b"\n")
        except OSError as exc:
            log.warning("could not write %d traces to %s: %s", len(chunk), name, exc)
