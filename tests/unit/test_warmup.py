"""model_warmup (``workers/warmup.py``): samples made from zeros, seeded random values and
files, the config errors that name them, and runs on a runner that leave no statistics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plaza.errors import ConfigError, ModelExecutionError
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.tensors import serialize_bytes
from plaza.workers import warmup
from plaza.workers.runner import BatchRunner

MODEL = """
name: "m" platform: "onnxruntime_onnx" max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }},
        {{ name: "s" data_type: TYPE_STRING dims: [ 1 ] optional: true }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{warmup}
"""


def spec(*entries: str) -> ModelSpec:
    text = MODEL.format(warmup="\n".join(f"model_warmup [ {{ {e} }} ]" for e in entries))
    return parse_model_config(text, source="m/config.pbtxt", default_name="m")


def x(kind: str, dims: str = "4") -> str:
    return f'inputs {{ key: "x" value {{ data_type: TYPE_FP32 dims: [ {dims} ] {kind} }} }}'


def from_file(name: str, dims: str = "4") -> str:
    return x(f'input_data_file: "{name}"', dims)


def test_zero_random_and_file_samples_become_requests(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
    (tmp_path / "warmup" / "s.bin").write_bytes(serialize_bytes(np.array([b"bc"], object)))
    made = warmup.samples(
        spec(
            f'name: "zeros" batch_size: 3 {x("zero_data: true")} count: 2',
            f'name: "random" batch_size: 1 {x("random_data: true")}',
            f'name: "file" batch_size: 2 {from_file("x.bin")} '
            'inputs { key: "s" value { data_type: TYPE_STRING dims: [ 1 ] '
            'input_data_file: "s.bin" } }',
        ),
        tmp_path,
    )
    assert [(s.name, s.rows, s.count) for s in made] == [
        ("zeros", 3, 2),
        ("random", 1, 1),
        ("file", 2, 1),
    ]
    zeros, random, file = (s.request for s in made)
    assert zeros.inputs[0].to_numpy().tolist() == [[0.0] * 4] * 3
    values = random.inputs[0].to_numpy()
    assert values.shape == (1, 4) and values.min() >= 0 and values.max() < 1
    again = warmup.samples(spec(f'name: "random" batch_size: 1 {x("random_data: true")}'), tmp_path)
    assert again[0].request.inputs[0].to_numpy().tolist() == values.tolist()  # seeded
    by_name = {t.name: t.to_numpy() for t in file.inputs}
    assert by_name["x"].tolist() == [[0, 1, 2, 3]] * 2  # one element, on every row
    assert by_name["s"].tolist() == [[b"bc"]] * 2


def test_a_file_holds_one_element_which_every_row_repeats_as_in_triton(tmp_path: Path) -> None:
    """Triton reads one batch-1 element from the file (its first bytes: a longer file is
    accepted) and makes batch_size requests of it; a BYTES file is the element's strings."""
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(np.arange(5, dtype="<f4").tobytes())  # 4 + 1
    (tmp_path / "warmup" / "s.bin").write_bytes(serialize_bytes(np.array([b"hi"], object)))
    strings = (
        'inputs { key: "s" value { data_type: TYPE_STRING dims: [ 1 ] input_data_file: "s.bin" } }'
    )
    (made,) = warmup.samples(
        spec(f'name: "f" batch_size: 4 {from_file("x.bin")} {strings}'), tmp_path
    )
    by_name = {t.name: t.to_numpy() for t in made.request.inputs}
    assert made.rows == 4
    assert by_name["x"].tolist() == [[0.0, 1.0, 2.0, 3.0]] * 4
    assert by_name["s"].tolist() == [[b"hi"]] * 4
    (tmp_path / "warmup" / "s.bin").write_bytes(serialize_bytes(np.array([b"a", b"b"], object)))
    with pytest.raises(ConfigError, match="trailing bytes"):  # two strings for one element
        warmup.samples(spec(f'name: "f" batch_size: 1 {from_file("x.bin")} {strings}'), tmp_path)


SEQUENCE_MODEL = """
name: "acc" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
model_warmup [ { name: "seq" batch_size: 1
  inputs { key: "INPUT" value { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  %s } ]
"""


def _one(name: str) -> str:
    return (
        f'inputs {{ key: "{name}" value {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }} }}'
    )


def test_a_stateful_sample_may_name_its_control_and_state_inputs(tmp_path: Path) -> None:
    """Triton's sample names them (override inputs there); the worker adds its own, so they
    are left out of the request, and any other unknown name is still refused."""
    named = " ".join(_one(n) for n in ("START", "READY", "SUM_IN"))
    s = parse_model_config(SEQUENCE_MODEL % named, source="acc/config.pbtxt", default_name="acc")
    (made,) = warmup.samples(s, tmp_path)
    assert [t.name for t in made.request.inputs] == ["INPUT"]
    assert made.request.parameters["sequence_start"] is True
    other = parse_model_config(
        SEQUENCE_MODEL % _one("END"), source="acc/config.pbtxt", default_name="acc"
    )
    with pytest.raises(ConfigError, match="input 'END', which the model does not have"):
        warmup.samples(other, tmp_path)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (f'name: "big" batch_size: 9 {x("zero_data: true")}', "batch_size 9 is outside 1..8"),
        (f'name: "none" batch_size: 1 {x("")}', "one of zero_data, random_data"),
        (
            'name: "who" batch_size: 1 inputs { key: "z" value { data_type: TYPE_FP32 '
            "dims: [ 1 ] zero_data: true } }",
            "input 'z', which the model does not have",
        ),
        (f'name: "wide" batch_size: 1 {x("zero_data: true", "5")}', "does not match dims"),
        (f'name: "gone" batch_size: 1 {from_file("no.bin")}', "cannot read"),
        (f'name: "up" batch_size: 1 {from_file("../config.pbtxt")}', "not a file"),
        (f'name: "short" batch_size: 1 {from_file("short.bin")}', "has 12 bytes"),
        ('name: "empty" batch_size: 1', "has no inputs"),
    ],
)
def test_a_sample_that_cannot_be_made_is_a_bad_config_naming_it(
    tmp_path: Path, entry: str, why: str
) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(np.zeros(4, "<f4").tobytes())
    (tmp_path / "warmup" / "short.bin").write_bytes(np.zeros(3, "<f4").tobytes())
    with pytest.raises(ConfigError) as info:
        warmup.samples(spec(entry), tmp_path)
    assert "model_warmup[0]" in info.value.message and why in info.value.message
    assert info.value.code == "bad_config"


