"""The SDK refuses, before publishing anything, the requests that nothing would answer where
their caller waits: a reply stream that workers refuse to write, and a model that the
client's repository does not hold. Real Kafka and Redis; a refused batch makes no topic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.connections import kafka_admin
from plaza.contract import InferResult
from plaza.errors import InvalidInput, ModelNotFound
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY, running_worker, wait_for

X = {"INPUT0": np.full((1, 3), 2.0, np.float32)}


async def request_topics(settings: PlazaSettings) -> list[str]:
    """This test's request topics that exist (one is made before its first publish)."""
    admin = kafka_admin(settings.kafka)
    await admin.start()
    try:
        topics: list[str] = await admin.list_topics()
    finally:
        await admin.close()
    prefix = f"{settings.kafka.topic_prefix}infer."
    return sorted(t for t in topics if t.startswith(prefix))


async def test_a_reply_stream_workers_refuse_fails_the_batch_before_anything_is_sent(
    settings: PlazaSettings,
) -> None:
    async with PlazaClient(settings) as client:
        good = make_request("identity", X, reply_stream=client.results_stream("etl"))
        bad = make_request("identity", X, reply_stream="etl-results")  # not results_stream's
        with pytest.raises(InvalidInput) as caught:
            await client.publish_many([good, bad])
    assert caught.value.code == "invalid_input"
    assert "'etl-results'" in caught.value.message
    assert "results_stream(name)" in caught.value.message
    assert caught.value.details["reply_stream"] == "etl-results"
    assert await request_topics(settings) == []  # the client flushed on exit: nothing sent


async def test_the_sdk_refuses_with_the_code_the_worker_answers_a_bad_stream_with(
    settings: PlazaSettings, unique_id: str, redis_client: redis.asyncio.Redis
) -> None:
    """The same request sent past the SDK's check (the producer core, as a raw producer
    would): the worker answers on the result key alone, never on the stream."""
    outside = f"{unique_id}-results"  # not under the test's key prefix ("<id>:")
    async with running_worker(settings, "identity"), PlazaClient(settings) as client:
        bad = make_request("identity", X, reply_stream=outside)
        with pytest.raises(InvalidInput) as caught:
            await client.publish_many([bad])
        await client.producer.publish_many([(bad, None)])
        answered: list[InferResult] = []

        async def polled() -> bool:
            status = await client.poll(bad.id)
            answered.extend([] if status.result is None else [status.result])
            return bool(answered)

        await wait_for(polled, 60, "the worker's answer on the result key")
    assert answered[0].error is not None
    assert answered[0].error.code == caught.value.code
    assert await redis_client.exists(outside) == 0  # a pipeline consuming it would wait


async def test_a_model_the_repository_lacks_fails_the_batch_before_anything_is_sent(
    settings: PlazaSettings,
) -> None:
    async with PlazaClient(settings) as client:
        stream = client.results_stream("etl")
        batch = [make_request(m, X, reply_stream=stream) for m in ("identity", "no_such_model")]
        with pytest.raises(ModelNotFound) as caught:
            await client.publish_many(batch)
        assert caught.value.code == "model_not_found"
        assert caught.value.details["model"] == "no_such_model"
        for call in (client.submit, client.infer):
            with pytest.raises(ModelNotFound):
                await call("no_such_model", X)
    assert await request_topics(settings) == []


async def test_a_model_added_to_the_repository_later_is_found(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """A refusal is not remembered: the model's folder may appear after it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    s = settings.model_copy(update={"repository": repo})
    async with PlazaClient(s) as client:
        with pytest.raises(ModelNotFound):
            await client.submit("identity", X)
        (repo / "identity").symlink_to(REPOSITORY / "identity", target_is_directory=True)
        job = await client.submit("identity", X)
    assert job
    assert await request_topics(s) == [s.names.request_topic("identity")]


async def test_without_a_repository_folder_the_worker_judges_the_model(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    blind = settings.model_copy(update={"repository": tmp_path / "no-repository"})
    options: dict[str, Any] = {"reply_stream": settings.names.results_stream("etl")}
    async with PlazaClient(blind) as client:
        ids = await client.publish_many([make_request("elsewhere", X, **options)])
    assert len(ids) == 1
    assert await request_topics(blind) == [blind.names.request_topic("elsewhere")]


async def test_a_negative_priority_fails_the_batch_before_anything_is_sent(
    settings: PlazaSettings,
) -> None:
    with pytest.raises(InvalidInput, match="negative"):  # make_request refuses it at once
        make_request("identity", X, priority=-1)
    # a request built otherwise (an envelope of one's own) is refused by publish_many
    negative = msgspec.structs.replace(make_request("identity", X), priority=-1)
    async with PlazaClient(settings) as client:
        batch = [make_request("identity", X), negative]
        with pytest.raises(InvalidInput):
            await client.publish_many(batch)
    assert await request_topics(settings) == []
