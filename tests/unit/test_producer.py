"""The producer core's pure parts: the in-flight byte budget and the job marker's TTL."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import redis.asyncio as aioredis

import plaza.producer as producer_module
from plaza.contract import InferRequest
from plaza.errors import QueueFull
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.producer import (
    DEADLINE_GRACE_S,
    InflightBytes,
    Producer,
    _Prepared,
    job_marker_ttl_s,
    request_bytes,
)
from plaza.settings import PlazaSettings, ProducerSettings, RedisSettings
from plaza.tensors import Tensor

SETTINGS = PlazaSettings(
    redis=RedisSettings(result_ttl_s=100), producer=ProducerSettings(max_queued_s=5000)
)


def _req(nbytes: int = 8, deadline_ms: int | None = None) -> InferRequest:
    x = np.zeros((1, nbytes // 4), np.float32)
    return InferRequest(
        id="r",
        model="m",
        version="",
        inputs=(Tensor.from_numpy("x", x),),
        deadline_ms=deadline_ms,
    )


def _spec(reject: bool) -> ModelSpec:
    action = "REJECT" if reject else "DELAY"
    return parse_model_config(
        f"""name: "m" platform: "onnxruntime_onnx" max_batch_size: 4
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        dynamic_batching {{ default_queue_policy {{ timeout_action: {action} }} }}""",
        source="test",
        default_name="m",
    )


def test_the_budget_refuses_what_does_not_fit_and_frees_on_exit() -> None:
    budget = InflightBytes(1000)
    with budget.hold(600):
        with pytest.raises(QueueFull, match="max_inflight_bytes") as info, budget.hold(401):
            pass
        assert info.value.retriable and budget.used == 600
        with budget.hold(400):
            assert budget.used == 1000
    assert budget.used == 0


def test_the_budget_is_freed_when_the_block_fails() -> None:
    budget = InflightBytes(1000)
    with pytest.raises(RuntimeError), budget.hold(500):
        raise RuntimeError("publish failed")
    assert budget.used == 0


def test_a_request_weighs_its_input_bytes() -> None:
    assert request_bytes(_req(4096)) == 4096


def test_a_marker_outlives_the_configured_queue_bound_plus_the_result_ttl() -> None:
    assert job_marker_ttl_s(_req(), None, 0, SETTINGS) == 5000 + 100
    assert job_marker_ttl_s(_req(), _spec(reject=True), 0, SETTINGS) == 5000 + 100


def test_a_deadline_bounds_the_marker_when_the_model_rejects_expired_requests() -> None:
    in_10_s = int(time.time() * 1000) + 10_000
    ttl = job_marker_ttl_s(_req(deadline_ms=in_10_s), _spec(reject=True), 0, SETTINGS)
    assert 10 + DEADLINE_GRACE_S + 100 - 1 <= ttl <= 10 + DEADLINE_GRACE_S + 100 + 1
    passed = job_marker_ttl_s(_req(deadline_ms=1), None, 0, SETTINGS)
    assert passed == DEADLINE_GRACE_S + 100


def test_a_delaying_model_keeps_the_queue_bound_despite_a_deadline() -> None:
    in_10_s = int(time.time() * 1000) + 10_000
    ttl = job_marker_ttl_s(_req(deadline_ms=in_10_s), _spec(reject=False), 0, SETTINGS)
    assert ttl == 5000 + 100


def test_fits_says_whether_a_hold_would_succeed() -> None:
    budget = InflightBytes(1000)
    with budget.hold(700):
        assert budget.fits(300) and not budget.fits(301)


async def test_a_marker_write_that_hangs_does_not_hold_the_caller(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka holds the job when its marker is written: a Redis that takes the write and
    never answers (frozen) must not hold the caller; the marker is then missing, logged,
    as when Redis refuses it. The fault is injected at the store, a fake for a hung Redis."""
    producer = Producer(SETTINGS, aioredis.Redis(), reply_stream="replies")

    async def never_answers(*args: object, **kwargs: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(producer._store, "mark_submitted", never_answers)
    monkeypatch.setattr(producer_module, "MARK_TIMEOUT_S", 0.01)
    ready = _Prepared(_req(), SETTINGS.names.request_topic("m"), 0)
    await asyncio.wait_for(producer._mark(ready, None), 30)  # a guard: it hung for good
    assert "marker was not written" in caplog.text
