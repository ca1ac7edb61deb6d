"""model_warmup through a real worker on real Kafka and Redis: a Python-backend model that
tallies its executions in a file shows the warmup ran, and how often, before the worker
took its first request; a warmup that fails fails the worker's start and leaves nothing
loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plaza.client import PlazaClient
from plaza.connections import kafka_admin
from plaza.errors import ModelExecutionError
from plaza.settings import PlazaSettings
from plaza.workers.worker import Worker
from tests.support import REPOSITORY, running_worker, wait_for, with_model

CONFIG = """
name: "tally"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "tally_file" value { string_value: "%s" } }
model_warmup [ { name: "zeros" batch_size: 2 count: 3
                 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
"""

MODEL = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X + 1; each request's X is appended to the tally file; X = -1 raises."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tally = config["parameters"]["tally_file"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x == -1).any():
                raise ValueError("X = -1 is refused")
            with open(self.tally, "a") as out:
                out.write(" ".join(str(v) for v in x.ravel()) + "\\n")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
'''


def repository(root: Path, tally: Path, warmup_value: str = "zero_data: true") -> Path:
    folder = root / "tally"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL)
    (folder / "config.pbtxt").write_text((CONFIG % tally).replace("zero_data: true", warmup_value))
    return root


async def test_the_warmup_runs_count_times_before_the_first_request(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    tally = tmp_path / "tally.txt"
    settings = settings.model_copy(update={"repository": repository(tmp_path / "r", tally)})
    async with running_worker(settings, "tally"), PlazaClient(settings) as client:
        assert tally.read_text().splitlines() == ["0.0 0.0"] * 3  # before any request
        result = await client.infer("tally", {"X": np.array([[5.0]], np.float32)}, timeout_s=60)
    assert result.output("Y").to_numpy().tolist() == [[6.0]]
    assert tally.read_text().splitlines() == ["0.0 0.0"] * 3 + ["5.0"]


async def test_a_one_element_file_warms_up_every_row_of_the_sample(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """A Triton repository's input_data_file holds one batch-1 element, whatever the
    sample's batch_size: each of its rows gets that element (it was a load failure)."""
    tally = tmp_path / "tally.txt"
    (tmp_path / "r" / "tally" / "warmup").mkdir(parents=True)
    (tmp_path / "r" / "tally" / "warmup" / "seven").write_bytes(np.full(1, 7, "<f4").tobytes())
    root = repository(tmp_path / "r", tally, 'input_data_file: "seven"')
    async with running_worker(settings.model_copy(update={"repository": root}), "tally"):
        assert tally.read_text().splitlines() == ["7.0 7.0"] * 3  # batch_size 2, count 3


async def test_a_stateful_sample_naming_its_control_and_state_inputs_loads(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """Triton's warmup of a sequence model may name START, READY and the state input (they
    override the sequence batcher's there); the worker fills them itself and starts."""
    (tmp_path / "accumulate").mkdir()
    (tmp_path / "accumulate" / "1").symlink_to(REPOSITORY / "accumulate" / "1")
    zero = "value { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }"
    inputs = " ".join(
        f'inputs {{ key: "{n}" {zero} }}' for n in ("INPUT", "START", "READY", "SUM_IN")
    )
    config = (REPOSITORY / "accumulate" / "config.pbtxt").read_text()
    warm = f'model_warmup [ {{ name: "seq" batch_size: 1 {inputs} }} ]\n'
    (tmp_path / "accumulate" / "config.pbtxt").write_text(config + warm)
    settings = settings.model_copy(update={"repository": tmp_path})
    async with running_worker(settings, "accumulate"), PlazaClient(settings) as client:
        params = {"sequence_id": 52, "sequence_start": True, "sequence_end": True}
        x = {"INPUT": np.array([[4]], np.int32)}
        result = await client.infer("accumulate", x, parameters=params, timeout_s=60)
    assert result.outputs[0].to_numpy().tolist() == [[4]]


async def test_a_warmup_that_fails_fails_the_start_and_unloads_the_model(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    tally = tmp_path / "tally.txt"
    (tmp_path / "r" / "tally" / "warmup").mkdir(parents=True)
    (tmp_path / "r" / "tally" / "warmup" / "minus_one").write_bytes(np.full(2, -1, "<f4").tobytes())
    root = repository(tmp_path / "r", tally, 'input_data_file: "minus_one"')
    worker = Worker(with_model(settings.model_copy(update={"repository": root}), "tally"))
    with pytest.raises(ModelExecutionError, match=r"warmup sample 'zeros' failed: .*-1 is refused"):
        await worker.start()
    assert all(not runner.backends for runner in worker.instances)
    assert not tally.exists()
    # nor does it stay on the process's /metrics (a host that loads it again later would
    # serve the dead one's zeros under the same labels as the live one's counts)
    assert worker.metrics not in worker.metrics.hub.members


async def test_a_start_that_fails_after_joining_the_group_leaves_it(
    settings: PlazaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer that joined the group and never fetches would hold its partitions for as
    long as its heartbeats go on: the failed start stops it (its group left empty)."""
    s = with_model(settings, "identity")
    worker = Worker(s)

    async def fails_once_assigned() -> None:  # the first heartbeat, Redis away
        await wait_for(lambda: bool(worker.consumer.assignment()), what="the assignment")
        raise ConnectionError("Redis away")

    monkeypatch.setattr(worker, "_beat", fails_once_assigned)
    with pytest.raises(ConnectionError, match="Redis away"):
        await worker.start()
    admin = kafka_admin(s.kafka)
    await admin.start()
    try:
        [described] = await admin.describe_consumer_groups([s.names.consumer_group("identity")])
    finally:
        await admin.close()
    (_, _, _, _, _, members, *_) = described.groups[0]
    assert members == []
    assert worker.metrics not in worker.metrics.hub.members
