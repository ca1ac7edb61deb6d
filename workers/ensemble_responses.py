"""A decoupled step inside an ensemble: its responses, in order, and the branches they start.

An ensemble whose step is a decoupled model (``model_transaction_policy { decoupled: true
}``, many responses per request) answers its own request many times: each response of that
step runs the steps downstream of it once (a *branch*, ``plaza.ensembles.downstream_of``),
and each branch that finishes becomes one response of the ensemble (``workers/ensemble.py``).

``StepResponses`` reads the step's responses in index order, each once, until its final
one, from wherever they are:

- on the runner's reply stream, as the step's worker writes them;
- under their response keys (``Names.response_key``) and the result key, when the step was
  answered before this runner asked (a replayed ensemble request: the step's worker skips
  an answered request, so nothing comes on the stream), or when a response is missing from
  the stream (a step request run twice: its second run adds to the stream only the
  responses its first run did not write), or when the runner read too slowly (its
  branches all busy while the step streams on: the stream, past ``MAX_PENDING_RESPONSES``
  waiting, ends with QueueFull, and the runner reads on from a new one). A gap in the
  indices, or a final answer found on the result key while the stream is silent, is filled
  from those keys, ``STORED_CHUNK`` a ``MGET``.

``ordered`` runs the branches, at most ``BRANCH_WINDOW`` at once for one ensemble request,
and hands their results out in the order of the step's responses (a branch that finishes
early waits for the ones before it), so the ensemble's responses keep the order the step
gave them. ``until_failed`` ends them as soon as a task beside them (the steps that run
beside the decoupled one) fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis

from plaza.codec import decode_result
from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.ensembles import EnsembleStep
from plaza.errors import DeadlineExceeded, PlazaError, QueueFull
from plaza.modelconfig import ModelSpec
from plaza.naming import Names
from plaza.producer import Producer
from plaza.replies import MAX_PENDING_RESPONSES, ResponseStream
from plaza.results import ResultStore
from plaza.tasks import cancel_and_wait
from plaza.workers.result_lookup import ResultLookup

T = TypeVar("T")

BRANCH_WINDOW = 16
"""Branches of one ensemble request running at once; the step's next responses wait on the
reply stream (at most ``MAX_PENDING_RESPONSES``; past that, under their response keys)
until one finishes."""
STORED_CHUNK = 256
"""Responses read from their response keys by one ``MGET`` (a long gap, a chunk at a
time, so that the runner never holds more of them)."""


class StepFailed(Exception):
    """A step answered with an error (or not at all): the ensemble request's answer."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


class AnsweredMeanwhile(Exception):
    """The ensemble request got an answer while it ran: its caller cancelled it."""


@dataclass(frozen=True, slots=True)
class Waits:
    """How a step's responses are waited for (the runner's ``RESULT_POLL_S`` and limits)."""

    poll_s: float
    """The result keys are looked at this often while the stream is silent."""
    limit_s: float
    """A step that sends nothing for this long (from its publish, or from its response
    before) has failed."""
    until: float | None = None
    """Monotonic time by which every response must have come (the request's deadline plus
    a grace), or None."""

    def give_up(self) -> float:
        """When the next response is given up on, waiting from now."""
        limit = time.monotonic() + self.limit_s
        return limit if self.until is None else min(limit, self.until)


