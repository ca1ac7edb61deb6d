"""The result writer on a real Redis: one wire format, isolated XADDs, bounded streams."""

from __future__ import annotations

import numpy as np
import redis.asyncio

from plaza.codec import decode_result, decode_results, encode_results
from plaza.contract import ErrorInfo, InferResult
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from plaza.workers.writer import ResultWriter, StateWrite


def ok(rid: str, value: float = 1.0) -> InferResult:
    y = Tensor.from_numpy("y", np.full((1, 4), value, np.float32))
    return InferResult(rid, "m", "1", (y,), timing_us={"queue": 3}, worker="w")


def failed(rid: str) -> InferResult:
    return InferResult(rid, "m", "1", error=ErrorInfo("invalid_input", "bad shape"))


async def entries(r: redis.asyncio.Redis, stream: str) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in await r.xrange(stream)]


async def test_the_writers_stream_entry_is_the_codecs_result_batch(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    writer = ResultWriter(redis_client, settings.redis, settings.names)
    stream = settings.names.results_stream("codec")
    batch = [ok("a", 2.0), failed("b"), ok("c", 3.0)]
    assert await writer.write([(res, stream) for res in batch]) == 3
    [entry] = await entries(redis_client, stream)
    assert entry[STREAM_FIELD_RESULTS] == encode_results(batch)  # byte for byte
    assert int(entry[STREAM_FIELD_COUNT]) == 3
    decoded = decode_results(entry[STREAM_FIELD_RESULTS])
    assert [(r.id, r.status) for r in decoded] == [("a", "ok"), ("b", "error"), ("c", "ok")]
    assert decoded[2].output("y").to_numpy().tolist() == [[3.0] * 4]
    stored = await redis_client.get(settings.names.result_key("b"))
    assert decode_result(stored).error == ErrorInfo("invalid_input", "bad shape")


async def test_a_hostile_reply_stream_loses_only_its_own_results(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    names = settings.names
    writer = ResultWriter(redis_client, settings.redis, names)
    good, hostile = names.results_stream("good"), names.results_stream("hostile")
    await redis_client.set(hostile, b"not a stream")
    batch = [
        (ok("h1"), hostile),
        (ok("g1"), good),
        (ok("h2"), names.result_key("g2")),  # a batch-mate's result key: a string by then
        (ok("g2"), good),
        (ok("g3"), None),
    ]
    assert await writer.write(batch) == 5
    [entry] = await entries(redis_client, good)
    assert [r.id for r in decode_results(entry[STREAM_FIELD_RESULTS])] == ["g1", "g2"]
    assert await redis_client.get(hostile) == b"not a stream"
    for rid in ("h1", "g1", "h2", "g2", "g3"):  # every answer is still pollable
        assert decode_result(await redis_client.get(names.result_key(rid))).id == rid


async def test_a_replay_never_sends_a_second_answer(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    writer = ResultWriter(redis_client, settings.redis, settings.names)
    stream = settings.names.results_stream("replay")
    assert await writer.write([(ok("a", 1.0), stream), (ok("b", 1.0), stream)]) == 2
    assert await writer.write([(ok("a", 9.0), stream), (ok("c", 1.0), stream)]) == 1
    first, second = await entries(redis_client, stream)
    assert [r.id for r in decode_results(first[STREAM_FIELD_RESULTS])] == ["a", "b"]
    assert [r.id for r in decode_results(second[STREAM_FIELD_RESULTS])] == ["c"]
    kept = decode_result(await redis_client.get(settings.names.result_key("a")))
    assert kept.output("y").to_numpy().tolist() == [[1.0] * 4]


async def test_every_write_bounds_its_reply_stream(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    bounded = settings.redis.model_copy(update={"stream_maxlen": 10, "reply_stream_ttl_s": 77})
    writer = ResultWriter(redis_client, bounded, settings.names)
    stream = settings.names.reply_stream("gone-client")
    await writer.write([(ok("first"), stream)])
    await redis_client.persist(stream)  # as if its reader's own expiry had been lost
    for i in range(300):
        await writer.write([(ok(f"late-{i}"), stream)])
    assert 0 < await redis_client.ttl(stream) <= 77
    assert await redis_client.xlen(stream) <= 10 + 100  # MAXLEN ~ trims whole stream nodes


async def test_a_sequences_state_goes_with_its_first_answer_only(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    """A stateful model's states (``StateWrite``) are written in the answers' script call,
    each only where its answer is the first written: a replay's answer loses, and so does
    the state it carries; an END drops the kept state."""
    names = settings.names
    writer = ResultWriter(redis_client, settings.redis, names)
    seq_a, seq_b = names.sequence_state_key("m", 1, 1), names.sequence_state_key("m", 1, "b")
    first = [(ok("s1"), None), (ok("t1"), None), (ok("plain"), None)]
    states = [StateWrite(0, seq_a, b"after-s1", 60_000), StateWrite(1, seq_b, b"after-t1", 50_000)]
    assert await writer.write(first, states) == 3
    assert await redis_client.get(seq_a) == b"after-s1"
    assert 0 < await redis_client.pttl(seq_b) <= 50_000  # its own expiry
    replay = [(ok("s1", 5.0), None), (ok("s2"), None)]
    again = [StateWrite(0, seq_a, b"replayed", 60_000), StateWrite(1, seq_b, None, 60_000)]
    assert await writer.write(replay, again) == 1
    assert await redis_client.get(seq_a) == b"after-s1"  # s1's replay wrote no state
    assert await redis_client.exists(seq_b) == 0  # s2 won, and it ended its sequence
    assert await writer.write([(ok("s3"), None)]) == 1  # no states: the script as before
