"""``instance_group`` count and kind: a negative count is a bad_config naming the model and
the field (where it was read as 1 before); 0, which is also what a count left out reads as
(proto3 has no presence for it), keeps Triton's meaning: the default count. A kind no
``KIND_*`` names is refused, the four that exist are read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from plaza.errors import ConfigError
from plaza.gateway.registry import ModelRegistry
from plaza.modelconfig import parse_model_config, parse_model_config_json
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY

CONFIG = """
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def with_groups(groups: str) -> str:
    return f"{CONFIG}\ninstance_group [ {groups} ]\n"


@pytest.mark.parametrize("count", [-1, -7])
def test_a_negative_count_is_refused_naming_the_model(count: int) -> None:
    text = with_groups(f"{{ count: 1 kind: KIND_CPU }}, {{ count: {count} kind: KIND_CPU }}")
    with pytest.raises(ConfigError) as info:
        parse_model_config(text, source="m/config.pbtxt", default_name="m")
    assert info.value.code == "bad_config"
    message = info.value.message
    assert message.startswith("m/config.pbtxt: field 'instance_group[1].count': ")
    assert f"{count} instances of model 'm'" in message


def test_a_negative_count_in_a_load_override_is_refused() -> None:
    override = {
        "backend": "plaza_simulated",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"count": -2, "kind": "KIND_CPU"}],
    }
    with pytest.raises(ConfigError, match=r"field 'instance_group\[0\]\.count': -2 instances"):
        parse_model_config_json(json.dumps(override), source="load", default_name="m")


@pytest.mark.parametrize("group", ["{ count: 0 kind: KIND_CPU }", "{ kind: KIND_CPU }"])
def test_a_count_of_0_or_left_out_is_the_default_one(group: str) -> None:
    spec = parse_model_config(with_groups(group), source="m/config.pbtxt", default_name="m")
    assert [g.count for g in spec.instance_groups] == [1]
    assert spec.instance_count == 1


@pytest.mark.parametrize("kind", ["KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL"])
def test_every_kind_triton_names_is_read(kind: str) -> None:
    spec = parse_model_config(
        with_groups(f"{{ count: 3 kind: {kind} }}"), source="m/config.pbtxt", default_name="m"
    )
    assert [(g.count, g.kind) for g in spec.instance_groups] == [(3, kind)]


@pytest.mark.parametrize("kind", ["KIND_TPU", "7"])
def test_a_kind_triton_does_not_name_is_refused(kind: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_model_config(
            with_groups(f"{{ kind: {kind} }}"), source="m/config.pbtxt", default_name="m"
        )
    assert info.value.code == "bad_config" and "m/config.pbtxt" in info.value.message


def test_a_model_with_a_negative_count_fails_alone_at_start(tmp_path: Path) -> None:
    """Read at start (mode none): the model is reported failed with the reason, the
    others are served."""
    shutil.copytree(REPOSITORY / "simulated", tmp_path / "simulated")
    (tmp_path / "negative" / "1").mkdir(parents=True)
    bad = with_groups("{ count: -1 kind: KIND_CPU }")
    (tmp_path / "negative" / "config.pbtxt").write_text(bad)
    registry = ModelRegistry(PlazaSettings(repository=tmp_path))
    registry.read_start_models()
    assert set(registry.models) == {"simulated"}
    assert "field 'instance_group[0].count'" in registry.failed["negative"]
    with pytest.raises(ConfigError, match=r"negative/config\.pbtxt: field 'instance_group"):
        ModelRepository(tmp_path).spec("negative")  # as a worker reads it
