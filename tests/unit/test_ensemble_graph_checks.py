"""An ensemble checked against its step models' configs, as Triton checks it at load: step
models through nested ensembles (no cycle), datatypes and shapes along each edge, unknown
step models; and the models whose workers an ensemble needs, through nested ensembles."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaza.errors import ConfigError
from plaza.gateway.registry import ModelRegistry
from plaza.model_control import read_load, repository_specs, serving_models, step_specs
from plaza.repository import ModelRepository
from plaza.workers.ensemble import EnsembleRunner
from tests.support import make_settings


def sim(
    name: str, dtype: str = "TYPE_FP32", dims: str = "-1", *, out: str = "", mbs: int = 8
) -> str:
    return f"""
name: "{name}"
backend: "plaza_simulated"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: {dtype} dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: {out or dtype} dims: [ {dims} ] }} ]
"""


def ens(name: str, *steps: str, io: str = "TYPE_FP32", dims: str = "-1", mbs: int = 8) -> str:
    """An ensemble X -> steps[0] -> ... -> Y, each step a model of INPUT0/OUTPUT0 (or X/Y
    for a nested ensemble made by this function)."""
    body, tensor = [], "X"
    for i, model in enumerate(steps):
        made = "Y" if i == len(steps) - 1 else f"T{i}"
        key_in, key_out = ("X", "Y") if model.startswith("e_") else ("INPUT0", "OUTPUT0")
        body.append(
            f'{{ model_name: "{model}" model_version: -1 '
            f'input_map {{ key: "{key_in}" value: "{tensor}" }} '
            f'output_map {{ key: "{key_out}" value: "{made}" }} }}'
        )
        tensor = made
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: {mbs}
input [ {{ name: "X" data_type: {io} dims: [ {dims} ] }} ]
output [ {{ name: "Y" data_type: {io} dims: [ {dims} ] }} ]
ensemble_scheduling {{ step [ {", ".join(body)} ] }}
"""


OUT_OF_THREE = ens("e", "step").replace(
    'name: "Y" data_type: TYPE_FP32 dims: [ -1 ]', 'name: "Y" data_type: TYPE_FP32 dims: [ 3 ]'
)
"""An ensemble whose output Y is declared three wide."""


def repo(root: Path, **configs: str) -> ModelRepository:
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(config)
    return ModelRepository(root)


def checked(repository: ModelRepository, name: str) -> None:
    step_specs(repository, repository.spec(name))


def test_ensembles_that_call_each_other_are_refused_naming_the_cycle(tmp_path: Path) -> None:
    r = repo(tmp_path, e_a=ens("e_a", "e_b"), e_b=ens("e_b", "e_c"), e_c=ens("e_c", "e_a"))
    with pytest.raises(ConfigError, match="cycle: e_a -> e_b -> e_c -> e_a") as err:
        checked(r, "e_a")
    assert err.value.code == "bad_config"
    assert err.value.details["field"] == "ensemble_scheduling.step[0].model_name"
    with pytest.raises(ConfigError, match="cycle: e_a -> e_b -> e_c -> e_a"):
        read_load(r, "e_a")  # a load request is refused before anything is written


def test_an_ensemble_above_a_cycle_is_refused_too(tmp_path: Path) -> None:
    r = repo(tmp_path, e_top=ens("e_top", "e_a"), e_a=ens("e_a", "e_b"), e_b=ens("e_b", "e_a"))
    with pytest.raises(ConfigError, match=r"cycle: e_a -> e_b -> e_a \(through e_top -> e_a\)"):
        checked(r, "e_top")


def test_a_model_called_twice_without_a_cycle_is_accepted(tmp_path: Path) -> None:
    r = repo(
        tmp_path,
        copy=sim("copy"),
        e_in=ens("e_in", "copy", "copy"),
        e_out=ens("e_out", "e_in", "copy", "e_in"),
    )
    assert set(step_specs(r, r.spec("e_out"))) == {"e_in", "copy"}


def test_a_runner_refuses_to_start_on_a_cycle(tmp_path: Path) -> None:
    r = repo(tmp_path, e_a=ens("e_a", "e_b"), e_b=ens("e_b", "e_a"))
    settings = make_settings("127.0.0.1:1", "redis://127.0.0.1:1/0", "t", repository=r.root)
    for name, cycle in (("e_a", "e_a -> e_b -> e_a"), ("e_b", "e_b -> e_a -> e_b")):
        with pytest.raises(ConfigError, match=cycle):
            EnsembleRunner(
                settings.model_copy(
                    update={"worker": settings.worker.model_copy(update={"model": name})}
                )
            )


