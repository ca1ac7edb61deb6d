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


def test_an_index_with_an_empty_label_has_no_label_part() -> None:
    # Triton: ClassificationLabel gives nullptr for an empty label, and AddClassResults
    # appends ":label" only for a non-null one
    p = Tensor.from_numpy("p", np.array([[0.5, 0.25, 0.125]], np.float32))
    assert strings(classify(p, 3, batched=True, names=["", "dog"])) == [
        ["0.500000:0", "0.250000:1:dog", "0.125000:2"]
    ]


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_large_integers_are_compared_in_their_own_datatype(dtype: type) -> None:
    big = 2**53  # 2**53 + 1 is the same float64
    p = Tensor.from_numpy("p", np.array([big, big + 1, big - 1], dtype))
    assert strings(classify(p, 3, batched=False)) == [
        f"{big + 1}:1",
        f"{big}:0",
        f"{big - 1}:2",
    ]


def test_extreme_integers_keep_their_order_and_ties_go_to_the_lower_index() -> None:
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    signed = Tensor.from_numpy("p", np.array([low, high, 0, high, low], np.int64))
    assert strings(classify(signed, 5, batched=False)) == [
        f"{high}:1",
        f"{high}:3",
        "0:2",
        f"{low}:0",
        f"{low}:4",
    ]
    top = np.iinfo(np.uint64).max
    unsigned = Tensor.from_numpy("p", np.array([0, top, 1, top], np.uint64))
    assert strings(classify(unsigned, 4, batched=False)) == [f"{top}:1", f"{top}:3", "1:2", "0:0"]


def test_each_datatype_prints_as_triton_prints_it() -> None:
    # std::to_string: "%f" for float and double, an integer (int8/uint8 too) as an integer
    cases: list[tuple[np.ndarray, list[str]]] = [
        (np.array([-1.5, 1e20], np.float64), ["100000000000000000000.000000:1", "-1.500000:0"]),
        (np.array([0.1, -0.0], np.float32), ["0.100000:0", "-0.000000:1"]),
        (np.array([0.5, 2.0], np.float16), ["2.000000:1", "0.500000:0"]),
        (np.array([-128, 127], np.int8), ["127:1", "-128:0"]),
        (np.array([255, 7], np.uint8), ["255:0", "7:1"]),
        (np.array([False, True], np.bool_), ["1:1", "0:0"]),
    ]
    for values, expected in cases:
        assert strings(classify(Tensor.from_numpy("p", values), 2, batched=False)) == expected


def test_nan_comes_last() -> None:
    p = Tensor.from_numpy("p", np.array([np.nan, -np.inf, 1.0], np.float32))
    assert strings(classify(p, 3, batched=False)) == ["1.000000:2", "-inf:1", "nan:0"]


def test_a_labels_file_is_split_at_newlines_only(tmp_path: Path) -> None:
    # Triton reads it with std::getline: a form feed or U+2028 inside a label does not
    # start a new one (str.splitlines would, and shift every later label); CRLF is a line
    (tmp_path / "labels.txt").write_bytes("a\x0cb\nc\u2028d\r\n\ne\n".encode())
    found = labels(spec('label_filename: "labels.txt"'), tmp_path)
    assert found == {"p": ["a\x0cb", "c\u2028d", "", "e"]}
