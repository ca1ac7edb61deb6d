"""The device scheduler: which model's batch runs next on a host's device.

A host serves several models on one device. Each model's worker forms its own batches (its
batcher, its queue depth); before a batch runs, the worker asks the host's scheduler for a
*grant*: one of the model's instances and an execution slot on the device. The scheduler
decides in what order the waiting models get them, so a flooded model cannot starve a quiet
one:

- **Execution slots.** The device runs at most ``slots`` executions at once (host setting
  ``execution_slots``; 0: the largest instance count of the models served, so a host of one
  model runs exactly its ``instance_group`` count at once, as a worker always did). A model
  added with ``device_slot=False`` (a Python backend model: its own processes, which may
  wait on a BLS call to another model of the host) takes no slot: its instances, resources
  and fair share bound it, as Triton bounds every model, which has no device-wide slots.
- **Instances.** A model has ``instance_group`` count instances; an execution takes a free
  one, so count still means parallel executions of that model. ``max_concurrency`` (a model
  parameter) caps them lower.
- **Rate limiter.** An instance group's ``rate_limiter.resources`` are taken from the
  host's budget while one of its executions runs; an execution starts only when all of its
  resources are free. A resource's budget is the host setting ``resources`` (``R:4,...``),
  else the largest count any served model asks for (Triton's default). Head of line, as
  Triton's rate limiter serves the head of its queue: the fairest model that waits for
  resources (or a slot) holds the resources it asks for, and no model behind it takes one
  of them until it has started; models using none of them run on meanwhile.
- **Fair share.** Among the models that could start now, the one with the least *virtual
  time* goes first; ties go to the one granted longest ago (round robin). A grant charges
  the model its expected device time (the running mean of its executions) times its
  ``rate_limiter.priority`` (Triton's meaning: priority 2 gets half the turns of 1), and
  the release corrects the charge to the time it really took. A model that was idle joins
  at the least virtual time of the busy ones as it was when their running executions
  started: idling earns no credit to burst with later, and the joiner goes next.

So a quiet model's batch waits at most for the executions already running, never behind a
flooded model's queue, while the flooded model still batches on its own queue depth (the
batch is formed before the grant is asked for, and waiting only makes the next one fuller).

The core (``submit``, ``dispatch``, ``release``) is pure and synchronous, driven by tests
with fake costs; ``acquire`` is its asyncio face for the worker.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from plaza.errors import ConfigError
from plaza.modelconfig import InstanceGroup

_EWMA = 1 / 8
"""Weight of the newest execution in a model's running mean device time."""
HISTORY = 4096
"""Grants remembered, newest last (``history``: what tests and debugging read)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """Leave to run one execution of ``model`` on its instance ``instance`` now."""

    model: str
    instance: int
    seq: int
    """The grant's number on this host (grants are numbered in the order given)."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What one execution on one instance of a model needs and weighs."""

    resources: Mapping[str, int] = field(default_factory=dict)
    priority: int = 1


@dataclass(slots=True)
class Ticket:
    """A model's request for a grant, waiting in the model's queue until granted."""

    model: str
    grant: Grant | None = None
    future: asyncio.Future[Grant] | None = None


@dataclass(slots=True)
class _Model:
    name: str
    instances: list[InstanceSpec]
    cap: int
    waiting: deque[Ticket] = field(default_factory=deque)
    busy: dict[int, float] = field(default_factory=dict)
    """Running executions: instance -> the charge made at grant."""
    vtime: float = 0.0
    mean_cost: float | None = None
    last_grant: int = -1
    device_slot: bool = True
    """Whether its executions take one of the device's slots (``add_model``)."""

    @property
    def active(self) -> bool:
        return bool(self.waiting or self.busy)

    def start_tag(self) -> float:
        """Virtual time before the charges of its running executions: where it stood when
        they started. A model joining starts here, so it goes before this one's next turn
        whatever the running execution turns out to cost."""
        return self.vtime - sum(c * self.instances[i].priority for i, c in self.busy.items())


def instance_specs(groups: Sequence[InstanceGroup]) -> list[InstanceSpec]:
    """One InstanceSpec per instance of a model's instance groups."""
    return [
        InstanceSpec({r.name: r.count for r in g.resources}, g.priority)
        for g in groups
        for _ in range(g.count)
    ]


