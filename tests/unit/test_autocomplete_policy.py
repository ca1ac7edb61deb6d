"""Completion follows the version policy (``plaza.autocomplete``): a config is completed from
the newest version the policy serves, not the newest folder; and a ``specific`` policy's
versions are checked (below 1: a ``bad_config``) and the ones with no folder logged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from onnx import TensorProto

from plaza.errors import ConfigError
from plaza.model_control import model_spec
from plaza.modelconfig import VersionPolicy
from plaza.repository import ModelRepository
from tests.unit.test_autocomplete import tensor, write_model
from tests.unit.test_python_autocomplete import hook, write_python_model


def _two_onnx_versions(folder: Path) -> None:
    """Version 1 takes ``x``, version 2 takes ``y``."""
    for version, name in (("1", "x"), ("2", "y")):
        write_model(
            folder,
            [tensor(name, TensorProto.FLOAT, ["b", 3])],
            [tensor(f"out_{name}", TensorProto.FLOAT, ["b", 3])],
            version,
        )


def test_an_onnx_config_is_completed_from_the_version_its_policy_serves(tmp_path: Path) -> None:
    _two_onnx_versions(tmp_path / "pol")
    (tmp_path / "pol" / "config.pbtxt").write_text(
        "version_policy { specific { versions: [ 1 ] } }\n"
    )
    repo = ModelRepository(tmp_path)
    spec = repo.spec("pol")
    assert [t.name for t in spec.inputs] == ["x"]
    assert [v.version for v in repo.served_versions("pol", spec)] == [1]


def test_a_load_requests_override_policy_chooses_the_version_too(tmp_path: Path) -> None:
    _two_onnx_versions(tmp_path / "pol")
    override = '{"version_policy": {"specific": {"versions": [1]}}}'
    spec = model_spec(ModelRepository(tmp_path), "pol", override)
    assert [t.name for t in spec.inputs] == ["x"]


def test_without_a_policy_the_newest_version_still_describes_the_model(tmp_path: Path) -> None:
    _two_onnx_versions(tmp_path / "pol")
    assert [t.name for t in ModelRepository(tmp_path).spec("pol").inputs] == ["y"]


def test_a_python_model_is_completed_by_the_hook_of_the_version_served(tmp_path: Path) -> None:
    for version, name in ((1, "IN_ONE"), (2, "IN_TWO")):
        body = f"""
config.add_input({{"name": "{name}", "data_type": "TYPE_FP32", "dims": [1]}})
config.add_output({{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}})
return config
"""
        write_python_model(tmp_path, "py", hook(body), version=version)
    (tmp_path / "py" / "config.pbtxt").write_text(
        'backend: "python"\nversion_policy { specific { versions: [ 1 ] } }\n'
    )
    assert [t.name for t in ModelRepository(tmp_path).spec("py").inputs] == ["IN_ONE"]


@pytest.mark.parametrize("bad", [0, -3])
def test_a_specific_version_below_1_is_a_bad_config(tmp_path: Path, bad: int) -> None:
    write_model(
        tmp_path / "spec",
        [tensor("x", TensorProto.FLOAT, ["b", 3])],
        [tensor("y", TensorProto.FLOAT, ["b", 3])],
    )
    (tmp_path / "spec" / "config.pbtxt").write_text(
        f"version_policy {{ specific {{ versions: [ 1, {bad} ] }} }}\n"
    )
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).spec("spec")
    assert caught.value.code == "bad_config"
    assert caught.value.details["field"] == "version_policy.specific.versions"
    assert f"{bad} is not a version" in caught.value.message


def test_a_specific_version_without_a_folder_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _two_onnx_versions(tmp_path / "spec")
    (tmp_path / "spec" / "config.pbtxt").write_text(
        "version_policy { specific { versions: [ 2, 5, 7 ] } }\n"
    )
    repo = ModelRepository(tmp_path)
    spec = repo.spec("spec")
    with caplog.at_level(logging.WARNING, logger="plaza.modelconfig"):
        assert [v.version for v in repo.served_versions("spec", spec)] == [2]
        assert spec.version_policy.select([1, 2]) == [2]  # a request's look: no new line
    missing = [r.getMessage() for r in caplog.records if "has no version folder" in r.message]
    assert len(missing) == 2
    assert "names version 5" in missing[0] and "names version 7" in missing[1]
    assert str(tmp_path / "spec" / "config.pbtxt") in missing[0]


def test_the_policy_logs_nothing_when_every_version_is_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = VersionPolicy(kind="specific", specific=(1, 3), source="cfg")
    with caplog.at_level(logging.WARNING, logger="plaza.modelconfig"):
        assert policy.select([3, 2, 1]) == [1, 3]
    assert not caplog.records
