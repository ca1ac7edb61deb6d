"""Triton's classification extension (``workers/classification.py``): top classes as
``value:index[:label]`` strings, the labels files, and the requests that cannot ask it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plaza.client import make_request
from plaza.errors import ConfigError, InvalidInput
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.tensors import Tensor
from plaza.validation import validate_request
from plaza.workers.classification import classify, labels


def spec(label: str = "", max_batch_size: int = 4) -> ModelSpec:
    text = f"""
    name: "m" platform: "onnxruntime_onnx" max_batch_size: {max_batch_size}
    input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }} ]
    output [ {{ name: "p" data_type: TYPE_FP32 dims: [ 3 ] {label} }},
             {{ name: "s" data_type: TYPE_STRING dims: [ 1 ] }} ]
    """
    return parse_model_config(text, source="m/config.pbtxt", default_name="m")


def strings(tensor: Tensor) -> list[list[str]] | list[str]:
    return tensor.to_numpy().astype(str).tolist()  # type: ignore[no-any-return]


def test_each_row_gives_its_largest_values_first_with_labels() -> None:
    p = Tensor.from_numpy("p", np.array([[0.1, 0.7, 0.2], [0.5, 0.5, 0.9]], np.float32))
    top = classify(p, 2, batched=True, names=["cat", "dog"])
    assert top.datatype == "BYTES" and top.shape == (2, 2)
    assert strings(top) == [
        ["0.700000:1:dog", "0.200000:2"],  # index 2 has no label
        ["0.900000:2", "0.500000:0:cat"],  # a tie goes to the lower index
    ]


def test_the_count_is_cut_to_the_classes_there_are_and_integers_print_as_integers() -> None:
    p = Tensor.from_numpy("p", np.array([[3, 9, 1]], np.int64))
    assert strings(classify(p, 10, batched=True)) == [["9:1", "3:0", "1:2"]]
    whole = Tensor.from_numpy("p", np.array([[0.0, 1.0], [2.0, 0.5]], np.float32))
    assert strings(classify(whole, 1, batched=False)) == ["2.000000:2"]


def test_labels_come_from_the_files_the_outputs_name(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    assert labels(spec('label_filename: "labels.txt"'), tmp_path) == {"p": ["cat", "dog"]}
    assert labels(spec(), tmp_path) == {}
    with pytest.raises(ConfigError, match=r"output\[0\].label_filename: cannot read"):
        labels(spec('label_filename: "gone.txt"'), tmp_path)
    with pytest.raises(ConfigError, match="is not a file name"):
        labels(spec('label_filename: "../labels.txt"'), tmp_path / "sub")


@pytest.mark.parametrize(
    ("outputs", "counts", "why"),
    [
        ((), {"q": 2}, "classification of unknown output 'q'"),
        (("s",), {"p": 2}, "output 'p' is to be classified but is not requested"),
        ((), {"s": 1}, "output 's' is BYTES"),
        ((), {"p": 0}, "classification count must be >= 1"),
    ],
)
def test_a_classification_the_model_cannot_give_is_invalid(
    outputs: tuple[str, ...], counts: dict[str, int], why: str
) -> None:
    x = {"x": np.zeros((1, 3), np.float32)}
    ok = make_request("m", x, classification={"p": 2})
    assert validate_request(ok, spec()) == 1
    bad = make_request("m", x, outputs=outputs, classification=counts)
    with pytest.raises(InvalidInput, match=why):
        validate_request(bad, spec())
