"""A sync call whose timeout is shorter than Kafka's acknowledgement, on every front.

Kafka's own limit (``kafka.request_timeout_ms``) bounds the wait for the ack, not the
caller's timeout: a request Kafka takes after the caller's time ran out is a job (504
``timeout`` / DEADLINE_EXCEEDED with its id, pollable), never a retriable 503 that a client
would send again. No worker runs while the calls are made, so none can answer before the
deadline; the one started afterwards answers each request once.

The backlog check of a model with ``max_queue_size`` comes before publishing, and is part of
the call's time: a call whose time runs out during it ends as a timeout with no job (nothing
was published, so a retry is safe), not as a 503 that blames Kafka for the call's short
timeout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from plaza.client import PlazaClient
from plaza.errors import DeadlineExceeded
from plaza.settings import PlazaSettings
from plaza.workers.worker import Worker
from tests.support import gateway_fronts, model_variant, running_worker, wait_for

ONE_US = 1
"""The shortest request timeout there is (microseconds): it passes before any ack."""

BOUNDED = """
name: "bounded" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { default_queue_policy { max_queue_size: 50 } }
"""
"""identity with a queue limit: every call checks the model's Kafka backlog first."""


def identity_json(x: np.ndarray[Any, Any]) -> dict[str, Any]:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape), "data": x.tolist()}
    return {"inputs": [tensor], "parameters": {"timeout": ONE_US}}


def identity_input(x: np.ndarray[Any, Any]) -> list[Any]:
    item = aioclient.InferInput("INPUT0", list(x.shape), "FP32")
    item.set_data_from_numpy(x)
    return [item]


async def answered_once(worker: Worker, count: int) -> None:
    """Wait until the worker has answered ``count`` records, then check it answered each
    exactly once (no second record of any request, no duplicate write)."""
    await wait_for(lambda: worker.metrics.records["written"] >= count, 60, "the answers")
    records = worker.metrics.records
    assert (records["fetched"], records["written"], records["duplicate"]) == (count, count, 0)


async def test_http_and_grpc_answer_timeout_with_a_pollable_job(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity")
    x = np.ones((1, 4), dtype=np.float32)
    async with (
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        over_http = await http.post("/v2/models/identity/infer", json=identity_json(x))
        assert over_http.status_code == 504, over_http.text
        assert over_http.json()["code"] == "timeout"
        grpc_client = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            with pytest.raises(InferenceServerException) as over_grpc:
                await grpc_client.infer("identity", identity_input(x), timeout=ONE_US)
        finally:
            await grpc_client.close()
        assert over_grpc.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        named = re.search(r"poll job (\w+)", str(over_grpc.value.message()))
        assert named is not None, over_grpc.value.message()
        job_ids = [over_http.json()["job_id"], named.group(1)]
        for job_id in job_ids:  # marked: pending, not unknown, before any worker runs
            polled = await http.get(f"/v2/jobs/{job_id}")
            assert polled.status_code == 200 and polled.json()["status"] == "pending"

        async with running_worker(settings, "identity") as worker:

            async def answered(job_id: str) -> bool:
                status: str = (await http.get(f"/v2/jobs/{job_id}")).json()["status"]
                return status != "pending"

            for job_id in job_ids:
                await wait_for(partial(answered, job_id), 60, f"job {job_id}'s answer")
                done = (await http.get(f"/v2/jobs/{job_id}")).json()
                # The 1 us deadline has passed when the worker takes the request in.
                assert (done["status"], done["code"]) == ("error", "timeout"), done
            await answered_once(worker, len(job_ids))


async def test_sdk_infer_answers_timeout_with_a_pollable_job(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity")
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    async with PlazaClient(settings) as sdk:
        with pytest.raises(DeadlineExceeded) as late:
            await sdk.infer("identity", {"INPUT0": x}, timeout_s=ONE_US / 1e6)
        job_id = late.value.details["job_id"]
        assert (await sdk.poll(job_id)).state == "pending"  # marked, not unknown
        async with running_worker(settings, "identity") as worker:
            # infer's timeout_s is the request's deadline: past it, the worker answers timeout
            result = await sdk.result(job_id, timeout_s=60, raise_on_error=False)
            assert result.error is not None and result.error.code == "timeout"
            await answered_once(worker, 1)


async def test_a_call_whose_time_runs_out_in_the_backlog_check_is_a_timeout_unpublished(
    settings: PlazaSettings, tmp_path: Path, redis_client: Any
) -> None:
    """The backlog is measured anew for the call (``backlog_check_ttl_ms`` 0) and its 1 us
    passes meanwhile: the call ends as a timeout, with no job and nothing published (was a
    503, "Kafka did not answer the backlog check within the call's 1e-06 s", which blamed
    Kafka for the call's own short time)."""
    kafka = settings.kafka.model_copy(update={"backlog_check_ttl_ms": 0})
    repository = model_variant(tmp_path, "bounded", BOUNDED)
    s = settings.model_copy(update={"repository": repository, "kafka": kafka})
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    async with PlazaClient(s) as sdk:
        with pytest.raises(DeadlineExceeded, match="nothing was published") as late:
            await sdk.infer("bounded", {"INPUT0": x}, timeout_s=ONE_US / 1e6)
        assert "job_id" not in late.value.details  # no job: a retry is safe
        topic = s.names.request_topic("bounded")
        assert await sdk.producer.backlog.lag("bounded", topic) == 0  # nothing published
