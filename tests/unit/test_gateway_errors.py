"""PlazaError codes -> HTTP statuses and bodies (gateway/errors.py)."""

from __future__ import annotations

import pytest

from plaza import errors as pe
from plaza.gateway.errors import error_body, http_error, http_status


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (pe.InvalidInput("x"), 400),
        (pe.CodecError("x"), 400),
        (pe.UnsupportedVersion("x"), 400),
        (pe.Unauthorized("x"), 401),
        (pe.ModelNotFound("x"), 404),
        (pe.JobNotFound("x"), 404),
        (pe.PayloadTooLarge("x"), 413),
        (pe.QueueFull("x"), 503),
        (pe.Unavailable("x"), 503),
        (pe.DeadlineExceeded("x"), 504),
        (pe.ModelExecutionError("x"), 500),
        (pe.ConfigError("x"), 500),
        (pe.PlazaError("x"), 500),
    ],
)
def test_status_by_code(error: pe.PlazaError, status: int) -> None:
    assert http_status(error) == status


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