def parse_budget(text: str) -> dict[str, int]:
    """``"R1:4,R2:1"`` -> {"R1": 4, "R2": 1}; ConfigError naming the bad entry."""
    budget: dict[str, int] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, count = entry.rpartition(":")
        try:
            value = int(count)
        except ValueError:
            value = -1
        if not sep or not name or value < 0:
            raise ConfigError(
                f"host.resources: {entry!r} is not NAME:COUNT (COUNT >= 0)", field="host.resources"
            )
        budget[name] = value
    return budget


class DeviceScheduler:
    """Grants executions on one device to the models of a host; see the module docstring."""

    def __init__(self, slots: int = 0, budget: Mapping[str, int] | None = None) -> None:
        self._slots = slots
        self._explicit = dict(budget or {})
        self._models: dict[str, _Model] = {}
        self._in_use: dict[str, int] = {}
        self._running = 0
        """Executions holding a device slot now."""
        self._seq = itertools.count()
        self.history: deque[Grant] = deque(maxlen=HISTORY)
        """The latest grants in the order given (bounded)."""
        self.peak: dict[str, int] = {}
        """The most executions of each model served that ran at once (dropped with the model)."""

    # -- the models --------------------------------------------------------------------------
    def add_model(
        self,
        name: str,
        instances: Sequence[InstanceSpec],
        max_concurrency: int = 0,
        *,
        device_slot: bool = True,
    ) -> None:
        """Serve ``name`` with these instances; ConfigError if one could never start.
        ``device_slot``: whether its executions take one of the device's slots."""
        if name in self._models:
            raise ConfigError(f"model {name!r} is already on this host")
        if not instances:
            raise ConfigError(f"model {name!r} has no instance")
        for spec in instances:
            for res, count in spec.resources.items():
                have = self._explicit.get(res)
                if have is not None and count > have:
                    raise ConfigError(
                        f"model {name!r} needs {count} of resource {res!r} per execution, "
                        f"the host's budget (host.resources) has {have}",
                        field="host.resources",
                    )
        cap = min(len(instances), max_concurrency) if max_concurrency > 0 else len(instances)
        self._models[name] = _Model(name, list(instances), cap, device_slot=device_slot)

    def remove_model(self, name: str) -> None:
        """Stop serving ``name`` (its waiting tickets are dropped, unanswered); its ``peak``
        goes with it, so a host that reloads a model often keeps one entry per model served."""
        self._models.pop(name, None)
        self.peak.pop(name, None)
        self.dispatch()  # the resources it waited for (``_next``) are no longer held for it

    @property
    def slots(self) -> int:
        """Executions the device runs at once (of the models that take a slot)."""
        if self._slots > 0:
            return self._slots
        counts = [len(m.instances) for m in self._models.values() if m.device_slot]
        return max(counts, default=1)

    def budget(self) -> dict[str, int]:
        """Each resource's budget: the setting, else the largest count any instance asks."""
        budget: dict[str, int] = {}
        for model in self._models.values():
            for spec in model.instances:
                for res, count in spec.resources.items():
                    budget[res] = max(budget.get(res, 0), count)
        return {**budget, **self._explicit}

    def running(self, model: str | None = None) -> int:
        """Executions granted and not yet released (of ``model``, or of all)."""
        if model is None:
            return sum(len(m.busy) for m in self._models.values())
        return len(self._models[model].busy)

    def waiting(self, model: str) -> int:
        return len(self._models[model].waiting)

    # -- the pure core -----------------------------------------------------------------------
    def submit(self, model: str) -> Ticket:
        """Queue a request for one execution of ``model``; ``dispatch`` grants it."""
        m = self._model(model)
        if not m.active:  # joining: no credit for the time it was idle
            busy = [o.start_tag() for o in self._models.values() if o.active]
            if busy:
                m.vtime = max(m.vtime, min(busy))
        ticket = Ticket(model)
        m.waiting.append(ticket)
        return ticket

    def withdraw(self, ticket: Ticket) -> None:
        """Take a ticket back: out of its queue if waiting, released (cost 0) if granted."""
        m = self._models.get(ticket.model)
        if ticket.grant is not None:
            self.release(ticket.grant, 0.0)
        elif m is not None and ticket in m.waiting:
            m.waiting.remove(ticket)

    def dispatch(self) -> list[Grant]:
        """Grant what can start now, fairest first; each granted ticket gets its grant."""
        granted: list[Grant] = []
        budget = self.budget()
        while True:
            pick = self._next(budget, slot_free=self._running < self.slots)
            if pick is None:
                break
            m, instance = pick
            granted.append(self._grant(m, instance))
        return granted

    def release(self, grant: Grant, cost: float) -> None:
        """An execution ended after ``cost`` (device seconds, or any unit used throughout)."""
        m = self._models.get(grant.model)
        if m is None or grant.instance not in m.busy:
            return
        charged = m.busy.pop(grant.instance)
        spec = m.instances[grant.instance]
        m.vtime += (cost - charged) * spec.priority
        m.mean_cost = cost if m.mean_cost is None else m.mean_cost + (cost - m.mean_cost) * _EWMA
        for res, count in spec.resources.items():
            self._in_use[res] -= count
        if m.device_slot:
            self._running -= 1

    def _model(self, name: str) -> _Model:
        try:
            return self._models[name]
        except KeyError:
            raise ConfigError(f"model {name!r} is not on this host") from None

    def _next(self, budget: Mapping[str, int], *, slot_free: bool) -> tuple[_Model, int] | None:
        """The fairest model that can start now, and the free instance it starts on.

        Head of line for resources, as Triton's rate limiter serves the head of its queue: a
        model that cannot start for want of resources or of a device slot holds the resources
        its free instances ask for (``held``), and no model behind it may take one of them.
        Else a flooded model whose executions overlap would keep a resource always partly in
        use, and a fairer model asking for more of it would never start. A model blocked by
        its own cap or busy instances holds nothing, nor does one waiting behind another's
        hold, so models using none of the held resources still run.
        """
        held: set[str] = set()
        for m in sorted(self._ready(), key=lambda m: (m.vtime, m.last_grant)):
            clear = [
                i
                for i, spec in enumerate(m.instances)
                if i not in m.busy and held.isdisjoint(spec.resources)
            ]
            fits = [i for i in clear if self._fits(m.instances[i], budget)]
            if fits and (slot_free or not m.device_slot):
                return m, fits[0]
            for i in clear:
                held.update(m.instances[i].resources)
        return None

    def _ready(self) -> list[_Model]:
        """The models with a ticket waiting and an execution left under their cap."""
        return [m for m in self._models.values() if m.waiting and len(m.busy) < m.cap]

    def _fits(self, spec: InstanceSpec, budget: Mapping[str, int]) -> bool:
        """Whether all of an execution's resources are free now."""
        return all(
            self._in_use.get(res, 0) + count <= budget.get(res, 0)
            for res, count in spec.resources.items()
        )

    def _grant(self, m: _Model, instance: int) -> Grant:
        spec = m.instances[instance]
        charge = m.mean_cost if m.mean_cost is not None else self._mean_cost()
        m.vtime += charge * spec.priority
        m.busy[instance] = charge
        for res, count in spec.resources.items():
            self._in_use[res] = self._in_use.get(res, 0) + count
        if m.device_slot:
            self._running += 1
        grant = Grant(m.name, instance, next(self._seq))
        m.last_grant = grant.seq
        self.history.append(grant)
        self.peak[m.name] = max(self.peak.get(m.name, 0), len(m.busy))
        ticket = m.waiting.popleft()
        ticket.grant = grant
        if ticket.future is not None and not ticket.future.done():
            ticket.future.set_result(grant)
        return grant

    def _mean_cost(self) -> float:
        """What a model's first execution is expected to cost: the others' mean, or 0."""
        known = [m.mean_cost for m in self._models.values() if m.mean_cost is not None]
        return sum(known) / len(known) if known else 0.0

    # -- the asyncio face --------------------------------------------------------------------
    async def acquire(self, model: str) -> Grant:
        """Wait for a grant for one execution of ``model``; ``release`` it when done.

        Cancelled while waiting, the request is withdrawn (a grant made meanwhile is given
        back), so a stopping worker leaves nothing behind.
        """
        ticket = self.submit(model)
        ticket.future = asyncio.get_running_loop().create_future()
        self.dispatch()
        try:
            return await ticket.future
        except asyncio.CancelledError:
            self.withdraw(ticket)
            self.dispatch()
            raise

    def finish(self, grant: Grant, cost: float) -> None:
        """``release`` and grant what can start in its place (the worker's call)."""
        self.release(grant, cost)
        self.dispatch()
