"""A following host's failures and measurements, with the follower's fakes and a stand-in
pynvml: loads tried again after a back-off, a lazy model too big for the budget, memory
readings that fail or come from child processes, a drain cut short by a new load, and the
GPU chosen among those CUDA_VISIBLE_DEVICES shows."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from plaza.errors import ConfigError
from plaza.model_control import DesiredModel
from plaza.workers.device import CPU, Device, select_device
from plaza.workers.memory_budget import NvmlMeter, RssMeter, _Proc, family, meter_for
from plaza.workers.model_watch import RETRY_MAX_S
from tests.unit.test_model_follower import FakeHost, FakeUnit, make

GB = 1 << 30
MB = 1 << 20


class FakeClock:
    """The follower's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedMeter:
    """Memory readings in order (None: a failed reading); 0 once they run out."""

    kind = "fake"

    def __init__(self, *readings: int | None) -> None:
        self.readings = list(readings)

    def used(self) -> int | None:
        return self.readings.pop(0) if self.readings else 0


def standby(host: FakeHost, name: str) -> set[str]:
    return host.services.redis.entries.get(host.settings.names.worker_registry_key(name), set())


class FailingUnit(FakeUnit):
    """A unit whose start raises the next of ``failures`` (then starts)."""

    def __init__(self, name: str, failures: list[Exception]) -> None:
        super().__init__(name)
        self._failures = failures

    async def start(self) -> None:
        if self._failures:
            raise self._failures.pop(0)


def failing_units(host: FakeHost, failures: list[Exception]) -> None:
    def make_unit(model: str, config: str = "") -> FakeUnit:
        host.units.append(FailingUnit(model, failures))
        return host.units[-1]

    host.make_unit = make_unit  # type: ignore[method-assign]


