"""The reply multiplexer's routing, without Redis: futures take a request's final result,
response streams take every result of theirs, in order, within their bound."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from plaza.codec import encode_results
from plaza.contract import InferResult
from plaza.errors import QueueFull, Unavailable
from plaza.replies import ReplyMux, ResponseStream


def mux() -> ReplyMux:
    # redis-py connects lazily: routing never touches the server
    return ReplyMux(redis.asyncio.Redis(port=1), "replies", ttl_s=60, maxlen=100)


def response(rid: str, index: int, final: bool = False, empty: bool = False) -> InferResult:
    return InferResult(rid, "m", "1", index=index, final=final, empty=empty)


async def take(stream: ResponseStream) -> list[tuple[int, bool]]:
    async with asyncio.timeout(2):
        return [(r.index, r.final) async for r in stream]


async def test_a_stream_gets_its_responses_in_order_until_the_final_one() -> None:
    replies = mux()
    stream = replies.expect_responses("a", limit=8)
    other = replies.expect("b")
    # with the entry's count, as the reader passes it (and without, below)
    replies._dispatch(encode_results([response("a", 0), response("b", 0, final=True)]), b"2")
    replies._dispatch(encode_results([response("a", 1), response("a", 0)]), b"2")  # a replay
    assert replies.waiting == 1 and other.done()
    replies._dispatch(encode_results([response("a", 2, final=True, empty=True)]), b"1")
    assert replies.waiting == 0  # the final result ends the wait in the mux
    replies._dispatch(encode_results([response("a", 3)]))  # late: ignored
    assert await take(stream) == [(0, False), (1, False), (2, True)]


async def test_past_its_limit_a_stream_ends_with_queue_full_after_what_it_holds() -> None:
    replies = mux()
    stream = replies.expect_responses("a", limit=2)
    replies._dispatch(encode_results([response("a", i) for i in range(4)]))
    assert not stream.ended  # an entry is handed over whole: its reader gets a turn first
    replies._check_limits()  # the next read: the reader took none of them
    assert replies.waiting == 0 and stream.ended  # dropped: the reader loop never waits
    replies._dispatch(encode_results([response("a", 4)]))  # the rest are dropped
    got = []
    with pytest.raises(QueueFull, match="4 responses waited undelivered, more than its limit of 2"):
        async with asyncio.timeout(2):
            async for result in stream:
                got.append(result.index)
    assert got == [0, 1, 2, 3]


async def test_a_reader_that_keeps_up_is_never_cut_off() -> None:
    replies = mux()
    stream = replies.expect_responses("a", limit=1)
    got: list[int] = []

    async def read() -> None:
        async for result in stream:
            got.append(result.index)

    reader = asyncio.create_task(read())
    for i in range(5):
        replies._dispatch(encode_results([response("a", i, final=i == 4)]))
        await asyncio.sleep(0)  # the reader takes each before the next comes
    async with asyncio.timeout(2):
        await reader
    assert got == [0, 1, 2, 3, 4]


async def test_a_future_waits_for_the_final_result_and_forget_drops_a_stream() -> None:
    replies = mux()
    fut = replies.expect("a")
    replies._dispatch(encode_results([response("a", 0)]))
    assert not fut.done()  # a response that is not final cannot answer a one-answer wait
    replies._dispatch(encode_results([response("a", 1, final=True)]))
    assert fut.result().index == 1
    stream = replies.expect_responses("s")
    replies.forget("s")
    replies._dispatch(encode_results([response("s", 0, final=True)]))
    assert replies.waiting == 0 and not stream.ended


async def test_a_failed_stream_raises_once_its_responses_are_taken() -> None:
    replies = mux()
    stream = replies.expect_responses("a")
    replies._dispatch(encode_results([response("a", 0)]))
    stream.fail(Unavailable("the reply stream's reader stopped"))
    assert replies.waiting == 0
    assert (await anext(stream)).index == 0
    with pytest.raises(Unavailable):
        await anext(stream)
    with pytest.raises(ValueError, match="at least 1"):
        replies.expect_responses("b", limit=0)
