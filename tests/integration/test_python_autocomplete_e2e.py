"""A Python model whose config.pbtxt names only its backend, its tensors made by its own
``auto_complete_config``, served end to end on real Kafka and Redis: the gateway answers the
completed config and metadata, a worker batches it, and a bad hook keeps it from loading."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from tests.python_models import write_model
from tests.support import gateway_fronts, running_worker

SCALE_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = 2 * X, its tensors and batching declared by the model itself."""

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        config = json.loads(args["model_config"])  # the completed config
        assert [i["name"] for i in config["input"]] == ["X"], config

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = pb_utils.Tensor("Y", (2 * x).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
'''

REFUSING_MODEL = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        raise RuntimeError("cannot describe myself")

    def execute(self, requests):
        return []
"""


async def test_a_python_model_that_describes_itself_is_served(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    root = write_model(tmp_path / "repository", "scale", 'backend: "python"\n', SCALE_MODEL)
    write_model(root, "refusing", 'backend: "python"\n', REFUSING_MODEL)
    settings = settings.model_copy(update={"repository": root})
    rows = [np.full((1, 3), i, np.float32) for i in range(4)]
    async with running_worker(settings, "scale"), gateway_fronts(settings) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False) as http:
            config = (await http.get("/v2/models/scale/config")).json()
            metadata = (await http.get("/v2/models/scale")).json()
            index = (await http.post("/v2/repository/index", json={})).json()
        async with PlazaClient(settings) as client:
            results = await asyncio.gather(*(client.infer("scale", {"X": r}) for r in rows))
    assert (config["backend"], config["max_batch_size"]) == ("python", 4)
    # the block it set, every field at its default (printed as Triton prints a config)
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 3]}]
    assert metadata["outputs"] == [{"name": "Y", "datatype": "FP32", "shape": [-1, 3]}]
    for sent, result in zip(rows, results, strict=True):
        np.testing.assert_array_equal(result.output("Y").to_numpy(), 2 * sent)
    refusing = next(row for row in index if row["name"] == "refusing")
    assert refusing["state"] == "UNAVAILABLE"
    assert "RuntimeError: cannot describe myself" in refusing["reason"]
    assert "model 'refusing'" in refusing["reason"]
