"""The dynamic batching policy: Triton's dynamic batcher, sized by queue depth.

Pure logic with an injected clock: the worker drives it with ``time.monotonic`` and
loadgen's headless simulator with a simulated clock, so both run the same code.

The rule, each time ``decide(backlog)`` is asked:

1. Requests whose queue timeout passed are taken out: REJECT ones are returned as
   ``expired`` (the caller answers them with a timeout error), DELAY ones move to their
   level's delayed queue and lose their timeout. As in Triton, a delayed request waits only
   behind the requests of its own level (and higher ones) that have not timed out: each
   level is served fresh requests first, then its delayed ones, then the next level down.
   A request's queue timeout is Triton's (``queue_deadline``): the level's
   ``default_timeout_microseconds``, which the request's own deadline shortens only where
   the level allows ``allow_timeout_override``; a request whose deadline passed before it
   was added (it waited that long in Kafka) times out at once, whatever the policy.
2. ``depth`` = pending requests (held here) + ``backlog`` (consumer lag: records already
   in Kafka but not fetched yet). The *goal* is the largest batch size the depth can fill:
   of the preferred sizes where the config names some, else max_batch_size. As in Triton,
   a model with preferred sizes 16 and 32 runs 32 at once from a queue of 64, not 64: the
   rest forms the next batch while this one computes.
3. If the pending requests already fill the goal, or a level holds its max_queue_size (no
   more can join it), that batch runs now. Otherwise the batcher
   waits for more, but never longer than ``max_queue_delay_microseconds`` after the oldest
   pending request arrived (the earliest arrival of all: a queue is in fetch order, so its
   head need not be the oldest); then it runs as much as is there (up to max_batch_size). (Where
   Triton, past the delay, runs all that is pending, this batcher still runs a preferred
   size it can fill first and the rest right after: requests fetched from Kafka are often
   past their delay already, counted from the send, and would otherwise always run as one
   max_batch_size batch.) A
   request arrives when ``add`` says (``arrival``; the worker passes the moment it was sent
   to Kafka, so the delay is a bound on the whole wait, not added to the Kafka hop), else
   when it is added.

A deep queue therefore gives large batches at once (throughput) and a shallow one gives small
batches after a short wait (latency). Batches are filled from the highest priority level
(1) down, first come first served within a level (its delayed requests after its others).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from plaza.errors import PlazaError, QueueFull
from plaza.modelconfig import ModelSpec, QueuePolicy
from plaza.priority import settle_level

T = TypeVar("T")
Clock = Callable[[], float]
"""Monotonic seconds."""


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """The knobs of the batcher, normally taken from a model's config.pbtxt."""

    max_batch_size: int = 1
    enabled: bool = True
    """False: no dynamic_batching block; every request runs on its own, at once."""
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_queue_policy: dict[int, QueuePolicy] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> BatchingPolicy:
        db = spec.batching
        return cls(
            max_batch_size=max(1, spec.max_batch_size),
            enabled=db.enabled and spec.max_batch_size > 0,
            preferred_batch_sizes=db.preferred_batch_sizes,
            max_queue_delay_us=db.max_queue_delay_us,
            priority_levels=db.priority_levels,
            default_priority_level=db.default_priority_level,
            default_queue_policy=db.default_queue_policy,
            priority_queue_policy=dict(db.priority_queue_policy),
        )

    @property
    def levels(self) -> range:
        """Priority levels, highest first (a single level 0 when none are configured)."""
        return range(1, self.priority_levels + 1) if self.priority_levels else range(0, 1)

    def level_of(self, priority: int) -> int:
        """The level a request's priority runs at (``plaza.priority``, Triton's rule)."""
        return settle_level(priority, self.priority_levels, self.default_priority_level)

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    def batch_sizes(self) -> tuple[int, ...]:
        """The sizes a batch aims at: the preferred sizes where the config names some (as in
        Triton, max_batch_size is then only the cap of a batch the delay forces out), else
        max_batch_size."""
        if self.preferred_batch_sizes:
            return tuple(sorted(set(self.preferred_batch_sizes)))
        return (self.max_batch_size,)


def queue_deadline(qp: QueuePolicy, deadline: float | None, now: float) -> float | None:
    """When a request added ``now`` times out in its level's queue (None: never).

    Triton's rule (``PriorityQueue::PolicyQueue::Enqueue``): the level's
    ``default_timeout_microseconds`` (0: no timeout), lowered to the request's own timeout
    only where the level has ``allow_timeout_override`` and a default timeout to lower;
    a request never raises it. Plaza's deadline is absolute (it counts the wait in Kafka
    too), so one that has already passed when the worker takes the request in times it
    out at once, whatever the policy: that is Plaza's, Triton has no hop before its queue.
    """
    if deadline is not None and deadline <= now:
        return deadline
    if not qp.default_timeout_us:
        return None
    configured = now + qp.default_timeout_us / 1e6
    if deadline is not None and qp.allow_timeout_override:
        return min(deadline, configured)
    return configured


