"""An ensemble checked against what its step models are loaded with (the model table's
records of them, ``DesiredModel.pinned``), not their folders as they are now; and an
ensemble's maximum batch size checked against its batching steps', as Triton checks it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from plaza.errors import ConfigError
from plaza.model_control import (
    DesiredModel,
    ServedConfig,
    loaded_records,
    read_model,
    step_specs,
)
from plaza.repository import ModelRepository
from plaza.workers.ensemble import _check_step_versions
from tests.unit.test_ensemble_graph_checks import ens, sim


def repo(root: Path, **configs: str) -> ModelRepository:
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(config)
    return ModelRepository(root)


def record(
    r: ModelRepository, name: str, config: str = "", versions: tuple[int, ...] = (1,)
) -> ServedConfig:
    """What a load of ``name`` (with the override ``config``) records in the model table."""
    spec = read_model(r, name, config).spec
    return ServedConfig(1, json.dumps(spec.config_json()), versions)


def int32_override() -> str:
    return json.dumps(
        {
            "backend": "plaza_simulated",
            "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        }
    )


def test_an_ensemble_is_checked_against_the_config_its_step_is_loaded_with(
    tmp_path: Path,
) -> None:
    r = repo(
        tmp_path, step=sim("step"), e=ens("e", "step"), e_int=ens("e_int", "step", io="TYPE_INT32")
    )
    loaded = {"step": record(r, "step", int32_override())}
    assert set(step_specs(r, r.spec("e_int"), loaded)) == {"step"}
    with pytest.raises(ConfigError, match=r"ensemble input is FP32, but step 0 .* is INT32"):
        step_specs(r, r.spec("e"), loaded)
    # mode none (no table): the repository's config, as before
    step_specs(r, r.spec("e"))
    with pytest.raises(ConfigError, match="is INT32, but step 0"):
        step_specs(r, r.spec("e_int"))


def test_only_loaded_unfailed_entries_with_a_record_count(tmp_path: Path) -> None:
    r = repo(tmp_path, a=sim("a"))
    pinned = record(r, "a")
    table = {
        "a": DesiredModel("a", True, 1, pinned=pinned),
        "b": DesiredModel("b", True, 1, failed="bad", pinned=pinned),
        "c": DesiredModel("c", False, 1, pinned=pinned),
        "d": DesiredModel("d", True, 1),
    }
    assert loaded_records(table) == {"a": pinned}


def versioned(root: Path) -> ModelRepository:
    """``step`` serving its newest version, 1 when loaded and 2 on disk now."""
    r = repo(root, step=sim("step"), e1=ens("e1", "step"), e2=ens("e2", "step"))
    shutil.copytree(root / "step" / "1", root / "step" / "2")
    for name, version in (("e1", 1), ("e2", 2)):
        config = (root / name / "config.pbtxt").read_text()
        config = config.replace("model_version: -1", f"model_version: {version}")
        (root / name / "config.pbtxt").write_text(config)
    return r


def test_a_runner_checks_step_versions_against_those_the_step_is_loaded_with(
    tmp_path: Path,
) -> None:
    r = versioned(tmp_path)
    loaded = {"step": record(r, "step", versions=(1,))}
    e1, e2 = r.spec("e1"), r.spec("e2")
    _check_step_versions(r, e1, step_specs(r, e1, loaded), loaded)
    with pytest.raises(ConfigError, match=r"version 2 is not served \(.* serves \[1\]\)"):
        _check_step_versions(r, e2, step_specs(r, e2, loaded), loaded)
    # no table: the repository's selection (the newest folder, 2)
    _check_step_versions(r, e2, step_specs(r, e2), {})
    with pytest.raises(ConfigError, match="version 1 is not served"):
        _check_step_versions(r, e1, step_specs(r, e1), {})


@pytest.mark.parametrize(("step_mbs", "refused"), [(4, True), (16, False), (0, False)])
def test_a_batching_step_must_allow_the_ensembles_max_batch_size(
    tmp_path: Path, step_mbs: int, refused: bool
) -> None:
    # a non-batching step under a batching ensemble is allowed where shapes agree (Triton)
    dims = "-1, -1" if step_mbs == 0 else "-1"
    r = repo(tmp_path, step=sim("step", dims=dims, mbs=step_mbs), e=ens("e", "step", mbs=8))
    if not refused:
        assert set(step_specs(r, r.spec("e"))) == {"step"}
        return
    with pytest.raises(
        ConfigError,
        match=r"step 0 \(model 'step'\): the ensemble allows maximum "
        r"batch size 8, but model 'step' only allows maximum batch size 4",
    ) as err:
        step_specs(r, r.spec("e"))
    assert err.value.code == "bad_config"
    assert err.value.details["field"] == "max_batch_size"


def test_the_max_batch_size_a_step_is_loaded_with_counts(tmp_path: Path) -> None:
    r = repo(tmp_path, step=sim("step", mbs=16), e=ens("e", "step", mbs=16))
    small = json.loads(int32_override())
    small["max_batch_size"] = 4
    for tensor in (*small["input"], *small["output"]):
        tensor["data_type"] = "TYPE_FP32"
    loaded = {"step": record(r, "step", json.dumps(small))}
    step_specs(r, r.spec("e"))
    with pytest.raises(ConfigError, match="only allows maximum batch size 4"):
        step_specs(r, r.spec("e"), loaded)
