"""A stateful model's sequences in the worker: the sequence batcher (``plaza.sequence_batching``)
and what each of its requests runs with.

Before a batch runs, ``prepare`` gives each request the inputs Plaza fills for the model
(``sequence_batching``'s control inputs: START, END, READY, CORRID; and its implicit state
inputs, from what the sequence's previous request left) and asks for the state outputs too.
After it ran, ``complete`` takes the state outputs out of each answer, keeps them for the
sequence's next request, and lets that request become a candidate (``finish``). A request
that was not run is let go (``release``) so its sequence goes on; a START let go leaves its
sequence not started, so the requests after it are refused rather than run on the state of
the sequence before it. So does a START that never runs another way: past its deadline,
refused, dead-lettered, or found answered when its record is read (its caller cancelled it
first): that one keeps its place in its sequence (``placeholder``) where the sequence is
held here, and is let go once the requests before it ran.

A sequence is one version's (``SequenceKey``: the version and the ``sequence_id``): a
model that serves several versions has one worker and one batcher for them all, and the
same id on two versions is two sequences, each with its own state and its own key. Each
version may hold ``max_candidate_sequences`` of them at once.

The state also goes to Redis, with each answer (``StateWrite``; the result writer keeps it
only where the answer is the first written, in the same script call): under the sequence's
key (``Names.sequence_state_key``) the state after its last answered request and when it
was made, and nothing after its END, nor after a START answered unrun (``unrun_starts``,
``drop_before_starts``): that key would still hold the state of the sequence before it,
which a worker taking the partition over within the idle time would resume. A request of a
sequence this worker does not hold, and
that does not start one, is one whose partition moved here (a rebalance, a worker that
stopped or crashed): the worker reads that state (``needs_state``, ``resume``) and the
sequence goes on where its answers left it, unless the request was sent more than the
model's idle time after the request that made the state was sent (the sequence went idle).
Both times are the senders' clocks (``sent_us``, stamped by the gateway or SDK that
published), so a worker's clock, whichever host it runs on, plays no part.

On a Redis Cluster the sequence's key is written just after the answers, not in their
script call (``workers/writer.py``), so a worker that dies in between leaves it one request
behind. Each answer's state is also stored with the answer itself
(``Names.answer_state_key``). The next owner replays the uncommitted requests, finds the
answered ones answered at intake (``skipped``), and takes the sequence up from the state
stored with the last of them (``state_key_for``); the requests committed before them were
written in full, so the sequence's key is right for those. A replay of an answered
request writes no answer, so no state either, and a request whose answer was never written
runs again on the state before it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import redis.asyncio as aioredis
from aiokafka.structs import TopicPartition

from plaza.contract import InferResult
from plaza.datatypes import from_numpy_dtype, to_numpy_dtype
from plaza.errors import ConfigError, PlazaError
from plaza.modelconfig import ModelSpec
from plaza.naming import Names
from plaza.sequence_batching import (
    SequenceBatcher,
    SequenceFlags,
    SequenceKey,
    State,
    Step,
    sequence_flags,
)
from plaza.sequence_config import CORRID, END, READY, START, SequenceControl
from plaza.tensors import Tensor
from plaza.workers.runner import WorkItem
from plaza.workers.writer import StateWrite

log = logging.getLogger(__name__)


class _Kept(msgspec.Struct, array_like=True):
    """A state as Redis keeps it."""

    at: float
    """When it was made (Unix time, the worker's clock): when its request ran."""
    tensors: dict[str, tuple[str, list[int], bytes]]
    """Each state input's datatype, shape and bytes."""
    sent: float = 0.0
    """When the request that made it was sent (Unix time, its sender's clock: ``sent_us``);
    0 when not known (a request published without it, or a state kept before this field)."""


_KEPT = msgspec.msgpack.Decoder(_Kept)


def encode_state(state: State | None, at: float, sent: float = 0.0) -> bytes:
    """A sequence's state as Redis keeps it, made at ``at`` by a request sent at ``sent``
    (0: not known). None, the zeros of a START: no tensors."""
    tensors = {
        name: (from_numpy_dtype(a.dtype), list(a.shape), np.ascontiguousarray(a).tobytes())
        for name, a in (state or {}).items()
    }
    return msgspec.msgpack.encode(_Kept(at, tensors, sent))


def decode_state(data: bytes) -> tuple[State, float, float]:
    """``encode_state``'s bytes back: the state (empty: zeros next), when it was made and
    when its request was sent (0: not known)."""
    kept = _KEPT.decode(data)
    state = {
        name: np.frombuffer(raw, dtype=to_numpy_dtype(datatype)).reshape(shape).copy()
        for name, (datatype, shape, raw) in kept.tensors.items()
    }
    return state, kept.at, kept.sent


DROP_TIMEOUT_S = 0.5
"""How long dropping the states of STARTs found answered at launch may take: past it they
stay (the batcher here refuses the requests after them anyway)."""

# KEYS: a sequence's state key. ARGV: the state read from it. Drops the key only while it
# still holds that state (a request that ran since wrote a newer one).
_DROP_IF_UNCHANGED = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

MAX_ANSWERED = 10_000
"""Sequences whose answered requests found at intake are remembered at once, at most."""
INITIAL_STATE_DIR = "initial_state"
"""Where a model's ``initial_state { data_file }`` files are, in its folder (Triton's)."""


def initial_states(spec: ModelSpec, model_dir: Path) -> State:
    """Each state input that starts from a data file, its value at a START (the others
    start from zeros); ConfigError when a file is missing or not the state's size."""
    initial: State = {}
    for st in spec.sequence.states:
        if not st.initial_file:
            continue
        path = model_dir / INITIAL_STATE_DIR / st.initial_file
        dtype = to_numpy_dtype(st.datatype)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"{spec.name}: initial state of {st.input_name!r}: {exc}", file=str(path)
            ) from exc
        expected = math.prod(st.dims) * dtype.itemsize
        if len(raw) != expected:
            raise ConfigError(
                f"{spec.name}: initial state file {path} holds {len(raw)} bytes; "
                f"{st.datatype} {list(st.dims)} is {expected}",
                file=str(path),
            )
        array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(st.dims)
        initial[st.input_name] = array.astype(dtype)  # little-endian, as Triton's files are
    return initial


