"""Configs Triton refuses are refused, and those it reads are read: enum numbers no enum
names, a config.pbtxt that is not all UTF-8, a platform and backend that disagree, Triton's
checks of dims, reshape and preferred sizes, and a model folder with no version folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from onnx import TensorProto

from plaza.errors import ConfigError
from plaza.gateway.registry import ModelRegistry
from plaza.modelconfig import load_model_config, parse_model_config, parse_model_config_json
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY
from tests.unit.test_autocomplete import tensor, write_model

X = 'name: "x" data_type: TYPE_FP32 dims: [ 4 ]'
Y = 'name: "y" data_type: TYPE_FP32 dims: [ 4 ]'


def config(*extra: str, batch: int = 8, x: str = X, platform: str = "onnxruntime_onnx") -> str:
    return "\n".join(
        [
            f'platform: "{platform}"' if platform else "",
            f"max_batch_size: {batch}",
            f"input [ {{ {x} }} ]",
            f"output [ {{ {Y} }} ]",
            *extra,
        ]
    )


def refused(text: str, field: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_model_config(text, source="m/config.pbtxt", default_name="m")
    assert info.value.code == "bad_config"
    assert f"m/config.pbtxt: field '{field}'" in info.value.message
    return info.value


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (config(x='name: "x" data_type: 99 dims: [ 4 ]'), "input[0].data_type"),
        (config(x=X + " format: 9"), "input[0].format"),
        (config("instance_group [ { kind: 7 } ]"), "instance_group[0].kind"),
        (
            config(
                'sequence_batching { control_input [ { name: "S" control [ { kind: 9 '
                "int32_false_true: [ 0, 1 ] } ] } ] }"
            ),
            "sequence_batching.control_input[0].control[0].kind",
        ),
        (
            config("dynamic_batching { default_queue_policy { timeout_action: 4 } }"),
            "dynamic_batching.default_queue_policy.timeout_action",
        ),
        (
            config(
                "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                "priority_queue_policy { key: 2 value { timeout_action: 3 } } }"
            ),
            "dynamic_batching.priority_queue_policy[2].timeout_action",
        ),
        (
            config(
                'model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { '
                "data_type: 42 dims: [ 4 ] zero_data: true } } } ]"
            ),
            "model_warmup[0].inputs[x].data_type",
        ),
    ],
)
def test_an_enum_number_no_name_stands_for_is_a_bad_config_naming_the_field(
    text: str, field: str
) -> None:
    refused(text, field)


def test_an_enum_number_in_a_json_config_is_refused_as_well() -> None:
    override = {"input": [{"name": "x", "data_type": 99, "dims": [4]}]}
    with pytest.raises(ConfigError, match=r"field 'input\[0\]\.data_type': 99 is not a DataType"):
        parse_model_config_json(json.dumps(override), source="load", default_name="m")


def test_one_model_with_a_bad_enum_fails_alone_when_the_gateway_starts(tmp_path: Path) -> None:
    """Mode none reads every model at start: the bad one is reported failed, the others
    are served (an enum lookup's ValueError used to stop the gateway from starting)."""
    shutil.copytree(REPOSITORY / "simulated", tmp_path / "simulated")
    (tmp_path / "badenum" / "1").mkdir(parents=True)
    bad = config('backend: "plaza_simulated"', "instance_group [ { kind: 7 } ]", platform="")
    (tmp_path / "badenum" / "config.pbtxt").write_text(bad)
    registry = ModelRegistry(PlazaSettings(repository=tmp_path))
    registry.read_start_models()
    assert set(registry.models) == {"simulated"}
    assert "field 'instance_group[0].kind'" in registry.failed["badenum"]


def test_a_comment_that_is_not_utf8_is_read_as_triton_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "m" / "config.pbtxt"
    path.parent.mkdir()
    path.write_bytes(b"# mod\xe8le du caf\xe9\n" + config().encode())
    spec = load_model_config(path)
    assert (spec.name, spec.inputs[0].dims) == ("m", (4,))


def test_a_string_that_is_not_utf8_is_a_bad_config_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "m" / "config.pbtxt"
    path.parent.mkdir()
    path.write_bytes(
        config().encode() + b'\nparameters { key: "k" value { string_value: "\xe9" } }'
    )
    with pytest.raises(ConfigError, match=r"line 5 holds bytes that are not UTF-8") as info:
        load_model_config(path)
    assert info.value.code == "bad_config"
    assert "\udce9" not in info.value.message  # no lone surrogate reaches a client


@pytest.mark.parametrize(
    ("names", "why"),
    [
        (
            'platform: "pytorch_libtorch" backend: "onnxruntime"',
            "unexpected 'platform' and 'backend' pair",
        ),
        ('platform: "onnxruntime_onnx" backend: "pytorch"', "'backend' pair"),
        ('platform: "onnxruntime_onnx" backend: "tensorrt"', "unsupported backend 'tensorrt'"),
        ('platform: "ensemble" backend: "python"', "an ensemble names no backend"),
    ],
)
def test_a_platform_and_backend_that_disagree_are_refused(names: str, why: str) -> None:
    error = refused(config(names, platform=""), "backend")
    assert why in error.message


def test_a_backend_names_its_own_platform_and_python_takes_any_as_in_triton() -> None:
    same = config('backend: "onnxruntime"')
    assert parse_model_config(same, source="s", default_name="m").platform == "onnxruntime_onnx"
    python = config('backend: "python"')  # Triton checks the pair for its own backends only
    assert parse_model_config(python, source="s", default_name="m").platform == "python"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (config(x='name: "x" data_type: TYPE_FP32 dims: [ ]'), "input[0].dims"),
        (
            config(batch=0, x=X.replace("[ 4 ]", "[ 1 ] reshape: { shape: [ ] }")),
            "input[0].reshape",
        ),
        (
            config("dynamic_batching { preferred_batch_size: [ 16 ] }", batch=0),
            "dynamic_batching.preferred_batch_size",
        ),
    ],
)
def test_tritons_checks_of_dims_reshape_and_preferred_sizes(text: str, field: str) -> None:
    """Triton's ValidateIOShape: "must specify 'dims'" (batching or not), "cannot have empty
    reshape for non-batching model"; ValidateModelConfig: "dynamic batching preferred size
    must be <= max batch size" (so a model that does not batch takes none)."""
    refused(text, field)