@pytest.mark.parametrize(
    ("configs", "match"),
    [
        (  # a step makes INT32, the ensemble declares FP32
            {"step": sim("step", out="TYPE_INT32"), "e": ens("e", "step")},
            r"'Y': step 0 \(model 'step'\) output 'OUTPUT0' is INT32, but the ensemble output "
            "is FP32",
        ),
        (  # the ensemble input is FP32, the step reads INT32
            {"step": sim("step", "TYPE_INT32"), "e": ens("e", "step", io="TYPE_FP32")},
            r"'X': ensemble input is FP32, but step 0 \(model 'step'\) input 'INPUT0' is INT32",
        ),
        (  # step 0 makes INT64, step 1 reads FP32
            {"a": sim("a", out="TYPE_INT64"), "b": sim("b"), "e": ens("e", "a", "b")},
            r"'T0': step 0 \(model 'a'\) output 'OUTPUT0' is INT64, but step 1 \(model 'b'\) "
            "input 'INPUT0' is FP32",
        ),
        (  # the step makes [-1, 4], the ensemble declares [-1, 3]
            {"step": sim("step", dims="4"), "e": OUT_OF_THREE},
            r"'Y': step 0 \(model 'step'\) output 'OUTPUT0' has shape \[-1, 4\], but the "
            r"ensemble output has shape \[-1, 3\]",
        ),
        (  # one dim against two
            {"step": sim("step", dims="2, 2"), "e": ens("e", "step", dims="4")},
            r"'X': ensemble input has shape \[-1, 4\], but step 0 \(model 'step'\) input "
            r"'INPUT0' has shape \[-1, 2, 2\]",
        ),
    ],
)
def test_an_edge_whose_ends_disagree_is_refused_naming_step_and_tensor(
    tmp_path: Path, configs: dict[str, str], match: str
) -> None:
    r = repo(tmp_path, **configs)
    with pytest.raises(ConfigError, match=match) as err:
        checked(r, "e")
    assert err.value.code == "bad_config"


def test_shapes_match_through_minus_one_and_the_batch_dim(tmp_path: Path) -> None:
    r = repo(
        tmp_path,
        fixed=sim("fixed", dims="4"),
        free=sim("free", dims="-1"),
        unbatched=sim("unbatched", dims="-1, 4", mbs=0),  # its batch dim is explicit
        reshaped=sim("reshaped", dims="4").replace(
            "dims: [ 4 ] }", "dims: [ 4 ] reshape: { shape: [ 2, 2 ] } }", 1
        ),
        e=ens("e", "fixed", "free", "unbatched", "reshaped", dims="4"),
    )
    assert set(step_specs(r, r.spec("e"))) == {"fixed", "free", "unbatched", "reshaped"}


def test_a_step_mapping_a_tensor_its_model_lacks_is_refused(tmp_path: Path) -> None:
    r = repo(tmp_path, step=sim("step"), e=ens("e", "step").replace('key: "OUTPUT0"', 'key: "OUT"'))
    with pytest.raises(ConfigError, match=r"step 0 \(model 'step'\): the model has no output"):
        checked(r, "e")


def test_an_unknown_step_model_fails_the_gateways_read(tmp_path: Path) -> None:
    r = repo(tmp_path, copy=sim("copy"), e_u=ens("e_u", "nosuch"), e_top=ens("e_top", "e_u"))
    settings = make_settings("127.0.0.1:1", "redis://127.0.0.1:1/0", "t", repository=r.root)
    registry = ModelRegistry(settings)
    registry.read_start_models()
    assert set(registry.models) == {"copy"}
    rows = {row.name: row for row in registry.index({"copy": 1})}
    for name in ("e_u", "e_top"):
        assert rows[name].state == "UNAVAILABLE"
        assert "step 0 (model 'nosuch')" in rows[name].reason
        assert "is not in the repository" in rows[name].reason


def test_serving_models_follows_nested_ensembles(tmp_path: Path) -> None:
    r = repo(
        tmp_path,
        copy=sim("copy"),
        other=sim("other"),
        e_in=ens("e_in", "copy"),
        e_out=ens("e_out", "e_in", "other"),
    )
    spec = r.spec("e_out")
    assert serving_models("e_out", spec, repository_specs(r)) == ["e_out", "e_in", "other", "copy"]
    assert serving_models("e_out", spec) == ["e_out", "e_in", "other"]  # no specs: one level
    assert serving_models("copy", r.spec("copy"), repository_specs(r)) == ["copy"]


def test_a_runner_refuses_a_step_pinned_to_a_version_not_served(tmp_path: Path) -> None:
    pinned = ens("e_v", "copy").replace("model_version: -1", "model_version: 7")
    r = repo(tmp_path, copy=sim("copy"), e_v=pinned)
    settings = make_settings("127.0.0.1:1", "redis://127.0.0.1:1/0", "t", repository=r.root)
    worker = settings.worker.model_copy(update={"model": "e_v"})
    with pytest.raises(ConfigError, match=r"step 0 \(model 'copy'\): version 7 is not served"):
        EnsembleRunner(settings.model_copy(update={"worker": worker}))
