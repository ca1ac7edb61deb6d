"""Triton's trace extension when a traced request fails, on a real Kafka and Redis: a
request counted against ``trace_count`` always yields its trace line (with its failure's
code), so the file is written as soon as the count is used up, even when the request that
used it up timed out, and a stream left before its final response is traced too."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from plaza.contract import InferRequest
from plaza.errors import DeadlineExceeded
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from tests.python_models import write_repository
from tests.support import gateway_fronts, make_settings, running_worker, wait_for

BODY: dict[str, Any] = {
    "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
}


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _on(trace_file: str, **more: str) -> dict[str, Any]:
    return {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_file": trace_file,
        **more,
    }


async def test_a_request_that_times_out_is_traced_and_the_used_up_count_flushes(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """trace_count 2, log_frequency 0: the second request times out (a 1 microsecond
    timeout); it is still traced, with error ``timeout``, and both lines reach the file
    while the gateway runs."""
    gateway = settings.gateway.model_copy(update={"trace_dir": tmp_path})
    settings = settings.model_copy(update={"gateway": gateway})
    trace_file = tmp_path / "failed.jsonl"
    async with (
        running_worker(settings, "identity"),
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, timeout=60) as client,
    ):
        on = _on(trace_file.name, trace_count="2", log_frequency="0")
        assert (await client.post("/v2/trace/setting", json=on)).status_code == 200
        ok = await client.post("/v2/models/identity/infer", json=BODY)
        late_body = {**BODY, "parameters": {"timeout": 1}}
        late = await client.post("/v2/models/identity/infer", json=late_body)
        left = (await client.get("/v2/trace/setting")).json()["trace_count"]
        await wait_for(
            lambda: len(_lines(trace_file)) == 2,
            what="both traces in the file while the gateway runs",
        )
    assert ok.status_code == 200 and late.status_code != 200 and left == "0"
    done, failed = _lines(trace_file)
    assert "error" not in done
    assert failed["error"] == DeadlineExceeded.code
    names = [s["name"] for s in failed["timestamps"]]
    assert names[0] == "REQUEST_START" and names[-1] == "REQUEST_END"


def _repeat_request() -> InferRequest:
    data = Tensor.from_numpy("IN", np.array([[4, 5, 6]], np.int32))
    return InferRequest(id=f"left-{uuid.uuid4().hex}", model="repeat", version="", inputs=(data,))


async def test_a_stream_left_or_timed_out_before_its_final_response_is_traced(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> None:
    """A decoupled model's stream left after its first response is traced as
    ``cancelled``; one whose wait runs out (1 microsecond) as ``timeout``."""
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        repository=write_repository(tmp_path / "repository", "repeat"),
        gateway={"trace_dir": tmp_path / "traces"},
    )
    trace_file = tmp_path / "traces" / "left.jsonl"
    async with running_worker(settings, "repeat"), gateway_fronts(settings) as gw:
        gw.service.tracer.update("", _on(trace_file.name, log_frequency="1"))
        left = _repeat_request()
        async with contextlib.aclosing(gw.service.infer_stream(left, timeout_s=60)) as stream:
            first = await anext(stream)  # then leave it, two responses and the final unread
        late = _repeat_request()
        timed_out = None
        try:
            async for _ in gw.service.infer_stream(late, timeout_s=1e-6):
                pass
        except DeadlineExceeded as exc:
            timed_out = exc
        await wait_for(lambda: len(_lines(trace_file)) == 2, what="both streams' traces")
    assert not first.final and timed_out is not None
    errors = {t["request_id"]: t.get("error") for t in _lines(trace_file)}
    assert errors == {left.id: "cancelled", late.id: DeadlineExceeded.code}
