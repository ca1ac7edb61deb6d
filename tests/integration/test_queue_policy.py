"""Deadlines, queue policy, max_queue_size and priority levels on real Kafka and Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from plaza.client import PlazaClient, make_request
from plaza.errors import DeadlineExceeded, QueueFull
from plaza.settings import PlazaSettings
from tests.support import model_variant, running_worker, wait_for

IDENTITY = """
name: "{name}" platform: "onnxruntime_onnx" max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} {batching} }}
"""


def variant(
    tmp_path: Path,
    settings: PlazaSettings,
    name: str,
    batching: str,
    mbs: int = 8,
    delay_us: int = 500,
    **kafka: object,
) -> PlazaSettings:
    config = IDENTITY.format(name=name, mbs=mbs, batching=batching, delay_us=delay_us)
    repo = model_variant(tmp_path, name, config)
    return settings.model_copy(
        update={
            "repository": repo,
            "kafka": settings.kafka.model_copy(update=kafka),
        }
    )


def x(i: float) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, 2), i, np.float32)}


async def test_expired_requests_are_answered_with_timeout_never_dropped(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    s = variant(tmp_path, settings, "rejecting", "default_queue_policy { timeout_action: REJECT }")
    async with PlazaClient(s) as client:
        stream = client.results_stream("deadlines")
        late = [
            make_request("rejecting", x(i), reply_stream=stream, timeout_s=0.001) for i in range(20)
        ]
        fresh = [make_request("rejecting", x(i), reply_stream=stream) for i in range(20)]
        await client.publish_many(late + fresh)
        async with running_worker(s, "rejecting") as worker:
            codes: dict[str, str] = {}
            async for entry, results in client.consume(stream, "g", "c", block_ms=300):
                codes.update({r.id: r.error.code if r.error else "ok" for r in results})
                await client.ack(stream, "g", entry)
                if len(codes) == 40:
                    break
        assert {codes[r.id] for r in late} == {"timeout"}
        assert {codes[r.id] for r in fresh} == {"ok"}
        assert worker.metrics.records["expired"] == 20
        with pytest.raises(DeadlineExceeded):
            await client.result(late[0].id)  # the stored answer is the typed timeout error


async def test_delay_policy_keeps_expired_requests_and_runs_them(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    s = variant(tmp_path, settings, "delaying", "default_queue_policy { timeout_action: DELAY }")
    async with PlazaClient(s) as client:
        jobs = [await client.submit("delaying", x(i), timeout_s=0.001) for i in range(10)]
        async with running_worker(s, "delaying") as worker:
            results = await asyncio.gather(*(client.result(j, timeout_s=60) for j in jobs))
        assert [float(r.output("OUTPUT0").to_numpy()[0, 0]) for r in results] == list(range(10))
        assert worker.metrics.records["expired"] == 0


@pytest.mark.parametrize("counted_from", ["sent", "fetched"])
async def test_the_queue_delay_counts_from_when_the_request_was_sent(
    settings: PlazaSettings, tmp_path: Path, counted_from: str
) -> None:
    """A request that sat in Kafka for longer than its model's queue delay has used the
    delay up: it runs as soon as a worker fetches it, alone. Counted from the fetch instead
    (``worker.queue_delay_from = fetched``), it waits the whole delay again."""
    delay_s = 1.5
    name = f"patient_{counted_from}"
    s = variant(tmp_path, settings, name, "", delay_us=int(delay_s * 1e6))
    async with PlazaClient(s) as client:
        job = await client.submit(name, x(1))
        await asyncio.sleep(delay_s)  # in Kafka, no worker yet
        async with running_worker(s, name, queue_delay_from=counted_from):
            result = await client.result(job, timeout_s=60)
    queue_s = result.timing_us["queue"] / 1e6
    if counted_from == "sent":
        assert queue_s < delay_s / 2
    else:
        assert queue_s >= delay_s - 0.001


async def test_max_queue_size_refuses_at_once_with_a_typed_error(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    s = variant(
        tmp_path,
        settings,
        "bounded",
        "default_queue_policy { max_queue_size: 5 }",
        backlog_check_ttl_ms=0,
    )
    async with PlazaClient(s) as client:
        for i in range(5):
            await client.submit("bounded", x(i))  # no worker: they wait in Kafka
        with pytest.raises(QueueFull) as info:
            await client.submit("bounded", x(99))
        assert info.value.retriable and info.value.details["depth"] == 5
        async with running_worker(s, "bounded"):
            topic = s.names.request_topic("bounded")

            async def drained() -> bool:
                return await client.producer.backlog.lag("bounded", topic) < 5

            await wait_for(drained, what="the worker to drain the queue")
            result = await client.infer("bounded", x(7), timeout_s=60)  # drained: accepted
        assert float(result.output("OUTPUT0").to_numpy()[0, 0]) == 7.0


async def test_overlapping_backlog_readings_share_one_measurement(
    settings: PlazaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests that find the cached backlog expired wait for one measurement (three round
    trips to Kafka) instead of each making their own; the next reading measures again."""
    s = variant(
        tmp_path,
        settings,
        "measured",
        "default_queue_policy { max_queue_size: 50 }",
        backlog_check_ttl_ms=0,  # every reading finds the cache expired
    )
    async with PlazaClient(s) as client:
        for i in range(3):
            await client.submit("measured", x(i))  # no worker: they wait in Kafka
        probe = client.producer.backlog
        topic = s.names.request_topic("measured")
        measured: list[str] = []
        measure = probe._measure

        async def counted(model: str, topic: str) -> int:
            measured.append(topic)
            return await measure(model, topic)

        monkeypatch.setattr(probe, "_measure", counted)
        together = await asyncio.gather(*(probe.lag("measured", topic) for _ in range(16)))
        assert together == [3] * 16
        assert measured == [topic]
        assert await probe.lag("measured", topic) == 3
        assert measured == [topic, topic]


