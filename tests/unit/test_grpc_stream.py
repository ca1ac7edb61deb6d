"""One ModelStreamInfer call's bookkeeping, without a network: a request with many answers
(a decoupled model's) keeps its slot until its last one is sent, answers waiting to be sent
stay bounded, and an error ends only its own request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from plaza.errors import QueueFull
from plaza.gateway.grpc_front import _Stream


def answers_of(count: int) -> Callable[[pb.ModelInferRequest], AsyncGenerator[Any, None]]:
    async def answers(request: pb.ModelInferRequest) -> AsyncGenerator[object, None]:
        for i in range(count):
            await asyncio.sleep(0)
            yield pb.ModelStreamInferResponse(
                infer_response=pb.ModelInferResponse(id=f"{request.id}.{i}")
            )

    return answers


async def requests(*ids: str) -> AsyncIterator[pb.ModelInferRequest]:
    for rid in ids:
        yield pb.ModelInferRequest(id=rid)


def label(answer: pb.ModelStreamInferResponse) -> str:
    return str(answer.error_message or answer.infer_response.id)


async def test_a_request_holds_its_slot_until_its_last_answer_is_sent() -> None:
    stream = _Stream(answers_of(3), max_inflight=1)
    async with asyncio.timeout(5):
        got = [label(a) async for a in stream.run(requests("a", "b"))]
    assert got == ["a.0", "a.1", "a.2", "b.0", "b.1", "b.2"]


async def test_requests_interleave_and_an_error_ends_only_its_own() -> None:
    b_answered = asyncio.Event()

    async def answers(request: pb.ModelInferRequest) -> AsyncGenerator[object, None]:
        yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id))
        if request.id == "a":
            await b_answered.wait()  # a's next answer comes after b's first
            yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id="a.1"))
            raise QueueFull("too slow")
        b_answered.set()

    stream = _Stream(answers, max_inflight=4)
    async with asyncio.timeout(5):
        got = [label(a) async for a in stream.run(requests("a", "b"))]
    assert got == ["a", "b", "a.1", "too slow"]


async def test_answers_waiting_to_be_sent_stay_within_the_bound() -> None:
    stream = _Stream(answers_of(50), max_inflight=2)
    run = stream.run(requests("a", "b"))
    async with asyncio.timeout(5):
        first = await anext(run)
        for _ in range(400):  # the client reads nothing while the answers could pile up
            await asyncio.sleep(0)
        assert stream._answers.qsize() <= 2
        rest = [label(a) async for a in run]
    assert len(rest) + 1 == 100 and label(first).endswith(".0")
