"""The worker's metrics without Kafka or Redis: statistics, the collector, the GPU collector."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from aiokafka.structs import TopicPartition

from plaza.client import make_request
from plaza.contract import ErrorInfo, InferResult
from plaza.metrics import render
from plaza.naming import Names
from plaza.settings import WorkerSettings
from plaza.statistics import ModelStatistics, increments
from plaza.workers.cpu_metrics import CpuCollector
from plaza.workers.device import list_gpus
from plaza.workers.gpu_metrics import GpuCollector
from plaza.workers.metrics import MetricsHub, WorkerMetrics
from plaza.workers.runner import WorkItem
from tests.metrics_support import named, samples, value

OFF = WorkerSettings(metrics_port=-1)


def item(rows: int, version: int = 1) -> WorkItem:
    x = np.zeros((rows, 2), dtype=np.float32)
    return WorkItem(request=make_request("m", {"INPUT0": x}), rows=rows, version=version)


def ok(
    version: str = "1", queue: int = 10, c_in: int = 1, c_infer: int = 5, c_out: int = 2
) -> InferResult:
    timing = {
        "queue": queue,
        "compute_input": c_in,
        "compute_infer": c_infer,
        "compute_output": c_out,
    }
    return InferResult(id="r", model="m", version=version, timing_us=timing)


def failed(code: str, version: str = "1") -> InferResult:
    return InferResult(id="r", model="m", version=version, error=ErrorInfo(code, "no"))


def metrics(versions: tuple[int, ...] = (1, 2)) -> WorkerMetrics:
    m = WorkerMetrics("m", Names(), OFF, stats_ttl_s=60, gpu=GpuCollector(nvml=_NoDriver()))
    m.start(list(versions), pending=lambda: 7)
    return m


# -- statistics -----------------------------------------------------------------------------


def test_statistics_round_trip_through_hash_fields() -> None:
    stats = ModelStatistics(inference_count=5, execution_count=2, last_inference=1234)
    stats.success.add(900)
    stats.queue.add(300)
    stats.failures["REJECTED"] = 1
    stats.batch(4).compute_infer.add(50)
    raw = {k.encode(): str(v).encode() for k, v in stats.fields().items()}
    raw[b"something.else"] = b"1"  # a field from a newer worker: ignored
    assert ModelStatistics.from_fields(raw) == stats


def test_tritons_json_shape() -> None:
    stats = ModelStatistics(inference_count=3, execution_count=1, last_inference=99)
    stats.compute_infer.add(10)
    stats.batch(3).compute_infer.add(10)
    doc = stats.to_triton("m", "1")
    assert doc["name"] == "m" and doc["version"] == "1" and doc["last_inference"] == 99
    assert doc["inference_count"] == 3 and doc["execution_count"] == 1
    assert set(doc["inference_stats"]) >= {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
    }
    assert doc["inference_stats"]["compute_infer"] == {"count": 1, "ns": 10}
    assert doc["batch_stats"] == [
        {
            "batch_size": 3,
            "compute_input": {"count": 0, "ns": 0},
            "compute_infer": {"count": 1, "ns": 10},
            "compute_output": {"count": 0, "ns": 0},
        }
    ]
    assert ModelStatistics().to_triton("m", "2")["batch_stats"] == []


def test_increments() -> None:
    before = {"inference_count": 2, "success.count": 2, "last_inference": 5}
    now = {"inference_count": 5, "success.count": 2, "fail.count": 1, "last_inference": 9}
    delta = increments(now, before)
    assert delta == {"inference_count": 3, "fail.count": 1}


# -- the worker's numbers -------------------------------------------------------------------


def test_executions_and_answers_count_like_triton() -> None:
    m = metrics()
    batch = [item(1), item(3)]
    results = [ok(c_out=2), ok(c_out=4)]
    m.executed(batch, results)
    m.answered([(r, None) for r in results])
    m.executed([item(2)], [failed("model_error")])  # a failed execution counts no execution
    m.answered([(failed("model_error", "2"), None), (failed("timeout", version=""), None)])

    s = m.stats["1"]
    assert s.execution_count == 1 and s.inference_count == 4  # rows, not requests
    assert s.success.count == 2 and s.success.ns == (10 + 1 + 5 + 2 + 10 + 1 + 5 + 4) * 1000
    assert s.queue.count == s.compute_input.count == s.compute_infer.count == 2
    assert s.queue.ns == 20_000 and s.compute_output.ns == 6_000
    assert s.fail.count == 0 and m.stats["2"].fail.count == 2  # "" is the default: newest
    assert m.stats["2"].failures == {"BACKEND": 1, "REJECTED": 1}
    batch4 = s.batches[4]
    assert batch4.compute_infer.count == 1 and batch4.compute_infer.ns == 5_000
    assert batch4.compute_output.ns == 4_000  # the execution's output phase: the longest
    assert s.last_inference > 0


def test_the_collector_exposes_tritons_names_per_version() -> None:
    m = metrics()
    m.executed([item(3)], [ok()])
    m.executed([item(1)], [ok()])
    m.answered([(ok(), None), (ok(), None), (failed("queue_full"), None)])
    m.lags = {TopicPartition("plaza.infer.m", 0): 4, TopicPartition("plaza.infer.m", 1): 0}
    got = samples(render(m.registry).decode())
    v1 = {"model": "m", "version": "1"}
    assert value(got, "nv_inference_request_success", **v1) == 2
    assert value(got, "nv_inference_count", **v1) == 4
    assert value(got, "nv_inference_exec_count", **v1) == 2
    assert value(got, "nv_inference_request_duration_us", **v1) == 36
    assert value(got, "nv_inference_queue_duration_us", **v1) == 20
    assert value(got, "nv_inference_compute_input_duration_us", **v1) == 2
    assert value(got, "nv_inference_compute_infer_duration_us", **v1) == 10
    assert value(got, "nv_inference_compute_output_duration_us", **v1) == 4
    assert value(got, "nv_inference_request_failure", reason="REJECTED", **v1) == 1
    assert value(got, "nv_inference_count", model="m", version="2") == 0  # served: zeros
    assert value(got, "nv_inference_pending_request_count", model="m", version="") == 7
    assert value(got, "plaza_inference_batch_size_bucket", le="1.0", **v1) == 1
    assert value(got, "plaza_inference_batch_size_bucket", le="2.0", **v1) == 1
    assert value(got, "plaza_inference_batch_size_bucket", le="4.0", **v1) == 2
    assert value(got, "plaza_inference_batch_size_bucket", le="+Inf", **v1) == 2
    assert value(got, "plaza_inference_batch_size_count", **v1) == 2
    assert value(got, "plaza_inference_batch_size_sum", **v1) == 4
    lag = {"model": "m", "topic": "plaza.infer.m"}
    assert value(got, "plaza_kafka_consumer_lag", partition="0", **lag) == 4
    assert value(got, "plaza_kafka_consumer_lag", partition="1", **lag) == 0
    assert not any(name.startswith("nv_gpu") for name, _ in got)


def test_record_outcomes_and_totals_are_exposed() -> None:
    m = metrics()
    m.count("fetched", 5)
    m.count("written", 4)
    m.count("dead_lettered")
    m.executed([item(3)], [ok()])
    m.executed([item(3)], [ok(version="2")])
    m.executed([item(1)], [ok()])
    got = samples(render(m.registry).decode())
    records = {o: value(got, "plaza_worker_records", model="m", outcome=o) for o in m.records}
    assert records == {
        "fetched": 5,
        "rejected": 0,
        "expired": 0,
        "dead_lettered": 1,
        "written": 4,
        "duplicate": 0,
        "skipped": 0,
    }
    assert m.executions() == 3 and m.batch_sizes() == {3: 2, 1: 1}


def test_a_stateful_models_active_sequences_are_exposed() -> None:
    m = WorkerMetrics("s", Names(), OFF, stats_ttl_s=60, gpu=GpuCollector(nvml=_NoDriver()))
    m.start([1], pending=lambda: 0, sequences=lambda: 3)
    got = samples(render(m.registry).decode())
    assert value(got, "plaza_sequences_active", model="s") == 3
    plain = samples(render(metrics().registry).decode())
    assert not any(name == "plaza_sequences_active" for name, _ in plain)


def test_one_served_version_labels_pending_with_it() -> None:
    got = samples(render(metrics(versions=(3,)).registry).decode())
    assert value(got, "nv_inference_pending_request_count", model="m", version="3") == 7


def test_port_off_and_free() -> None:
    assert metrics().port is None  # -1: off
    m = WorkerMetrics("m", Names(), WorkerSettings(), stats_ttl_s=60)
    m.start([1], pending=lambda: 0)
    try:
        assert m.port is not None and m.port > 0  # 0: a free one
    finally:
        assert m._server is not None
        m._server.close()


def test_a_busy_port_leaves_the_worker_without_metrics() -> None:
    first = WorkerMetrics("m", Names(), WorkerSettings(), stats_ttl_s=60)
    first.start([1], pending=lambda: 0)
    assert first._server is not None
    try:
        busy = WorkerSettings(metrics_port=first._server.port)
        second = WorkerMetrics("m", Names(), busy, stats_ttl_s=60)
        second.start([1], pending=lambda: 0)
        assert second.port is None
    finally:
        first._server.close()


def test_two_workers_in_one_process_have_separate_registries() -> None:
    a, b = metrics(), metrics()
    a.answered([(ok(), None)])
    got = samples(render(b.registry).decode())
    assert value(got, "nv_inference_request_success", model="m", version="1") == 0


# -- GPU ------------------------------------------------------------------------------------


class _NoDriver:
    """pynvml where no NVIDIA driver is installed: nvmlInit raises."""

    calls = 0

    def nvmlInit(self) -> None:
        type(self).calls += 1
        raise RuntimeError("NVML Shared Library Not Found")


class _FakeNvml:
    def __init__(self, count: int = 1, fail_reads: bool = False) -> None:
        self.count, self.fail_reads, self.shut = count, fail_reads, False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if self.fail_reads:
            raise RuntimeError("GPU is lost")
        return i

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle}".encode()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=40, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=3 << 30, total=8 << 30, free=5 << 30)


def test_gpu_collector_yields_nothing_without_a_driver_and_tries_once() -> None:
    collector = GpuCollector(nvml=_NoDriver())
    before = _NoDriver.calls
    assert list(collector.collect()) == []
    assert list(collector.collect()) == []
    assert _NoDriver.calls == before + 1


@pytest.mark.parametrize("nvml", [_FakeNvml(count=0), _FakeNvml(fail_reads=True)])
def test_gpu_collector_yields_nothing_without_gpus_or_when_reads_fail(nvml: _FakeNvml) -> None:
    assert list(GpuCollector(nvml=nvml).collect()) == []


def test_gpu_collector_reports_each_gpu() -> None:
    nvml = _FakeNvml(count=2)
    collector = GpuCollector(nvml=nvml)
    families = {f.name: f for f in collector.collect()}
    assert set(families) == {
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_memory_total_bytes",
    }
    util = {s.labels["gpu_uuid"]: s.value for s in families["nv_gpu_utilization"].samples}
    assert util == {"GPU-0": 0.4, "GPU-1": 0.4}
    assert families["nv_gpu_memory_total_bytes"].samples[0].value == 8 << 30
    collector.close()
    assert nvml.shut


def test_gpu_collector_on_this_machine() -> None:
    """The real pynvml: no crash either way, and nothing at all when there is no GPU."""
    collector = GpuCollector()
    try:
        families = list(collector.collect())
    finally:
        collector.close()
    gpus = list_gpus()
    if not gpus:
        assert families == []
    else:
        used = named(samples(render(_Registry(families)).decode()), "nv_gpu_memory_used_bytes")
        assert len(used) == len(gpus)


class _Registry:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def test_a_hubs_models_share_one_registry_and_each_family_appears_once() -> None:
    """A host's /metrics: one family per name, a sample per model (no duplicate families)."""
    hub = MetricsHub(OFF, gpu=GpuCollector(nvml=_NoDriver()))
    a = WorkerMetrics("a", Names(), OFF, stats_ttl_s=60, hub=hub)
    b = WorkerMetrics("b", Names(), OFF, stats_ttl_s=60, hub=hub)
    a.start([1], pending=lambda: 3)
    b.start([2], pending=lambda: 5)
    a.answered([(ok(), None)])
    text = render(hub.registry).decode()
    types = [line for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))
    got = samples(text)
    assert value(got, "nv_inference_pending_request_count", model="a", version="1") == 3
    assert value(got, "nv_inference_pending_request_count", model="b", version="2") == 5
    assert value(got, "nv_inference_request_success", model="a", version="1") == 1
    assert value(got, "nv_inference_request_success", model="b", version="2") == 0
    assert a.registry is b.registry is hub.registry


