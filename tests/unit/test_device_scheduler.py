"""The host's device scheduler with fake costs: order and grants, never durations."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from plaza.errors import ConfigError
from plaza.modelconfig import InstanceGroup, RateLimitResource
from plaza.workers.device_scheduler import (
    DeviceScheduler,
    Grant,
    InstanceSpec,
    instance_specs,
    parse_budget,
)

ONE = [InstanceSpec()]


def run_one(s: DeviceScheduler, cost: float = 1.0) -> Grant:
    """Grant the next execution (exactly one must be grantable), then finish it."""
    granted = s.dispatch()
    assert len(granted) == 1, granted
    s.release(granted[0], cost)
    return granted[0]


def test_a_quiet_model_goes_before_a_flooded_ones_queue() -> None:
    s = DeviceScheduler(slots=1)
    s.add_model("flood", ONE)
    s.add_model("quiet", ONE)
    for _ in range(10):
        s.submit("flood")
    order = [run_one(s).model for _ in range(3)]
    s.submit("quiet")  # arrives while flood has 7 waiting
    order += [run_one(s).model for _ in range(2)]
    assert order == ["flood", "flood", "flood", "quiet", "flood"]


def test_a_joining_model_goes_next_even_when_the_running_execution_was_cheap() -> None:
    """The flood's running batch costs less than its mean: the quiet one still goes next."""
    s = DeviceScheduler(slots=1)
    s.add_model("flood", ONE)
    s.add_model("quiet", ONE)
    for _ in range(10):
        s.submit("flood")
    for _ in range(3):
        run_one(s, cost=1.0)
    running = s.dispatch()
    assert [g.model for g in running] == ["flood"]
    s.submit("quiet")
    s.release(running[0], 0.25)
    assert [g.model for g in s.dispatch()] == ["quiet"]


def test_two_backlogged_models_alternate() -> None:
    s = DeviceScheduler(slots=1)
    s.add_model("a", ONE)
    s.add_model("b", ONE)
    for _ in range(6):
        s.submit("a")
        s.submit("b")
    order = [run_one(s).model for _ in range(12)]
    assert order.count("a") == order.count("b") == 6
    assert all(x != y for x, y in itertools.pairwise(order))  # round robin


def test_device_time_decides_not_execution_count() -> None:
    """A model whose executions take 3x as long gets about a third of the turns."""
    s = DeviceScheduler(slots=1)
    s.add_model("slow", ONE)
    s.add_model("fast", ONE)
    for _ in range(40):
        s.submit("slow")
        s.submit("fast")
    turns = {"slow": 0, "fast": 0}
    for _ in range(40):
        granted = s.dispatch()
        assert len(granted) == 1
        g = granted[0]
        s.release(g, 3.0 if g.model == "slow" else 1.0)
        turns[g.model] += 1
    assert 8 <= turns["slow"] <= 12 and turns["fast"] == 40 - turns["slow"]


def test_priority_weights_the_share() -> None:
    """Triton's rate limiter priority: priority 2 gets half the turns of priority 1."""
    s = DeviceScheduler(slots=1)
    s.add_model("p1", instance_specs([InstanceGroup(priority=1)]))
    s.add_model("p2", instance_specs([InstanceGroup(priority=2)]))
    for _ in range(30):
        s.submit("p1")
        s.submit("p2")
    order = [run_one(s).model for _ in range(30)]
    assert order.count("p1") in (19, 20, 21) and order.count("p2") == 30 - order.count("p1")


def test_an_idle_model_earns_no_credit() -> None:
    """Idle for 20 of the other's turns, it then shares equally: no burst of 20 turns."""
    s = DeviceScheduler(slots=1)
    s.add_model("a", ONE)
    s.add_model("b", ONE)
    for _ in range(40):
        s.submit("a")
    assert {run_one(s).model for _ in range(20)} == {"a"}
    for _ in range(10):
        s.submit("b")
    order = [run_one(s).model for _ in range(10)]
    assert order.count("a") == order.count("b") == 5


def test_instance_count_is_parallel_executions_of_one_model() -> None:
    s = DeviceScheduler()  # slots 0: the largest instance count (3)
    s.add_model("m", instance_specs([InstanceGroup(count=3)]))
    for _ in range(5):
        s.submit("m")
    granted = s.dispatch()
    assert sorted(g.instance for g in granted) == [0, 1, 2]
    assert s.dispatch() == [] and s.waiting("m") == 2
    s.release(granted[1], 1.0)
    assert [g.instance for g in s.dispatch()] == [1]


