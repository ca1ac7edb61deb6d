"""The batch runner: stack a batch's inputs once, run the backend, split the outputs.

Used by the worker (fed by the batcher) and by the GPU check script (fed directly). Requests
whose non-batch shapes differ cannot share one tensor; they run as separate sub-batches, as
in Triton. A backend call that raises is retried on halves of its sub-batch until the
request(s) that fail on their own are found; only those get a ``model_error`` result, their
batch-mates are answered normally, and the worker keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from aiokafka.structs import TopicPartition

from plaza import reshape as reshaping
from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.datatypes import from_numpy_dtype, to_numpy_dtype
from plaza.errors import InvalidInput, ModelExecutionError, PlazaError
from plaza.modelconfig import ModelSpec
from plaza.tensors import Tensor
from plaza.workers.backends.base import (
    Answer,
    Arrays,
    Backend,
    Response,
    streams_responses,
    takes_requests,
)
from plaza.workers.classification import classify
from plaza.workers.response_statistics import ResponseTiming

log = logging.getLogger(__name__)
ExecutionObserver = Callable[[Sequence["WorkItem"], list[InferResult]], None]
"""Told of every backend execution that returned: its requests and their results (worker
metrics). A failed batch retried in halves is each half that ran, on its own; a call that
raised is no execution."""
Execution = tuple[Sequence["WorkItem"], list[InferResult]]
"""One backend execution that returned: its requests and their results."""
ResponseSink = Callable[["WorkItem", InferResult], None]
"""Takes a decoupled model's responses before the final ones, as they come, on the
executor thread that runs the batch (it may block it: that is the back-pressure)."""
ResponseObserver = Callable[["WorkItem", InferResult, ResponseTiming], None]
"""Told of each response of a decoupled model, final ones included, with its timing, on the
executor thread that runs the batch (worker metrics: Triton's ``response_stats``)."""


NO_PARTITION = TopicPartition("", -1)
"""The partition of a WorkItem that did not come from Kafka."""


@dataclass(slots=True)
class WorkItem:
    """A validated request waiting in the batcher."""

    request: InferRequest
    rows: int
    version: int
    received: float = field(default_factory=time.monotonic)
    """Monotonic time the worker took the request in (queue time starts here)."""
    partition: TopicPartition = NO_PARTITION
    """The Kafka partition it came from (``NO_PARTITION`` outside the worker)."""
    offset: int = -1
    looked_at: float | None = None
    """Monotonic time its answer was looked for, unanswered, at intake (None: not looked
    for; ``workers/answered.py``)."""


def _group_key(item: WorkItem) -> tuple[Any, ...]:
    inputs = item.request.inputs
    if len(inputs) == 1:  # most models: no sort to make
        return (item.version, ((inputs[0].name, inputs[0].shape[1:]),))
    shapes = tuple(sorted((t.name, t.shape[1:]) for t in inputs))
    return (item.version, shapes)


def stack_inputs(items: Sequence[WorkItem], batched: bool) -> Arrays:
    """One array per input: the requests' tensors joined on the batch dim (one copy).

    The requests of a batch share each input's shape past the batch dim (``_group_key``),
    so a fixed-size datatype's rows are the tensors' bytes end to end: joined once and
    read as one (writable) array, not an array per request and a concatenation (53 µs
    against 3 for 64 small requests, 37 against 3.3 for mlp's 512 floats). BYTES tensors
    are decoded one by one and concatenated."""
    first = items[0].request.inputs
    if len(items) == 1 or not batched:
        return {t.name: t.to_numpy() for t in first}
    arrays: Arrays = {}
    for i, head in enumerate(first):
        tensors = [_input_at(it.request.inputs, i, head.name) for it in items]
        arrays[head.name] = _joined(tensors)
    return arrays


def _input_at(inputs: Sequence[Tensor], i: int, name: str) -> Tensor:
    """The input ``name`` of a request, looked for at ``i`` first (requests list their
    inputs in one order, almost always)."""
    if i < len(inputs) and inputs[i].name == name:
        return inputs[i]
    return next(t for t in inputs if t.name == name)


def _joined(tensors: Sequence[Tensor]) -> np.ndarray[Any, Any]:
    dtype = to_numpy_dtype(tensors[0].datatype)
    if dtype.kind == "O":
        return np.concatenate([t.to_numpy() for t in tensors], axis=0)
    rows = sum(t.shape[0] for t in tensors)
    shape = (rows, *tensors[0].shape[1:])
    data = bytearray().join([t.data for t in tensors])  # writable, as a concatenation is
    if len(data) != math.prod(shape) * dtype.itemsize:  # admission checked each one
        raise InvalidInput(f"input {tensors[0].name!r}: the batch's tensors do not fill {shape}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


class BatchRunner:
    """Runs batches of WorkItems on the model's backends (one per served version)."""

    def __init__(
        self,
        spec: ModelSpec,
        backends: dict[int, Backend],
        executor: Executor | None = None,
        worker_id: str = "",
        observer: ExecutionObserver | None = None,
        labels: Mapping[str, Sequence[str]] | None = None,
        response_observer: ResponseObserver | None = None,
    ) -> None:
        """``labels``: each output's class labels (``workers/classification.py``).
        ``observer`` and ``response_observer`` hear of what ``run`` runs, never of what
        ``run_group`` runs alone (warmup stays out of the statistics)."""
        self.spec = spec
        self.labels = labels or {}
        self.backends = backends
        self.executor = executor
        self.worker_id = worker_id
        self.observer = observer
        self.response_observer = response_observer
        self._all_outputs = [o.name for o in spec.outputs]
        self._batched = spec.max_batch_size > 0
        # Triton's reshape (plaza.reshape): inputs to the model's shape, outputs back to dims
        self._to_model = reshaping.to_model(spec.inputs)
        self._to_client = reshaping.to_client(spec.outputs)

    async def run(
        self, items: Sequence[WorkItem], responses: ResponseSink | None = None
    ) -> list[InferResult]:
        """Results in the order of ``items``; inference runs in the executor thread. For a
        decoupled model these are the requests' final responses; the ones before go to
        ``responses`` as the model sends them (dropped without one)."""
        loop = asyncio.get_running_loop()
        groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
        by_request = {v for v, b in self.backends.items() if takes_requests(b)}
        for i, item in enumerate(items):
            groups[self._key(i, item, by_request)].append(i)
        results: list[InferResult | None] = [None] * len(items)
        for indices in groups.values():
            group = [items[i] for i in indices]
            ran: list[Execution] = []
            done = await loop.run_in_executor(
                self.executor, self.run_group, group, responses, True, ran
            )
            if self.observer is not None:  # on the event loop, as the metrics' other feeds
                for executed, outcome in ran:
                    self.observer(executed, outcome)
            for i, res in zip(indices, done, strict=True):
                results[i] = res
        return [r for r in results if r is not None]

    def _key(self, i: int, item: WorkItem, by_request: set[int]) -> tuple[Any, ...]:
        """Requests that may share one backend call: same version and shapes (stacked), or
        same version alone for a backend that takes the requests themselves."""
        if self.spec.max_batch_size <= 0:
            return (i,)
        if item.version in by_request:
            return (item.version,)
        return _group_key(item)

    def run_group(
        self,
        items: Sequence[WorkItem],
        responses: ResponseSink | None = None,
        observed: bool = False,
        ran: list[Execution] | None = None,
    ) -> list[InferResult]:
        """Run requests that share shapes and a version as one backend call (blocking);
        ``observed``: a decoupled model's responses go to ``response_observer``; ``ran``:
        each backend execution that returned is added to it, with its results.

        When the call fails, the group is split in halves and each half runs again, down
        to single requests: one culprit costs about 2*log2(n) extra calls, and only the
        requests that fail on their own get a ``model_error`` (which is final: first write
        wins), never their innocent batch-mates. Each half that runs is an execution of
        its own (in ``ran``); the calls that raised are none.
        """
        if self.spec.decoupled:  # never split: its responses may be out already
            observe = self.response_observer if observed else None
            results = self._execute_decoupled(items, responses, observe)
        else:
            try:
                results = self._execute(items)
            except Exception as exc:
                return self._retry_in_halves(items, exc, ran)
        if ran is not None:
            ran.append((items, results))
        return results

    def _retry_in_halves(
        self, items: Sequence[WorkItem], exc: Exception, ran: list[Execution] | None
    ) -> list[InferResult]:
        """After a failed call: a lone request's ``model_error``, or each half run again."""
        if len(items) == 1:
            log.error("%s: request %s failed", self.spec.name, items[0].request.id, exc_info=exc)
            err = ModelExecutionError(f"model {self.spec.name!r} failed: {exc}")
            return [self._error(items[0], err)]
        log.warning(
            "%s: batch of %d failed (%s); retrying it in halves to isolate the culprit",
            self.spec.name,
            len(items),
            exc,
        )
        half = len(items) // 2
        return self.run_group(items[:half], ran=ran) + self.run_group(items[half:], ran=ran)

    def _execute_decoupled(
        self,
        items: Sequence[WorkItem],
        responses: ResponseSink | None,
        observe: ResponseObserver | None = None,
    ) -> list[InferResult]:
        """A decoupled model's batch: each response numbered within its request; the final
        ones returned. A batch that fails (``execute`` raised, the process died) closes
        each request still open with that error, as its next response; a request whose
        earlier responses went out keeps them (first write wins per response). Each
        response, from the request's previous one (or the batch's start) on, is timed for
        ``observe``; each one's ``timing_us`` (an empty final's too) is its request's: queued
        until the batch started, computing from there to its send."""
        backend = self.backends[items[0].version]
        if not streams_responses(backend):
            err = ModelExecutionError(f"model {self.spec.name!r}: its backend cannot stream")
            return [self._error(it, err) for it in items]
        t0 = time.monotonic()
        sent = [0] * len(items)
        starts = [t0] * len(items)
        finals: list[InferResult | None] = [None] * len(items)

        def send(i: int, answer: Answer | None, final: bool) -> None:
            it = items[i]
            t_sent = time.monotonic()
            if answer is None:  # timed as any final: the request's statistics count it
                result = msgspec.structs.replace(self._ok(it, (), t0, t0, t_sent), empty=True)
            else:
                result = self._answered(it, self._answer_to_client(answer), t0, t_sent)
            result = msgspec.structs.replace(result, index=sent[i], final=final)
            sent[i] += 1
            if observe is not None:
                observe(it, result, _timing(it, starts[i], t_sent))
            if final:
                finals[i] = result
            elif responses is not None:
                responses(it, result)
            starts[i] = time.monotonic()  # the next response starts once this one is handed on

        try:
            requests = [self._request_to_model(it.request) for it in items]
            backend.execute_decoupled(requests, send)
            failure: PlazaError = ModelExecutionError(
                f"model {self.spec.name!r}: execute ended without closing the request "
                "(a response with the flag TRITONSERVER_RESPONSE_COMPLETE_FINAL)"
            )
        except Exception as exc:
            log.warning("%s: decoupled batch of %d failed: %s", self.spec.name, len(items), exc)
            failure = ModelExecutionError(f"model {self.spec.name!r} failed: {exc}")
        return [
            final if final is not None else self._close(it, failure, sent[i], starts[i], observe)
            for i, (it, final) in enumerate(zip(items, finals, strict=True))
        ]

    def _close(
        self,
        it: WorkItem,
        failure: PlazaError,
        index: int,
        start: float,
        observe: ResponseObserver | None,
    ) -> InferResult:
        """The error response that closes a request its failed batch left open."""
        failed_at = time.monotonic()
        closed = msgspec.structs.replace(self._error(it, failure), index=index)
        if observe is not None:
            observe(it, closed, _timing(it, start, failed_at))
        return closed

    def _execute(self, items: Sequence[WorkItem]) -> list[InferResult]:
        t0 = time.monotonic()
        backend = self.backends[items[0].version]
        if takes_requests(backend):
            requests = [self._request_to_model(it.request) for it in items]
            answers = [self._answer_to_client(a) for a in backend.execute_requests(requests)]
            t2 = time.monotonic()
            return [self._answered(it, a, t0, t2) for it, a in zip(items, answers, strict=True)]
        wanted = sorted({o for it in items for o in (it.request.outputs or self._all_outputs)})
        inputs = stack_inputs(items, self._batched)
        if self._to_model:
            inputs = reshaping.arrays(inputs, self._to_model, self._batched)
        t1 = time.monotonic()
        outputs = backend.infer(inputs, wanted)
        t2 = time.monotonic()
        if self._to_client:  # a model's output that dims cannot hold fails as the model's
            outputs = reshaping.arrays(outputs, self._to_client, self._batched)
        return self._split(items, outputs, t0, t1, t2)

    def _request_to_model(self, request: InferRequest) -> InferRequest:
        if not self._to_model:
            return request
        inputs = reshaping.tensors(request.inputs, self._to_model, self._batched)
        return msgspec.structs.replace(request, inputs=inputs)

    def _answer_to_client(self, answer: Answer) -> Answer:
        if not self._to_client or isinstance(answer, PlazaError):
            return answer
        if isinstance(answer, Response):
            outputs = reshaping.tensors(answer.outputs, self._to_client, self._batched)
            return msgspec.structs.replace(answer, outputs=outputs)
        return reshaping.tensors(answer, self._to_client, self._batched)

    def _answered(self, it: WorkItem, answer: Answer, t0: float, t2: float) -> InferResult:
        """A request backend's answer as the request's result (its response parameters,
        when the model gave some, with it)."""
        if isinstance(answer, PlazaError):
            return self._error(it, answer)
        if isinstance(answer, Response):
            result = self._ok(it, answer.outputs, t0, t0, t2)
            return msgspec.structs.replace(result, parameters=answer.parameters)
        return self._ok(it, answer, t0, t0, t2)

    def _split(
        self, items: Sequence[WorkItem], outputs: Arrays, t0: float, t1: float, t2: float
    ) -> list[InferResult]:
        total = sum(it.rows for it in items)
        batched = self._batched
        for name, arr in outputs.items():
            if batched and (arr.ndim == 0 or arr.shape[0] != total):
                raise ModelExecutionError(
                    f"output {name!r} has shape {list(arr.shape)}, expected {total} rows"
                )
        results: list[InferResult] = []
        if not batched:
            for it in items:
                names = it.request.outputs or self._all_outputs
                tensors = tuple(Tensor.from_numpy(n, outputs[n]) for n in names)
                results.append(self._ok(it, tensors, t0, t1, t2))
            return results
        # Each output once per batch: its wire datatype and C-ordered bytes; a request's
        # tensor is then a view of its rows (as ``Tensor.from_numpy`` of its slice gives).
        wire: dict[str, _Rows] = {}
        start = 0
        for it in items:
            end = start + it.rows
            names = it.request.outputs or self._all_outputs
            for n in names:
                if n not in wire:
                    wire[n] = _rows_of(outputs[n])
            tensors = tuple(_slice(n, wire[n], outputs[n], start, end) for n in names)
            start = end
            results.append(self._ok(it, tensors, t0, t1, t2))
        return results

    def _ok(
        self, it: WorkItem, tensors: tuple[Tensor, ...], t0: float, t1: float, t2: float
    ) -> InferResult:
        if it.request.classification:
            tensors = self._classified(it.request.classification, tensors)
        t3 = time.monotonic()
        timing = {
            "queue": int((t0 - it.received) * 1e6),
            "compute_input": int((t1 - t0) * 1e6),
            "compute_infer": int((t2 - t1) * 1e6),
            "compute_output": int((t3 - t2) * 1e6),
        }
        return InferResult(
            id=it.request.id,
            model=self.spec.name,
            version=str(it.version),
            outputs=tensors,
            timing_us=timing,
            worker=self.worker_id,
            trace_ns=_trace(it.received, t0, t1, t2, t3) if it.request.trace else {},
        )

    def _classified(
        self, counts: Mapping[str, int], tensors: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        batched = self._batched
        return tuple(
            classify(t, counts[t.name], batched, self.labels.get(t.name, ()))
            if t.name in counts
            else t
            for t in tensors
        )

    def _error(self, it: WorkItem, err: PlazaError) -> InferResult:
        return error_result(it.request, err, version=str(it.version), worker=self.worker_id)


_Rows = tuple[str, tuple[int, ...], memoryview, int] | None
"""An output's datatype, its shape past the batch dim, its bytes, and bytes per row (None:
BYTES, sliced through ``Tensor.from_numpy``)."""


def _rows_of(array: np.ndarray[Any, Any]) -> _Rows:
    datatype = from_numpy_dtype(array.dtype)
    if datatype == "BYTES":
        return None
    arr = np.ascontiguousarray(array, dtype=to_numpy_dtype(datatype))
    rest = tuple(arr.shape[1:])
    # flat first: a memoryview with a zero in its shape (no rows, or 0 per row) cannot be cast
    return datatype, rest, arr.reshape(-1).data.cast("B"), arr.itemsize * math.prod(rest)


def _slice(name: str, rows: _Rows, array: np.ndarray[Any, Any], start: int, end: int) -> Tensor:
    if rows is None:
        return Tensor.from_numpy(name, array[start:end])
    datatype, rest, data, row_bytes = rows
    return Tensor(name, datatype, (end - start, *rest), data[start * row_bytes : end * row_bytes])


def _timing(it: WorkItem, start: float, sent: float) -> ResponseTiming:
    """A response's timing (``ResponseTiming``) from monotonic seconds: its start, the
    model's send, and now (ready)."""
    ready = time.monotonic()
    return ResponseTiming(
        int((sent - start) * 1e9), int((ready - sent) * 1e9), int((ready - it.received) * 1e9)
    )


def _trace(received: float, t0: float, t1: float, t2: float, t3: float) -> dict[str, int]:
    """A traced request's stages (monotonic seconds) as Unix epoch nanoseconds, by Triton's
    names: the monotonic clock read onto the wall clock once, now."""
    offset_ns = time.time_ns() - time.monotonic_ns()
    return {
        name: int(moment * 1e9) + offset_ns
        for name, moment in (
            ("QUEUE_START", received),
            ("COMPUTE_START", t0),
            ("COMPUTE_INPUT_END", t1),
            ("COMPUTE_OUTPUT_START", t2),
            ("COMPUTE_END", t3),
        )
    }


def error_result(
    req: InferRequest | None,
    err: Any,
    *,
    rid: str = "",
    model: str = "",
    version: str = "",
    worker: str = "",
) -> InferResult:
    """An error answer for a request (or for a record of which only the id is known)."""
    return InferResult(
        id=req.id if req else rid,
        model=req.model if req else model,
        version=version or (req.version if req else ""),
        error=ErrorInfo(err.code, err.message),
        worker=worker,
    )
