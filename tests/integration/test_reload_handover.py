"""A reload without downtime: a following host hands a model over to its new generation.

Real Kafka and Redis, a host following the model table (``workers/model_watch.py``) and
loads through ``ModelControl`` (what the gateway's repository API runs: it returns once a
worker of the new generation serves, and raises ConfigError, the gateway's 400, when the
host refused it). The model is simulated; its reload's config override widens OUTPUT0
from 4 to 8 values a row, so an answer shows which generation computed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio
from aiokafka.structs import TopicPartition

from plaza.client import PlazaClient
from plaza.codec import decode_results, entry_count
from plaza.contract import InferResult
from plaza.errors import ConfigError
from plaza.model_control import ModelControl
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.host import Host
from plaza.workers.model_watch import ModelFollower, Running
from tests.support import group_offsets, make_settings, wait_for

pytestmark = pytest.mark.timeout(300)

MODEL = "rh"
CONFIG = """
name: "rh"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
parameters [ { key: "latency_b_us" value: { string_value: "2000" } } ]
"""
LIMIT = 5000
"""The most requests the stream sends before the hand-over (a bound, not a target)."""
AFTER = 60
"""Requests sent once the old unit is gone: each must be the new generation's."""


def override(width: int, latency_b_us: str = "2000") -> str:
    """The model's config (Triton's JSON form) with OUTPUT0 ``width`` values a row."""
    return json.dumps(
        {
            "name": MODEL,
            "backend": "plaza_simulated",
            "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [width]}],
            "dynamic_batching": {"max_queue_delay_microseconds": 1000},
            "parameters": {"latency_b_us": {"string_value": latency_b_us}},
        }
    )


def following(settings: PlazaSettings) -> PlazaSettings:
    update = {"models": "*", "follow_model_table": True, "follow_interval_s": 0.2}
    worker = settings.worker.model_copy(update={"worker_id": "rh", "metrics_port": 0})
    return settings.model_copy(
        update={"host": settings.host.model_copy(update=update), "worker": worker}
    )


@contextlib.asynccontextmanager
async def serving(settings: PlazaSettings) -> AsyncIterator[tuple[ModelFollower, ModelControl]]:
    client = redis.asyncio.Redis.from_url(settings.redis.url)
    repo = ModelRepository.of(settings)
    control = ModelControl(client, settings.names, settings.kafka, repo, load_timeout_s=60)
    host = Host(settings)
    stop = asyncio.Event()
    await host.start()
    task = asyncio.create_task(host.run_until_stopped(stop))
    try:
        assert host.follower is not None
        yield host.follower, control
    finally:
        stop.set()
        await task
        await client.aclose()


def setup(tmp_path: Path, kafka_bootstrap: str, redis_url: str, unique_id: str) -> PlazaSettings:
    (tmp_path / "repo" / MODEL / "1").mkdir(parents=True)
    (tmp_path / "repo" / MODEL / "config.pbtxt").write_text(CONFIG)
    base = make_settings(kafka_bootstrap, redis_url, unique_id, repository=tmp_path / "repo")
    return following(base)


def row(i: int) -> np.ndarray:
    return np.full((1, 4), i, dtype=np.float32)


async def committed_all(settings: PlazaSettings) -> bool:
    """Whether the model's group committed every request (no replay can follow)."""
    topics = settings.names.request_topics(MODEL, 1)
    tps = [TopicPartition(t, p) for t in topics for p in range(settings.kafka.partitions)]
    offsets = await group_offsets(settings, MODEL, tps)
    return all(end == 0 or committed == end for committed, end in offsets.values())


async def answers_per_request(settings: PlazaSettings, client: str) -> Counter[str]:
    """How many answers each request id has in the client's reply stream."""
    r = redis.asyncio.Redis.from_url(settings.redis.url)
    try:
        entries: Any = await r.xrange(settings.names.reply_stream(client))
    finally:
        await r.aclose()
    return Counter(
        result.id
        for _, fields in entries
        if STREAM_FIELD_RESULTS in fields  # not the reader's own first entry
        for result in decode_results(
            fields[STREAM_FIELD_RESULTS], entry_count(fields.get(STREAM_FIELD_COUNT))
        )
    )