# -- 1. given up for good -> tried again ----------------------------------------------------
async def test_a_load_that_found_no_room_in_time_is_tried_again_once_there_is_room(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    follower, host, table, probe = make(
        tmp_path, {"a": 100, "b": 100, "c": 100}, 200, load_wait_s=5, clock=clock
    )
    await follower.step()
    assert sorted(follower.state.running) == ["b", "c"] and follower.state.evicted == {"a"}
    probe.queued = {"a": 3, "b": 1, "c": 1}  # a's requests wait; b and c are busy
    await follower.step()  # a waits for room
    clock.now = 6.0
    await follower.step()  # waited longer than load_wait_s: a backs off (no standby)
    assert "a" in follower.state.retrying and follower.state.given_up == {}
    assert standby(host, "a") == set()
    probe.queued = {"a": 3}  # b and c idle again; a's requests still wait
    await follower.step()  # not due yet
    assert "a" not in follower.state.running
    clock.now = 6.0 + RETRY_MAX_S
    await follower.step()
    assert "a" in follower.state.running and follower.state.retrying == {}
    assert table.models["a"].loaded and follower.metrics.loads["a"] == 2


async def test_a_start_failing_on_kafka_is_tried_again_with_a_growing_bounded_back_off(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    follower, host, _, _ = make(tmp_path, {"a": 10}, 0, clock=clock)
    failures: list[Exception] = [KafkaConnectionError("Unable to bootstrap") for _ in range(9)]
    failing_units(host, failures)
    delays = []
    for tries in range(1, 10):
        await follower.step()
        retry = follower.state.retrying["a"]
        assert retry.tries == tries and len(host.units) == tries
        delays.append(retry.due - clock.now)
        await follower.step()  # not due: not tried again yet
        assert len(host.units) == tries and standby(host, "a") == set()
        clock.now = retry.due
    assert delays == [1, 2, 4, 8, 16, RETRY_MAX_S, RETRY_MAX_S, RETRY_MAX_S, RETRY_MAX_S]
    assert follower.state.given_up == {} and follower.budget.held == {}
    await follower.step()  # Kafka is back
    assert list(follower.state.running) == ["a"] and follower.state.retrying == {}
    assert follower.budget.held == {"a": 10}


async def test_a_bad_config_at_start_gives_the_model_up_until_its_next_load(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    follower, host, table, _ = make(tmp_path, {"a": 10}, 0, clock=clock)
    failing_units(host, [ConfigError("model.py: initialize failed")])
    await follower.step()
    assert follower.state.given_up == {"a": 1} and follower.state.retrying == {}
    clock.now = 10 * RETRY_MAX_S
    await follower.step()
    assert len(host.units) == 1 and standby(host, "a") == set()
    table.load("a", generation=2)
    await follower.step()
    assert list(follower.state.running) == ["a"]


# -- 3. a lazy model too big for the budget ---------------------------------------------------
async def test_a_lazy_model_bigger_than_the_budget_is_given_up_at_once(tmp_path: Path) -> None:
    follower, host, table, probe = make(tmp_path, {"big": 300}, 250, lazy=True)
    await follower.step()
    assert follower.state.given_up == {"big": table.models["big"].generation}
    assert standby(host, "big") == set()  # not servable: the gateway does not count it
    probe.queued = {"big": 5}
    await follower.step()
    assert follower.state.running == {} and host.units == []


# -- 4. a failed reading is unknown, not 0 ----------------------------------------------------
class FlakyNvml:
    """Stand-in for pynvml: 30 GB used on the GPU; the reads named in ``fail`` raise."""

    def __init__(self, *fail: int) -> None:
        self.reads = 0
        self.fail = set(fail)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        self.reads += 1
        if self.reads in self.fail:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return types.SimpleNamespace(used=30 * GB)


def test_a_failed_gpu_reading_is_unknown() -> None:
    meter = NvmlMeter(0, nvml=FlakyNvml(1))
    assert meter.used() is None and meter.used() == 30 * GB


@pytest.mark.parametrize("fail", [3, 4])  # b's reading before its load, or after it
async def test_an_unknown_reading_around_a_load_leaves_its_estimate(
    tmp_path: Path, fail: int
) -> None:
    follower, _, _, _ = make(tmp_path, {"a": GB, "b": GB}, 10 * GB)
    follower._meter = NvmlMeter(0, nvml=FlakyNvml(fail))
    await follower.step()
    assert follower.budget.held == {"a": GB, "b": GB}
    assert sorted(follower.state.running) == ["a", "b"] and follower.metrics.evictions == {}


async def test_the_over_budget_warning_names_the_idle_models_that_would_not_free_enough(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    meter = ScriptedMeter()
    follower, _, table, probe = make(tmp_path, {"a": 150, "b": 20, "c": 50}, 300, meter=meter)
    del table.models["c"]
    await follower.step()
    assert sorted(follower.state.running) == ["a", "b"]
    probe.queued = {"a": 1}  # a busy, b idle
    meter.readings = [0, 200]  # c measures 200 bytes (estimated 50)
    table.load("c")
    with caplog.at_level(logging.WARNING, logger="plaza.workers.model_watch"):
        await follower.step()
    assert follower.budget.held == {"a": 150, "b": 20, "c": 200}  # b alone would not do
    warning = [r.getMessage() for r in caplog.records if "over the budget" in r.getMessage()]
    assert len(warning) == 1
    assert "evicting every idle model (b) would not free enough, busy: a" in warning[0]


# -- 2. the memory of the host's child processes ------------------------------------------------
def test_the_rss_meter_counts_the_processes_the_host_started() -> None:
    meter = RssMeter()
    before = meter.used()
    holds = "import sys; data = b'x' * (64 << 20); print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", holds], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        after = meter.used()
    finally:
        child.kill()
        child.wait()
    assert before is not None and after is not None
    assert after - before >= 60 * MB


def test_the_family_holds_descendants_and_the_groups_they_lead() -> None:
    processes = {
        10: _Proc(ppid=1, pgrp=10, rss_pages=1),  # the host, leading its own group
        11: _Proc(ppid=10, pgrp=11, rss_pages=1),  # a model process (its own session)
        12: _Proc(ppid=11, pgrp=11, rss_pages=1),  # a helper it started
        13: _Proc(ppid=1, pgrp=11, rss_pages=1),  # a helper orphaned, still in its group
        14: _Proc(ppid=1, pgrp=10, rss_pages=1),  # a stranger in the host's group (a pipe)
        15: _Proc(ppid=1, pgrp=15, rss_pages=1),  # a stranger
    }
    assert family(10, processes) == {10, 11, 12, 13}


# -- 6. unload, then load again while draining --------------------------------------------------
async def test_a_draining_model_loaded_again_restarts_at_once(tmp_path: Path) -> None:
    follower, host, table, probe = make(tmp_path, {"a": 10}, 0, drain_limit_s=3600)
    await follower.step()
    probe.queued = {"a": 2}  # steady traffic: its lag never reaches 0
    try:
        table.models["a"] = DesiredModel("a", False, 2)
        await follower.step()  # drains in the background
        config = json.dumps(
            {
                "backend": "plaza_simulated",
                "max_batch_size": 8,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
            }
        )
        table.models["a"] = DesiredModel("a", True, 3, config)
        await follower.step()
        item = follower.state.running["a"]
        assert item.desired.generation == 3 and item.desired.config == config
        assert len(host.units) == 2 and host.units[0].stopped and not host.units[1].stopped
        assert follower.metrics.loads == {"a": 2} and follower.metrics.unloads == {"a": 1}
    finally:
        probe.queued = {}
        await follower.close()


# -- 5. CUDA_VISIBLE_DEVICES -------------------------------------------------------------------
def fake_pynvml() -> types.ModuleType:
    """Three GPUs by NVML index: free 10, 70 and 40 GB; used 1, 2 and 3 GB."""
    free, used = [10 * GB, 70 * GB, 40 * GB], [1 * GB, 2 * GB, 3 * GB]
    uuids = ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-cccc3333-0000"]
    nvml: Any = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 3
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: f"GPU{h}"
    nvml.nvmlDeviceGetUUID = lambda h: uuids[h]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(free=free[h], used=used[h])
    return nvml  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, Device("cuda", 1, "GPU1", 70 * GB, 1)),  # unset: every GPU, by NVML index
        ("0", Device("cuda", 0, "GPU0", 10 * GB, 0)),
        ("2,0", Device("cuda", 0, "GPU2", 40 * GB, 2)),
        ("0,2", Device("cuda", 1, "GPU2", 40 * GB, 2)),
        ("GPU-cccc3333", Device("cuda", 0, "GPU2", 40 * GB, 2)),  # a UUID (prefix)
        ("GPU-aaaa1111-0000,GPU-BBBB", Device("cuda", 1, "GPU1", 70 * GB, 1)),
        ("0, 7, 1", Device("cuda", 0, "GPU0", 10 * GB, 0)),  # CUDA stops at a bad entry
        ("0,0,1", Device("cuda", 0, "GPU0", 10 * GB, 0)),
        ("", CPU),  # an empty value: no GPU
        ("-1", CPU),
        ("MIG-GPU-bbbb2222-0000/1/0,1", CPU),  # a MIG instance is not mapped
    ],
)
def test_the_gpu_is_chosen_among_the_visible_ones_and_numbered_as_cuda_does(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, expected: Device
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert select_device("auto") == expected


def test_the_gpu_meter_reads_the_chosen_physical_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    device = select_device("auto")
    assert device.index == 0
    assert meter_for(device).used() == 3 * GB  # NVML GPU 2's, not GPU 0's