def test_a_batched_scalar_is_dims_one_reshaped_to_nothing() -> None:
    text = config(x=X.replace("[ 4 ]", "[ 1 ] reshape: { shape: [ ] }"))
    assert parse_model_config(text, source="s", default_name="m").inputs[0].reshape == ()


def test_a_batch_only_onnx_tensor_is_completed_as_tritons_backend_does(tmp_path: Path) -> None:
    write_model(
        tmp_path / "m",
        [tensor("x", TensorProto.FLOAT, ["b"]), tensor("w", TensorProto.FLOAT, ["b", 3])],
        [tensor("y", TensorProto.FLOAT, ["b"]), tensor("v", TensorProto.FLOAT, ["b", 3])],
    )
    spec = ModelRepository(tmp_path).spec("m")
    assert spec.max_batch_size == 4
    shapes = [(t.name, t.dims, t.reshape) for t in spec.inputs + spec.outputs]
    assert shapes == [("x", (1,), ()), ("w", (3,), None), ("y", (1,), ()), ("v", (3,), None)]


def test_a_folder_whose_only_subfolder_is_no_version_is_listed_and_fails_clearly(
    tmp_path: Path,
) -> None:
    x, y = tensor("x", TensorProto.FLOAT, ["b", 2]), tensor("y", TensorProto.FLOAT, ["b", 2])
    write_model(tmp_path / "z", [x], [y], version="01")
    repo = ModelRepository(tmp_path)
    assert repo.model_names() == ["z"]
    with pytest.raises(ConfigError, match="no version folder holds a model file") as info:
        repo.spec("z")
    assert info.value.code == "bad_config"