def test_max_concurrency_caps_a_model_below_its_instances() -> None:
    s = DeviceScheduler(slots=8)
    s.add_model("m", instance_specs([InstanceGroup(count=4)]), max_concurrency=2)
    for _ in range(4):
        s.submit("m")
    assert len(s.dispatch()) == 2 and s.running("m") == 2 and s.waiting("m") == 2


def test_slots_bound_the_device() -> None:
    s = DeviceScheduler(slots=2)
    s.add_model("a", instance_specs([InstanceGroup(count=2)]))
    s.add_model("b", instance_specs([InstanceGroup(count=2)]))
    for _ in range(2):
        s.submit("a")
        s.submit("b")
    granted = s.dispatch()
    assert len(granted) == 2 and s.running() == 2
    assert {g.model for g in granted} == {"a", "b"}  # the second slot goes to the other model


def test_a_model_without_a_device_slot_runs_beside_a_full_device() -> None:
    """A Python model (``device_slot=False``) whose batch waits on a BLS call to another
    model of the host must not hold the slot that model needs: its executions take none,
    bounded by their instances alone, and the default slot count ignores them."""
    s = DeviceScheduler()
    s.add_model("bls", instance_specs([InstanceGroup(count=3)]), device_slot=False)
    s.add_model("onnx", ONE)
    assert s.slots == 1  # the largest instance count of the models that take a slot
    s.submit("bls")
    (caller,) = s.dispatch()
    s.submit("onnx")  # the call the caller's batch waits on
    (callee,) = s.dispatch()
    assert (caller.model, callee.model) == ("bls", "onnx")
    s.submit("onnx")
    for _ in range(3):
        s.submit("bls")
    granted = s.dispatch()
    assert [g.model for g in granted] == ["bls", "bls"]  # its 3 instances; onnx's slot is full
    assert s.running() == 4 and s.running("bls") == 3 and s.waiting("onnx") == 1
    s.release(callee, 1.0)
    assert [g.model for g in s.dispatch()] == ["onnx"]


def test_an_execution_starts_only_when_its_resources_are_free() -> None:
    r2 = (RateLimitResource("R", 2),)
    r1 = (RateLimitResource("R", 1),)
    s = DeviceScheduler(slots=8)  # budget of R: the largest count asked for, 2
    s.add_model("big", instance_specs([InstanceGroup(count=2, resources=r2)]))
    s.add_model("small", instance_specs([InstanceGroup(count=2, resources=r1)]))
    assert s.budget() == {"R": 2}
    s.submit("small")
    s.submit("small")
    first, second = s.dispatch()  # R now 2 of 2
    assert [first.model, second.model] == ["small", "small"]
    s.submit("big")
    assert s.dispatch() == []
    s.release(first, 1.0)
    assert s.dispatch() == []  # 1 free still: big waits
    assert s.waiting("big") == 1
    s.release(second, 1.0)
    assert [g.model for g in s.dispatch()] == ["big"]


def test_a_fairer_model_holds_the_resources_it_waits_for() -> None:
    """The reviewer's starvation: a's two instances take R:1 each and always overlap, b asks
    for R:2, the whole budget. Were b skipped while R is partly in use, a would take it again
    at every end and b would never start. b, the fairest, holds R: a waits, b starts as soon
    as a's running executions end, and c, which uses no R, runs on meanwhile."""
    r1 = (RateLimitResource("R", 1),)
    r2 = (RateLimitResource("R", 2),)
    s = DeviceScheduler(slots=8)
    s.add_model("a", instance_specs([InstanceGroup(count=2, resources=r1)]))
    s.add_model("b", instance_specs([InstanceGroup(resources=r2)]))
    s.add_model("c", ONE)
    flooded = {"a": s.submit("a"), "c": s.submit("c")}
    running = s.dispatch()
    order: list[str] = []

    def step() -> None:  # the oldest execution ends; a flooded model asks again at once
        s.release(running.pop(0), 1.0)
        for _ in range(2):
            granted = s.dispatch()
            running.extend(granted)
            order.extend(g.model for g in granted)
            for name, ticket in flooded.items():
                if ticket.grant is not None:
                    flooded[name] = s.submit(name)

    for _ in range(6):
        step()
    assert s.running("a") == 2 and s.waiting("a") == 1
    order.clear()
    s.submit("b")
    while "b" not in order:
        step()
        assert len(order) < 10  # bounded: b does not wait out the flood
    assert order[: order.index("b")].count("a") == 0  # a took no R meanwhile
    assert "c" in order[: order.index("b")]  # ... and c kept running


