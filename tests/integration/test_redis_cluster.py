"""Plaza on a real 3-node Redis Cluster (``redis.cluster``): SDK -> Kafka -> worker -> Redis.

A batch's requests have keys in many hash slots, on all three nodes, so each test here
would fail with CROSSSLOT (or redis-py's "keys must map to the same slot") if the writer,
the delivery counter, the answered check or the statistics flush sent one multi-key
command or script across slots.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio
from redis.crc import key_slot

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_result
from plaza.connections import is_cluster, redis_client
from plaza.contract import InferResult
from plaza.naming import Names
from plaza.settings import PlazaSettings
from plaza.stack import RedisClusterNodes
from plaza.tensors import Tensor
from plaza.workers.answered import AnsweredCheck
from plaza.workers.deliveries import DeliveryCounter
from plaza.workers.runner import WorkItem
from plaza.workers.sequences import decode_state, encode_state
from plaza.workers.writer import ResultWriter, StateWrite
from tests.integration.test_gateway_http import add_sub_json, http, outputs_by_name, poll_until
from tests.support import REPOSITORY, make_settings, running_worker, wait_for


@pytest.fixture
async def cluster_client(cluster_settings: PlazaSettings) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis_client(cluster_settings.redis)
    assert is_cluster(client)
    try:
        yield client
    finally:
        await client.aclose()


def nodes_holding(cluster: RedisClusterNodes, keys: list[str]) -> set[int]:
    """Which nodes (by index) own the slots of ``keys``."""
    ranges = [cluster.slot_range(i) for i in range(cluster.nodes)]
    return {
        i for key in keys for i, (lo, hi) in enumerate(ranges) if lo <= key_slot(key.encode()) <= hi
    }


async def test_the_cluster_has_three_masters_sharing_every_slot(
    redis_cluster: RedisClusterNodes,
) -> None:
    client = redis.asyncio.Redis.from_url(redis_cluster.url)
    try:
        info = await client.cluster("INFO")
        slots = await client.execute_command("CLUSTER SLOTS")
    finally:
        await client.aclose()
    assert info["cluster_state"] == "ok" and info["cluster_known_nodes"] == "3"
    assert sorted((int(s[0]), int(s[1])) for s in slots) == [
        redis_cluster.slot_range(i) for i in range(3)
    ]


async def test_sync_infer_async_job_and_result_stream_on_a_cluster(
    cluster_settings: PlazaSettings, redis_cluster: RedisClusterNodes
) -> None:
    names = cluster_settings.names
    async with running_worker(cluster_settings, "add_sub"), PlazaClient(cluster_settings) as sdk:
        a = np.arange(32, dtype=np.int32).reshape(2, 16)
        calls = [sdk.infer("add_sub", {"INPUT0": a, "INPUT1": a * 0 + i}) for i in range(24)]
        answers = await asyncio.gather(*calls)
        for i, result in enumerate(answers):
            np.testing.assert_array_equal(result.as_numpy()["OUTPUT0"], a + i)
            np.testing.assert_array_equal(result.as_numpy()["OUTPUT1"], a - i)
        # the answers' result keys are spread over the nodes: the writer crossed slots
        assert len(nodes_holding(redis_cluster, [names.result_key(r.id) for r in answers])) > 1

        job = await sdk.submit("add_sub", {"INPUT0": a, "INPUT1": a})
        done = await sdk.result(job, timeout_s=60)
        np.testing.assert_array_equal(done.as_numpy()["OUTPUT0"], a * 2)
        assert (await sdk.poll(job)).state == "done"
        assert (await sdk.poll("never-submitted")).state == "unknown"

        stream = sdk.results_stream("cluster")
        ids = await sdk.publish_many(
            make_request(
                "add_sub",
                {"INPUT0": a, "INPUT1": np.full_like(a, i)},
                reply_stream=stream,
            )
            for i in range(40)
        )
        seen: dict[str, int] = {}
        async for entry_id, results in sdk.consume(stream, "g", "c1", block_ms=500):
            for res in results:
                seen[res.id] = int(res.as_numpy()["OUTPUT1"][0, 0])
            await sdk.ack(stream, "g", entry_id)
            if len(seen) == len(ids):
                break
        assert seen == {rid: -i for i, rid in enumerate(ids)}


async def test_the_worker_flushes_statistics_to_the_cluster(
    cluster_settings: PlazaSettings, cluster_client: redis.asyncio.Redis
) -> None:
    """The heartbeat's statistics script touches one model's version hashes in one call."""
    key = cluster_settings.names.model_stats_key("identity", "1")
    async with running_worker(cluster_settings, "identity"), PlazaClient(cluster_settings) as sdk:
        x = np.ones((1, 4), np.float32)
        await asyncio.gather(*(sdk.infer("identity", {"INPUT0": x}) for _ in range(5)))

        async def flushed() -> bool:
            return int(await cluster_client.hget(key, "success.count") or 0) >= 5

        await wait_for(flushed, 30, "the statistics hash on the cluster")


def repository_of(root: Path, *models: str) -> Path:
    """A repository holding only ``models``, copied from the sample repository (a gateway
    loads every model of its repository, and is ready only when each has a worker)."""
    for model in models:
        shutil.copytree(REPOSITORY / model, root / "repo" / model)
    return root / "repo"


def _result(names: Names, i: int, worker: str = "w1") -> InferResult:
    return InferResult(f"cluster-{names.key_prefix}{i}", "identity", "1", worker=worker)


async def test_writer_first_write_wins_on_a_cluster(
    cluster_settings: PlazaSettings, cluster_client: redis.asyncio.Redis
) -> None:
    names = cluster_settings.names
    writer = ResultWriter(cluster_client, cluster_settings.redis, names)
    stream = names.reply_stream("w")
    assert await writer.write([(_result(names, i), stream) for i in range(10)]) == 10
    # a replay (another worker's answers for the first ten) changes none of them
    replay = [(_result(names, i, worker="w2"), stream) for i in range(30)]
    assert await writer.write(replay) == 20
    entries = await cluster_client.xrange(stream)
    assert [int(fields[b"n"]) for _, fields in entries] == [10, 20]
    for i in (0, 9, 10, 29):
        stored = decode_result(await cluster_client.get(names.result_key(_result(names, i).id)))
        assert stored.worker == ("w1" if i < 10 else "w2")
    # the same write tried again (as after a step that failed midway) claims its own answers
    # again, and adds them to the stream again: the same bytes, never a different answer
    assert await writer.write(replay[10:]) == 20
    again = (await cluster_client.xrange(stream))[-1][1]
    assert again[b"r"] == entries[-1][1][b"r"]
    # a reply stream that is not a stream loses its own results only
    await cluster_client.set(names.reply_stream("not-a-stream"), b"x")
    mixed = [
        (_result(names, 100), names.reply_stream("not-a-stream")),
        (_result(names, 101), stream),
    ]
    assert await writer.write(mixed) == 2
    assert int((await cluster_client.xrange(stream))[-1][1][b"n"]) == 1
    assert await cluster_client.exists(names.result_key(_result(names, 100).id)) == 1


async def test_sequence_states_go_with_their_first_answers_on_a_cluster(
    cluster_settings: PlazaSettings,
    cluster_client: redis.asyncio.Redis,
    redis_cluster: RedisClusterNodes,
) -> None:
    names = cluster_settings.names
    writer = ResultWriter(cluster_client, cluster_settings.redis, names)
    keys = [names.sequence_state_key("accumulate", 1, i) for i in range(6)]
    assert len(nodes_holding(redis_cluster, keys)) > 1  # states on several nodes
    states = [StateWrite(i, key, f"after-{i}".encode(), 60_000) for i, key in enumerate(keys)]
    assert await writer.write([(_result(names, 200 + i), None) for i in range(6)], states) == 6
    assert [await cluster_client.get(k) for k in keys] == [f"after-{i}".encode() for i in range(6)]
    # a replay of the first three (losing) and an END of the fourth (winning)
    replay = [(_result(names, 200 + i, worker="w2"), None) for i in range(3)]
    replay.append((_result(names, 300), None))
    later = [StateWrite(i, keys[i], b"replayed", 60_000) for i in range(3)]
    assert await writer.write(replay, [*later, StateWrite(3, keys[3], None, 60_000)]) == 1
    assert await cluster_client.get(keys[0]) == b"after-0"
    assert await cluster_client.exists(keys[3]) == 0


async def test_delivery_counts_and_answered_check_on_a_cluster(
    cluster_settings: PlazaSettings, cluster_client: redis.asyncio.Redis
) -> None:
    names = cluster_settings.names
    counter = DeliveryCounter(cluster_client, names, ttl_s=60)
    records = [("topic", p, o) for p in range(3) for o in range(10)]
    assert await counter.count(records) == [1] * 30
    assert await counter.count(records[:5]) == [2] * 5
    assert await counter.trial(records[0]) == 1
    counter.finished(records)
    await counter.flush()
    keys = [names.delivery_key(*r) for r in records]
    assert await cluster_client.exists(*keys) == 0

    check = AnsweredCheck(cluster_client, names)
    ids = [f"answered-{names.key_prefix}{i}" for i in range(12)]
    for rid in ids[::3]:
        await cluster_client.set(names.result_key(rid), b"x")
    items = [
        WorkItem(request=make_request("identity", {}, correlation_id=rid), rows=1, version=1)
        for rid in ids
    ]
    run, answered = await check.split(items)
    assert [it.request.id for it in answered] == ids[::3]
    assert len(run) == 8

    # The intake's look rides on the count: the same pipeline, keys in many slots.
    looks = [names.result_key(rid) for rid in ids[:6]]
    counts, found = await counter.count_and_look(records[:6], [*looks[:5], None])
    assert counts == [1] * 6
    assert found == [True, False, False, True, False, None]


async def test_the_gateway_on_a_cluster(
    kafka_bootstrap: str,
    redis_cluster: RedisClusterNodes,
    unique_id: str,
    tmp_path: Path,
) -> None:
    """Readiness (its pipelined registry look), sync infer, a job, and statistics."""
    settings = make_settings(
        kafka_bootstrap,
        redis_cluster.url,
        unique_id,
        repository=repository_of(tmp_path, "add_sub"),
        redis={"cluster": True},
    )
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    async with running_worker(settings, "add_sub"), http(settings) as client:

        async def ready() -> bool:
            return (await client.get("/v2/health/ready")).status_code == 200

        await wait_for(ready, 30, "the gateway on the cluster to be ready")
        response = await client.post("/v2/models/add_sub/infer", json=add_sub_json(a, a))
        assert response.status_code == 200, response.text
        assert outputs_by_name(response.json())["OUTPUT0"]["data"] == (2 * a).reshape(-1).tolist()
        job = await client.post("/v2/models/add_sub/jobs", json=add_sub_json(a, a * 0))
        assert job.status_code == 202, job.text
        done = await poll_until(client, job.json()["job_id"], "done")
        assert outputs_by_name(done)["OUTPUT1"]["data"] == a.reshape(-1).tolist()

        async def counted() -> bool:
            stats = (await client.get("/v2/models/add_sub/stats")).json()["model_stats"]
            return bool(stats) and stats[0]["inference_stats"]["success"]["count"] >= 2

        await wait_for(counted, 30, "statistics read back from the cluster")


async def test_a_sequence_goes_on_from_the_state_stored_with_its_last_answer(
    cluster_settings: PlazaSettings, cluster_client: redis.asyncio.Redis
) -> None:
    """As if a worker had stored a request's answer (its state with it, in the claim's
    script) and died before updating the sequence's own key: the next worker finds that
    request answered at intake and takes the sequence up from the state stored with its
    answer, so the sequence's END adds to 8, not to the key's older 5."""
    settings, names = cluster_settings, cluster_settings.names
    seq = 4711

    def ints(v: int) -> dict[str, np.ndarray]:
        return {"INPUT": np.array([[v]], np.int32)}

    async with PlazaClient(settings) as client:
        async with running_worker(settings, "accumulate"):
            start = {"sequence_id": seq, "sequence_start": True}
            first = await client.infer("accumulate", ints(5), parameters=start)
        assert first.as_numpy()["OUTPUT"].tolist() == [[5]]
        second = make_request("accumulate", ints(3), parameters={"sequence_id": seq})
        answer = InferResult(
            second.id, "accumulate", "1", (Tensor.from_numpy("OUTPUT", np.array([[8]], np.int32)),)
        )
        state = encode_state({"SUM_IN": np.array([8], np.int32)}, time.time(), time.time())
        writer = ResultWriter(cluster_client, settings.redis, names)
        try:  # the answer and its state; the sequence's own key not reached ("elsewhere")
            elsewhere = names.sequence_state_key("accumulate", 1, "elsewhere")
            assert await writer.write([(answer, None)], [StateWrite(0, elsewhere, state, 60_000)])
        finally:
            await writer.close()
        kept = await cluster_client.get(names.sequence_state_key("accumulate", 1, seq))
        assert kept is not None and decode_state(kept)[0]["SUM_IN"].tolist() == [5]  # behind
        end = make_request(
            "accumulate", ints(4), parameters={"sequence_id": seq, "sequence_end": True}
        )
        await client.publish_many([second, end])  # the replay: the answered one, then END
        async with running_worker(settings, "accumulate"):

            async def answered() -> bool:
                return (await client.poll(end.id)).state == "done"

            await wait_for(answered, 60, "the END's answer")
        done = (await client.poll(end.id)).result
    assert done is not None and done.error is None
    assert done.as_numpy()["OUTPUT"].tolist() == [[12]]  # 8 + 4: on the answered state