class _PowerNvml(_FakeNvml):
    """GPU 0 reports its power and energy; GPU 1 cannot (NVML's "not supported")."""

    def __init__(self) -> None:
        super().__init__(count=2)
        self.energy_mj = 5_000_000

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 1:
            raise RuntimeError("Not Supported")
        return 150_500  # milliwatts

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:
        if handle == 1:
            raise RuntimeError("Not Supported")
        return 300_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if handle == 1:
            raise RuntimeError("Not Supported")
        self.energy_mj += 2_500  # 2.5 J between reads
        return self.energy_mj


def test_gpu_collector_reports_power_and_energy_where_a_gpu_can() -> None:
    collector = GpuCollector(nvml=_PowerNvml())

    def scrape() -> dict[str, dict[str, float]]:
        return {
            f.name: {s.labels["gpu_uuid"]: s.value for s in f.samples} for f in collector.collect()
        }

    first, second = scrape(), scrape()
    assert first["nv_gpu_power_usage"] == {"GPU-0": 150.5}  # watts; GPU-1 has none
    assert first["nv_gpu_power_limit"] == {"GPU-0": 300.0}
    assert first["nv_energy_consumption"] == {"GPU-0": 0.0}  # counted from the first read
    assert second["nv_energy_consumption"] == {"GPU-0": 2.5}
    assert set(second["nv_gpu_utilization"]) == {"GPU-0", "GPU-1"}  # the rest as before