class Counting:
    """A backend that counts its calls; ``fail`` makes each call raise."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[int, ...]] = []
        self.fail = fail

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        self.calls.append(inputs["x"].shape)
        if self.fail:
            raise RuntimeError("cannot run")
        return {"y": inputs["x"] + 1}


def test_each_sample_runs_count_times_and_is_left_out_of_the_statistics(tmp_path: Path) -> None:
    s = spec(
        f'name: "a" batch_size: 2 {x("zero_data: true")} count: 3',
        f'name: "b" batch_size: 5 {x("random_data: true")}',
    )
    observed: list[Any] = []
    backend = Counting()
    runner = BatchRunner(s, {1: backend}, observer=lambda *a: observed.append(a))  # type: ignore[dict-item]
    warmup.run(runner, 1, warmup.samples(s, tmp_path))
    assert backend.calls == [(2, 4)] * 3 + [(5, 4)]
    assert observed == []


def test_a_sample_that_fails_fails_the_load(tmp_path: Path) -> None:
    s = spec(f'name: "a" batch_size: 1 {x("zero_data: true")}')
    runner = BatchRunner(s, {1: Counting(fail=True)})  # type: ignore[dict-item]
    with pytest.raises(ModelExecutionError, match=r"warmup sample 'a' failed: .*cannot run"):
        warmup.run(runner, 1, warmup.samples(s, tmp_path))
