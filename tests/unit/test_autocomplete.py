"""A config made from an ONNX model whose folder has no config.pbtxt (``plaza.autocomplete``,
Triton's auto-completed configuration): batching or not by the first dims, Triton's types,
what the repository lists, and files it cannot describe."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from plaza.autocomplete import signature
from plaza.errors import ConfigError
from plaza.model_control import model_spec
from plaza.repository import ModelRepository


def write_model(
    folder: Path,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    version: str = "1",
) -> Path:
    """An ONNX model passing each input to the output of the same position (Identity)."""
    nodes = [
        helper.make_node("Identity", [i.name], [o.name])
        for i, o in zip(inputs, outputs, strict=True)
    ]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (folder / version).mkdir(parents=True, exist_ok=True)
    path = folder / version / "model.onnx"
    onnx.save(model, str(path))
    return path


def tensor(name: str, elem: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def test_a_model_whose_first_dims_are_free_batches(tmp_path: Path) -> None:
    write_model(
        tmp_path / "ranker",
        [
            tensor("x", TensorProto.FLOAT, ["batch", 4]),
            tensor("ids", TensorProto.INT64, ["b", "s"]),
        ],
        [
            tensor("y", TensorProto.FLOAT, ["batch", 4]),
            tensor("ids_out", TensorProto.INT64, ["b", "s"]),
        ],
    )
    repo = ModelRepository(tmp_path)
    assert repo.model_names() == ["ranker"]
    spec = repo.spec("ranker")
    assert (spec.platform, spec.max_batch_size, spec.batching.enabled) == (
        "onnxruntime_onnx",
        4,
        True,
    )
    assert [(t.name, t.datatype, t.dims) for t in spec.inputs] == [
        ("x", "FP32", (4,)),
        ("ids", "INT64", (-1,)),
    ]
    assert [(t.name, t.dims) for t in spec.outputs] == [("y", (4,)), ("ids_out", (-1,))]
    batching = spec.config_json()["dynamic_batching"]  # added, every field at its default
    assert (batching["max_queue_delay_microseconds"], batching["preferred_batch_size"]) == (0, [])
    assert [mv.path.name for mv in repo.served_versions("ranker")] == ["model.onnx"]


def test_a_model_with_a_fixed_first_dim_does_not_batch(tmp_path: Path) -> None:
    write_model(
        tmp_path / "fixed",
        [tensor("x", TensorProto.STRING, [2, "n"])],
        [tensor("y", TensorProto.STRING, [2, "n"])],
    )
    spec = ModelRepository(tmp_path).spec("fixed")
    assert (spec.max_batch_size, spec.batching.enabled) == (0, False)
    assert [(t.datatype, t.dims) for t in spec.inputs] == [("BYTES", (2, -1))]


def test_a_written_config_wins_and_the_newest_version_describes_the_model(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    write_model(
        folder,
        [tensor("old", TensorProto.FLOAT, ["b", 1])],
        [tensor("o", TensorProto.FLOAT, ["b", 1])],
    )
    write_model(
        folder,
        [tensor("new", TensorProto.FLOAT, ["b", 1])],
        [tensor("o", TensorProto.FLOAT, ["b", 1])],
        "2",
    )
    repo = ModelRepository(tmp_path)
    assert [t.name for t in repo.spec("m").inputs] == ["new"]
    (folder / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx" max_batch_size: 8 '
        'input [ { name: "new" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "o" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    )
    assert repo.spec("m").max_batch_size == 8


def test_the_model_file_is_read_once_until_it_changes(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    path = write_model(
        folder,
        [tensor("a", TensorProto.FLOAT, ["b", 1])],
        [tensor("o", TensorProto.FLOAT, ["b", 1])],
    )
    repo = ModelRepository(tmp_path)
    assert signature(path) is signature(path)
    assert [t.name for t in repo.spec("m").inputs] == ["a"]
    write_model(
        folder,
        [tensor("z", TensorProto.FLOAT, ["b", 1])],
        [tensor("o", TensorProto.FLOAT, ["b", 1])],
    )
    os.utime(path, ns=(1, 1))  # a clearly different modification time
    assert [t.name for t in repo.spec("m").inputs] == ["z"]


@pytest.mark.parametrize(
    ("inputs", "why"),
    [
        ([tensor("x", TensorProto.BFLOAT16, ["b", 2])], "no Triton type"),
        ([tensor("x", TensorProto.FLOAT, [])], "scalar of a model that does not batch"),
    ],
)
def test_a_model_it_cannot_describe_asks_for_a_config(
    tmp_path: Path,
    inputs: list[onnx.ValueInfoProto],
    why: str,
) -> None:
    write_model(tmp_path / "m", inputs, [tensor("o", inputs[0].type.tensor_type.elem_type, [])])
    with pytest.raises(ConfigError, match=why) as info:
        ModelRepository(tmp_path).spec("m")
    assert "in config.pbtxt" in info.value.message


def test_a_file_that_is_not_a_model_is_a_bad_config(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(ConfigError, match="cannot read the model"):
        ModelRepository(tmp_path).spec("m")


MINIMAL = 'platform: "onnxruntime_onnx"\n'


@pytest.mark.parametrize(
    ("written", "batch", "x_dims"),
    [
        ("", 4, (3,)),  # names nothing: batching found from the model, as with no config
        ("max_batch_size: 16", 16, (3,)),  # its own batch size; the dims past the batch dim
        # refused below: a field autocomplete cannot make right
        ('platform: "onnxruntime_onnx" sequence_batching { iterative_sequence: true }', 0, None),
    ],
)
def test_a_config_that_names_no_tensors_gets_the_models(
    tmp_path: Path, written: str, batch: int, x_dims: tuple[int, ...] | None
) -> None:
    write_model(
        tmp_path / "m",
        [tensor("x", TensorProto.FLOAT, ["b", 3])],
        [tensor("y", TensorProto.FLOAT, ["b", 3])],
    )
    (tmp_path / "m" / "config.pbtxt").write_text(written)
    repo = ModelRepository(tmp_path)
    if x_dims is None:
        with pytest.raises(ConfigError, match="sequence_batching"):
            repo.spec("m")
        return
    spec = repo.spec("m")
    assert (spec.platform, spec.max_batch_size) == ("onnxruntime_onnx", batch)
    assert [(t.name, t.dims) for t in spec.inputs] == [("x", x_dims)]
    assert [(t.name, t.dims) for t in spec.outputs] == [("y", x_dims)]


def test_what_a_config_names_stays_as_written(tmp_path: Path) -> None:
    write_model(
        tmp_path / "m",
        [tensor("x", TensorProto.FLOAT, ["b", 3])],
        [tensor("y", TensorProto.FLOAT, ["b", 3])],
    )
    (tmp_path / "m" / "config.pbtxt").write_text(
        MINIMAL + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]'
    )
    spec = ModelRepository(tmp_path).spec("m")
    assert spec.max_batch_size == 0  # named inputs: its batch size is the config's (none)
    assert [(t.name, t.dims) for t in spec.outputs] == [("y", (-1, 3))]  # the whole shape
    other = tmp_path / "t"
    (other / "1").mkdir(parents=True)
    (other / "config.pbtxt").write_text('platform: "pytorch_libtorch" max_batch_size: 2')
    with pytest.raises(ConfigError, match="at least one is required"):
        ModelRepository(tmp_path).spec("t")  # only ONNX models are completed


def test_a_load_requests_override_is_completed_too(tmp_path: Path) -> None:
    """Triton's load API takes a config in JSON; one that names only a batch size gets the
    model's tensors, as a config.pbtxt would."""
    write_model(
        tmp_path / "m",
        [tensor("x", TensorProto.FLOAT, ["b", 3])],
        [tensor("y", TensorProto.FLOAT, ["b", 3])],
    )
    spec = model_spec(ModelRepository(tmp_path), "m", '{"max_batch_size": 2}')
    assert spec.max_batch_size == 2 and [(t.name, t.dims) for t in spec.inputs] == [("x", (3,))]


