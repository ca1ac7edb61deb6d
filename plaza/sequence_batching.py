"""Triton's sequence batcher for stateful models: pure logic with an injected clock, as the
dynamic batcher (``plaza.batching``) is, and the same face to the worker.

A sequence is the requests to one model version that share a ``sequence_id``; its first
sets ``sequence_start`` and its last ``sequence_end``. A model that serves several versions
batches them in one batcher, and each version has its own sequences, as each version of a
Triton model has its own sequence batcher: sequence 7 on version 1 and sequence 7 on
version 2 are two sequences, with their own flags, states and idle times (``SequenceKey``).
Kafka keeps a sequence's requests in order (the producer core sends them all to one
partition, ``plaza.producer``), and this batcher keeps them so:

- A sequence runs one request at a time. A batch holds at most one request of each
  sequence, the heads of the sequences waiting longest (Triton's ``oldest`` strategy), up
  to ``max_batch_size``; a sequence's next request becomes a candidate only once the one
  before it has run (``finish``) or was let go unrun (``release``).
- Each request runs with its ``Step``: its START and END flags, and the state its sequence
  carries (the model's implicit state outputs of the request before; none at a START, where
  the model gets zeros).
- A request whose sequence has not started (no START came, or its END ran, or its START
  never ran: past its deadline, or let go unrun because its caller cancelled it; or it was
  idle past ``max_sequence_idle_microseconds`` and released) is refused, those queued
  behind such a START too; so is a new sequence beyond ``max_candidate_sequences``
  (``queue_full``). Both are clear errors, where serving them would give the model a state
  that is not theirs (the sequence's before that START, or zeros for one never started).
  The limit is each version's, as each Triton version's sequence batcher has its own: with
  2, versions 1 and 2 hold two sequences each. A sequence that ran on another worker (its
  partition moved here) is taken up with the state it left there (``resume``: the worker
  reads it from Redis first, ``workers/sequences.py``).
- ``oldest.max_queue_delay_microseconds`` lets a batch wait that long after its oldest
  request for more sequences to fill it (0: run at once); with
  ``oldest.preferred_batch_size``, the largest preferred size the waiting sequences fill
  runs at once, before the delay is out (as the dynamic batcher's preferred sizes do).
  ``direct``'s delay and ``minimum_slot_utilization`` come as the same two
  (``plaza.sequence_config``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from plaza.batching import Clock, Decision
from plaza.errors import InvalidInput, PlazaError, QueueFull
from plaza.sequence_config import SequenceBatching

T = TypeVar("T")
SequenceId = int | str
"""A request's ``sequence_id`` parameter: what the model gets as its CORRID control."""
SequenceKey = tuple[int, SequenceId]
"""A sequence: the model version its requests run on, and their ``sequence_id``."""
State = dict[str, np.ndarray[Any, Any]]
"""A sequence's implicit state: each state input's array (one row, the state's dims)."""
_SWEEP_S = 0.1
"""Idle sequences are looked for at most this often."""


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """A request's place in its sequence (its ``sequence_*`` parameters)."""

    key: SequenceId
    """Its ``sequence_id``."""
    start: bool = False
    end: bool = False
    version: int = 0
    """The model version it runs on: each version has its own sequences."""

    @property
    def sequence(self) -> SequenceKey:
        """Its sequence: its version and id."""
        return (self.version, self.key)


@dataclass(frozen=True, slots=True)
class Step:
    """What the model gets for one request of a sequence, beside the request's inputs."""

    key: SequenceId
    """Its ``sequence_id`` (the CORRID control's value)."""
    start: bool
    end: bool
    state: State | None
    """The state its sequence carries; None: zeros (a START, or nothing kept yet)."""
    version: int = 0
    """The model version it runs on."""

    @property
    def sequence(self) -> SequenceKey:
        """Its sequence: its version and id (where Redis keeps its state)."""
        return (self.version, self.key)


@dataclass(slots=True)
class _Queued(Generic[T]):
    item: T
    flags: SequenceFlags
    arrival: float
    deadline: float | None