def test_a_model_waiting_for_its_own_instance_holds_no_resource() -> None:
    """Only a want of resources (or of a slot) holds them: the fairest model, waiting for
    its one busy instance, does not keep another model off the R it left free."""
    r1 = (RateLimitResource("R", 1),)
    s = DeviceScheduler(slots=8, budget={"R": 2})
    s.add_model("x", instance_specs([InstanceGroup(resources=r1)]))
    s.add_model("y", instance_specs([InstanceGroup(resources=r1)]))
    for name, cost in (("y", 5.0), ("x", 1.0)):  # vtimes: y 5, x 1
        s.submit(name)
        s.release(s.dispatch()[0], cost)
    s.submit("x")
    (running,) = s.dispatch()
    s.submit("x")  # x, the fairest still, waits for its busy instance
    s.submit("y")
    assert [g.model for g in s.dispatch()] == ["y"]
    s.release(running, 1.0)
    assert [g.model for g in s.dispatch()] == ["x"]


def test_a_model_waiting_for_a_slot_holds_its_resources() -> None:
    """b waits for the device's one slot (d holds it) and for R. A Python model (no slot)
    taking R must not keep it from b, or whenever d's slot came free R might be in use."""
    r1 = (RateLimitResource("R", 1),)
    s = DeviceScheduler(slots=1, budget={"R": 1})
    s.add_model("d", ONE)
    s.add_model("b", instance_specs([InstanceGroup(resources=r1)]))
    s.add_model("py", instance_specs([InstanceGroup(resources=r1)]), device_slot=False)
    s.submit("d")
    (slot,) = s.dispatch()
    s.submit("b")
    s.submit("py")
    assert s.dispatch() == []  # b is fairer than py: R is b's once d's slot comes free
    s.release(slot, 1.0)
    assert [g.model for g in s.dispatch()] == ["b"]


def test_removing_a_model_lets_go_of_what_it_waited_for() -> None:
    r1 = (RateLimitResource("R", 1),)
    s = DeviceScheduler(slots=8, budget={"R": 2})
    s.add_model("a", instance_specs([InstanceGroup(count=2, resources=r1)]))
    s.add_model("b", instance_specs([InstanceGroup(resources=(RateLimitResource("R", 2),))]))
    s.submit("a")
    s.dispatch()
    s.submit("b")
    queued = s.submit("a")
    assert s.dispatch() == []  # b holds R
    s.remove_model("b")
    assert queued.grant is not None and queued.grant.model == "a"


def test_a_resource_budget_from_settings() -> None:
    r1 = (RateLimitResource("GPU_SLOT", 1),)
    s = DeviceScheduler(slots=8, budget=parse_budget("GPU_SLOT:3"))
    s.add_model("m", instance_specs([InstanceGroup(count=5, resources=r1)]))
    for _ in range(5):
        s.submit("m")
    assert len(s.dispatch()) == 3


def test_a_budget_below_what_an_execution_needs_is_a_config_error() -> None:
    s = DeviceScheduler(budget={"R": 1})
    with pytest.raises(ConfigError, match="needs 2 of resource 'R'") as info:
        s.add_model("m", instance_specs([InstanceGroup(resources=(RateLimitResource("R", 2),))]))
    assert info.value.code == "bad_config"


@pytest.mark.parametrize("bad", ["R", "R:x", ":2", "R:-1"])
def test_bad_budget_text(bad: str) -> None:
    with pytest.raises(ConfigError, match="NAME:COUNT"):
        parse_budget(bad)


def test_acquire_waits_and_a_cancelled_wait_leaves_nothing() -> None:
    async def scenario() -> None:
        s = DeviceScheduler(slots=1)
        s.add_model("a", ONE)
        s.add_model("b", ONE)
        first = await s.acquire("a")
        waiter = asyncio.create_task(s.acquire("b"))
        cancelled = asyncio.create_task(s.acquire("a"))
        await asyncio.sleep(0)
        assert not waiter.done() and s.waiting("b") == 1
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert s.waiting("a") == 0
        s.finish(first, 1.0)
        assert (await waiter).model == "b" and s.running() == 1

    asyncio.run(scenario())


def test_peak_counts_executions_at_once() -> None:
    s = DeviceScheduler(slots=4)
    s.add_model("m", instance_specs([InstanceGroup(count=3)]))
    for _ in range(3):
        s.submit("m")
    granted = s.dispatch()
    for g in granted:
        s.release(g, 1.0)
    s.submit("m")
    s.dispatch()
    assert s.peak == {"m": 3}