@dataclass(slots=True)
class _Pending(Generic[T]):
    item: T
    size: int
    level: int
    arrival: float
    deadline: float | None
    reject_on_timeout: bool
    seq: int
    alive: bool = True


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    """What to do now: run ``batch``, answer ``expired``, and look again at ``wake_at``."""

    batch: list[T]
    expired: list[T]
    wake_at: float | None
    """When to decide again if nothing arrives (None: only when something arrives)."""
    refused: list[tuple[T, PlazaError]] = field(default_factory=list)
    """Requests to answer with an error instead (the sequence batcher's; never here)."""


class Batcher(Protocol[T]):
    """What the worker asks of a batcher: this module's, or the sequence batcher
    (``plaza.sequence_batching``) for a stateful model."""

    def add(
        self,
        item: T,
        *,
        size: int = 1,
        priority: int = 0,
        deadline: float | None = None,
        arrival: float | None = None,
    ) -> None: ...

    def decide(self, backlog: int = 0) -> Decision[T]: ...

    def remove_if(self, predicate: Callable[[T], bool]) -> list[T]: ...

    def __len__(self) -> int: ...


class DynamicBatcher(Generic[T]):
    """Holds pending requests and forms batches from them; see the module docstring."""

    def __init__(
        self, policy: BatchingPolicy, clock: Clock = time.monotonic, *, bounded: bool = True
    ) -> None:
        """``bounded``: refuse a request past its level's max_queue_size (QueueFull). The
        worker's is not: its requests are in Kafka already, so it fetches no more of a full
        level (``level_room``) and never refuses one for a full queue."""
        self.policy = policy
        self._bounded = bounded
        self._clock = clock
        self._queues: dict[int, deque[_Pending[T]]] = {lv: deque() for lv in policy.levels}
        self._delayed: dict[int, deque[_Pending[T]]] = {lv: deque() for lv in policy.levels}
        # Every queue in the order it is served: each level's fresh requests, then its
        # delayed ones, then the next level down (Triton's order).
        self._order: tuple[deque[_Pending[T]], ...] = tuple(
            q for lv in policy.levels for q in (self._queues[lv], self._delayed[lv])
        )
        self._deadlines: list[tuple[float, int, _Pending[T]]] = []
        # Every pending request's arrival, smallest first: a level's queue is in the order
        # requests were fetched, not sent, so its head need not be the one waiting longest.
        self._arrivals: list[tuple[float, int, _Pending[T]]] = []
        self._seq = itertools.count()
        self._count = 0
        self._size = 0
        # Pending requests per level, DELAY-moved ones included. A deque's length would
        # count the husks too, so this is what max_queue_size is checked against.
        self._level_counts: dict[int, int] = dict.fromkeys(policy.levels, 0)
        self._queue_bounds = [
            (level, size)
            for level in policy.levels
            if (size := policy.queue_policy(level).max_queue_size) > 0
        ]
        """(level, max_queue_size) of the levels with a bound."""

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
        """Queue a request of ``size`` rows. ``deadline`` is a monotonic time (or None).

        The request times out in the queue as ``queue_deadline`` says (Triton's rule: the
        level's timeout, which the deadline lowers only with ``allow_timeout_override``;
        a deadline already passed times it out at once). QueueFull when the level already
        holds max_queue_size pending requests (as in Triton: those waiting, DELAY-moved ones
        included; expired, served and removed ones no longer count).
        ``arrival`` (a monotonic time, at most now; default now) is when the request's wait
        began, which the queue delay counts from: the worker passes the moment it was sent.
        """
        level = self.policy.level_of(priority)
        qp = self.policy.queue_policy(level)
        if self._bounded and 0 < qp.max_queue_size <= self._level_counts[level]:
            raise QueueFull(f"priority level {level} queue is full ({qp.max_queue_size})")
        now = self._clock()
        if deadline is not None or qp.default_timeout_us:
            deadline = queue_deadline(qp, deadline, now)
        since = now if arrival is None else min(arrival, now)
        entry = _Pending(item, size, level, since, deadline, qp.reject_on_timeout, next(self._seq))
        self._hold(entry, self._queues[level])

    def __len__(self) -> int:
        """Pending requests."""
        return self._count

    @property
    def pending_size(self) -> int:
        """Pending rows (sum of the requests' batch sizes)."""
        return self._size

    def level_room(self, level: int) -> int | None:
        """Requests ``level`` (a settled level) takes before it holds max_queue_size (0 when
        full, or past it); None when its queue has no bound."""
        limit = self.policy.queue_policy(level).max_queue_size
        return max(0, limit - self._level_counts[level]) if limit else None

    def level_depths(self) -> dict[int, int]:
        """Pending requests per priority level (the count max_queue_size is checked
        against): DELAY-moved ones count at the level they came in at."""
        return dict(self._level_counts)

    def remove_if(self, predicate: Callable[[T], bool]) -> list[T]:
        """Drop pending requests matching ``predicate`` (e.g. of a revoked partition)."""
        removed: list[T] = []
        for entry in self._entries():
            if predicate(entry.item):
                removed.append(self._kill(entry))
        self._compact()
        return removed

    # -- scheduling ------------------------------------------------------------------------
    def decide(self, backlog: int = 0) -> Decision[T]:
        """Form the next batch, if one is due; ``backlog`` is records not yet fetched."""
        now = self._clock()
        expired = self._expire(now)
        if not self._count:
            return Decision([], expired, None)
        if not self.policy.enabled:
            return Decision(self._take(1, max_requests=1), expired, None)
        goal = self._goal(self._size + max(0, backlog))
        if goal is not None and self._size >= goal:
            return Decision(self._take(goal), expired, None)
        if self._a_level_is_full():  # none can come into it: waiting would fill nothing
            return Decision(self._take(self.policy.max_batch_size), expired, None)
        oldest = self._oldest_arrival()
        due = oldest + self.policy.max_queue_delay_us / 1e6
        if now >= due:
            return Decision(self._take(self.policy.max_batch_size), expired, None)
        return Decision([], expired, self._next_wake(due))

    def _a_level_is_full(self) -> bool:
        """Whether a level holds its max_queue_size: nothing more joins it (refused here, or
        not fetched by the worker), so its requests are not kept waiting for more."""
        counts = self._level_counts
        return any(counts[level] >= size for level, size in self._queue_bounds)

    def _goal(self, depth: int) -> int | None:
        fits = [s for s in self.policy.batch_sizes() if s <= depth]
        return fits[-1] if fits else None

    def _expire(self, now: float) -> list[T]:
        expired: list[T] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, entry = heapq.heappop(self._deadlines)
            if not entry.alive or entry.deadline is None:
                continue
            item = self._kill(entry)
            if entry.reject_on_timeout:
                expired.append(item)
            else:  # DELAY: keep it, behind its level's fresh requests, with no timeout now
                moved = _Pending(
                    item,
                    entry.size,
                    entry.level,
                    entry.arrival,
                    None,
                    entry.reject_on_timeout,
                    next(self._seq),
                )
                self._hold(moved, self._delayed[entry.level])
        self._compact()
        return expired

    def _next_wake(self, due: float) -> float:
        while self._deadlines and not self._deadlines[0][2].alive:
            heapq.heappop(self._deadlines)
        return min(due, self._deadlines[0][0]) if self._deadlines else due

    def _oldest_arrival(self) -> float:
        """The earliest arrival among the pending requests (there is one at least)."""
        heap = self._arrivals
        while not heap[0][2].alive:
            heapq.heappop(heap)
        return heap[0][0]

    def _entries(self) -> Iterator[_Pending[T]]:
        for q in self._order:
            yield from (e for e in q if e.alive)

    def _take(self, limit: int, max_requests: int | None = None) -> list[T]:
        batch: list[T] = []
        rows = 0
        for entry in self._entries():
            if batch and (rows + entry.size > limit or len(batch) == max_requests):
                break
            rows += entry.size
            batch.append(self._kill(entry))
        self._compact()
        return batch

    def _hold(self, entry: _Pending[T], queue: deque[_Pending[T]]) -> None:
        """Put ``entry`` into the pending set, at the back of ``queue``."""
        queue.append(entry)
        heapq.heappush(self._arrivals, (entry.arrival, entry.seq, entry))
        if entry.deadline is not None:
            heapq.heappush(self._deadlines, (entry.deadline, entry.seq, entry))
        self._count += 1
        self._size += entry.size
        self._level_counts[entry.level] += 1

    def _kill(self, entry: _Pending[T]) -> T:
        """Take ``entry`` out of the pending set and hand back its item.

        The entry's husk may stay a while in a queue or on the deadline heap (they are
        pruned lazily), so it lets go of the item now: a served request's payload must not
        live on until its deadline, which a client may set hours away.
        """
        item = entry.item
        del entry.item
        entry.alive = False
        self._count -= 1
        self._size -= entry.size
        self._level_counts[entry.level] -= 1
        return item

    def _compact(self) -> None:
        # Husks at a queue's head go at once. Those behind a live entry (expired, revoked
        # or moved) wait until they are over half of what the queues hold (the live count
        # is known, so telling costs nothing): a rebuild then, O(1) per entry amortised.
        held = 0
        for q in self._order:
            while q and not q[0].alive:
                q.popleft()
            held += len(q)
        if held > 64 and held - self._count > held // 2:
            for q in self._order:
                alive = [e for e in q if e.alive]
                q.clear()
                q.extend(alive)
        self._deadlines = self._pruned(self._deadlines)
        self._arrivals = self._pruned(self._arrivals)

    def _pruned(
        self, heap: list[tuple[float, int, _Pending[T]]]
    ) -> list[tuple[float, int, _Pending[T]]]:
        # Taken entries keep their heap slot until they come up at its top. Rebuild once the
        # heap is more than twice the pending count: at least half of it is husks then, so
        # the rebuild costs O(1) per request amortised and the heap stays within 2x + 64.
        if len(heap) <= 2 * self._count + 64:
            return heap
        live = [e for e in heap if e[2].alive]
        heapq.heapify(live)
        return live
