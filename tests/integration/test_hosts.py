"""Model hosts on real Kafka and Redis: several models in one process, fairly scheduled.

A host runs a worker per model (own batcher, own consumer group) sharing one device, one
/metrics port and one device scheduler. The fairness test floods one simulated model (the
simulated device spends its time sleeping, so the 2 CPUs do not decide it) and sends a
quiet model requests one at a time: the quiet one's executions must interleave with the
flood's batches (counted in the scheduler's grant history, never timed), and the flood must
still batch.
"""

from __future__ import annotations

import asyncio
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.settings import PlazaSettings
from plaza.stack import Deployment, HostProcess, ProcessGroup
from plaza.workers.host import Host, host_models
from tests.metrics_support import samples, value
from tests.python_models import ADD_SUB_CONFIG, write_repository
from tests.support import REPOSITORY, make_settings, wait_for

pytestmark = pytest.mark.timeout(180)

SIMULATED = """
name: "{name}"
backend: "plaza_simulated"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
parameters [
  {{ key: "latency_a_us" value: {{ string_value: "{a_us}" }} }},
  {{ key: "latency_b_us" value: {{ string_value: "{b_us}" }} }}
]
"""


def simulated(root: Path, name: str, a_us: int = 500, b_us: int = 2000) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(SIMULATED.format(name=name, a_us=a_us, b_us=b_us))


def repository(tmp_path: Path, onnx: tuple[str, ...], sims: tuple[str, ...]) -> Path:
    root = tmp_path / "repo"
    for model in onnx:
        shutil.copytree(REPOSITORY / model, root / model)
    for model in sims:
        simulated(root, model)
    return root


async def test_one_host_answers_each_of_its_models_and_serves_one_metrics_port(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    repo = repository(tmp_path, ("add_sub", "identity"), ("sim",))
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        repository=repo,
        worker={"worker_id": "h1", "metrics_port": 0},
    )
    settings = settings.model_copy(
        update={"host": settings.host.model_copy(update={"models": "*"})}
    )
    assert host_models(settings) == ["add_sub", "identity", "sim"]
    host = Host(settings)
    await host.start()
    try:
        async with PlazaClient(settings) as client:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            b = np.full((1, 16), 3, dtype=np.int32)
            x = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
            added, same, echoed = await asyncio.gather(
                client.infer("add_sub", {"INPUT0": a, "INPUT1": b}),
                client.infer("identity", {"INPUT0": x}),
                client.infer("sim", {"INPUT0": x}),
            )
        np.testing.assert_array_equal(added.output("OUTPUT0").to_numpy(), a + b)
        np.testing.assert_array_equal(added.output("OUTPUT1").to_numpy(), a - b)
        np.testing.assert_array_equal(same.output("OUTPUT0").to_numpy(), x)
        np.testing.assert_array_equal(echoed.output("OUTPUT0").to_numpy(), x)
        assert [r.worker for r in (added, same, echoed)] == ["h1.add_sub", "h1.identity", "h1.sim"]
        ports = {w.metrics.port for w in host.workers}
        assert len(ports) == 1 and None not in ports  # one /metrics for the process
        url = f"http://127.0.0.1:{ports.pop()}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        got = samples(text.decode())
        for model in ("add_sub", "identity", "sim"):
            assert value(got, "nv_inference_request_success", model=model, version="1") == 1
        groups = {w.consumer._group_id for w in host.workers}  # each its model's own group
        assert groups == {settings.names.consumer_group(m) for m in host.models}
    finally:
        await host.stop()


async def test_a_flooded_model_does_not_starve_a_quiet_one(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    repo = repository(tmp_path, (), ("flood", "quiet"))
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=repo)
    settings = settings.model_copy(  # one execution at a time: the device is contended
        update={"host": settings.host.model_copy(update={"execution_slots": 1})}
    )
    host = Host(settings, ["flood", "quiet"])
    await host.start()
    flood, quiet = host.workers
    try:
        async with PlazaClient(settings) as client:
            rows = [np.full((1, 4), i, dtype=np.float32) for i in range(3000)]
            await client.publish_many(make_request("flood", {"INPUT0": r}) for r in rows)
            await wait_for(lambda: flood.metrics.executions() > 0, 60, "the flood to start")
            answers = []
            for i in range(10):  # a low rate: one at a time, each answered before the next
                x = np.full((1, 4), 1000 + i, dtype=np.float32)
                answers.append(await client.infer("quiet", {"INPUT0": x}, timeout_s=60))
            flood_left = 3000 - flood.metrics.records["written"]
        history = [g.model for g in host.services.scheduler.history]
    finally:
        await host.stop()
    assert [a.output("OUTPUT0").to_numpy()[0, 0] for a in answers] == [1000 + i for i in range(10)]
    assert flood_left > 0  # the quiet model was served while the flood still had work
    first_quiet, last_quiet = history.index("quiet"), len(history) - history[::-1].index("quiet")
    assert "flood" in history[:first_quiet] and "flood" in history[last_quiet:]
    assert history.count("quiet") == 10
    assert max(flood.metrics.batch_sizes()) > 1  # and the flood still batches
    assert quiet.metrics.executions() == 10