class StepResponses:
    """Reads one decoupled step's responses for the ensemble runner."""

    def __init__(
        self,
        producer: Producer,
        lookup: ResultLookup,
        redis: aioredis.Redis,
        store: ResultStore,
        names: Names,
    ) -> None:
        self._producer = producer
        self._lookup = lookup
        self._redis = redis
        self._store = store
        self._names = names

    async def read(
        self,
        owner: str,
        sreq: InferRequest,
        step: EnsembleStep,
        spec: ModelSpec | None,
        waits: Waits,
    ) -> AsyncGenerator[InferResult, None]:
        """``sreq``'s responses in index order, ending with its final one (an error is
        a final response too). ``owner`` is the ensemble request's id: an answer stored
        for it meanwhile (its caller cancelled) raises AnsweredMeanwhile. StepFailed when
        publishing fails, a response is lost, or nothing comes for ``waits.limit_s``.
        Stopping early does not cancel the step's request (a runner that stops leaves it
        to the next one): ``cancel`` does."""
        stored = await self._lookup.get(sreq.id)
        if stored is not None:  # answered before this runner asked: a replay
            async for result in self._stored(sreq.id, 0, stored, step):
                yield result
            return
        mux = await self._producer.replies()

        def listen() -> ResponseStream:
            return mux.expect_responses(sreq.id, MAX_PENDING_RESPONSES)

        stream = listen()  # before publishing
        try:
            try:
                await self._producer.publish_many([(sreq, spec)])
            except PlazaError as exc:
                raise StepFailed(ErrorInfo(exc.code, f"{step.label}: {exc.message}")) from exc
            async for result in self._follow(owner, sreq, step, (stream, listen), waits):
                yield result
        finally:
            mux.forget(sreq.id)

    async def cancel(self, sreq: InferRequest) -> None:
        """Store ``cancelled`` for the step's request unless it is answered (its worker
        tells a decoupled model, which may stop early); a failure only costs that."""
        with contextlib.suppress(Exception):
            await self._store.cancel(sreq)

    async def _follow(
        self,
        owner: str,
        sreq: InferRequest,
        step: EnsembleStep,
        streams: tuple[ResponseStream, Callable[[], ResponseStream]],
        waits: Waits,
    ) -> AsyncIterator[InferResult]:
        """The responses from ``streams`` (the first one, and how to listen anew), in
        order, each once: what a stream missed comes from the response keys."""
        stream, listen = streams
        nxt = 0
        getter: asyncio.Task[InferResult] | None = None
        give_up = waits.give_up()
        look_at_owner = time.monotonic() + waits.poll_s
        try:
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait({getter}, timeout=waits.poll_s)
                if getter in done:
                    try:
                        result = getter.result()
                    except StopAsyncIteration:  # only after a final one, which ends us first
                        return
                    except QueueFull:  # this runner read too slowly: the step streamed on
                        # (into its response keys); listen anew, the gap is read from those
                        getter, stream = None, listen()
                        continue
                    except PlazaError as exc:  # the reply reader stopped
                        error = ErrorInfo(exc.code, f"{step.label}: {exc.message}")
                        raise StepFailed(error) from exc
                    getter = None
                    if time.monotonic() > look_at_owner:  # a step that never pauses, too
                        await self._check_owner(owner)
                        look_at_owner = time.monotonic() + waits.poll_s
                    if result.index < nxt:
                        continue
                    async for earlier in self._from_keys(sreq.id, nxt, result.index, step):
                        yield earlier
                    yield result
                    if result.final:
                        return
                    nxt = result.index + 1
                    give_up = waits.give_up()
                    continue
                await self._check_owner(owner)
                look_at_owner = time.monotonic() + waits.poll_s
                stored = await self._lookup.get(sreq.id)
                if stored is not None:  # answered on its keys only (its worker skipped it)
                    async for result in self._stored(sreq.id, nxt, stored, step):
                        yield result
                    return
                if time.monotonic() > give_up:
                    message = f"{step.label}: its next response did not come in time"
                    raise StepFailed(ErrorInfo(DeadlineExceeded.code, message))
        finally:
            if getter is not None:
                await cancel_and_wait([getter])

    async def _check_owner(self, owner: str) -> None:
        """AnsweredMeanwhile when the ensemble request has an answer (its caller cancelled
        it, and the responses still to come go nowhere)."""
        if await self._lookup.get(owner) is not None:
            raise AnsweredMeanwhile(owner)

    async def _stored(
        self, rid: str, start: int, final: InferResult, step: EnsembleStep
    ) -> AsyncIterator[InferResult]:
        """Responses ``start``.. of a request whose final answer is ``final``. A final
        answer numbered before ``start`` (a ``cancelled`` stored by someone else while the
        step streamed) comes alone: it ends the reading with its error."""
        if final.index >= start:
            async for result in self._from_keys(rid, start, final.index, step):
                yield result
        yield final

    async def _from_keys(
        self, rid: str, start: int, stop: int, step: EnsembleStep
    ) -> AsyncIterator[InferResult]:
        """Responses ``start`` to ``stop - 1`` from their response keys, ``STORED_CHUNK``
        a round trip, each chunk read once the ones before it are taken."""
        for first in range(start, stop, STORED_CHUNK):
            for result in await self._stored_range(
                rid, first, min(stop, first + STORED_CHUNK), step
            ):
                yield result

    async def _stored_range(
        self, rid: str, start: int, stop: int, step: EnsembleStep
    ) -> list[InferResult]:
        """Responses ``start`` to ``stop - 1``, read from their response keys; StepFailed
        when one is no longer there (expired)."""
        if stop <= start:
            return []
        keys = [self._names.response_key(rid, i) for i in range(start, stop)]
        stored: list[Any] = await self._redis.mget(keys)
        missing = [start + i for i, raw in enumerate(stored) if raw is None]
        if missing:
            message = f"{step.label}: its responses {missing} are not stored (expired?)"
            raise StepFailed(ErrorInfo("model_error", message))
        return [decode_result(raw) for raw in stored]


async def ordered(
    items: AsyncIterator[T], run: Callable[[T], Awaitable[Any]], window: int = BRANCH_WINDOW
) -> AsyncGenerator[tuple[T, Any], None]:
    """``(item, await run(item))`` for each of ``items``, in their order, with at most
    ``window`` runs at once. An exception from ``items`` or from a run is raised in its
    place (the runs after it are cancelled)."""
    room = asyncio.Semaphore(window)
    # At most ``window`` runs (each holds a place until the reader took its result), and
    # one end: an exception, or None.
    slots: asyncio.Queue[tuple[T, asyncio.Future[Any]] | Exception | None] = asyncio.Queue(
        window + 1
    )

    async def feed() -> None:
        try:
            async for item in items:
                await room.acquire()
                slots.put_nowait((item, asyncio.ensure_future(run(item))))
            slots.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the reader, in its place in the order
            slots.put_nowait(exc)
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:  # stopped early: the source's own cleanup runs now
                await close()

    feeder = asyncio.create_task(feed())
    try:
        while True:
            slot = await slots.get()
            if slot is None:
                return
            if isinstance(slot, BaseException):
                raise slot
            item, task = slot
            try:
                result = await task
            finally:
                room.release()
            yield item, result
    finally:
        await cancel_and_wait([feeder])
        while not slots.empty():
            left = slots.get_nowait()
            if isinstance(left, tuple):
                left[1].cancel()
                with contextlib.suppress(BaseException):
                    await left[1]


async def until_failed(items: AsyncIterator[T], task: asyncio.Task[Any]) -> AsyncGenerator[T, None]:
    """``items``, while ``task`` runs beside them: should it fail, its exception is raised
    at once, instead of waiting for the next item (which may never come), and the wait for
    that item is cancelled. A ``task`` that succeeds changes nothing."""
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            pending = asyncio.ensure_future(anext(items))
            if not task.done():
                await asyncio.wait((pending, task), return_when=asyncio.FIRST_COMPLETED)
            if not pending.done():  # the task ended first
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    raise error
            try:
                item = await pending
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None:
            await cancel_and_wait([pending])
