"""PlazaError codes -> HTTP and gRPC statuses, and HTTP error bodies: the only place that
knows both sides.

Triton-like: the body is always ``{"error": "<message>"}`` (what tritonclient reads), plus
the stable ``code`` and, for a sync call that timed out, the ``job_id`` to poll.
"""

from __future__ import annotations

from typing import Any

import grpc

from plaza.errors import (
    Cancelled,
    CodecError,
    ConfigError,
    DeadlineExceeded,
    InvalidInput,
    JobNotFound,
    ModelNotFound,
    PayloadTooLarge,
    PlazaError,
    QueueFull,
    SharedMemoryError,
    Unauthorized,
    Unavailable,
    Unsupported,
    UnsupportedVersion,
)
from plaza.gateway.shared_memory import RegionNotFound

_Status = tuple[int, grpc.StatusCode]
_STATUS_BY_CODE: dict[str, _Status] = {
    InvalidInput.code: (400, grpc.StatusCode.INVALID_ARGUMENT),
    ConfigError.code: (400, grpc.StatusCode.INVALID_ARGUMENT),  # a load's bad config
    CodecError.code: (400, grpc.StatusCode.INVALID_ARGUMENT),
    UnsupportedVersion.code: (400, grpc.StatusCode.INVALID_ARGUMENT),
    SharedMemoryError.code: (400, grpc.StatusCode.INVALID_ARGUMENT),
    RegionNotFound.code: (404, grpc.StatusCode.NOT_FOUND),  # Triton's, for a region's status
    Unsupported.code: (400, grpc.StatusCode.UNIMPLEMENTED),  # Triton's, for decoupled models
    Unauthorized.code: (401, grpc.StatusCode.UNAUTHENTICATED),
    ModelNotFound.code: (404, grpc.StatusCode.NOT_FOUND),
    JobNotFound.code: (404, grpc.StatusCode.NOT_FOUND),
    PayloadTooLarge.code: (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
    QueueFull.code: (503, grpc.StatusCode.UNAVAILABLE),
    Unavailable.code: (503, grpc.StatusCode.UNAVAILABLE),
    DeadlineExceeded.code: (504, grpc.StatusCode.DEADLINE_EXCEEDED),
    Cancelled.code: (499, grpc.StatusCode.CANCELLED),  # 499: nginx's "client closed request"
}
_UNMAPPED: _Status = (500, grpc.StatusCode.INTERNAL)

_EXPOSED_DETAILS = ("job_id",)
"""Error details that are part of the HTTP body (the rest stay server-side)."""


def http_status(error: PlazaError) -> int:
    """The HTTP status for ``error``'s code; 500 for anything unmapped."""
    return _STATUS_BY_CODE.get(error.code, _UNMAPPED)[0]


def grpc_status(error: PlazaError) -> grpc.StatusCode:
    """The gRPC status for ``error``'s code; INTERNAL for anything unmapped."""
    return _STATUS_BY_CODE.get(error.code, _UNMAPPED)[1]


def error_body(error: PlazaError) -> dict[str, Any]:
    """``{"error": message, "code": code}`` plus any exposed details (``job_id``)."""
    code = str(error.details.get("code", error.code))
    body: dict[str, Any] = {"error": error.message, "code": code}
    for key in _EXPOSED_DETAILS:
        if key in error.details:
            body[key] = error.details[key]
    return body


def http_error(error: PlazaError) -> tuple[int, dict[str, Any]]:
    """Status and body for ``error``."""
    return http_status(error), error_body(error)
