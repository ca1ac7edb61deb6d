"""The gateway's model registry without Redis: which models each control mode starts with,
and the repository index's states."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from plaza.errors import ConfigError, Unavailable
from plaza.gateway.registry import MODEL_CONTROL_DISABLED, IndexEntry, ModelRegistry
from plaza.settings import GatewaySettings, PlazaSettings
from tests.support import REPOSITORY


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name in ("add_sub", "simulated"):
        shutil.copytree(REPOSITORY / name, tmp_path / name, ignore=shutil.ignore_patterns("*.onnx"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text("max_batch_size: {")
    return tmp_path


def registry(repo: Path, **gateway: object) -> ModelRegistry:
    settings = PlazaSettings(repository=repo, gateway=GatewaySettings(**gateway))  # type: ignore[arg-type]
    reg = ModelRegistry(settings)
    reg.read_start_models()
    return reg


@pytest.mark.parametrize(
    ("gateway", "served"),
    [
        ({}, {"simulated"}),  # none: every model (add_sub has no model file here: failed)
        ({"models": "simulated"}, {"simulated"}),
        ({"model_control_mode": "explicit"}, set()),
        ({"model_control_mode": "explicit", "models": "*"}, {"simulated"}),
        ({"model_control_mode": "poll"}, {"simulated"}),
    ],
)
def test_each_mode_starts_with_its_models(
    repo: Path, gateway: dict[str, str], served: set[str]
) -> None:
    assert set(registry(repo, **gateway).models) == served


def test_unknown_start_model_is_a_config_error(repo: Path) -> None:
    with pytest.raises(ConfigError, match="nope"):
        registry(repo, model_control_mode="explicit", models="nope")


def test_index_states(repo: Path) -> None:
    reg = registry(repo)
    reg.unloaded.add("other")
    rows = {r.name: r for r in reg.index({"simulated": 0})}
    assert rows["simulated"] == IndexEntry("simulated", "1", "LOADING", "no worker serves it yet")
    assert rows["broken"].state == rows["add_sub"].state == "UNAVAILABLE"
    assert "config.pbtxt" in rows["broken"].reason
    assert reg.index({"simulated": 1}, ready_only=True) == [IndexEntry("simulated", "1", "READY")]


async def test_mode_none_refuses_load_and_unload_with_tritons_message(repo: Path) -> None:
    reg = registry(repo)
    for change in (reg.load("simulated"), reg.unload("simulated")):
        with pytest.raises(Unavailable, match=MODEL_CONTROL_DISABLED):
            await change


def _ensemble(root: Path, name: str, step_model: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "{step_model}" model_version: -1
  input_map {{ key: "INPUT0" value: "INPUT0" }} output_map {{ key: "OUTPUT0" value: "OUTPUT0" }}
}} ] }}
"""
    )


def test_unload_dependents_finds_the_ensembles_that_call_a_model(repo: Path) -> None:
    _ensemble(repo, "inner", "simulated")  # calls it
    _ensemble(repo, "outer", "inner")  # calls it through inner
    shutil.copytree(repo / "simulated", repo / "other")
    config = (repo / "other" / "config.pbtxt").read_text()
    (repo / "other" / "config.pbtxt").write_text(config.replace('"simulated"', '"other"'))
    _ensemble(repo, "apart", "other")  # does not
    reg = registry(repo)
    assert {"simulated", "inner", "outer", "apart"} <= set(reg.models)
    assert reg.dependents("simulated") == ["inner", "outer"]
    assert reg.dependents("outer") == []


def test_a_model_without_a_config_is_served_and_its_file_changes_are_seen(repo: Path) -> None:
    """An ONNX model with no config.pbtxt (its config made from the file) is a model of the
    repository; poll mode sees its model file change."""
    from onnx import TensorProto

    from tests.unit.test_autocomplete import tensor, write_model

    x, y = tensor("x", TensorProto.FLOAT, ["b", 2]), tensor("y", TensorProto.FLOAT, ["b", 2])
    path = write_model(repo / "made", [x], [y])
    reg = registry(repo)
    assert "made" in reg.models and reg.models["made"].spec.max_batch_size == 4
    before = reg._fingerprint("made")
    path.write_bytes(path.read_bytes() + b"\0")  # the file changed (size and time)
    assert reg._fingerprint("made") != before


def test_poll_mode_sees_every_file_of_a_model_but_bytecode(repo: Path) -> None:
    """A label file beside the config, or a module a model.py imports deeper in its version
    folder, is part of the model: poll mode reloads it when one changes. The bytecode Python
    writes when it loads model.py is not."""
    from onnx import TensorProto

    from tests.unit.test_autocomplete import tensor, write_model

    x, y = tensor("x", TensorProto.FLOAT, ["b", 2]), tensor("y", TensorProto.FLOAT, ["b", 2])
    write_model(repo / "made", [x], [y])
    reg = registry(repo)
    (repo / "made" / "labels.txt").write_text("a\n")
    (repo / "made" / "1" / "utils").mkdir()
    (repo / "made" / "1" / "utils" / "helper.py").write_text("X = 1\n")
    seen = reg._fingerprint("made")
    (repo / "made" / "1" / "__pycache__").mkdir()
    (repo / "made" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert reg._fingerprint("made") == seen
    for changed in (repo / "made" / "labels.txt", repo / "made" / "1" / "utils" / "helper.py"):
        changed.write_text(changed.read_text() + "more\n")
        assert reg._fingerprint("made") != seen, changed
        seen = reg._fingerprint("made")


def test_explicit_mode_serves_the_steps_of_an_ensemble_named_at_start(repo: Path) -> None:
    """Triton's ``--load-model`` of an ensemble loads its composing models with it."""
    _ensemble(repo, "inner", "simulated")
    _ensemble(repo, "outer", "inner")
    reg = registry(repo, model_control_mode="explicit", models="outer")
    assert set(reg.models) == {"outer", "inner", "simulated"}