async def test_a_backlog_check_that_hangs_ends_within_the_calls_timeout(
    settings: PlazaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog check is part of a sync call's time: a Kafka that does not answer it
    (held here, where an unreachable broker would take the request timeout) ends the call
    as a timeout inside its own time, with no job, and nothing is published."""
    s = variant(
        tmp_path,
        settings,
        "held",
        "default_queue_policy { max_queue_size: 50 }",
        backlog_check_ttl_ms=0,
    )
    async with PlazaClient(s) as client:
        probe = client.producer.backlog
        measure = probe._measure
        never = asyncio.Event()

        async def hung(model: str, topic: str) -> int:
            await never.wait()
            return 0

        monkeypatch.setattr(probe, "_measure", hung)
        async with asyncio.timeout(30):  # the bug: the call waited for the check alone
            with pytest.raises(
                DeadlineExceeded, match=r"0\.5 s ran out during the backlog"
            ) as late:
                await client.infer("held", x(1), timeout_s=0.5)
        assert "job_id" not in late.value.details  # nothing was published: no job to poll
        monkeypatch.setattr(probe, "_measure", measure)
        never.set()  # the held measurement ends; the next reading is Kafka's own
        assert await probe.lag("held", s.names.request_topic("held")) == 0


async def test_priority_one_finishes_before_priority_two_under_a_backlog(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    s = variant(tmp_path, settings, "prio", "priority_levels: 2 default_priority_level: 2", mbs=4)
    async with PlazaClient(s) as client:
        stream = client.results_stream("prio")
        low = [make_request("prio", x(i), reply_stream=stream, priority=2) for i in range(150)]
        high = [make_request("prio", x(i), reply_stream=stream, priority=1) for i in range(150)]
        await client.publish_many(low)  # the low ones are older, and there are as many
        await client.publish_many(high)
        order: list[str] = []
        async with running_worker(s, "prio", max_pending=16, fetch_max_records=8):
            async for entry, results in client.consume(stream, "g", "c", block_ms=300):
                order.extend(r.id for r in results)
                await client.ack(stream, "g", entry)
                if len(order) == 300:
                    break
        rank = {rid: i for i, rid in enumerate(order)}
        last_high = max(rank[r.id] for r in high)
        low_before = sum(1 for r in low if rank[r.id] < last_high)
        # a batch in flight when the backlog appears may hold a few low ones; not more
        assert low_before <= 15, f"{low_before} priority-2 requests finished before priority 1"


async def test_gateway_answers_503_at_once_beyond_max_queue_size(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    import httpx

    from plaza.gateway.app import create_app
    from plaza.gateway.service import GatewayService

    s = variant(
        tmp_path,
        settings,
        "bounded_http",
        "default_queue_policy { max_queue_size: 3 }",
        backlog_check_ttl_ms=0,
    )
    service = GatewayService(s)
    await service.start()
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}
    try:
        transport = httpx.ASGITransport(app=create_app(s, service))
        async with httpx.AsyncClient(transport=transport, base_url="http://plaza") as http:
            for _ in range(3):  # no worker: the jobs wait in Kafka
                ok = await http.post("/v2/models/bounded_http/jobs", json=body)
                assert ok.status_code == 202, ok.text
            full = await http.post("/v2/models/bounded_http/infer", json=body)
        assert full.status_code == 503
        assert full.json()["code"] == "queue_full" and "max_queue_size is 3" in full.json()["error"]
    finally:
        await service.stop()
