"""The SDK's ``make_request`` checks ``priority`` and ``timeout_s`` before anything is
published, as the gateway checks Triton's ``priority`` and ``timeout`` parameters.

A float priority once named an orphan topic (``.p2.0``, read by no worker: the job pending
for ever), a bool one was published and refused by the worker, a numpy int did not encode;
an infinite or NaN timeout raised Python's own errors, a negative one made a deadline in
the past.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from plaza.client import make_request
from plaza.errors import InvalidInput
from plaza.naming import Names
from plaza.priority import settle_level

X = {"x": np.ones((1, 2), np.float32)}
NAMES = Names(topic_prefix="t.", key_prefix="t:")


@pytest.mark.parametrize(
    "priority", [2.0, 1.5, True, False, np.True_, "2", None, -1, np.int64(-3), math.nan]
)
def test_a_priority_that_is_not_an_integer_ge_0_is_refused(priority: Any) -> None:
    with pytest.raises(InvalidInput, match="priority") as caught:
        make_request("m", X, priority=priority)
    assert caught.value.code == "invalid_input"


@pytest.mark.parametrize("priority", [0, 2, np.int64(2), np.uint8(2), np.int32(7), 10**12])
def test_an_integral_priority_is_kept_as_a_plain_int(priority: Any) -> None:
    req = make_request("m", X, priority=priority)
    assert req.priority == int(priority) and type(req.priority) is int


@pytest.mark.parametrize(
    "timeout_s",
    [math.inf, -math.inf, math.nan, -1, -0.5, True, "5", 1e300, 10**400, np.float64(np.inf)],
)
def test_a_timeout_that_is_not_a_finite_number_ge_0_is_refused(timeout_s: Any) -> None:
    with pytest.raises(InvalidInput, match="timeout_s") as caught:
        make_request("m", X, timeout_s=timeout_s)
    assert caught.value.code == "invalid_input"


@pytest.mark.parametrize(
    ("timeout_s", "ms"), [(2, 2000), (0.0005, 1), (np.float32(1.5), 1500), (np.int64(3), 3000)]
)
def test_a_finite_timeout_is_a_deadline_ahead(timeout_s: Any, ms: int) -> None:
    req = make_request("m", X, timeout_s=timeout_s)
    assert req.deadline_ms is not None and req.deadline_ms - req.created_ms == ms


@pytest.mark.parametrize("timeout_s", [None, 0, 0.0])
def test_a_timeout_of_zero_is_no_deadline_as_the_gateways(timeout_s: Any) -> None:
    assert make_request("m", X, timeout_s=timeout_s).deadline_ms is None


@pytest.mark.parametrize("priority", [2.0, True, "2"])
@pytest.mark.parametrize("levels", [0, 3])
def test_no_level_is_settled_from_a_non_integer(priority: Any, levels: int) -> None:
    """The producer core and the worker settle a level from the request as it came (a
    direct producer's too): a level is an int, or InvalidInput."""
    with pytest.raises(InvalidInput, match="priority"):
        settle_level(priority, levels, levels)


def test_a_numpy_priority_settles_to_a_plain_int_topic() -> None:
    level = settle_level(np.int64(2), 3, 3)  # type: ignore[arg-type]
    assert type(level) is int
    assert NAMES.request_topic("mlp", level) == "t.infer.mlp.p2"