async def test_a_reload_under_steady_traffic_answers_every_request_once(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    settings = setup(tmp_path, kafka_bootstrap, redis_url, unique_id)
    name = f"{unique_id}-client"
    async with serving(settings) as (watch, control), PlazaClient(settings, name=name) as client:
        await control.load(MODEL)
        old = watch.state.running[MODEL]
        # Who serves the model at the moment the old unit has stopped.
        at_stop: list[Running | None] = []
        old.task.add_done_callback(lambda _: at_stop.append(watch.state.running.get(MODEL)))
        handed_over = asyncio.Event()
        answers: dict[int, tuple[InferResult, bool]] = {}
        sent: list[int] = []
        after: list[int] = []

        async def lane() -> None:
            """Sends one request after another: before the hand-over up to LIMIT of them
            (all lanes together), then AFTER more (all lanes together)."""
            while True:
                if len(sent) >= LIMIT:
                    await handed_over.wait()
                late = handed_over.is_set()
                if late and len(after) >= AFTER:
                    return
                i = len(sent)
                sent.append(i)
                if late:
                    after.append(i)
                got = await client.infer(MODEL, {"INPUT0": row(i)}, timeout_s=120)
                answers[i] = (got, late)

        lanes = [asyncio.create_task(lane()) for _ in range(6)]
        try:
            await wait_for(lambda: len(answers) >= 30, 60, "answers before the reload")
            await control.load(MODEL, override(8))  # returns once the new generation serves
            await wait_for(old.task.done, 90, "the old unit to stop")
            handed_over.set()
            await asyncio.gather(*lanes)
        finally:
            for task in lanes:
                task.cancel()
        new = watch.state.running[MODEL]
        assert new.unit is not old.unit and new.desired.generation != old.desired.generation
        assert at_stop == [new]  # the new generation served before the old unit stopped
        assert new.unit.id != old.unit.id  # two registry entries, one group
        assert len(sent) < LIMIT  # the stream went on during the hand-over, bounded
        # Every request answered with its own row: 4 values (old) or 8 (new).
        assert sorted(answers) == sent
        for i, (got, late) in answers.items():
            out = got.output("OUTPUT0").to_numpy()
            assert out.shape in ((1, 4), (1, 8)) and np.all(out == i), (i, got.worker)
            if late:  # sent after the old unit stopped: the new generation's answer
                assert out.shape == (1, 8) and got.worker == new.unit.id, (i, got.worker)
        assert {got.worker for got, _ in answers.values()} == {old.unit.id, new.unit.id}
        # Exactly one answer each: once the group committed everything no replay can follow,
        # then the client's reply stream holds one result per request.
        await wait_for(lambda: committed_all(settings), 60, "every request committed")
        counts = await answers_per_request(settings, name)
        assert sorted(counts) == sorted(got.id for got, _ in answers.values())
        assert set(counts.values()) == {1}


async def test_a_reload_with_a_config_that_fails_keeps_the_old_generation_serving(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    settings = setup(tmp_path, kafka_bootstrap, redis_url, unique_id)
    async with serving(settings) as (watch, control), PlazaClient(settings) as client:
        await control.load(MODEL)
        old = watch.state.running[MODEL]
        # Read fine by the load (the gateway), refused where the backend is made.
        with pytest.raises(ConfigError) as refused:
            await control.load(MODEL, override(8, latency_b_us="slow"))
        assert "latency" in refused.value.message
        assert watch.state.running[MODEL] is old and not old.task.done()
        assert watch.state.given_up[MODEL] != old.desired.generation
        assert await control.ready(MODEL, mode="explicit")
        for i in range(5):
            got = await client.infer(MODEL, {"INPUT0": row(i)}, timeout_s=60)
            np.testing.assert_array_equal(got.output("OUTPUT0").to_numpy(), row(i))
            assert got.worker == old.unit.id