def _proc(root: Path, busy: int, idle: int, available_kib: int) -> Path:
    # user nice system idle iowait irq softirq steal guest guest_nice
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 7 0\ncpu0 1 2 3 4\n")
    (root / "meminfo").write_text(
        f"MemTotal:       16384 kB\nMemFree:        1024 kB\nMemAvailable:   {available_kib} kB\n"
    )
    return root


def test_cpu_collector_reports_utilization_since_the_last_scrape(tmp_path: Path) -> None:
    collector = CpuCollector(_proc(tmp_path, busy=100, idle=300, available_kib=4096))
    _proc(tmp_path, busy=160, idle=340, available_kib=4096)  # 60 busy of 100 ticks
    first = {f.name: f.samples[0].value for f in collector.collect()}
    assert first == {
        "nv_cpu_utilization": 0.6,
        "nv_cpu_memory_used_bytes": (16384 - 4096) * 1024,
        "nv_cpu_memory_total_bytes": 16384 * 1024,
    }
    _proc(tmp_path, busy=170, idle=430, available_kib=2048)  # 10 busy of 100
    second = {f.name: f.samples[0].value for f in collector.collect()}
    assert second["nv_cpu_utilization"] == pytest.approx(0.1)
    assert second["nv_cpu_memory_used_bytes"] == (16384 - 2048) * 1024
    # no tick between two scrapes: no rate to tell, the memory still
    assert "nv_cpu_utilization" not in {f.name for f in collector.collect()}