async def read_states(
    redis: aioredis.Redis, places: Sequence[tuple[str, ...]]
) -> list[bytes | None]:
    """For each sequence, the first state Redis keeps under its ``places`` (None where
    none): one round trip, one key per command (a Redis Cluster holds them in many slots)."""
    pipe = redis.pipeline(transaction=False)
    for keys in places:
        for key in keys:
            pipe.get(key)
    found = iter(await pipe.execute())
    firsts: list[bytes | None] = []
    for keys in places:
        values = [next(found) for _ in keys]
        firsts.append(next((v for v in values if v is not None), None))
    return firsts


def _made_before(data: bytes, sent: float) -> bool:
    """Whether the kept state ``data`` was made by a request sent before ``sent`` (its send
    time, else when it was made, as ``SequenceRuns.resume`` judges); False if unreadable."""
    try:
        _, made, made_sent = decode_state(data)
    except Exception:  # not a state this worker wrote: left alone
        return False
    return (made_sent or made) < sent


class SequenceRuns:
    """The sequences of one stateful model on one worker."""

    def __init__(
        self,
        spec: ModelSpec,
        names: Names,
        keep_s: int,
        initial: State | None = None,
        *,
        answer_states: bool = False,
    ) -> None:
        """``keep_s``: how long a kept state outlives the idle time (``redis.result_ttl_s``,
        as long as the answers are kept); ``initial``: the states that do not start from
        zeros (``initial_states``); ``answer_states``: answers carry their states
        (a Redis Cluster's writer), so answered requests found at intake are remembered."""
        self.spec = spec
        self.answer_states = answer_states
        self._answered: dict[SequenceKey, tuple[TopicPartition, str]] = {}
        """A sequence not held here -> the last of its requests found answered at intake
        (its partition and id), oldest first, at most ``MAX_ANSWERED``."""
        self.initial = initial or {}
        self.names = names
        self.config = spec.sequence
        self.idle_s = spec.sequence.max_idle_us / 1e6
        self.state_ttl_ms = math.ceil(spec.sequence.max_idle_us / 1000) + keep_s * 1000
        """A kept state outlives the idle time: a crashed worker's next owner may start
        late, and whether the sequence went idle is judged by when its requests were sent
        (``resume``), not by how long the next one waited in Kafka."""
        self.batcher: SequenceBatcher[WorkItem] = SequenceBatcher(
            spec.sequence, spec.max_batch_size, self._flags
        )
        self._batched = spec.max_batch_size > 0
        self._user_outputs = tuple(o.name for o in spec.outputs)
        self._state_input = {s.output_name: s.input_name for s in spec.sequence.states}
        """Each state output, and the state input it feeds the sequence's next request."""

    def _flags(self, item: WorkItem) -> SequenceFlags:
        return sequence_flags(item.request.parameters, self.spec.name, item.version)

    def prepare(self, batch: Sequence[WorkItem]) -> list[WorkItem]:
        """``batch`` (handed out by the batcher, or adopted) with each request's control and
        state inputs added, and the state outputs asked for."""
        return [self._with_step(item, self.batcher.step(item)) for item in batch]

    def alone(self, item: WorkItem) -> WorkItem:
        """``item`` as a sequence of its own (START and END, zero state), outside the
        batcher: a warmup sample."""
        flags = self._flags(item)
        return self._with_step(item, Step(flags.key, True, True, None, flags.version))

    def _with_step(self, item: WorkItem, step: Step) -> WorkItem:
        req = item.request
        extra = [self._control(c, step) for c in self.config.controls]
        extra += [
            self._state(s.input_name, s.datatype, s.dims, step.state) for s in self.config.states
        ]
        outputs = (req.outputs or self._user_outputs) + self.config.state_outputs
        request = msgspec.structs.replace(req, inputs=req.inputs + tuple(extra), outputs=outputs)
        return dataclasses.replace(item, request=request)

    def _control(self, control: SequenceControl, step: Step) -> Tensor:
        value: Any
        if control.kind == CORRID:
            value = step.key  # the sequence_id alone, as Triton gives it
        elif control.kind == START:
            value = control.true_value if step.start else control.false_value
        elif control.kind == END:
            value = control.true_value if step.end else control.false_value
        else:
            assert control.kind == READY
            value = control.true_value
        shape = (1, 1) if self._batched else (1,)
        array = np.full(shape, value, dtype=to_numpy_dtype(control.datatype))
        return Tensor.from_numpy(control.name, array)

    def _state(
        self, name: str, datatype: str, dims: tuple[int, ...], state: State | None
    ) -> Tensor:
        row = None if state is None else state.get(name)
        if row is None:
            row = self.initial.get(name)
        if row is None:
            row = np.zeros(dims, dtype=to_numpy_dtype(datatype))
        return Tensor.from_numpy(name, row[np.newaxis] if self._batched else row)

    def complete(
        self, batch: Sequence[WorkItem], results: Sequence[InferResult]
    ) -> tuple[list[InferResult], list[StateWrite]]:
        """The answers without the state outputs, whose values each sequence keeps; and
        the states to write to Redis with them (``answers[w.index]`` for each)."""
        answers: list[InferResult] = []
        writes: list[StateWrite] = []
        now = time.time()
        for item, result in zip(batch, results, strict=True):
            step = self.batcher.step(item)
            if result.error is not None:
                self.batcher.finish(item, None)
                answers.append(result)
                if step.start or step.end:  # a failed START: zeros next; an END ends anyway
                    writes.append(self._write(len(answers) - 1, step, None, now, item))
                continue
            state: State = {}
            kept: list[Tensor] = []
            for tensor in result.outputs:
                name = self._state_input.get(tensor.name)
                if name is None:
                    kept.append(tensor)
                    continue
                array = np.array(tensor.to_numpy(), copy=True)  # not a view of the batch
                state[name] = array[0] if self._batched else array
            self.batcher.finish(item, state)
            answers.append(msgspec.structs.replace(result, outputs=tuple(kept)))
            writes.append(self._write(len(answers) - 1, step, state, now, item))
        return answers, writes

    def _write(
        self, index: int, step: Step, state: State | None, now: float, item: WorkItem
    ) -> StateWrite:
        kept = None if step.end else encode_state(state, now, item.request.sent_us / 1e6)
        key = self.state_key(step.sequence)
        return StateWrite(index, key, kept, self.state_ttl_ms)

    def unrun_starts(self, items: Sequence[WorkItem], first: int = 0) -> list[StateWrite]:
        """The state writes that go with error answers to ``items`` (``answers[first + i]``
        is ``items[i]``'s) written instead of running them (past their deadline, refused,
        dead-lettered): each START among them drops its sequence's key, as an END's answer
        does. Its sequence has not started (``SequenceBatcher``), and the key still holds
        the state of the sequence before it (the same id, left without an END), which a
        worker taking the partition over would resume. Dropped only where the answer is the
        first written, so a replay of a START that ran leaves the state it made."""
        writes: list[StateWrite] = []
        for index, item in enumerate(items, first):
            key = self.start_of(item)
            if key is not None:
                writes.append(StateWrite(index, self.state_key(key), None, self.state_ttl_ms))
        return writes

    def placeholder(self, item: WorkItem) -> WorkItem:
        """``item``, a START found answered at intake whose sequence is held here (or waits
        for its state in the same fetch), as it queues in its sequence's order, to be let go
        unrun at launch (``release``, ``drop_before_starts``) once the requests before it
        ran: without its deadline, as it never runs (past it, the batcher would answer it
        again, in vain, and the state before it would stay in Redis)."""
        request = msgspec.structs.replace(item.request, deadline_ms=None)
        return dataclasses.replace(item, request=request)

    async def drop_before_starts(self, redis: aioredis.Redis, items: Sequence[WorkItem]) -> None:
        """``items`` were found answered before they ran (``workers/answered.py``): cancelled
        by their callers, or replays. For each START among them, drop its sequence's key
        where the state there was made by a request sent before that START: the sequence
        before it, which the cancelled START left not started. A state made by the START
        or after it (a replay of a START that ran) stays, as does one whose START's send
        time is not known. Redis not answering in ``DROP_TIMEOUT_S`` leaves them."""
        starts = [(self.state_key(k), it.request.sent_us / 1e6) for it, k in self._starts(items)]
        starts = [(key, sent) for key, sent in starts if sent > 0]
        if not starts:
            return
        try:
            async with asyncio.timeout(DROP_TIMEOUT_S):
                stored = await read_states(redis, [(key,) for key, _ in starts])
                pipe = redis.pipeline(transaction=False)
                for (key, sent), data in zip(starts, stored, strict=True):
                    if data is not None and _made_before(data, sent):
                        pipe.eval(_DROP_IF_UNCHANGED, 1, key, data)
                await pipe.execute()
        except Exception as exc:  # Redis away: the batcher here still refuses them
            log.warning("states of %d unrun sequence STARTs not dropped: %s", len(starts), exc)

    def _starts(self, items: Sequence[WorkItem]) -> list[tuple[WorkItem, SequenceKey]]:
        return [(it, key) for it in items if (key := self.start_of(it)) is not None]

    def start_of(self, item: WorkItem) -> SequenceKey | None:
        """``item``'s sequence when ``item`` is its START, else None."""
        try:
            flags = self._flags(item)
        except PlazaError:
            return None
        return flags.sequence if flags.start else None

    def key_of(self, item: WorkItem) -> SequenceKey | None:
        """``item``'s sequence (its version and id); None where its parameters name none
        (the batcher refuses it with the reason)."""
        try:
            return self._flags(item).sequence
        except PlazaError:
            return None

    def needs_state(self, item: WorkItem) -> SequenceKey | None:
        """``item``'s sequence (its version and id) when this worker does not hold it and
        ``item`` does not start it: its state is to be read from Redis (``resume``). None
        otherwise."""
        try:
            flags = self._flags(item)
        except PlazaError:
            return None
        key = flags.sequence
        return None if flags.start or self.batcher.holds(key) else key

    def state_key(self, key: SequenceKey) -> str:
        """Where Redis keeps the state of sequence ``key`` (its version and id)."""
        version, sequence_id = key
        return self.names.sequence_state_key(self.spec.name, version, sequence_id)

    def skipped(self, item: WorkItem) -> None:
        """``item`` was found answered at intake and finished unrun. Where answers carry
        their states, and its sequence is not held here, its next request here takes the
        sequence up from ``item``'s stored state (``state_key_for``)."""
        if not self.answer_states:
            return
        key = self.key_of(item)
        if key is None or self.batcher.holds(key):
            return
        self._answered.pop(key, None)  # newest last
        self._answered[key] = (item.partition, item.request.id)
        if len(self._answered) > MAX_ANSWERED:
            del self._answered[next(iter(self._answered))]

    def state_keys_for(self, key: SequenceKey) -> tuple[str, ...]:
        """Where to read the state to take sequence ``key`` up with, first found first:
        the one stored with its request found answered last at intake here, if any
        (asked once), then its own key (an answer that carries none: a cancelled
        request's)."""
        last = self._answered.pop(key, None)
        own = self.state_key(key)
        return (own,) if last is None else (self.names.answer_state_key(last[1]), own)

    def forget(self, partitions: set[TopicPartition]) -> None:
        """Partitions moved away: what was remembered of their answered requests goes (a
        partition that comes back has had other owners meanwhile)."""
        for key in [k for k, (tp, _) in self._answered.items() if tp in partitions]:
            del self._answered[key]

    def resume(self, key: SequenceKey, stored: bytes, item: WorkItem, sent: float) -> bool:
        """Take sequence ``key`` up with the state Redis kept for it; ``item`` is its request
        that asked, sent at ``sent`` (Unix time, its sender's clock). False, and not taken
        up, when that request was sent more than the idle time after the request that made
        the state: the sequence went idle. Both are senders' clocks; only a state whose
        request's send time is not known is judged by when it was made (a worker's clock).
        QueueFull past its version's ``max_candidate_sequences``."""
        state, made, made_sent = decode_state(stored)
        if sent - (made_sent or made) > self.idle_s:
            return False
        self.batcher.resume(key, state, item)
        return True

    def release(self, items: Sequence[WorkItem]) -> None:
        """These will not run (handed out and let go, or suspects that ran outside the
        batches): their sequences go on, but for those whose START is among them (not
        started: ``SequenceBatcher.release``)."""
        for item in items:
            self.batcher.release(item)
