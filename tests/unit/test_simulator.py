"""The headless scheduling simulator: Plaza's DynamicBatcher on a simulated clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plaza.batching import BatchingPolicy
from plaza.errors import ConfigError
from plaza.loadgen.arrivals import ArrivalProcess
from plaza.loadgen.latency import LinearLatency, ProfileLatency
from plaza.loadgen.simulator import SimConfig, simulate
from plaza.modelconfig import parse_model_config

LATENCY = LinearLatency(a_us=1000, b_us=10_000)  # batch of n: (n + 10) ms
POLICY = BatchingPolicy(max_batch_size=16, max_queue_delay_us=2000)


def capacity(policy: BatchingPolicy = POLICY) -> float:
    return policy.max_batch_size / LATENCY.batch_latency_s(policy.max_batch_size)


def test_overload_grows_batches_to_max_batch_size() -> None:
    rate = 2 * capacity()  # twice what one instance can do
    res = simulate(SimConfig(POLICY, LATENCY, arrivals=ArrivalProcess(rate), duration_s=10))
    assert set(res.batch_sizes) == {16}
    assert res.throughput == pytest.approx(capacity(), rel=0.01)
    assert res.utilization == [pytest.approx(1.0)]
    assert res.depth_max > 100  # the queue keeps growing


def test_low_rate_without_queue_delay_runs_batches_of_one() -> None:
    policy = BatchingPolicy(max_batch_size=16, max_queue_delay_us=0)
    res = simulate(SimConfig(policy, LATENCY, arrivals=ArrivalProcess(20), duration_s=10))
    assert set(res.batch_sizes) == {1}
    assert res.throughput == pytest.approx(20, rel=0.01)
    assert res.latency.p99_ms == pytest.approx(11.0)  # a batch of one, never a wait


def test_queue_delay_is_waited_when_no_batch_mate_comes() -> None:
    res = simulate(SimConfig(POLICY, LATENCY, arrivals=ArrivalProcess(10), duration_s=5))
    assert set(res.batch_sizes) == {1}
    assert res.server_latency.p50_ms == pytest.approx(2.0 + 11.0)


def test_moderate_rate_batches_between_one_and_max() -> None:
    rate = 0.6 * capacity()
    res = simulate(SimConfig(POLICY, LATENCY, arrivals=ArrivalProcess(rate, "poisson", seed=3)))
    assert 1 < res.mean_batch < 16
    assert res.throughput == pytest.approx(rate, rel=0.05)


def test_same_seed_same_result_and_another_seed_differs() -> None:
    def run(seed: int) -> dict[str, object]:
        arrivals = ArrivalProcess(300, "poisson", seed=seed)
        return simulate(SimConfig(POLICY, LATENCY, arrivals=arrivals, seed=seed)).as_dict()

    assert json.dumps(run(7)) == json.dumps(run(7))
    assert json.dumps(run(7)) != json.dumps(run(8))


def test_closed_loop_runs_the_clients_as_one_batch() -> None:
    policy = BatchingPolicy(max_batch_size=16, max_queue_delay_us=0)
    res = simulate(SimConfig(policy, LATENCY, concurrency=8, duration_s=10))
    # the first batch takes one request; afterwards the other 7 + 1 travel together
    assert max(res.batch_sizes) == 8
    assert res.throughput == pytest.approx(8 / LATENCY.batch_latency_s(8), rel=0.02)


def test_closed_loop_overhead_adds_to_latency() -> None:
    res = simulate(SimConfig(POLICY, LATENCY, concurrency=1, overhead_s=0.005, duration_s=5))
    assert res.latency.p50_ms == pytest.approx(res.server_latency.p50_ms + 5.0)


def test_more_instances_share_an_overload() -> None:
    def run(instances: int) -> float:
        cfg = SimConfig(
            POLICY,
            LATENCY,
            arrivals=ArrivalProcess(4 * capacity()),
            instances=instances,
            partitions=4,
            duration_s=5,
        )
        return simulate(cfg).throughput

    one, four = run(1), run(4)
    assert four == pytest.approx(4 * one, rel=0.02)


def test_instances_beyond_partitions_stay_idle() -> None:
    cfg = SimConfig(
        POLICY,
        LATENCY,
        arrivals=ArrivalProcess(4 * capacity()),
        instances=3,
        partitions=2,
        duration_s=5,
    )
    res = simulate(cfg)
    assert res.utilization[2] == 0.0
    assert res.throughput == pytest.approx(2 * capacity(), rel=0.02)


def test_shared_routing_feeds_every_instance_from_one_batcher() -> None:
    cfg = SimConfig(
        POLICY,
        LATENCY,
        arrivals=ArrivalProcess(3 * capacity()),
        instances=2,
        partitions=1,
        routing="shared",
        duration_s=5,
    )
    res = simulate(cfg)
    assert res.throughput == pytest.approx(2 * capacity(), rel=0.02)


def test_max_pending_bounds_what_a_worker_batches() -> None:
    cfg = SimConfig(
        POLICY, LATENCY, arrivals=ArrivalProcess(2 * capacity()), max_pending=4, duration_s=5
    )
    res = simulate(cfg)
    assert max(res.batch_sizes) <= 4
    assert res.depth_max > 4  # the rest waits in Kafka, counted as backlog


def test_bursts_fill_batches_at_once() -> None:
    policy = BatchingPolicy(max_batch_size=16, max_queue_delay_us=0)
    arrivals = ArrivalProcess(100, "bursts", burst_size=16)
    res = simulate(SimConfig(policy, LATENCY, arrivals=arrivals, duration_s=5))
    assert 16 in res.batch_sizes


def test_depth_series_is_sampled_over_the_run() -> None:
    res = simulate(SimConfig(POLICY, LATENCY, arrivals=ArrivalProcess(200), depth_points=50))
    assert len(res.depth_series) == 50
    times = [t for t, _ in res.depth_series]
    assert times == sorted(times) and times[-1] == pytest.approx(10.0)


def test_event_limit_bounds_a_run() -> None:
    res = simulate(SimConfig(POLICY, LATENCY, arrivals=ArrivalProcess(5000), max_events=1000))
    assert res.unfinished > 0


def test_config_needs_exactly_one_kind_of_load() -> None:
    with pytest.raises(ValueError):
        SimConfig(POLICY, LATENCY)
    with pytest.raises(ValueError):
        SimConfig(POLICY, LATENCY, arrivals=ArrivalProcess(1), concurrency=1)


# -- arrivals and latency models -------------------------------------------------------------


def test_arrival_processes() -> None:
    constant = list(ArrivalProcess(100).times(1.0))
    assert len(constant) == 100 and constant[1] == pytest.approx(0.01)
    poisson = list(ArrivalProcess(1000, "poisson", seed=1).times(20.0))
    assert len(poisson) == pytest.approx(20_000, rel=0.03)
    bursts = list(ArrivalProcess(100, "bursts", burst_size=10).times(1.0))
    assert bursts[:10] == [0.0] * 10 and bursts[10] == pytest.approx(0.1)
    assert len(list(ArrivalProcess(100).times(10.0, limit=7))) == 7
    with pytest.raises(ValueError):
        ArrivalProcess(0)


def test_profile_latency_interpolates_and_extrapolates() -> None:
    model = ProfileLatency.from_points({1: 0.010, 4: 0.013, 8: 0.021})
    assert model.batch_latency_s(4) == pytest.approx(0.013)
    assert model.batch_latency_s(6) == pytest.approx(0.017)
    assert model.batch_latency_s(16) == pytest.approx(0.037)  # along the last segment
    assert model.batch_latency_s(1) == pytest.approx(0.010)


def test_profile_latency_reads_a_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps({"curve": [{"batch_size": 1, "p50_ms": 2.0}, {"batch_size": 8, "p50_ms": 9.0}]})
    )
    assert ProfileLatency.from_file(path).batch_latency_s(8) == pytest.approx(0.009)
    path.write_text("{}")
    with pytest.raises(ConfigError):
        ProfileLatency.from_file(path)


def test_linear_latency_from_a_simulated_model_config() -> None:
    text = """
    backend: "plaza_simulated"
    max_batch_size: 8
    input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]
    output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]
    parameters [{ key: "latency_a_us" value: { string_value: "250" } },
                 { key: "latency_b_us" value: { string_value: "4000" } }]
    """
    spec = parse_model_config(text, source="sim/config.pbtxt", default_name="sim")
    assert LinearLatency.from_spec(spec) == LinearLatency(250.0, 4000.0)


def test_committed_simulated_model_is_a_simulated_device() -> None:
    from plaza.modelconfig import load_model_config

    path = Path(__file__).resolve().parents[2] / "model_repository" / "simulated" / "config.pbtxt"
    spec = load_model_config(path)
    latency = LinearLatency.from_spec(spec)
    assert latency.a_us > 0 and latency.b_us > 0
    assert spec.batching.enabled and spec.max_batch_size > 1