@dataclass(slots=True, eq=False)
class _Sequence(Generic[T]):
    key: SequenceKey
    origin: T
    """Its latest request: what ``remove_if`` judges the sequence by (its partition)."""
    queue: deque[_Queued[T]] = field(default_factory=deque)
    state: State | None = None
    last: float = 0.0
    """When it last had a request run or arrive (idle time counts from here)."""
    running: bool = False
    ended: bool = False
    """Its END ran: only a START may follow."""


class SequenceBatcher(Generic[T]):
    """Holds the waiting requests of stateful sequences and forms batches of their heads."""

    def __init__(
        self,
        policy: SequenceBatching,
        max_batch_size: int,
        flags_of: Callable[[T], SequenceFlags],
        clock: Clock = time.monotonic,
    ) -> None:
        self.policy = policy
        self.max_batch_size = max(1, max_batch_size)
        self._flags_of = flags_of
        self._clock = clock
        self._sequences: dict[SequenceKey, _Sequence[T]] = {}
        self._held: dict[int, int] = {}
        """By version: its sequences in ``_sequences`` (each version has its own limit)."""
        self._running: dict[int, tuple[_Sequence[T], SequenceFlags]] = {}
        """By ``id(item)``: the requests handed out, not finished or released yet."""
        self._count = 0
        self._next_sweep = 0.0

    # -- intake ----------------------------------------------------------------------------
    def add(
        self,
        item: T,
        *,
        size: int = 1,
        priority: int = 0,
        deadline: float | None = None,
        arrival: float | None = None,
    ) -> None:
        """Queue ``item`` behind its sequence's earlier requests (``size`` and ``priority``
        are the dynamic batcher's: a sequence's request is one row, and sequences have no
        priority levels). InvalidInput if its sequence has not started, QueueFull past
        ``max_sequences`` of its version."""
        flags = self._flags_of(item)
        now = self._clock()
        key = flags.sequence
        seq = self._sequences.get(key)
        if seq is None:
            if not flags.start:
                raise _not_started(key)
            self._check_room(flags.version)
            seq = self._hold(_Sequence(key, item))
        seq.origin = item
        seq.last = now
        since = now if arrival is None else min(arrival, now)
        seq.queue.append(_Queued(item, flags, since, deadline))
        self._count += 1

    def _check_room(self, version: int) -> None:
        limit = self.policy.max_sequences
        if self._held.get(version, 0) >= limit:
            raise QueueFull(
                f"{limit} sequences of version {version} are active on this worker "
                f"({self.policy.max_sequences_field}); end one first"
            )

    def _hold(self, seq: _Sequence[T]) -> _Sequence[T]:
        """Hold ``seq``, in place of one of the same key if any; ``seq`` back."""
        if seq.key not in self._sequences:
            version = seq.key[0]
            self._held[version] = self._held.get(version, 0) + 1
        self._sequences[seq.key] = seq
        return seq

    def _drop(self, key: SequenceKey) -> None:
        """Let go of sequence ``key``, which is held."""
        del self._sequences[key]
        version = key[0]
        left = self._held[version] - 1
        if left:
            self._held[version] = left
        else:
            del self._held[version]  # a version no longer served leaves no entry behind

    def __len__(self) -> int:
        """Requests waiting (not handed out)."""
        return self._count

    @property
    def active(self) -> int:
        """Sequences held (started, not ended or released), of all versions."""
        return len(self._sequences)

    def remove_if(self, predicate: Callable[[T], bool]) -> list[T]:
        """Drop the waiting requests matching ``predicate``, and every sequence whose latest
        request matches it, state and all (its partition went to another worker, which
        now owns the sequence; a state kept here could only be stale)."""
        removed: list[T] = []
        for key, seq in list(self._sequences.items()):
            whole = predicate(seq.origin)
            kept: deque[_Queued[T]] = deque()
            for q in seq.queue:
                if whole or predicate(q.item):
                    removed.append(q.item)
                else:
                    kept.append(q)
            self._count -= len(seq.queue) - len(kept)
            seq.queue = kept
            if whole:
                self._drop(key)
        return removed

    # -- scheduling ------------------------------------------------------------------------
    def decide(self, backlog: int = 0) -> Decision[T]:
        """The next batch: the heads of the sequences not running, oldest first."""
        now = self._clock()
        expired: list[T] = []
        refused: list[tuple[T, PlazaError]] = []
        if now >= self._next_sweep:
            self._release_idle(now)
        candidates: list[_Sequence[T]] = []
        for seq in self._sequences.values():
            if seq.running:
                continue
            self._drop_unrunnable(seq, now, expired, refused)
            if seq.queue:
                candidates.append(seq)
        if not candidates:
            return Decision([], expired, self._wake(now), refused)
        candidates.sort(key=lambda s: s.queue[0].arrival)
        due = candidates[0].queue[0].arrival + self.policy.max_queue_delay_us / 1e6
        size = min(len(candidates), self.max_batch_size)
        if size < self.max_batch_size and now < due:
            preferred = [n for n in self.policy.preferred_batch_sizes if n <= size]
            if not preferred:
                return Decision([], expired, min(due, self._wake(now) or due), refused)
            size = preferred[-1]  # the largest preferred size the sequences can fill
        batch: list[T] = []
        for seq in candidates[:size]:
            head = seq.queue.popleft()
            self._count -= 1
            seq.running = True
            seq.last = now
            self._running[id(head.item)] = (seq, head.flags)
            batch.append(head.item)
        return Decision(batch, expired, None, refused)

    def _drop_unrunnable(
        self,
        seq: _Sequence[T],
        now: float,
        expired: list[T],
        refused: list[tuple[T, PlazaError]],
    ) -> None:
        """Take out the heads that cannot run: past their deadline, or after an END (or
        after a START that expired)."""
        while seq.queue:
            head = seq.queue[0]
            if head.deadline is not None and head.deadline <= now:
                expired.append(seq.queue.popleft().item)
                if head.flags.start:
                    self._unstart(seq)
            elif seq.ended and not head.flags.start:
                refused.append((seq.queue.popleft().item, _not_started(seq.key)))
            else:
                return
            self._count -= 1

    def _release_idle(self, now: float) -> None:
        idle_s = self.policy.max_idle_us / 1e6
        for key, seq in list(self._sequences.items()):
            if not seq.running and not seq.queue and now - seq.last >= idle_s:
                self._drop(key)
        self._next_sweep = now + min(_SWEEP_S, idle_s)

    def _wake(self, now: float) -> float | None:
        """When to look again with nothing to run: the next sweep while sequences are held
        (their idle time runs out without any arrival)."""
        return max(self._next_sweep, now) if self._sequences else None

    def holds(self, key: SequenceKey) -> bool:
        """Whether sequence ``key`` (version and id) is held here (started, not released)."""
        return key in self._sequences

    def resume(self, key: SequenceKey, state: State, item: T) -> None:
        """Take up a sequence that ran elsewhere (its partition was another worker's), with
        the state it left, ``item`` its request that asked for it; QueueFull past
        ``max_sequences`` of its version. A sequence held here already is left as it is."""
        if key in self._sequences:
            return
        self._check_room(key[0])
        seq = self._hold(_Sequence(key, item, state=state))
        seq.last = self._clock()

    # -- running ---------------------------------------------------------------------------
    def step(self, item: T) -> Step:
        """The flags and state ``item`` runs with (an item ``decide`` or ``adopt`` gave)."""
        seq, flags = self._running[id(item)]
        state = None if flags.start else seq.state
        return Step(flags.key, flags.start, flags.end, state, flags.version)

    def adopt(self, item: T) -> Step:
        """Run ``item`` outside the batches (a suspect run alone): its sequence must have
        started, unless it starts one. InvalidInput otherwise."""
        flags = self._flags_of(item)
        key = flags.sequence
        seq = self._sequences.get(key)
        if seq is None or (seq.ended and not flags.start):
            if not flags.start:
                raise _not_started(key)
            seq = self._hold(_Sequence(key, item))
        seq.running = True
        self._running[id(item)] = (seq, flags)
        return self.step(item)

    def finish(self, item: T, state: State | None) -> None:
        """``item`` ran: its sequence carries ``state`` on (None: the run failed, and the
        state stays as it was, or is zeros after a START), or ends if it was the END."""
        seq, flags = self._running.pop(id(item))
        seq.running = False
        seq.last = self._clock()
        if flags.end:
            seq.state, seq.ended = None, True
            if not seq.queue and self._sequences.get(seq.key) is seq:
                self._drop(seq.key)
            return
        seq.ended = False
        if state is not None:
            seq.state = state
        elif flags.start:  # a failed START still began the sequence anew: zeros next
            seq.state = None

    def release(self, item: T) -> None:
        """``item`` will not run: its sequence goes on, unless ``item`` is its START, which
        then never ran. Handed out, it was let go (answered already: its caller cancelled
        it); never handed out, it ran outside the batches (a suspect, expired, answered or
        dead-lettered before it ran), and its START unstarts the sequence held here all the
        same, which would otherwise go on with the state of the sequence before it."""
        entry = self._running.pop(id(item), None)
        if entry is not None:
            seq, flags = entry
            seq.running = False
        else:
            try:
                flags = self._flags_of(item)
            except PlazaError:  # names no sequence: none to unstart
                return
            held = self._sequences.get(flags.sequence)
            if held is None or held.running:
                return
            seq = held
        if flags.start:
            self._unstart(seq)

    @staticmethod
    def _unstart(seq: _Sequence[T]) -> None:
        """``seq``'s START will not run: the sequence has not started, as after an END, so
        neither the state of the sequence before it nor zeros serve the requests that
        follow (they are refused until a START). It stays held, and counted, until its
        idle time runs out, so that a request that follows is refused here rather than
        taken up from a state Redis still keeps for the sequence before."""
        seq.state, seq.ended = None, True