PARALLEL = """
name: "{name}"
backend: "plaza_simulated"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters [
  {{ key: "latency_b_us" value: {{ string_value: "20000" }} }},
  {{ key: "max_concurrency" value: {{ string_value: "{cap}" }} }}
]
"""


async def test_instance_count_runs_in_parallel_and_max_concurrency_caps_it(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    for name, cap in (("two", 0), ("capped", 1)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(PARALLEL.format(name=name, cap=cap))
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    host = Host(settings, ["two", "capped"])
    await host.start()
    try:
        async with PlazaClient(settings) as client:
            for model in ("two", "capped"):  # one after the other: each has the device
                rows = [np.full((1, 4), i, dtype=np.float32) for i in range(80)]
                calls = (client.infer(model, {"INPUT0": r}, timeout_s=60) for r in rows)
                results = await asyncio.gather(*calls)
                got = [r.output("OUTPUT0").to_numpy()[0, 0] for r in results]
                assert got == list(range(80))
        peak = dict(host.services.scheduler.peak)
    finally:
        await host.stop()
    assert peak == {"two": 2, "capped": 1}


async def test_a_host_process_serves_its_models_from_the_command_line(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
    tmp_path: Path,
) -> None:
    repo = repository(tmp_path, ("add_sub",), ("sim",))
    deployment = Deployment(kafka_bootstrap, redis_url, repo, unique_id, partitions=2)
    group = ProcessGroup(tmp_path / "logs")
    env = {"PLAZA_WORKER__INTRA_OP_THREADS": "1", "PLAZA_WORKER__DEVICE": "cpu"}
    try:
        host = group.start(HostProcess(deployment, ["add_sub", "sim"], group.log_dir, env=env))
        await host.wait_registered()
        settings: PlazaSettings = deployment.settings()
        async with PlazaClient(settings) as client:
            a = np.ones((1, 16), dtype=np.int32)
            added = await client.infer("add_sub", {"INPUT0": a, "INPUT1": a})
            echoed = await client.infer("sim", {"INPUT0": np.ones((2, 4), np.float32)})
        assert added.output("OUTPUT0").to_numpy().tolist() == [[2] * 16]
        assert echoed.output("OUTPUT0").to_numpy().tolist() == [[1.0] * 4] * 2
        assert {added.worker, echoed.worker} == {host.unit_id("add_sub"), host.unit_id("sim")}
        assert len({host.pid}) == 1 and host.pid is not None  # one process for both
    finally:
        group.stop_all()


TWIN = ADD_SUB_CONFIG.replace('name: "add_sub"', 'name: "twin"').replace(
    'backend: "python"', 'backend: "plaza_simulated"'
)
"""add_sub's tensors on the simulated device: each output a copy of INPUT0."""


async def test_a_python_models_bls_call_to_a_model_of_its_own_host_is_answered(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    """One host, its execution slots the default (1: the largest instance count): ``bls``
    (Python) calls ``twin`` (simulated) through BLS while its own batch runs. A Python
    model's execution takes no device slot, so twin's batch gets the slot at once; before,
    bls's batch held it and the call waited out its 30 s timeout."""
    root = write_repository(tmp_path / "repo", "bls")
    (root / "twin" / "1").mkdir(parents=True)
    (root / "twin" / "config.pbtxt").write_text(TWIN)
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    settings = settings.model_copy(
        update={"host": settings.host.model_copy(update={"models": "*"})}
    )
    host = Host(settings)
    await host.start()
    try:
        assert host.services.scheduler.slots == 1
        async with PlazaClient(settings) as client:
            x = np.arange(8, dtype=np.float32).reshape(2, 4)
            inputs = {
                "INPUT0": x,
                "INPUT1": x + 100,
                "MODEL_NAME": np.array([[b"twin"], [b"twin"]], dtype=np.object_),
            }
            result = await client.infer("bls", inputs, timeout_s=20)
        # twin copies its first input to every output; bls hands twin's outputs back
        np.testing.assert_array_equal(result.output("OUTPUT0").to_numpy(), x)
        np.testing.assert_array_equal(result.output("OUTPUT1").to_numpy(), x)
        assert host.services.scheduler.peak == {"bls": 1, "twin": 1}
    finally:
        await host.stop()