def test_with_auto_complete_off_a_config_is_used_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton's --disable-auto-complete-config (``disable_auto_complete_config``): an ONNX
    model without a config is a bad_config, not completed from its file, and a Python
    model's auto_complete_config never runs (no child process is even started)."""
    from plaza import autocomplete_python
    from plaza.settings import PlazaSettings
    from plaza.stack import Deployment

    write_model(
        tmp_path / "bare",
        [tensor("x", TensorProto.FLOAT, ["b", 4])],
        [tensor("y", TensorProto.FLOAT, ["b", 4])],
    )
    (tmp_path / "py" / "1").mkdir(parents=True)
    (tmp_path / "py" / "config.pbtxt").write_text('backend: "python"')
    (tmp_path / "py" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(config):\n"
        "        return config\n"
    )

    def no_child(path: str, written: str) -> object:
        raise AssertionError("auto_complete_config ran with completion off")

    monkeypatch.setattr(autocomplete_python, "run_child", no_child)
    settings = PlazaSettings(repository=tmp_path, disable_auto_complete_config=True)
    repo = ModelRepository.of(settings)
    assert not repo.auto_complete and repo.model_names() == ["bare", "py"]
    with pytest.raises(ConfigError, match=r"no config.pbtxt, and completion is off.*platform"):
        repo.spec("bare")
    with pytest.raises(ConfigError, match="field 'input'"):
        repo.spec("py")
    with pytest.raises(ConfigError, match="field 'input'"):
        model_spec(repo, "py", '{"backend": "python"}')
    assert ModelRepository(tmp_path).spec("bare").inputs[0].name == "x"  # on by default
    deployment = Deployment("k:9092", "redis://r", tmp_path, disable_auto_complete_config=True)
    assert deployment.env()["PLAZA_DISABLE_AUTO_COMPLETE_CONFIG"] == "True"
    assert deployment.settings().disable_auto_complete_config
