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
    (tmp_path / "warmup" / "x.bin").write_bytes(np.arange(8, dtype="<f4").tobytes())
    (tmp_path / "warmup" / "s.bin").write_bytes(serialize_bytes(np.array([b"a", b"bc"], object)))
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
    assert by_name["x"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert by_name["s"].tolist() == [[b"a"], [b"bc"]]


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
        (f'name: "short" batch_size: 2 {from_file("x.bin")}', "has 16 bytes"),
        ('name: "empty" batch_size: 1', "has no inputs"),
    ],
)
def test_a_sample_that_cannot_be_made_is_a_bad_config_naming_it(
    tmp_path: Path, entry: str, why: str
) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(np.zeros(4, "<f4").tobytes())
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
