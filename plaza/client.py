"""The producer SDK: publish jobs straight to Kafka, await or stream results from Redis.

``PlazaClient`` is asyncio; ``SyncPlazaClient`` wraps it for plain code. Both speak the wire
contract of docs/protocol.md and need only Kafka and Redis (no gateway).

    async with PlazaClient(settings) as client:
        result = await client.infer("mlp", {"x": batch})          # sync-style call
        job = await client.submit("mlp", {"x": batch})            # async job
        result = await client.result(job)                         # poll until done
        async for response in client.infer_stream("tokens", {"x": batch}):  # decoupled
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import numbers
import threading
import time
import uuid
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import CancelledError
from concurrent.futures import Future as ConcurrentFuture
from contextlib import aclosing, asynccontextmanager
from typing import Any, TypeVar

import numpy as np
from redis.exceptions import RedisClusterException, RedisError

from plaza.connections import kafka_answers, redis_client
from plaza.contract import InferRequest, InferResult, ReplyTo, Scalar, new_correlation_id
from plaza.errors import (
    DeadlineExceeded,
    InvalidInput,
    JobNotFound,
    ModelNotFound,
    PlazaError,
    Unavailable,
)
from plaza.modelconfig import ModelSpec
from plaza.naming import check_model_name
from plaza.priority import check_priority
from plaza.producer import Producer
from plaza.repository import ModelRepository
from plaza.results import JobStatus, ack_entry, consume_stream, raise_for_error
from plaza.retry import redis_failure
from plaza.settings import PlazaSettings
from plaza.tasks import cancel_and_wait
from plaza.tensors import Tensor

T = TypeVar("T")
REDIS_ERRORS = (RedisError, RedisClusterException, OSError)
"""What redis-py raises when Redis does not answer (a cluster's errors are no RedisError)."""
LAST_POLL_S = 0.1
"""What ``result``'s poll at its deadline may still wait for Redis (a healthy one answers
well within it), so that a pending job ends in DeadlineExceeded rather than Unavailable."""
Inputs = Mapping[str, np.ndarray[Any, Any]] | Sequence[Tensor]


def make_request(
    model: str,
    inputs: Inputs,
    *,
    version: str = "",
    outputs: Sequence[str] = (),
    reply_stream: str | None = None,
    timeout_s: float | None = None,
    priority: int = 0,
    parameters: Mapping[str, Scalar] | None = None,
    correlation_id: str | None = None,
    classification: Mapping[str, int] | None = None,
) -> InferRequest:
    """Build a request envelope; ``timeout_s`` becomes an absolute ``deadline_ms``,
    rounded up to the millisecond (None or 0, as Triton's timeout 0: no deadline);
    ``classification``: outputs to answer with their top classes (output name -> count).
    InvalidInput for inputs that are not numpy arrays by name, or Tensors; for a
    ``priority`` that is not an integer >= 0 (numpy's ints are, bools and floats are not);
    for a ``timeout_s`` that is not a finite number >= 0 (as the gateway's ``timeout``)."""
    tensors = _tensors(inputs)
    level = check_priority(priority)
    now_ms = int(time.time() * 1000)
    return InferRequest(
        id=correlation_id or new_correlation_id(),
        model=model,
        version=version,
        inputs=tensors,
        outputs=tuple(outputs),
        reply=ReplyTo(stream=reply_stream),
        deadline_ms=_deadline_ms(timeout_s, now_ms),
        priority=level,
        parameters=dict(parameters or {}),
        created_ms=now_ms,
        classification=dict(classification or {}),
    )


DEADLINE_MAX_MS = 2**63 - 1
"""The latest ``deadline_ms`` a request may carry (the envelope's int64)."""


def _deadline_ms(timeout_s: float | None, now_ms: int) -> int | None:
    """``now_ms`` plus ``timeout_s`` rounded up to the millisecond; None for None or 0 (no
    deadline). InvalidInput for a bool, a non-number, a negative, NaN or infinite timeout,
    or one whose deadline is past the envelope's int64."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
        raise InvalidInput(
            f"timeout_s must be a number of seconds, not a {type(timeout_s).__name__} "
            f"({repr(timeout_s)[:80]})"
        )
    try:
        seconds = float(timeout_s)
    except OverflowError:  # an int past any float: as good as infinite
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(
            f"timeout_s must be a finite number >= 0 (0: none), got {repr(timeout_s)[:80]}"
        )
    if seconds == 0:
        return None
    deadline = now_ms + math.ceil(seconds * 1000)
    if deadline > DEADLINE_MAX_MS:
        raise InvalidInput(f"timeout_s {timeout_s!r} puts the deadline past {DEADLINE_MAX_MS} ms")
    return deadline


def _wait_s(value: float, name: str) -> float:
    """A call's wait (``timeout_s``, ``interval_s``) as seconds: InvalidInput, before
    anything is published or polled, for a bool, a non-number, NaN, an infinite one or one
    <= 0 (a call that may not wait cannot be answered; NaN would never time out)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInput(
            f"{name} must be a number of seconds, not a {type(value).__name__} ({repr(value)[:80]})"
        )
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidInput(f"{name} must be a finite number > 0, got {repr(value)[:80]}")
    return seconds


def _tensors(inputs: Inputs) -> tuple[Tensor, ...]:
    """The request's input tensors: ``inputs`` maps names to numpy arrays, or is a
    sequence of ``Tensor``; InvalidInput for anything else (a Python list or number is
    not taken as an array: its dtype would be numpy's guess, not the model's)."""
    if isinstance(inputs, Mapping):
        for name, array in inputs.items():
            if not isinstance(name, str):
                raise InvalidInput(f"an input's name is a {type(name).__name__}, not a str")
            if not isinstance(array, np.ndarray):
                raise InvalidInput(
                    f"input {name[:100]!r} is a {type(array).__name__}: inputs map names "
                    "to numpy arrays (np.asarray(value, dtype=...))",
                    input=name[:100],
                )
        return tuple(Tensor.from_numpy(n, a) for n, a in inputs.items())
    if isinstance(inputs, Sequence) and not isinstance(inputs, str | bytes):
        for tensor in inputs:
            if not isinstance(tensor, Tensor):
                raise InvalidInput(
                    f"an input is a {type(tensor).__name__}: a sequence of inputs holds "
                    "plaza.tensors.Tensor (or pass a mapping of names to numpy arrays)"
                )
        return tuple(inputs)
    raise InvalidInput(
        f"inputs are a {type(inputs).__name__}: give a mapping of names to numpy arrays, "
        "or a sequence of plaza.tensors.Tensor"
    )


SPEC_RETRY_S = 10.0
"""How long a model whose config did not read is sent without it (its worker judges)
before the client reads the config again: a config fixed meanwhile is picked up, and a
broken one is not read again on every call (a Python model's runs a child process)."""


class PlazaClient:
    """Publishes requests to Kafka and reads their results from Redis.

    Producing goes through ``plaza.producer.Producer``, the same core the gateway uses.
    The client reads model configs from ``settings.repository`` when it can (priority
    levels, max_queue_size); without them (no such folder) a request goes to its model's
    base topic with its priority as given, and the worker settles it. A model that a
    readable repository does not hold is refused (ModelNotFound) before publishing:
    nothing would ever answer it.
    """

    def __init__(self, settings: PlazaSettings | None = None, *, name: str = "") -> None:
        self.settings = settings or PlazaSettings()
        self.names = self.settings.names
        self._client_name = name or f"sdk-{uuid.uuid4().hex[:12]}"
        self._redis = redis_client(self.settings.redis)
        self.producer = Producer(
            self.settings,
            self._redis,
            reply_stream=self.names.reply_stream(self._client_name),
            validate=False,  # the worker validates; its error comes back as the answer
        )
        self._repository = ModelRepository.of(self.settings)
        self._specs: dict[str, ModelSpec] = {}
        self._unread: dict[str, float] = {}
        """Models of the repository whose config did not read: when it last failed."""
        self._stopped = False
        self._calls: dict[asyncio.Task[Any], asyncio.Future[None]] = {}
        """The tasks polling Redis in a call (``result``, ``poll``, ``consume``, ``ack``),
        each with the future its call sets once it has ended: ``stop`` cancels them."""
        self._ended: set[asyncio.Task[Any]] = set()
        """The tasks of ``_calls`` that ``stop`` cancelled (they end in Unavailable)."""
        self._waiting: set[str] = set()
        """The correlation ids of this client's ``infer`` and ``infer_stream`` calls in
        flight: their answers are told apart by id alone."""

    async def start(self) -> None:
        """Connect; a start that fails closes what it opened (its producer, its Redis pool).
        Unavailable, naming ``kafka.bootstrap_servers``, when Kafka does not answer."""
        try:
            with kafka_answers(self.settings.kafka):
                await self.producer.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop: a call polling Redis is cancelled and waited for (it raises Unavailable),
        as are the ``infer`` and ``infer_stream`` calls still waiting; a call after it
        raises Unavailable at once."""
        self._stopped = True
        current = asyncio.current_task()
        ends = [end for task, end in self._calls.items() if task is not current]
        for task in self._calls:
            if task is not current:
                self._ended.add(task)
                task.cancel()
        if ends:
            await asyncio.wait(ends, timeout=self.settings.producer.stop_timeout_s)
        await self.producer.stop()
        await self._redis.aclose()

    def _check_open(self) -> None:
        if self._stopped:
            raise Unavailable("the client is stopped")

    @asynccontextmanager
    async def _call(self) -> AsyncIterator[None]:
        """Run a call that reads Redis as one ``stop`` may end: Unavailable once stopped,
        and when ``stop`` cancels it (a cancellation of its own is not absorbed)."""
        self._check_open()
        task = asyncio.current_task()
        if task is None or task in self._calls:  # no task, or a call within a call
            yield
            return
        end: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._calls[task] = end
        try:
            yield
        except asyncio.CancelledError:
            if task not in self._ended or task.uncancel() > 0:
                raise
            raise Unavailable("the client was stopped before the call ended") from None
        except Unavailable as exc:
            if task not in self._ended:
                raise
            if task.cancelling():
                task.uncancel()  # stop's cancel, absorbed below (redis-py may)
            raise Unavailable("the client was stopped before the call ended") from exc
        else:
            if task in self._ended:  # stop's cancel came, and was absorbed below
                if task.cancelling():
                    task.uncancel()
                raise Unavailable("the client was stopped before the call ended")
        finally:
            del self._calls[task]
            self._ended.discard(task)
            end.set_result(None)

    async def __aenter__(self) -> PlazaClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _spec(self, model: str) -> ModelSpec | None:
        """The model's config when ``settings.repository`` has it; None when there is no
        repository folder to read, or the model's config does not read (its worker answers;
        read again after ``SPEC_RETRY_S``). InvalidInput for a bad model name; ModelNotFound
        when the repository folder is there but holds no such model (not remembered: the
        model may be added later). A config is read once per model, on a thread: completing
        it may take a while (a Python model's ``auto_complete_config`` runs in a child
        process)."""
        spec = self._specs.get(model)
        if spec is not None:
            return spec
        check_model_name(model)
        failed = self._unread.get(model)
        if failed is not None and time.monotonic() - failed < SPEC_RETRY_S:
            return None
        if not self._repository.root.is_dir():
            return None  # no repository here: the worker is the judge
        try:
            spec = await asyncio.to_thread(self._repository.spec, model)
        except ModelNotFound:
            raise
        except PlazaError:
            self._unread[model] = time.monotonic()  # one per model folder: bounded
            return None
        self._unread.pop(model, None)
        self._specs[model] = spec
        return spec

    async def infer(
        self,
        model: str,
        inputs: Inputs,
        *,
        timeout_s: float = 30.0,
        raise_on_error: bool = True,
        **options: Any,
    ) -> InferResult:
        """Publish one request and wait for its answer on this client's reply stream.

        ``timeout_s`` (a finite number > 0) bounds the wait and is the request's deadline
        (``deadline_ms``): a worker that takes it later answers it ``timeout`` rather than
        run it. On timeout raises DeadlineExceeded with ``details["job_id"]`` (poll it).
        InvalidInput for a ``correlation_id`` that a call of this client still waits on."""
        self._check_open()
        wait_s = _wait_s(timeout_s, "timeout_s")
        req = make_request(model, inputs, timeout_s=wait_s, **options)
        with self._awaiting(req.id):
            result = await self.producer.infer(req, await self._spec(model), wait_s)
        return raise_for_error(result) if raise_on_error else result

    @contextlib.contextmanager
    def _awaiting(self, correlation_id: str) -> Iterator[None]:
        """Hold ``correlation_id`` for a call awaiting its answer; InvalidInput when
        another call of this client holds it (one of the two would wait in vain)."""
        if correlation_id in self._waiting:
            raise InvalidInput(
                f"correlation_id {correlation_id[:200]!r} is already in flight on this "
                "client: give each concurrent call its own",
                correlation_id=correlation_id[:200],
            )
        self._waiting.add(correlation_id)
        try:
            yield
        finally:
            self._waiting.discard(correlation_id)

    async def infer_stream(
        self,
        model: str,
        inputs: Inputs,
        *,
        timeout_s: float = 30.0,
        raise_on_error: bool = True,
        **options: Any,
    ) -> AsyncGenerator[InferResult, None]:
        """Publish one request and yield each of its responses as it comes, until the final
        one: a decoupled model's many (``index`` 0, 1, ...), an ordinary model's one.

        A decoupled model's ``empty`` final response (it closed the request without data)
        is not yielded: the stream just ends. ``timeout_s`` bounds the wait for each
        response; past it DeadlineExceeded with ``details["job_id"]`` (``poll`` it for all
        its responses). ``raise_on_error``: a response that carries an error is raised,
        ending the stream. Leaving the stream early (``break``; close it with
        ``contextlib.aclosing`` so that this happens at once) stores a ``cancelled`` answer
        for the request, as a cancelled ``infer`` does. ``timeout_s`` is a finite number
        > 0; it is no deadline of the request (a stream may outlast it). InvalidInput for a
        ``correlation_id`` that a call of this client still waits on."""
        self._check_open()
        wait_s = _wait_s(timeout_s, "timeout_s")
        req = make_request(model, inputs, **options)
        with self._awaiting(req.id):
            responses = self.producer.infer_stream(req, await self._spec(model), wait_s)
            async with aclosing(responses):
                async for result in responses:
                    if result.empty:
                        continue
                    yield raise_for_error(result) if raise_on_error else result

    async def submit(self, model: str, inputs: Inputs, **options: Any) -> str:
        """Publish an async job; returns its id (poll it with ``poll`` or ``result``)."""
        self._check_open()
        req = make_request(model, inputs, **options)
        return await self.producer.submit(req, await self._spec(model))

    async def publish_many(self, requests: Iterable[InferRequest]) -> list[str]:
        """Send many requests, letting the producer batch them; waits for every ack.

        Each request is answered on the ``reply_stream`` it names (``results_stream``), or
        on its result key alone when it names none. The whole batch is checked before any
        of it is published: InvalidInput for a reply stream that workers refuse to write
        (one not made by ``results_stream``), ModelNotFound for a model that the
        repository does not hold, PayloadTooLarge, QueueFull for a queue without room for
        the batch (``Producer.publish_many``); each time nothing of the batch is sent. A
        failure after the first send carries ``details["published_ids"]``."""
        self._check_open()
        batch = list(requests)
        for req in batch:
            self._check_reply_stream(req)
        specs = {model: await self._spec(model) for model in dict.fromkeys(r.model for r in batch)}
        return await self.producer.publish_many((req, specs[req.model]) for req in batch)

    def _check_reply_stream(self, req: InferRequest) -> None:
        """InvalidInput (the code a worker answers with) for a reply stream that no worker
        writes to: a pipeline consuming it would wait for ever."""
        stream = req.reply.stream
        if stream is None or self.names.is_reply_stream(stream):
            return
        raise InvalidInput(
            f"reply_stream {stream[:200]!r} of request {req.id} is not a stream workers "
            f"answer on: make it with results_stream(name) (it must start with "
            f"{self.names.results_stream('')!r}), or name none to poll the result",
            model=req.model,
            reply_stream=stream[:200],
        )

    async def poll(self, job_id: str) -> JobStatus:
        """pending, done (with the result; a decoupled model's job with every response,
        ``JobStatus.responses``) or unknown; Unavailable when Redis does not answer within
        ``plaza.producer.POLL_TIMEOUT_S``, or once the client is stopped."""
        async with self._call():
            return await self.producer.poll(job_id)

    async def result(
        self,
        job_id: str,
        *,
        timeout_s: float = 30.0,
        interval_s: float = 0.02,
        raise_on_error: bool = True,
    ) -> InferResult:
        """Poll ``job_id`` until it is done (or raise DeadlineExceeded / JobNotFound).

        Each poll waits for Redis no longer than the time left (Unavailable past it, at the
        deadline). A job this client submitted whose marker Redis did not take (out of
        memory, no answer) is pending, not unknown, until its result is stored.
        InvalidInput for a ``timeout_s`` or ``interval_s`` that is not a finite number > 0;
        Unavailable once the client is stopped (``stop`` ends a call in flight)."""
        timeout_s = _wait_s(timeout_s, "timeout_s")
        interval_s = _wait_s(interval_s, "interval_s")
        async with self._call():
            return await self._result(job_id, timeout_s, interval_s, raise_on_error)

    async def _result(
        self, job_id: str, timeout_s: float, interval_s: float, raise_on_error: bool
    ) -> InferResult:
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_open()  # a cancellation by stop may be absorbed below
            left_s = deadline - time.monotonic()
            status = await self.producer.poll(job_id, timeout_s=max(left_s, LAST_POLL_S))
            if status.result is not None:
                return raise_for_error(status.result) if raise_on_error else status.result
            if status.state == "unknown" and job_id not in self.producer.unmarked:
                raise JobNotFound(f"job {job_id} is not known (or its result expired)")
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(f"job {job_id} still pending after {timeout_s}s")
            await asyncio.sleep(min(interval_s, max(deadline - time.monotonic(), 0.0)))
            interval_s = min(interval_s * 1.5, 0.5)

    def results_stream(self, name: str) -> str:
        """The full Redis name of a pipeline's result stream (use as ``reply_stream``)."""
        return self.names.results_stream(name)

    async def consume(
        self, stream: str, group: str, consumer: str, **options: Any
    ) -> AsyncGenerator[tuple[bytes, list[InferResult]], None]:
        """Read a result stream as one consumer of a consumer group (XREADGROUP); ``ack``
        each entry once processed. Unavailable when Redis does not answer or refuses the
        read; a group that is gone (Redis restarted empty, the stream expired or evicted)
        is made again and read on (``consume_stream``)."""
        self._check_open()
        options.setdefault("keep_alive_s", self.settings.redis.reply_stream_ttl_s)
        entries = consume_stream(self._redis, stream, group, consumer, **options)
        try:
            while True:
                async with self._call():
                    try:
                        entry = await anext(entries)
                    except StopAsyncIteration:
                        return
                yield entry
        except REDIS_ERRORS as exc:
            raise Unavailable(redis_failure(exc)) from exc
        finally:
            await _aclose(entries)

    async def ack(self, stream: str, group: str, entry_id: bytes) -> None:
        """Acknowledge a processed entry of ``stream`` (XACK); Unavailable when Redis
        does not answer."""
        try:
            async with self._call():
                await ack_entry(self._redis, stream, group, entry_id)
        except REDIS_ERRORS as exc:
            raise Unavailable(redis_failure(exc)) from exc


