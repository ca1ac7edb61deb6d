"""What a Python model's ``auto_complete_config`` may not do, and what it is shown: a
completed config with an enum number no name has fails that model alone (a ``bad_config``);
a failed hook is run again on the next read; a written ``decoupled: false`` or
``optional: false`` is seen, so a contrary call raises (Triton's); ``dims`` must be ints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plaza.errors import ConfigError
from plaza.gateway.registry import ModelRegistry
from plaza.model_control import read_load
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.backends.pb_model_config import ModelConfig
from tests.unit.test_python_autocomplete import hook, write_python_model

OUT = 'config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]})\n'
GOOD = 'config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [1]})\n' + OUT


@pytest.mark.parametrize(
    ("body", "field", "value"),
    [
        (
            'config.add_input({"name": "IN", "data_type": 99, "dims": [1]})\n' + OUT,
            "input[0].data_type",
            "99 is not a DataType",
        ),
        (
            GOOD + 'config._model_config["instance_group"] = [{"kind": 42}]\n',
            "instance_group[0].kind",
            "42 is not a Kind",
        ),
    ],
)
def test_an_enum_number_the_hook_writes_is_a_bad_config(
    tmp_path: Path, body: str, field: str, value: str
) -> None:
    write_python_model(tmp_path, "numbered", hook(body + "return config"))
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).spec("numbered")
    assert caught.value.code == "bad_config"
    assert caught.value.details["field"] == field
    assert value in caught.value.message and "model 'numbered'" in caught.value.message


def test_a_model_whose_hook_writes_an_enum_number_fails_alone(tmp_path: Path) -> None:
    body = 'config.add_input({"name": "IN", "data_type": 99, "dims": [1]})\n' + OUT
    write_python_model(tmp_path, "bad", hook(body + "return config"))
    write_python_model(tmp_path, "good", hook(GOOD + "return config"))
    registry = ModelRegistry(PlazaSettings(repository=str(tmp_path)))
    registry.read_start_models()
    assert sorted(registry.models) == ["good"]
    assert "99 is not a DataType" in registry.failed["bad"]


def test_a_failed_hook_runs_again_once_its_cause_is_fixed(tmp_path: Path) -> None:
    body = "import helper\n" + GOOD + "return config"
    path = write_python_model(tmp_path, "helped", hook(body))
    helper = path.parent / "helper.py"
    helper.write_text("raise RuntimeError('helper broken')\n")
    repo = ModelRepository(tmp_path)
    with pytest.raises(ConfigError, match="helper broken"):
        read_load(repo, "helped")
    helper.write_text("FIXED = True\n")  # model.py itself is not touched
    assert [t.name for t in read_load(repo, "helped").spec.inputs] == ["IN"]


WRITTEN_IO = (
    'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] optional: false } ]\n'
    'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
)


@pytest.mark.parametrize(
    ("config", "body", "refusal"),
    [
        (
            "model_transaction_policy { decoupled: false }\n",
            'config.set_model_transaction_policy({"decoupled": True})\n',
            "the config sets decoupled False, auto_complete_config sets True",
        ),
        (
            "",
            'config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [1], '
            '"optional": True})\n',
            "the config has optional False, auto_complete_config gives True",
        ),
    ],
)
def test_a_hook_may_not_overturn_a_written_false(
    tmp_path: Path, config: str, body: str, refusal: str
) -> None:
    written = 'backend: "python"\n' + config + WRITTEN_IO
    write_python_model(tmp_path, "m", hook(body + "return config"), written)
    with pytest.raises(ConfigError, match=refusal):
        ModelRepository(tmp_path).spec("m")


def test_the_hook_sees_the_config_with_its_defaults_printed(tmp_path: Path) -> None:
    body = """
seen = config.as_dict()
assert seen["model_transaction_policy"] == {"decoupled": False}, seen
assert seen["input"][0]["optional"] is False, seen
assert seen["max_batch_size"] == 0, seen
return config
"""
    written = 'backend: "python"\nmodel_transaction_policy { decoupled: false }\n' + WRITTEN_IO
    write_python_model(tmp_path, "m", hook(body), written)
    spec = ModelRepository(tmp_path).spec("m")
    assert not spec.decoupled and not spec.inputs[0].optional


@pytest.mark.parametrize("dims", ["16", [2.7], [True], None, 4, [1, "2"]])
@pytest.mark.parametrize("kind", ["input", "output"])
def test_dims_must_be_a_list_of_ints(kind: str, dims: Any) -> None:
    config = ModelConfig({"name": "m"})
    add = config.add_input if kind == "input" else config.add_output
    with pytest.raises(ValueError, match="dims are a list of ints"):
        add({"name": "T", "data_type": "TYPE_FP32", "dims": dims})
    assert config.as_dict()[kind] == []


@pytest.mark.parametrize("dims", [[4, -1], (2, 3)])
def test_a_list_or_tuple_of_ints_is_taken(dims: Any) -> None:
    config = ModelConfig({"name": "m"})
    config.add_input({"name": "T", "data_type": "TYPE_FP32", "dims": dims})
    assert config.as_dict()["input"][0]["dims"] == list(dims)
