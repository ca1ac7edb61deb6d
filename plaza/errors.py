"""One error base for Plaza; behaviour lives in class attributes, never in messages.

``code`` is stable and goes on the wire (result entries, dead-letter headers, HTTP bodies).
``retriable`` tells callers whether the same request may succeed later. The gateway maps
codes to HTTP status codes (``gateway/errors.py``); nothing in the core knows about HTTP.
"""

from __future__ import annotations

from typing import Any, ClassVar

EXIT_RETRIABLE = 75
"""The exit status of a command that failed for a reason that may pass (``PlazaError.
retriable``: Kafka or Redis did not answer), sysexits' EX_TEMPFAIL: a supervisor starts
such a worker again, and gives up on one that exits 1 (it refused its model)."""


class PlazaError(Exception):
    """Base of every error Plaza raises on purpose."""

    code: ClassVar[str] = "internal"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ConfigError(PlazaError):
    """A model repository or config.pbtxt that cannot be used; names the file and field."""

    code = "bad_config"

    @classmethod
    def at(cls, source: str, field: str, message: str) -> ConfigError:
        """The error of one field of the config file ``source``, in the form every config
        check uses: ``<source>: field '<field>': <message>``."""
        return cls(f"{source}: field '{field}': {message}", file=source, field=field)


class CodecError(PlazaError):
    """Bytes that are not a valid Plaza envelope or result."""

    code = "bad_envelope"


class UnsupportedVersion(CodecError):
    """An envelope version this build does not speak."""

    code = "unsupported_envelope_version"


class ModelNotFound(PlazaError):
    """No such model, or no such version of it, is served."""

    code = "model_not_found"


class InvalidInput(PlazaError):
    """A request whose tensors do not match the model's configuration."""

    code = "invalid_input"


class PayloadTooLarge(InvalidInput):
    """A request bigger than the configured limit."""

    code = "payload_too_large"


class DeadlineExceeded(PlazaError):
    """The request's deadline passed before it ran (queue policy REJECT)."""

    code = "timeout"


class QueueFull(PlazaError):
    """The model's queue is at max_queue_size; try again later."""

    code = "queue_full"
    retriable = True


class ModelExecutionError(PlazaError):
    """The backend raised while running a batch."""

    code = "model_error"


class PoisonRecord(PlazaError):
    """A record delivered ``worker.max_deliveries`` times without an answer: every worker
    that took it died (a crash, an abort, out of memory) before answering it."""

    code = "poison_record"


class Unavailable(PlazaError):
    """A service Plaza needs (Kafka, Redis, a worker) does not answer."""

    code = "unavailable"
    retriable = True


class JobNotFound(PlazaError):
    """No job with that id is known (never submitted, or its result expired)."""

    code = "job_not_found"


class Cancelled(PlazaError):
    """The caller cancelled the request (a cancelled gRPC call, a closed stream) before its
    answer came; a worker that has not run it yet skips it."""

    code = "cancelled"


class Unsupported(PlazaError):
    """A well-formed request that this endpoint does not serve for that model (a decoupled
    model, which answers many times, called where one answer is expected)."""

    code = "unsupported"


class Unauthorized(PlazaError):
    """Missing or wrong API key."""

    code = "unauthorized"


class SharedMemoryError(PlazaError):
    """A client's shared memory region that cannot be registered, found or used (Triton's
    system shared memory extension, ``gateway/shared_memory.py``)."""

    code = "shared_memory"


_BY_CODE: dict[str, type[PlazaError]] = {}


def _register(cls: type[PlazaError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(PlazaError)


def error_from_wire(code: str, message: str) -> PlazaError:
    """Rebuild a typed error from a result entry's ``{"code", "message"}``."""
    cls = _BY_CODE.get(code, PlazaError)
    err = cls(message)
    if cls is PlazaError and code != PlazaError.code:
        err.details["code"] = code
    return err
