"""The model config in Triton's JSON form (``plaza.modelconfig.config_to_json``, served at
``GET /v2/models/{model}/config``): every primitive field printed, 64-bit integers as JSON
numbers, and the output read back as a config override gives the same config."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from plaza.model_control import model_spec
from plaza.modelconfig import config_to_json, parse_model_config, parse_model_config_json
from plaza.repository import ModelRepository

SHIPPED = Path(__file__).resolve().parents[2] / "model_repository"

BATCHED = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4, -1 ] reshape { shape: [ 2, 2, -1 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 200000
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { default_timeout_microseconds: 5000 }
  priority_queue_policy { key: 2 value { default_timeout_microseconds: 7000 max_queue_size: 3 } }
}
version_policy { specific { versions: [ 1, 3 ] } }
"""
UNBATCHED = """
platform: "onnxruntime_onnx"
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""
STATEFUL = """
platform: "onnxruntime_onnx"
max_batch_size: 2
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 9000000
  oldest { max_candidate_sequences: 2 max_queue_delay_microseconds: 300 }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
    fp32_false_true: [ 0, 1 ] } ] } ]
}
"""


def served(text: str) -> dict[str, Any]:
    spec = parse_model_config(text, source="m/config.pbtxt", default_name="m")
    return spec.config_json()


def digit_strings(doc: Any) -> list[str]:
    """Every string value in ``doc`` that is an integer's text (map keys aside)."""
    if isinstance(doc, dict):
        return [s for value in doc.values() for s in digit_strings(value)]
    if isinstance(doc, list):
        return [s for value in doc for s in digit_strings(value)]
    return [doc] if isinstance(doc, str) and re.fullmatch(r"-?[0-9]+", doc) else []


def test_64_bit_integers_are_json_numbers() -> None:
    config = served(BATCHED)
    assert config["input"][0]["dims"] == [4, -1]
    assert config["input"][0]["reshape"] == {"shape": [2, 2, -1]}
    assert config["output"][0]["dims"] == [4]
    assert config["version_policy"] == {"specific": {"versions": [1, 3]}}
    batching = config["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 200000
    assert (batching["priority_levels"], batching["default_priority_level"]) == (2, 1)
    assert batching["preferred_batch_size"] == [4, 8]
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5000
    # A map's keys stay strings (JSON's keys are), its values' numbers do not.
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 7000
    assert digit_strings(config) == []


def test_a_sequence_batchers_numbers_too() -> None:
    batching = served(STATEFUL)["sequence_batching"]
    assert batching["max_sequence_idle_microseconds"] == 9000000
    assert batching["oldest"]["max_queue_delay_microseconds"] == 300
    assert digit_strings(batching) == []


def test_every_64_bit_field_of_the_message_is_a_number() -> None:
    """Set each int64 field anywhere in ModelConfig (in messages, lists and map values)
    and look for none printed as a string: nothing left to a hand-kept list."""
    common = """
        input { dims: 5 reshape { shape: 5 } }
        output { dims: 5 reshape { shape: 5 } }
        version_policy { specific { versions: 5 } }
        optimization { cuda { graph_spec { input { key: "x" value { dim: 5 } }
          graph_lower_bound { input { key: "x" value { dim: 5 } } } } } }
        instance_group { secondary_devices { device_id: 5 } }
        model_warmup { inputs { key: "x" value { dims: 5 } } }
    """
    schedulers = [  # one of them in a config
        "sequence_batching { max_sequence_idle_microseconds: 5 direct "
        "{ max_queue_delay_microseconds: 5 } state { dims: 5 initial_state { dims: 5 } } }",
        "ensemble_scheduling { step { model_version: 5 } }",
    ]
    docs = [config_to_json(text_format.Parse(common + s, mc.ModelConfig())) for s in schedulers]
    assert digit_strings(docs) == []
    sequence, ensemble = docs
    assert sequence["sequence_batching"]["state"][0]["initial_state"][0]["dims"] == [5]
    assert ensemble["ensemble_scheduling"]["step"][0]["model_version"] == 5
    assert ensemble["model_warmup"][0]["inputs"]["x"]["dims"] == [5]
    graph = ensemble["optimization"]["cuda"]["graph_spec"][0]
    assert graph["graph_lower_bound"]["input"]["x"]["dim"] == [5]


def test_fields_at_their_default_are_printed() -> None:
    """As Triton prints them: tritonclient's image_client reads max_batch_size and an
    input's format."""
    config = served(UNBATCHED)
    assert config["max_batch_size"] == 0
    assert config["input"][0]["format"] == "FORMAT_NONE"
    assert config["input"][0]["optional"] is False
    assert config["output"][0]["label_filename"] == ""
    assert config["parameters"] == {}
    [group] = config["instance_group"]  # filled, as Triton's normalized config shows it
    assert (group["kind"], group["count"]) == ("KIND_CPU", 1)
    assert "dynamic_batching" not in config  # a block not set stays out, as in Triton


@pytest.mark.parametrize("text", [BATCHED, UNBATCHED, STATEFUL])
def test_the_json_read_back_as_an_override_is_the_same_config(text: str) -> None:
    spec = parse_model_config(text, source="m/config.pbtxt", default_name="m")
    again = parse_model_config_json(
        json.dumps(spec.config_json()), source="override", default_name="m"
    )
    assert again.config == spec.config
    assert again.config_json() == spec.config_json()
    # And as the gRPC front rebuilds the message from it.
    assert json_format.ParseDict(spec.config_json(), mc.ModelConfig()) == spec.config


def test_each_shipped_models_json_loads_back_as_the_same_model() -> None:
    """As a load request's config override (``parameters.config``), completed as the
    repository completes it."""
    repo = ModelRepository(SHIPPED)
    for name in repo.model_names():
        spec = repo.spec(name)
        assert model_spec(repo, name, json.dumps(spec.config_json())).config == spec.config
