"""A reload's hand-over with the follower's fakes: the new generation's unit starts beside
the old one, which stops only once the new one serves; a new generation that fails leaves
the old one serving; without room for both, the old unit stops first."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.errors import KafkaConnectionError

from plaza.errors import ConfigError
from plaza.model_control import DesiredModel
from plaza.workers.memory_budget import MemoryBudget
from plaza.workers.metrics import HostMetrics
from plaza.workers.model_watch import ModelFollower
from tests.unit.test_model_follower import FakeHost, FakeTable, FakeUnit, ZeroMeter, make


class LoggedUnit(FakeUnit):
    """A unit that writes when it starts and stops into ``events``; its start raises
    ``failure`` when one is given."""

    def __init__(self, name: str, n: int, events: list[str], failure: Exception | None) -> None:
        super().__init__(name)
        self.n = n
        self._events = events
        self._failure = failure

    async def start(self) -> None:
        if self._failure is not None:
            raise self._failure
        self._events.append(f"start {self.n}")

    async def run_until_stopped(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._events.append(f"stop {self.n}")
        self.stopped = True


@dataclass
class Units:
    """Makes the host's units: LoggedUnits numbered from 1; ``failures`` are raised by the
    starts of the next units, in order."""

    host: FakeHost
    events: list[str] = field(default_factory=list)
    failures: list[Exception] = field(default_factory=list)

    def __call__(self, model: str, config: str = "") -> FakeUnit:
        failure = self.failures.pop(0) if self.failures else None
        unit = LoggedUnit(model, len(self.host.units) + 1, self.events, failure)
        self.host.units.append(unit)
        return unit


@dataclass
class ReportingTable(FakeTable):
    failed: list[tuple[int, str]] = field(default_factory=list)

    async def fail(self, desired: DesiredModel, reason: str) -> bool:
        self.failed.append((desired.generation, reason))
        return True


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Setup:
    follower: ModelFollower
    units: Units
    table: ReportingTable
    clock: Clock


def following(tmp_path: Path, sizes: dict[str, int], budget: int) -> Setup:
    """The fakes of ``make`` with units that log, a table that records the failures
    reported and a clock moved by hand."""
    _, host, table, probe = make(tmp_path, sizes, budget)
    units, reporting, clock = Units(host), ReportingTable(dict(table.models)), Clock()
    host.make_unit = units  # type: ignore[method-assign]
    follower = ModelFollower(
        host,  # type: ignore[arg-type]
        reporting,  # type: ignore[arg-type]
        probe,  # type: ignore[arg-type]
        MemoryBudget(budget),
        ZeroMeter(),
        HostMetrics(budget),
        clock,
    )
    return Setup(follower, units, reporting, clock)


def unit_of(follower: ModelFollower, name: str) -> LoggedUnit:
    unit = follower.state.running[name].unit
    assert isinstance(unit, LoggedUnit)
    return unit


async def test_the_new_generation_starts_before_the_old_unit_stops(tmp_path: Path) -> None:
    t = following(tmp_path, {"a": 100, "b": 100}, 300)
    await t.follower.step()
    t.units.events.clear()
    old = unit_of(t.follower, "a")
    t.table.load("a", generation=2)
    await t.follower.step()
    new = unit_of(t.follower, "a")
    assert t.follower.state.running["a"].desired.generation == 2 and new is not old
    assert t.units.events == [f"start {new.n}", f"stop {old.n}"]
    assert t.follower.budget.held == {"a": 100, "b": 100}  # the old unit's bytes went with it
    assert t.follower.budget.peak == 300  # both generations were accounted meanwhile
    assert t.follower.metrics.loads["a"] == 2 and t.follower.metrics.unloads["a"] == 1
    await t.follower.close()


async def test_a_new_generation_that_fails_leaves_the_old_unit_serving(tmp_path: Path) -> None:
    t = following(tmp_path, {"a": 100}, 0)
    await t.follower.step()
    old = unit_of(t.follower, "a")
    t.units.failures.append(ConfigError("model.py: initialize failed"))
    t.table.load("a", generation=2)
    await t.follower.step()
    assert unit_of(t.follower, "a") is old and not old.stopped
    assert t.follower.state.given_up == {"a": 2}
    assert t.table.failed == [(2, "model.py: initialize failed")]  # the load answers 400
    assert t.follower.budget.held == {"a": 100}
    await t.follower.step()  # given up: not tried again
    assert unit_of(t.follower, "a") is old and len(t.units.host.units) == 2
    t.table.load("a", generation=3)  # a new load hands over
    await t.follower.step()
    assert t.follower.state.running["a"].desired.generation == 3 and old.stopped
    await t.follower.close()


async def test_a_new_generation_that_could_not_start_is_tried_again_beside_the_old(
    tmp_path: Path,
) -> None:
    t = following(tmp_path, {"a": 100}, 0)
    await t.follower.step()
    old = unit_of(t.follower, "a")
    t.units.failures.append(KafkaConnectionError())
    t.table.load("a", generation=2)
    await t.follower.step()
    assert unit_of(t.follower, "a") is old and t.follower.state.retrying["a"].generation == 2
    await t.follower.step()  # backing off: the old unit serves on
    assert unit_of(t.follower, "a") is old and len(t.units.host.units) == 2
    t.clock.now = t.follower.state.retrying["a"].due
    await t.follower.step()
    assert t.follower.state.running["a"].desired.generation == 2 and old.stopped
    await t.follower.close()


async def test_without_room_for_both_the_old_unit_stops_first(tmp_path: Path) -> None:
    t = following(tmp_path, {"a": 100, "b": 100}, 250)
    await t.follower.step()
    t.units.events.clear()
    old = unit_of(t.follower, "a")
    t.table.load("a", generation=2)
    await t.follower.step()
    new = unit_of(t.follower, "a")
    assert t.follower.state.running["a"].desired.generation == 2
    assert t.units.events == [f"stop {old.n}", f"start {new.n}"]
    assert t.follower.budget.peak <= 250 and t.follower.budget.held == {"a": 100, "b": 100}
    await t.follower.close()


def test_a_budget_swaps_two_accounts() -> None:
    budget = MemoryBudget(300)
    budget.add("a", 100)
    budget.add("a~reload", 120)
    assert budget.fits_now(80) and not budget.fits_now(81)
    budget.swap("a", "a~reload")
    assert budget.held == {"a": 120, "a~reload": 100}
    assert budget.remove("a~reload") == 100 and budget.held == {"a": 120}
    assert MemoryBudget(0).fits_now(1 << 40)  # no limit
