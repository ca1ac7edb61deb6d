"""A Python model with two instances (two model processes) on real Kafka and Redis: its
custom gauge on the worker's /metrics is the value set most recently by either instance,
as Triton's instances share one gauge, and its counter is their sum.

``gauged`` sets its gauge to each request's first INPUT0 element. Calls one after another
run on the first free instance, so one instance sets every value and the other (whose
snapshot the worker also holds, from its ``initialize``) never does.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from tests.metrics_support import samples, value
from tests.python_models import ADD_SUB_CONFIG, write_model
from tests.support import make_settings, running_worker

GAUGED_CONFIG = ADD_SUB_CONFIG.replace('name: "add_sub"', 'name: "gauged"').replace(
    "instance_group [ { kind: KIND_CPU } ]", "instance_group [ { kind: KIND_CPU count: 2 } ]"
)

GAUGED_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """add_sub's outputs; a gauge set to each request's first INPUT0 element, a counter
    of requests."""

    def initialize(self, args):
        self.last = pb_utils.MetricFamily(
            name="gauged_last", description="first INPUT0 element of the last request",
            kind=pb_utils.MetricFamily.GAUGE,
        ).Metric()
        self.seen = pb_utils.MetricFamily(
            name="gauged_requests", description="requests seen",
            kind=pb_utils.MetricFamily.COUNTER,
        ).Metric()

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            self.last.set(float(a[0, 0]))
            self.seen.increment(1)
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''


@pytest.fixture
def gauged_settings(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> PlazaSettings:
    root = tmp_path / "repository"
    write_model(root, "gauged", GAUGED_CONFIG, GAUGED_MODEL)
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


@pytest.mark.timeout(180)
async def test_a_gauge_of_two_instances_shows_the_value_set_last(
    gauged_settings: PlazaSettings,
) -> None:
    async with (
        running_worker(gauged_settings, "gauged", metrics_port=0) as worker,
        PlazaClient(gauged_settings) as client,
        httpx.AsyncClient(trust_env=False, timeout=30) as scraper,
    ):
        assert len(worker.instances) == 2
        url = f"http://127.0.0.1:{worker.metrics.port}/metrics"
        for n in (3.0, 7.0, 5.0):
            x = np.full((1, 4), n, np.float32)
            await client.infer("gauged", {"INPUT0": x, "INPUT1": x})
            got = samples((await scraper.get(url)).text)  # the answer came with its metrics
            assert value(got, "gauged_last") == n
        assert value(got, "gauged_requests") == 3  # the instances' counters, summed