def test_cpu_collector_yields_nothing_without_proc(tmp_path: Path) -> None:
    assert list(CpuCollector(tmp_path / "absent").collect()) == []


def test_cpu_collector_on_this_machine() -> None:
    collector = CpuCollector()
    families = {f.name: f.samples[0].value for f in collector.collect()}
    assert families["nv_cpu_memory_total_bytes"] > families["nv_cpu_memory_used_bytes"] > 0
    assert 0.0 <= families.get("nv_cpu_utilization", 0.0) <= 1.0


def test_a_reloads_two_units_of_a_model_render_each_series_once() -> None:
    """A reload's new unit joins the host's hub before the old one leaves
    (workers/model_watch.py): the newest speaks for the model, no series shows twice."""
    settings = WorkerSettings(metrics_port=-1)
    hub = MetricsHub(settings)
    units = [WorkerMetrics("m", Names(), settings, stats_ttl_s=60, hub=hub) for _ in range(2)]
    for unit in units:
        unit.start([1], pending=lambda: 0)
    units[0].count("fetched", 5)  # the old unit's, not shown while the new one serves
    units[1].count("fetched", 2)
    text = render(hub.registry).decode()
    series = Counter(line.rsplit(" ", 1)[0] for line in text.splitlines() if line[:1] != "#")
    assert series and max(series.values()) == 1
    assert 'plaza_worker_records{model="m",outcome="fetched"} 2.0' in text
