"""The host's model-table follower with fakes: which unit it starts, evicts or keeps waiting.

The table, the backlog probe, Redis and the units are stand-ins (no Kafka, no timing): each
test sets the queued requests per model and runs rounds (``step``) by hand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plaza.model_control import DesiredModel
from plaza.settings import HostSettings, PlazaSettings
from plaza.workers.memory_budget import MemoryBudget, MemoryMeter
from plaza.workers.metrics import HostMetrics
from plaza.workers.model_watch import ModelFollower

CONFIG = """
name: "{name}"
backend: "plaza_simulated"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
parameters [
  {{ key: "memory_bytes" value: {{ string_value: "{nbytes}" }} }},
  {{ key: "lazy" value: {{ string_value: "{lazy}" }} }}
]
"""


class FakeUnit:
    def __init__(self, name: str) -> None:
        self.name = name
        self.stopped = False

    async def start(self) -> None:
        pass

    async def run_until_stopped(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stopped = True

    async def stop(self) -> None:
        self.stopped = True


class FakePipe:
    def __init__(self, redis: FakeRedis) -> None:
        self._redis = redis

    def zadd(self, key: str, members: dict[str, float]) -> None:
        self._redis.entries.setdefault(key, set()).update(members)

    def expire(self, key: str, ttl: int) -> None:
        pass

    def set(self, key: str, value: str, ex: int) -> None:
        pass

    async def execute(self) -> None:
        pass


@dataclass
class FakeRedis:
    entries: dict[str, set[str]] = field(default_factory=dict)

    def pipeline(self, transaction: bool = False) -> FakePipe:
        return FakePipe(self)

    async def zrem(self, key: str, member: str) -> None:
        self.entries.get(key, set()).discard(member)


@dataclass
class FakeServices:
    redis: FakeRedis = field(default_factory=FakeRedis)


class FakeHost:
    def __init__(self, settings: PlazaSettings) -> None:
        self.settings = settings
        self.id = "h"
        self.services = FakeServices()
        self.units: list[FakeUnit] = []

    def make_unit(self, model: str, config: str = "") -> FakeUnit:
        self.units.append(FakeUnit(model))
        return self.units[-1]


@dataclass
class FakeTable:
    models: dict[str, DesiredModel] = field(default_factory=dict)

    async def read(self) -> dict[str, DesiredModel]:
        return dict(self.models)

    def load(self, name: str, generation: int = 1) -> None:
        self.models[name] = DesiredModel(name, True, generation)


@dataclass
class FakeProbe:
    queued: dict[str, int] = field(default_factory=dict)

    async def lag(self, model: str, topic: str) -> int:
        return self.queued.get(model, 0)


class ZeroMeter:
    kind = "fake"

    def used(self) -> int:
        return 0


def make(
    tmp_path: Path,
    sizes: dict[str, int],
    budget: int,
    *,
    lazy: bool = False,
    meter: MemoryMeter | None = None,
    clock: Callable[[], float] = time.monotonic,
    **host: Any,
) -> tuple[ModelFollower, FakeHost, FakeTable, FakeProbe]:
    for name, nbytes in sizes.items():
        (tmp_path / name / "1").mkdir(parents=True)
        text = CONFIG.format(name=name, nbytes=nbytes, lazy=str(lazy).lower())
        (tmp_path / name / "config.pbtxt").write_text(text)
    settings = PlazaSettings(
        repository=tmp_path,
        host=HostSettings(models="*", follow_model_table=True, **host),
    )
    host_ = FakeHost(settings)
    table, probe = FakeTable(), FakeProbe()
    follower = ModelFollower(
        host_,  # type: ignore[arg-type]
        table,  # type: ignore[arg-type]
        probe,  # type: ignore[arg-type]
        MemoryBudget(budget),
        meter or ZeroMeter(),
        HostMetrics(budget),
        clock,
    )
    for name in sizes:
        table.load(name)
    return follower, host_, table, probe


async def test_loads_what_fits_and_evicts_the_least_recently_used_idle_model(
    tmp_path: Path,
) -> None:
    follower, _, _, probe = make(tmp_path, {"a": 100, "b": 100, "c": 100}, 250)
    await follower.step()
    # a and b fit; c evicts a, the least recently used (idle: nothing queued).
    assert sorted(follower.state.running) == ["b", "c"]
    assert follower.state.evicted == {"a"}
    assert follower.metrics.evictions == {"a": 1}
    await follower.step()  # a comes back only on demand
    assert sorted(follower.state.running) == ["b", "c"]
    probe.queued = {"a": 3, "b": 1}  # a has requests waiting; b has work in flight
    await follower.step()
    # b is the least recently used, but busy: c goes instead.
    assert sorted(follower.state.running) == ["a", "b"]
    assert follower.metrics.evictions == {"a": 1, "c": 1}
    assert max(follower.memory_samples) <= 250 and follower.budget.peak <= 250


async def test_a_load_waits_while_every_model_is_busy_then_backs_off(tmp_path: Path) -> None:
    follower, host, table, probe = make(
        tmp_path, {"a": 100, "b": 100, "c": 100}, 200, lazy=True, load_wait_s=1e-6
    )
    probe.queued = {"a": 1, "b": 1}
    await follower.step()
    assert sorted(follower.state.running) == ["a", "b"]
    probe.queued = {"a": 1, "b": 1, "c": 1}
    await follower.step()  # no idle model to evict: c waits
    assert "c" not in follower.state.running and follower.metrics.evictions == {}
    await follower.step()
    assert follower.state.retrying["c"].generation == table.models["c"].generation
    assert follower.state.given_up == {}  # tried again later (tests/unit/test_model_host_fixes.py)
    key = host.settings.names.worker_registry_key("c")
    assert host.services.redis.entries.get(key, set()) == set()  # not servable: no standby
    table.load("c", generation=2)  # a new load tries again, once there is room
    probe.queued = {"a": 0, "b": 1, "c": 1}
    await follower.step()
    assert sorted(follower.state.running) == ["b", "c"]
    assert follower.metrics.evictions == {"a": 1}


async def test_lazy_models_stand_by_until_requests_wait(tmp_path: Path) -> None:
    follower, host, _, probe = make(tmp_path, {"a": 10, "b": 10}, 0, lazy=True)
    await follower.step()
    assert follower.state.running == {}
    redis = host.services.redis
    for name in ("a", "b"):
        entries = redis.entries[host.settings.names.worker_registry_key(name)]
        assert entries == {f"h.{name}~standby"}
    probe.queued = {"b": 2}
    await follower.step()
    assert list(follower.state.running) == ["b"]
    assert redis.entries[host.settings.names.worker_registry_key("b")] == set()
    assert follower.metrics.loads == {"b": 1}


async def test_a_model_bigger_than_the_budget_is_not_loaded(tmp_path: Path) -> None:
    follower, _, table, _ = make(tmp_path, {"big": 300, "small": 100}, 250)
    await follower.step()
    assert list(follower.state.running) == ["small"]
    assert follower.state.given_up == {"big": table.models["big"].generation}


async def test_an_unloaded_model_is_stopped_and_a_new_generation_restarts(
    tmp_path: Path,
) -> None:
    follower, host, table, _ = make(tmp_path, {"a": 10}, 0)
    await follower.step()
    first = follower.state.running["a"].unit
    table.load("a", generation=2)
    await follower.step()
    assert follower.state.running["a"].unit is not first and host.units[0].stopped
    table.models["a"] = DesiredModel("a", False, 3)
    await follower.step()
    await follower.close()  # waits for the background drain
    assert follower.state.running == {} and host.units[1].stopped
    assert follower.metrics.unloads == {"a": 2} and follower.metrics.loads == {"a": 2}


async def test_a_unit_that_cannot_be_made_is_given_up_and_the_round_goes_on(
    tmp_path: Path,
) -> None:
    """Making a unit can fail before it starts (a model asking more of a rate-limiter
    resource than the host has): its reserved bytes go back, it is given up until its next
    load, and the models after it in the round still load."""
    from plaza.errors import ConfigError

    follower, host, _, _ = make(tmp_path, {"a": 100, "b": 100, "c": 100}, 250)
    made = host.make_unit

    def refuses_b(model: str, config: str = "") -> FakeUnit:
        if model == "b":
            raise ConfigError("model 'b' needs 2 of resource 'R'; the host has 1")
        return made(model, config)

    host.make_unit = refuses_b  # type: ignore[method-assign]
    await follower.step()
    assert sorted(follower.state.running) == ["a", "c"]
    assert follower.budget.held == {"a": 100, "c": 100}
    assert follower.state.given_up == {"b": 1}
    await follower.step()  # given up: not tried again, the round as before
    assert sorted(follower.state.running) == ["a", "c"]


async def test_demand_that_goes_away_ends_the_wait_for_room(tmp_path: Path) -> None:
    """A lazy model that waited for room and whose requests were then served elsewhere
    waits afresh when demand comes back (an old start of its wait gave it up at once)."""
    follower, _, _, probe = make(tmp_path, {"a": 100, "b": 100, "c": 100}, 200, lazy=True)
    probe.queued = {"a": 1, "b": 1}
    await follower.step()
    probe.queued = {"a": 1, "b": 1, "c": 1}
    await follower.step()  # c waits: a and b are busy
    assert "c" in follower.state.waiting
    probe.queued = {"a": 1, "b": 1}  # c's requests served by another host of the group
    await follower.step()
    assert "c" not in follower.state.waiting
    assert "c" not in follower.state.given_up
