"""PlazaError codes -> HTTP and gRPC statuses, and HTTP bodies (gateway/errors.py)."""

from __future__ import annotations

import grpc
import pytest

from plaza import errors as pe
from plaza.gateway.errors import error_body, grpc_status, http_error, http_status

S = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "status", "rpc_status"),
    [
        (pe.InvalidInput("x"), 400, S.INVALID_ARGUMENT),
        (pe.CodecError("x"), 400, S.INVALID_ARGUMENT),
        (pe.UnsupportedVersion("x"), 400, S.INVALID_ARGUMENT),
        (pe.ConfigError("x"), 400, S.INVALID_ARGUMENT),  # a load with a bad config
        (pe.Unauthorized("x"), 401, S.UNAUTHENTICATED),
        (pe.ModelNotFound("x"), 404, S.NOT_FOUND),
        (pe.JobNotFound("x"), 404, S.NOT_FOUND),
        (pe.PayloadTooLarge("x"), 413, S.RESOURCE_EXHAUSTED),
        (pe.QueueFull("x"), 503, S.UNAVAILABLE),
        (pe.Unavailable("x"), 503, S.UNAVAILABLE),
        (pe.DeadlineExceeded("x"), 504, S.DEADLINE_EXCEEDED),
        (pe.ModelExecutionError("x"), 500, S.INTERNAL),
        (pe.PoisonRecord("x"), 500, S.INTERNAL),
        (pe.PlazaError("x"), 500, S.INTERNAL),
    ],
)
def test_status_by_code(error: pe.PlazaError, status: int, rpc_status: grpc.StatusCode) -> None:
    assert http_status(error) == status
    assert grpc_status(error) == rpc_status


def test_body_has_message_and_code() -> None:
    assert error_body(pe.ModelNotFound("no model 'm'", model="m")) == {
        "error": "no model 'm'",
        "code": "model_not_found",
    }


def test_timeout_body_carries_the_job_id() -> None:
    status, body = http_error(pe.DeadlineExceeded("no result", job_id="abc"))
    assert status == 504
    assert body == {"error": "no result", "code": "timeout", "job_id": "abc"}


def test_wire_errors_map_like_local_ones() -> None:
    assert http_status(pe.error_from_wire("queue_full", "busy")) == 503
    assert http_status(pe.error_from_wire("invalid_input", "bad")) == 400
    unknown = pe.error_from_wire("brand_new_code", "?")
    assert http_status(unknown) == 500
    assert error_body(unknown)["code"] == "brand_new_code"
