"""Error codes across the Python backend's edge: Triton's numeric codes <-> Plaza's codes.

A model's ``TritonError`` becomes a Plaza error answer with a stable code; a Plaza error
answer to a BLS call becomes the ``TritonError`` of its ``InferenceResponse``.
"""

from __future__ import annotations

from plaza.workers.backends.pb_utils import TritonError

_TO_PLAZA = {
    TritonError.INVALID_ARG: "invalid_input",
    TritonError.UNAVAILABLE: "unavailable",
    TritonError.CANCELLED: "cancelled",
}
_TO_TRITON = {
    "invalid_input": TritonError.INVALID_ARG,
    "payload_too_large": TritonError.INVALID_ARG,
    "model_not_found": TritonError.NOT_FOUND,
    "unavailable": TritonError.UNAVAILABLE,
    "queue_full": TritonError.UNAVAILABLE,
    "timeout": TritonError.UNAVAILABLE,
    "cancelled": TritonError.CANCELLED,
}


def plaza_code(triton: int) -> str:
    """The Plaza code of a model's TritonError: INVALID_ARG, UNAVAILABLE and CANCELLED keep
    their meaning (invalid_input, unavailable, cancelled: a decoupled model's answer to a
    request whose caller went away, counted as a cancel in ``response_stats``); every other
    code is a model_error."""
    return _TO_PLAZA.get(triton, "model_error")


def triton_code(plaza: str) -> int:
    """The TritonError code of a Plaza error answer (INTERNAL when no closer one exists)."""
    return _TO_TRITON.get(plaza, TritonError.INTERNAL)
