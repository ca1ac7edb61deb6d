"""A load's record of what it read (``DesiredModel.pinned``): kept in the table's entry,
what every later unit of the generation starts from, and a version gone is a clear failure.

Pure logic on a repository in a temporary folder: no Kafka, no Redis.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from plaza.errors import ConfigError
from plaza.model_control import (
    DesiredModel,
    ServedConfig,
    model_spec,
    pin,
    previous_served,
    read_model,
    unit_config,
)
from plaza.repository import ModelRepository

CONFIG = """
name: "m"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ WIDTH ] } ]
"""


def repository(tmp_path: Path, width: int = 4) -> ModelRepository:
    (tmp_path / "m" / "1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "m" / "config.pbtxt").write_text(CONFIG.replace("WIDTH", str(width)))
    return ModelRepository(tmp_path)


def loaded(tmp_path: Path) -> tuple[ModelRepository, DesiredModel]:
    repo = repository(tmp_path)
    desired = DesiredModel("m", True, 7, pinned=pin(7, read_model(repo, "m")))
    return repo, desired


def test_the_record_survives_the_table_and_its_generation_is_read_first(tmp_path: Path) -> None:
    _, desired = loaded(tmp_path)
    text = desired.encode()
    assert DesiredModel.decode("m", text) == desired
    # the table's script reads the first "generation" of the text: the entry's own
    assert re.search(r'"generation": *(-?\d+)', text).group(1) == "7"  # type: ignore[union-attr]
    assert DesiredModel.decode("m", json.dumps({"loaded": True, "generation": 1})).pinned is None


def test_a_late_unit_starts_from_the_record_not_the_staged_folder(tmp_path: Path) -> None:
    repo, desired = loaded(tmp_path)
    repository(tmp_path, width=8)  # the next config staged
    (tmp_path / "m" / "2").mkdir()  # and the next version
    config = unit_config(repo, desired)
    spec = model_spec(repo, "m", config)
    assert spec.outputs[0].dims == (4,)
    assert [v.version for v in repo.served_versions("m", spec)] == [1]


def test_a_pinned_version_gone_is_a_config_error_not_a_switch(tmp_path: Path) -> None:
    repo, desired = loaded(tmp_path)
    (tmp_path / "m" / "1").rename(tmp_path / "m" / "3")
    with pytest.raises(ConfigError, match="version folder\\(s\\) 1 of model 'm' are gone"):
        unit_config(repo, desired)


def test_an_entry_without_a_record_uses_its_override(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    assert unit_config(repo, DesiredModel("m", True, 1, config="")) == ""


def test_the_record_becomes_the_next_generations_previous_config(tmp_path: Path) -> None:
    _, desired = loaded(tmp_path)
    assert previous_served(desired, None) == (desired.pinned,)
    record = desired.pinned
    assert record is not None
    doc = json.loads(ServedConfig(7, record.config, (1, 3)).unit_config())
    assert doc["version_policy"] == {"specific": {"versions": [1, 3]}}
