"""PlazaError codes -> HTTP statuses and error bodies: the only place that knows both.

Triton-like: the body is always ``{"error": "<message>"}`` (what tritonclient reads), plus
the stable ``code`` and, for a sync call that timed out, the ``job_id`` to poll.
"""

from __future__ import annotations

from typing import Any

from plaza.errors import (
    CodecError,
    DeadlineExceeded,
    InvalidInput,
    JobNotFound,
    ModelNotFound,
    PayloadTooLarge,
    PlazaError,
    QueueFull,
    Unauthorized,
    Unavailable,
    UnsupportedVersion,
)

_STATUS_BY_CODE: dict[str, int] = {
    InvalidInput.code: 400,
    CodecError.code: 400,
    UnsupportedVersion.code: 400,
    Unauthorized.code: 401,
    ModelNotFound.code: 404,
    JobNotFound.code: 404,
    PayloadTooLarge.code: 413,
    QueueFull.code: 503,
    Unavailable.code: 503,
    DeadlineExceeded.code: 504,
}

_EXPOSED_DETAILS = ("job_id",)
"""Error details that are part of the HTTP body (the rest stay server-side)."""


def http_status(error: PlazaError) -> int:
    """The HTTP status for ``error``'s code; 500 for anything unmapped."""
    return _STATUS_BY_CODE.get(error.code, 500)


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