class SyncPlazaClient:
    """A blocking wrapper: the async client runs on a private event loop thread.

    Its calls may come from several threads. ``close`` ends the calls still waiting, in any
    thread, with Unavailable; a call after it raises Unavailable at once. A client dropped
    without ``close`` is closed when it is garbage collected (its loop thread ends)."""

    def __init__(self, settings: PlazaSettings | None = None) -> None:
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="plaza-client"
        )
        self._thread.start()
        try:
            self._client = self._call(self._make(settings))
            self._call(self._client.start())
        except BaseException:  # no loop thread left behind by a client that did not start
            self._stop_loop()
            raise
        self._finalizer = weakref.finalize(self, _shut_down, self._client, self._loop, self._thread)

    @staticmethod
    async def _make(settings: PlazaSettings | None) -> PlazaClient:
        return PlazaClient(settings)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise Unavailable("the client is closed")
        fut: ConcurrentFuture[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except CancelledError:
            if self._closed:  # ended by close(), from another thread
                raise Unavailable("the client was closed before the call ended") from None
            raise

    def infer(self, model: str, inputs: Inputs, **options: Any) -> InferResult:
        return self._call(self._client.infer(model, inputs, **options))

    def infer_stream(
        self, model: str, inputs: Inputs, **options: Any
    ) -> Generator[InferResult, None, None]:
        """``PlazaClient.infer_stream``, blocking: each response as it comes. Leaving the
        loop early cancels the request once the generator is closed (``close()``, or
        garbage collection)."""
        responses = self._client.infer_stream(model, inputs, **options)
        try:
            while True:
                more, result = self._call(_step(responses))
                if not more:
                    return
                assert result is not None
                yield result
        finally:
            self._aclose(responses)

    def _aclose(self, responses: AsyncGenerator[InferResult, None]) -> None:
        """Close a stream on the loop; nothing to do once the client is closed (its loop
        is gone, and so is every request it would cancel)."""
        if self._closed:
            return
        try:
            self._call(responses.aclose())
        except Unavailable:
            if not self._closed:  # closed meanwhile, from another thread: as above
                raise

    def submit(self, model: str, inputs: Inputs, **options: Any) -> str:
        return self._call(self._client.submit(model, inputs, **options))

    def poll(self, job_id: str) -> JobStatus:
        return self._call(self._client.poll(job_id))

    def result(self, job_id: str, **options: Any) -> InferResult:
        return self._call(self._client.result(job_id, **options))

    def close(self) -> None:
        """Stop the client: the calls still waiting end (Unavailable), then its loop."""
        if self._closed:
            return
        self._closed = True  # from here on, a call is refused
        self._finalizer()

    def _stop_loop(self) -> None:
        self._closed = True
        _end_loop(self._loop, self._thread)

    def __enter__(self) -> SyncPlazaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shut_down(
    client: PlazaClient, loop: asyncio.AbstractEventLoop, thread: threading.Thread
) -> None:
    """Stop a ``SyncPlazaClient``'s client and its loop thread (``close``, or its garbage
    collection); where the collection runs on the loop thread itself, the loop is only
    told to stop (waiting on it there would wait for ever)."""
    if loop.is_closed():
        return
    if threading.current_thread() is thread:
        loop.stop()
        return
    asyncio.run_coroutine_threadsafe(_stop_all(client.stop()), loop).result()
    _end_loop(loop, thread)


def _end_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()


async def _stop_all(stop: Coroutine[Any, Any, None]) -> None:
    """Run ``stop`` (a client's), then cancel every other task of the loop and wait for
    them: a call polling a job, or publishing, would otherwise wait on a loop that stops."""
    await stop
    current = asyncio.current_task()
    await cancel_and_wait([t for t in asyncio.all_tasks() if t is not current])


async def _aclose(entries: AsyncIterator[Any]) -> None:
    """Close ``entries`` where it is a generator (it ends its Redis read)."""
    aclose = getattr(entries, "aclose", None)
    if aclose is not None:
        await aclose()


async def _step(responses: AsyncGenerator[T, None]) -> tuple[bool, T | None]:
    """The next item of ``responses``: (True, item), or (False, None) at its end."""
    try:
        return True, await anext(responses)
    except StopAsyncIteration:
        return False, None
