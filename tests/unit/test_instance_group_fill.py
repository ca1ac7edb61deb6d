"""The served config (``GET /v2/models/{m}/config``, gRPC ``ModelConfig``: both
``ModelSpec.config_json``) shows the instance groups filled in as Triton's normalized config
does: one group where the config has none, each with its name, a kind and a count; the
instances a worker runs and the Python instances' names stay as they were."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from plaza.modelconfig import ModelSpec, parse_model_config, parse_model_config_json
from plaza.workers.backends.python_backend import instance_name

IO = """
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def spec(groups: str = "", *, head: str = 'platform: "onnxruntime_onnx"') -> ModelSpec:
    return parse_model_config(f"{head}\n{IO}\n{groups}", source="m/config.pbtxt", default_name="m")


def served_groups(s: ModelSpec) -> list[dict[str, Any]]:
    return [{k: g[k] for k in ("name", "kind", "count")} for g in s.config_json()["instance_group"]]


def test_a_model_without_instance_group_serves_one_filled_group() -> None:
    s = spec()
    assert served_groups(s) == [{"name": "m_0", "kind": "KIND_CPU", "count": 1}]
    assert s.instance_count == 1 and [g.count for g in s.instance_groups] == [1]
    assert instance_name(s, 0) == "m_0_0"


def test_each_unnamed_group_gets_its_name_a_cpu_kind_and_a_count() -> None:
    s = spec(
        'instance_group [ { count: 2 }, { name: "pool" kind: KIND_GPU gpus: [ 0 ] },'
        " { kind: KIND_MODEL count: 3 } ]"
    )
    assert served_groups(s) == [
        {"name": "m_0", "kind": "KIND_CPU", "count": 2},
        {"name": "pool", "kind": "KIND_GPU", "count": 1},
        {"name": "m_2", "kind": "KIND_MODEL", "count": 3},
    ]
    assert s.instance_count == 6
    assert [instance_name(s, i) for i in (0, 1, 2, 3, 5)] == [
        "m_0_0",
        "m_0_1",
        "pool_0",
        "m_2_0",
        "m_2_2",
    ]


def test_the_grpc_front_rebuilds_the_filled_groups() -> None:
    """As ``grpc_front.ModelConfig`` rebuilds the message from the served JSON."""
    message = json_format.ParseDict(spec().config_json(), mc.ModelConfig())
    [group] = message.instance_group
    assert (group.name, group.kind, group.count) == ("m_0", mc.ModelInstanceGroup.KIND_CPU, 1)


def test_the_served_config_read_back_is_the_same_config() -> None:
    s = spec("instance_group [ { count: 0 } ]")
    again = parse_model_config_json(
        json_format.MessageToJson(s.config), source="override", default_name="m"
    )
    assert again.config == s.config and again.instance_count == s.instance_count == 1


def test_an_ensemble_gets_no_instance_group() -> None:
    """Triton does not normalize an ensemble's instance groups (it has no instances)."""
    ensemble = spec(
        'ensemble_scheduling { step [ { model_name: "a" model_version: -1'
        ' input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }',
        head='platform: "ensemble"',
    )
    assert ensemble.config_json()["instance_group"] == []