PARAM_ID, PARAM_START, PARAM_END = "sequence_id", "sequence_start", "sequence_end"


def sequence_flags(params: Mapping[str, Any], model: str, version: int = 0) -> SequenceFlags:
    """A request's ``sequence_id``, ``sequence_start`` and ``sequence_end`` parameters
    (Triton's, as tritonclient sends them), for a request to ``version`` of ``model``;
    InvalidInput unless the id is a positive integer or a non-empty string (Triton's int64,
    uint64 or string: one of another type is refused as such, not taken for none) and the
    flags are booleans."""
    key = params.get(PARAM_ID)
    if type(key) is int:
        if key <= 0 or key >= 1 << 64:
            raise InvalidInput(f"sequence_id {key} must be between 1 and 2^64 - 1")
    elif key is not None and not isinstance(key, str):
        raise InvalidInput(f"sequence_id must be an integer or a string, got {kind_of(key)}")
    elif not key:
        raise InvalidInput(
            f"model {model!r} batches sequences: a request needs a sequence_id (a positive "
            "integer or a non-empty string)"
        )
    flags = []
    for name in (PARAM_START, PARAM_END):
        value = params.get(name, False)
        if not isinstance(value, bool):
            raise InvalidInput(f"parameter {name!r} must be true or false, got {kind_of(value)}")
        flags.append(value)
    return SequenceFlags(key, flags[0], flags[1], version)


def kind_of(value: object) -> str:
    """A parameter value's type in the protocol's words (an InferParameter's kinds: a JSON
    number with a fraction is a double, as over gRPC)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _not_started(key: SequenceKey) -> InvalidInput:
    version, sequence_id = key
    return InvalidInput(
        f"sequence {sequence_id!r} of version {version} has not started: its first request "
        "must set sequence_start (or it ended, or its START timed out or was cancelled "
        "before it ran, or it was idle past max_sequence_idle_microseconds and was released)"
    )
