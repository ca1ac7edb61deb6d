"""The data path end to end on real Kafka and Redis: SDK -> topic -> worker -> Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_results, encode_request
from plaza.connections import kafka_producer
from plaza.errors import Cancelled, InvalidInput, ModelNotFound
from plaza.naming import HEADER_ERROR_CODE, STREAM_FIELD_RESULTS
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from tests.support import running_worker, wait_for


async def test_sync_infer_through_kafka(settings: PlazaSettings) -> None:
    async with running_worker(settings, "add_sub"), PlazaClient(settings) as client:
        a = np.arange(32, dtype=np.int32).reshape(2, 16)
        b = np.full((2, 16), 7, dtype=np.int32)
        result = await client.infer("add_sub", {"INPUT0": a, "INPUT1": b})
        out = result.as_numpy()
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        assert result.version == "1" and result.timing_us["compute_infer"] >= 0


async def test_async_job_submit_and_poll(settings: PlazaSettings) -> None:
    async with PlazaClient(settings) as client:
        x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
        job = await client.submit("identity", {"INPUT0": x})
        assert (await client.poll(job)).state == "pending"  # no worker yet: still queued
        async with running_worker(settings, "identity"):
            result = await client.result(job, timeout_s=60)
        np.testing.assert_array_equal(result.output("OUTPUT0").to_numpy(), x)
        assert (await client.poll("never-submitted")).state == "unknown"


async def test_requests_published_before_the_worker_starts_are_batched(
    settings: PlazaSettings,
) -> None:
    async with PlazaClient(settings) as client:
        stream = client.results_stream("batched")
        rows = [np.full((1, 4), i, dtype=np.float32) for i in range(200)]
        ids = await client.publish_many(
            make_request("identity", {"INPUT0": r}, reply_stream=stream) for r in rows
        )
        async with running_worker(settings, "identity") as worker:
            seen: dict[str, float] = {}
            async for _, results in client.consume(stream, "g", "c1", block_ms=500):
                for res in results:
                    seen[res.id] = float(res.output("OUTPUT0").to_numpy()[0, 0])
                if len(seen) == len(ids):
                    break
            assert seen == {rid: float(i) for i, rid in enumerate(ids)}
            # a deep queue gives big batches: far fewer batches than requests
            assert worker.metrics.executions() < len(ids) / 4
            assert max(worker.metrics.batch_sizes()) > 16


async def test_result_stream_consumed_by_a_consumer_group(settings: PlazaSettings) -> None:
    n = 300
    async with running_worker(settings, "identity"), PlazaClient(settings) as client:
        stream = client.results_stream("pipeline")
        ids = await client.publish_many(
            make_request(
                "identity", {"INPUT0": np.full((1, 2), i, np.float32)}, reply_stream=stream
            )
            for i in range(n)
        )
        counts: dict[str, int] = {}

        async def consume(name: str) -> None:
            async for entry_id, results in client.consume(
                stream, "pipeline", name, block_ms=300, idle_exit=True
            ):
                for res in results:
                    counts[res.id] = counts.get(res.id, 0) + 1
                await client.ack(stream, "pipeline", entry_id)
                if len(counts) == n:
                    return

        await wait_for(lambda: client._redis.exists(stream), what="first results")
        await asyncio.gather(consume("a"), consume("b"))
        assert set(counts) == set(ids) and set(counts.values()) == {1}
        pending = await client._redis.xpending(stream, "pipeline")
        assert pending["pending"] == 0  # every entry acknowledged


async def test_two_workers_in_one_group_share_the_load(settings: PlazaSettings) -> None:
    n = 400
    async with (
        running_worker(settings, "identity", max_pending=64) as w1,
        running_worker(settings, "identity", max_pending=64) as w2,
        PlazaClient(settings) as client,
    ):
        await wait_for(
            lambda: len(w1.consumer.assignment()) == 1 and len(w2.consumer.assignment()) == 1,
            what="one partition each",
        )
        stream = client.results_stream("shared")
        ids = await client.publish_many(
            make_request(
                "identity",
                {"INPUT0": np.full((1, 1), i, np.float32)},
                reply_stream=stream,
                correlation_id=f"req-{i}",
            )
            for i in range(n)
        )
        got: set[str] = set()
        async for _, results in client.consume(stream, "g", "c", block_ms=500):
            got.update(r.id for r in results)
            if len(got) == n:
                break
        assert got == set(ids)
        # A worker counts an answer once its write returned, a moment after the client saw it.
        written = (w1.metrics.records, w2.metrics.records)
        await wait_for(lambda: sum(r["written"] for r in written) == n, what="the counts")
        assert w1.metrics.records["written"] > 0 and w2.metrics.records["written"] > 0


async def test_invalid_request_gets_an_error_and_its_batch_mates_run(
    settings: PlazaSettings,
) -> None:
    async with running_worker(settings, "add_sub"), PlazaClient(settings) as client:
        good = {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)}
        bad = {"INPUT0": np.ones((1, 15), np.int32), "INPUT1": np.ones((1, 15), np.int32)}
        results = await asyncio.gather(
            client.infer("add_sub", good),
            client.infer("add_sub", bad),
            client.infer("add_sub", good),
            return_exceptions=True,
        )
        assert isinstance(results[1], InvalidInput) and "shape" in str(results[1])
        for ok in (results[0], results[2]):
            assert not isinstance(ok, BaseException)
            np.testing.assert_array_equal(ok.output("OUTPUT0").to_numpy(), 2 * good["INPUT0"])
        with pytest.raises(ModelNotFound):
            await client.infer("add_sub", good, version="9")


async def test_undecodable_record_goes_to_the_dead_letter_topic(settings: PlazaSettings) -> None:
    names = settings.names
    async with running_worker(settings, "identity") as worker:
        producer = kafka_producer(settings.kafka)
        await producer.start()
        try:
            await producer.send_and_wait(names.request_topic("identity"), b"\xc1garbage")
            await producer.send_and_wait(
                names.request_topic("identity"), msgpack.packb({"v": 1, "model": "identity"})
            )
        finally:
            await producer.stop()
        dlq = AIOKafkaConsumer(
            names.dead_letter_topic("identity"),
            bootstrap_servers=settings.kafka.bootstrap_servers,
            auto_offset_reset="earliest",
            group_id=None,
        )
        await dlq.start()
        try:
            records = []
            while len(records) < 2:
                batch = await dlq.getmany(timeout_ms=5000)
                assert batch, "dead letters did not arrive"
                records.extend(r for rs in batch.values() for r in rs)
        finally:
            await dlq.stop()
        # two partitions: the dead letters may come back in either order
        assert b"\xc1garbage" in {r.value for r in records}
        codes = [dict(r.headers)[HEADER_ERROR_CODE] for r in records]
        assert codes == [b"bad_envelope", b"bad_envelope"]
        assert worker.metrics.records["dead_lettered"] == 2


async def test_a_replayed_request_keeps_its_first_answer(settings: PlazaSettings) -> None:
    async with running_worker(settings, "identity") as worker, PlazaClient(settings) as client:
        stream = client.results_stream("replay")
        first = make_request(
            "identity",
            {"INPUT0": np.zeros((1, 2), np.float32)},
            reply_stream=stream,
            correlation_id="same-id",
        )
        again = make_request(
            "identity",
            {"INPUT0": np.ones((1, 2), np.float32)},
            reply_stream=stream,
            correlation_id="same-id",
        )
        await client.publish_many([first])
        await wait_for(lambda: worker.metrics.records["written"] == 1, what="first answer")
        await client.publish_many([again])
        # Its answer is found before it runs: skipped, not run and then suppressed.
        await wait_for(lambda: worker.metrics.records["skipped"] == 1, what="replay")
        assert worker.metrics.executions() == 1

        # The retry (sent after the answer was stored) gets that first answer on its stream.
        async def copied() -> bool:
            return bool(await client._redis.xlen(stream) == 2)

        await wait_for(copied, what="the retry's copy of the first answer")
        entries: Any = await client._redis.xrange(stream)
        copies = [r for _, f in entries for r in decode_results(f[STREAM_FIELD_RESULTS])]
        stored = await client.result("same-id")
        for answer in (*copies, stored):
            np.testing.assert_array_equal(answer.output("OUTPUT0").to_numpy(), np.zeros((1, 2)))


async def test_a_request_cancelled_before_it_runs_is_skipped(settings: PlazaSettings) -> None:
    x = np.full((1, 2), 7, np.float32)
    async with PlazaClient(settings) as client:
        store = ResultStore(client._redis, settings.redis, settings.names)
        stream = client.results_stream("cancel")
        cancelled, kept = (
            make_request("identity", {"INPUT0": x}, reply_stream=stream, correlation_id=rid)
            for rid in ("cancelled-id", "kept-id")
        )
        assert await store.cancel(cancelled)
        assert not await store.cancel(cancelled)  # first write wins, for cancels too
        await client.publish_many([cancelled, kept])
        async with running_worker(settings, "identity") as worker:
            await wait_for(lambda: worker.metrics.records["written"] == 1, what="kept's answer")
            await wait_for(lambda: worker.metrics.records["skipped"] == 1, what="the skip")
            kept_answer = await client.result("kept-id")
            assert worker.metrics.executions() == 1
            with pytest.raises(Cancelled):
                await client.result("cancelled-id")
    np.testing.assert_array_equal(kept_answer.output("OUTPUT0").to_numpy(), x)


async def test_a_cancelled_raw_record_keyed_otherwise_is_skipped_too(
    settings: PlazaSettings,
) -> None:
    """Raw producers may key records by anything or nothing: intake cannot look those up
    by key, so the launch-time look finds their answers."""
    x = np.full((1, 2), 3, np.float32)
    async with PlazaClient(settings) as client:
        store = ResultStore(client._redis, settings.redis, settings.names)
        stream = client.results_stream("raw-cancel")
        reqs = [
            make_request("identity", {"INPUT0": x}, reply_stream=stream, correlation_id=rid)
            for rid in ("raw-wrong-key", "raw-no-key", "raw-kept")
        ]
        assert await store.cancel(reqs[0])
        assert await store.cancel(reqs[1])
        async with running_worker(settings, "identity") as worker:  # it makes the topic
            producer = kafka_producer(settings.kafka)
            await producer.start()
            try:
                topic = settings.names.request_topic("identity")
                for req, key in zip(reqs, (b"another-id", None, b"raw-kept"), strict=True):
                    await producer.send_and_wait(topic, encode_request(req), key=key)
            finally:
                await producer.stop()
            await wait_for(lambda: worker.metrics.records["written"] == 1, what="kept's answer")
            await wait_for(lambda: worker.metrics.records["skipped"] == 2, what="the skips")
            kept = await client.result("raw-kept")
            assert worker.metrics.executions() == 1
            for req in reqs[:2]:
                with pytest.raises(Cancelled):
                    await client.result(req.id)
    np.testing.assert_array_equal(kept.output("OUTPUT0").to_numpy(), x)


async def test_results_are_bounded_by_ttl(settings: PlazaSettings) -> None:
    async with running_worker(settings, "identity"), PlazaClient(settings) as client:
        job = await client.submit("identity", {"INPUT0": np.zeros((1, 1), np.float32)})
        await client.result(job)
        ttl = await client._redis.ttl(settings.names.result_key(job))
        assert 0 < ttl <= settings.redis.result_ttl_s


async def test_wire_contract_from_a_plain_producer(settings: PlazaSettings) -> None:
    """A producer that knows only docs/protocol.md: raw msgpack on the topic, raw Redis reads."""
    async with running_worker(settings, "identity"), PlazaClient(settings) as client:
        body = {
            "v": 1,
            "id": "plain-1",
            "model": "identity",
            "version": "",
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 3],
                    "data": np.array([1, 2, 3], "<f4").tobytes(),
                }
            ],
        }
        producer = kafka_producer(settings.kafka)
        await producer.start()
        try:
            await producer.send_and_wait(
                settings.names.request_topic("identity"), msgpack.packb(body), key=b"plain-1"
            )
        finally:
            await producer.stop()
        await wait_for(
            lambda: client._redis.exists(settings.names.result_key("plain-1")), what="result key"
        )
        raw = msgpack.unpackb(await client._redis.get(settings.names.result_key("plain-1")))
        assert raw["status"] == "ok" and raw["id"] == "plain-1"
        out = raw["outputs"][0]
        assert out["name"] == "OUTPUT0" and out["shape"] == [1, 3]
        assert np.frombuffer(out["data"], "<f4").tolist() == [1.0, 2.0, 3.0]
        assert encode_request(make_request("identity", {"INPUT0": np.zeros(1)})) is not None


async def test_sync_client_wrapper(settings: PlazaSettings) -> None:
    from plaza.client import SyncPlazaClient

    def use_it() -> tuple[np.ndarray, np.ndarray, str]:
        with SyncPlazaClient(settings) as client:
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            direct = client.infer("identity", {"INPUT0": x}).output("OUTPUT0").to_numpy()
            job = client.submit("identity", {"INPUT0": x + 1})
            polled = client.result(job, timeout_s=30).output("OUTPUT0").to_numpy()
            return direct, polled, client.poll(job).state

    async with running_worker(settings, "identity"):
        direct, polled, state = await asyncio.to_thread(use_it)
    expected = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(direct, expected)
    np.testing.assert_array_equal(polled, expected + 1)
    assert state == "done"
