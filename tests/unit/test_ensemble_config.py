"""Ensembles in config.pbtxt: Triton's ensemble_scheduling parsed, the step graph checked,
and the step requests the runner builds from it (pure logic, no services)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plaza.client import make_request
from plaza.contract import ErrorInfo, InferResult
from plaza.ensembles import EnsembleStep, downstream_of, runnable
from plaza.errors import ConfigError
from plaza.modelconfig import PLATFORM_ENSEMBLE, parse_model_config
from plaza.repository import ModelRepository
from plaza.tensors import Tensor
from plaza.workers.ensemble import StepFailed, step_outputs, step_request

# As Triton's documentation writes one: add_sub -> two steps in parallel -> add_sub.
FAN = """
name: "fan"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "X" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "Y" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "TWO_X" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "X" }
      input_map { key: "INPUT1" value: "Y" }
      output_map { key: "OUTPUT0" value: "SUM" }
      output_map { key: "OUTPUT1" value: "DIFF" }
    },
    {
      model_name: "copy"
      model_version: 2
      input_map { key: "INPUT0" value: "SUM" }
      output_map { key: "OUTPUT0" value: "SUM2" }
    },
    {
      model_name: "copy"
      model_version: -1
      input_map { key: "INPUT0" value: "DIFF" }
      output_map { key: "OUTPUT0" value: "DIFF2" }
    },
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "SUM2" }
      input_map { key: "INPUT1" value: "DIFF2" }
      output_map { key: "OUTPUT0" value: "TWO_X" }
    }
  ]
}
"""


def spec(text: str = FAN, name: str = "fan"):
    return parse_model_config(text, source=f"{name}/config.pbtxt", default_name=name)


def test_triton_ensemble_config_parses_into_steps() -> None:
    s = spec()
    assert s.platform == PLATFORM_ENSEMBLE and s.is_ensemble
    assert [(st.index, st.model_name, st.model_version) for st in s.ensemble_steps] == [
        (0, "add_sub", -1),
        (1, "copy", 2),
        (2, "copy", -1),
        (3, "add_sub", -1),
    ]
    first = s.ensemble_steps[0]
    assert dict(first.input_map) == {"INPUT0": "X", "INPUT1": "Y"}
    assert dict(first.output_map) == {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}
    assert (first.version, s.ensemble_steps[1].version) == ("", "2")
    assert s.config_json()["ensemble_scheduling"]["step"][1]["model_name"] == "copy"
    assert s.default_model_filename == ""


def test_steps_become_runnable_as_their_inputs_appear() -> None:
    steps = spec().ensemble_steps
    assert [s.index for s in runnable(steps, {"X", "Y"}, set())] == [0]
    after_first = {"X", "Y", "SUM", "DIFF"}
    assert [s.index for s in runnable(steps, after_first, {0})] == [1, 2]  # fan-out
    assert [s.index for s in runnable(steps, after_first | {"SUM2"}, {0, 1, 2})] == []
    assert [s.index for s in runnable(steps, after_first | {"SUM2", "DIFF2"}, {0, 1, 2})] == [3]


def test_a_cycle_is_refused_naming_its_steps() -> None:
    text = FAN.replace(
        'input_map { key: "INPUT0" value: "SUM" }', 'input_map { key: "INPUT0" value: "TWO_X" }'
    )
    with pytest.raises(ConfigError) as err:
        spec(text)
    assert "cycle" in err.value.message
    assert (
        "step 1 (model 'copy')" in err.value.message
        and "step 3 (model 'add_sub')" in err.value.message
    )


def test_a_step_input_nobody_produces_is_refused() -> None:
    text = FAN.replace(
        'value: "DIFF" }\n      output_map { key: "OUTPUT0" value: "DIFF2" }',
        'value: "NOPE" }\n      output_map { key: "OUTPUT0" value: "DIFF2" }',
    )
    with pytest.raises(ConfigError) as err:
        spec(text)
    assert err.value.details["field"] == "ensemble_scheduling.step[2].input_map"
    assert "step 2 (model 'copy')" in err.value.message and "'NOPE'" in err.value.message


def test_a_tensor_with_two_producers_is_refused() -> None:
    text = FAN.replace(
        'output_map { key: "OUTPUT0" value: "DIFF2" }',
        'output_map { key: "OUTPUT0" value: "SUM2" }',
    )
    with pytest.raises(ConfigError) as err:
        spec(text)
    assert err.value.details["field"] == "ensemble_scheduling.step[2].output_map"
    assert "'SUM2'" in err.value.message and "step 1 already produces" in err.value.message


def test_a_step_may_not_overwrite_an_ensemble_input() -> None:
    text = FAN.replace(
        'output_map { key: "OUTPUT0" value: "SUM2" }', 'output_map { key: "OUTPUT0" value: "X" }'
    )
    with pytest.raises(ConfigError, match="an ensemble input"):
        spec(text)


def test_an_ensemble_output_no_step_produces_is_refused() -> None:
    text = FAN.replace('{ name: "SUM" data_type', '{ name: "NEVER" data_type')
    with pytest.raises(ConfigError, match="ensemble output 'NEVER' is not produced"):
        spec(text)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (FAN.split("ensemble_scheduling")[0], "at least one step"),
        (FAN.replace('model_name: "copy"\n      model_version: 2', 'model_name: ""'), "model_name"),
        (
            FAN.replace('model_name: "copy"\n      model_version: 2', 'model_name: "fan"'),
            "cannot call itself",
        ),
        (FAN.replace("model_version: 2", "model_version: -3"), "model_version"),
        (FAN.replace('platform: "ensemble"', 'platform: "onnxruntime_onnx"'), "only for platform"),
    ],
)
def test_bad_steps_are_refused(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        spec(text)


def test_an_ensemble_version_folder_may_be_empty(tmp_path: Path) -> None:
    (tmp_path / "fan" / "1").mkdir(parents=True)  # Triton: `1/` with nothing in it
    (tmp_path / "fan" / "config.pbtxt").write_text(FAN)
    versions = ModelRepository(tmp_path).served_versions("fan")
    assert [(v.version, v.path) for v in versions] == [(1, tmp_path / "fan" / "1")]


def test_a_step_request_inherits_deadline_priority_and_parameters() -> None:
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    req = make_request("fan", {"X": x, "Y": x}, timeout_s=5, priority=2, parameters={"k": 1})
    step = spec().ensemble_steps[0]
    have = {t.name: t for t in req.inputs}
    sreq = step_request(req, step, have, reply_stream="s:replies:r", priority=2)
    assert sreq.id == f"{req.id}.0" and sreq.model == "add_sub" and sreq.version == ""
    assert (sreq.deadline_ms, sreq.priority, sreq.parameters) == (req.deadline_ms, 2, {"k": 1})
    assert sorted(t.name for t in sreq.inputs) == ["INPUT0", "INPUT1"]
    assert sreq.reply.stream == "s:replies:r"
    assert sorted(sreq.outputs) == ["OUTPUT0", "OUTPUT1"]


def test_the_steps_downstream_of_a_step_read_its_outputs_directly_or_not() -> None:
    steps = spec().ensemble_steps  # 0 -> (1, 2) -> 3
    assert downstream_of(steps, 0) == {1, 2, 3}
    assert downstream_of(steps, 1) == {3}
    assert downstream_of(steps, 2) == {3}
    assert downstream_of(steps, 3) == set()


def test_a_step_answer_becomes_ensemble_tensors_or_an_error_naming_the_step() -> None:
    step = EnsembleStep(1, "mlp", -1, {"x": "A"}, {"y": "B"})
    out = Tensor.from_numpy("y", np.ones((1, 2), dtype=np.float32))
    ok = InferResult("r.1", "mlp", "1", outputs=(out,))
    assert step_outputs(step, ok)["B"].name == "B"
    bad = InferResult("r.1", "mlp", "1", error=ErrorInfo("invalid_input", "bad shape"))
    with pytest.raises(StepFailed) as err:
        step_outputs(step, bad)
    assert err.value.error == ErrorInfo("invalid_input", "step 1 (model 'mlp'): bad shape")
    with pytest.raises(StepFailed, match="has no output 'y'"):
        step_outputs(step, InferResult("r.1", "mlp", "1"))


def test_a_decoupled_step_needs_a_decoupled_ensemble_and_is_its_only_one(
    tmp_path: Path,
) -> None:
    from plaza.workers.ensemble import _decoupled_step, _step_specs

    def model(name: str, text: str) -> None:
        (tmp_path / name / "1").mkdir(parents=True, exist_ok=True)
        (tmp_path / name / "config.pbtxt").write_text(text)

    body = (
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },\n'
        '        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },\n'
        '         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
    )
    policy = "model_transaction_policy { decoupled: true }\n"
    model("add_sub", body + policy)
    model("copy", body)
    model("fan", FAN)
    repo = ModelRepository(tmp_path)
    fan = repo.spec("fan")
    with pytest.raises(ConfigError, match=r"step 0 \(model 'add_sub'\).*decoupled too") as err:
        _decoupled_step(fan, _step_specs(repo, fan))
    assert err.value.details["field"] == "ensemble_scheduling.step[0].model_name"
    model("fan", FAN.replace("max_batch_size: 8", "max_batch_size: 8\n" + policy))
    repo = ModelRepository(tmp_path)
    fan = repo.spec("fan")
    assert fan.decoupled
    with pytest.raises(ConfigError, match=r"step 3 .*a second decoupled step") as err:
        _decoupled_step(fan, _step_specs(repo, fan))  # add_sub runs at steps 0 and 3
    assert err.value.details["field"] == "ensemble_scheduling.step[3].model_name"
    model("add_sub", body)
    model("copy", body + policy)
    model("other", body)
    chain = FAN.replace('name: "fan"', 'name: "chain"').replace(
        "model_version: 2", "model_version: -1"
    )
    diff_step = '      model_version: -1\n      input_map { key: "INPUT0" value: "DIFF" }'
    chain = chain.replace(f'model_name: "copy"\n{diff_step}', f'model_name: "other"\n{diff_step}')
    model("chain", chain.replace("max_batch_size: 8", "max_batch_size: 8\n" + policy))
    repo = ModelRepository(tmp_path)
    chain_spec = repo.spec("chain")
    step = _decoupled_step(chain_spec, _step_specs(repo, chain_spec))
    assert step is not None and (step.index, step.model_name) == (1, "copy")
    model("copy", body)
    repo = ModelRepository(tmp_path)
    assert _decoupled_step(repo.spec("chain"), _step_specs(repo, repo.spec("chain"))) is None
