"""config.pbtxt parsing into Triton's ModelConfig, the repository layout, bad configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from plaza.autocomplete import model_file
from plaza.errors import ConfigError, ModelNotFound
from plaza.modelconfig import parse_model_config
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings

GOOD = """
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "x" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 32, 16 ]
  max_queue_delay_microseconds: 2000
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 }
  priority_queue_policy { key: 1 value { max_queue_size: 8 } }
}
version_policy { latest { num_versions: 2 } }
parameters { key: "intra_op_thread_count" value { string_value: "2" } }
"""


def spec(text: str = GOOD, name: str = "mlp"):
    return parse_model_config(text, source=f"{name}/config.pbtxt", default_name=name)


def test_good_config_parses_every_block() -> None:
    s = spec()
    assert (s.name, s.platform, s.max_batch_size, s.instance_count) == (
        "mlp",
        "onnxruntime_onnx",
        64,
        2,
    )
    assert s.inputs[0].datatype == "FP32" and s.inputs[0].dims == (512,)
    assert s.batching.preferred_batch_sizes == (16, 32)
    assert s.batching.max_queue_delay_us == 2000
    assert s.batching.priority_levels == 2 and s.batching.default_priority_level == 2
    assert not s.batching.default_queue_policy.reject_on_timeout
    assert s.batching.default_queue_policy.default_timeout_us == 5000
    assert s.batching.queue_policy(1).max_queue_size == 8
    assert s.version_policy.select([1, 2, 3]) == [2, 3]
    assert s.parameters == {"intra_op_thread_count": "2"}
    assert s.config_json()["dynamic_batching"]["max_queue_delay_microseconds"] == 2000


def test_defaults_name_from_folder_and_latest_one() -> None:
    s = spec(
        GOOD.replace('name: "mlp"', "").replace(
            "version_policy { latest { num_versions: 2 } }", ""
        ),
        name="other",
    )
    assert s.name == "other"
    assert s.version_policy.select([1, 4, 2]) == [4]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (('platform: "onnxruntime_onnx"', 'platform: "tensorflow_savedmodel"'), "platform"),
        (('name: "mlp"', 'name: "other"'), "name"),
        (("max_batch_size: 64", "max_batch_size: -1"), "max_batch_size"),
        (('input [ { name: "x" data_type: TYPE_FP32 dims: [ 512 ] } ]', "input [ ]"), "input"),
        (('{ name: "x" data_type: TYPE_FP32', "{ data_type: TYPE_FP32"), "input[0].name"),
        (("data_type: TYPE_FP32 dims: [ 512 ]", "dims: [ 512 ]"), "input[0].data_type"),
        (("dims: [ 512 ]", "dims: [ 0 ]"), "input[0].dims"),
        (
            ("preferred_batch_size: [ 32, 16 ]", "preferred_batch_size: [ 128 ]"),
            "dynamic_batching.preferred_batch_size",
        ),
        (
            ("default_priority_level: 2", "default_priority_level: 3"),
            "dynamic_batching.default_priority_level",
        ),
        (
            ("priority_queue_policy { key: 1", "priority_queue_policy { key: 5"),
            "dynamic_batching.priority_queue_policy",
        ),
        (("num_versions: 2", "num_versions: 0"), "version_policy.latest.num_versions"),
    ],
)
def test_bad_config_names_file_and_field(edit: tuple[str, str], field: str) -> None:
    old, new = edit
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        spec(GOOD.replace(old, new))
    assert "mlp/config.pbtxt" in info.value.message
    assert f"'{field}'" in info.value.message
    assert info.value.code == "bad_config"


_X = 'name: "x" data_type: TYPE_FP32 dims: [ 512 ]'
_DYNAMIC = GOOD[GOOD.index("dynamic_batching {") : GOOD.index("version_policy")]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ((_X, _X + " allow_ragged_batch: true"), "input[0].allow_ragged_batch"),
        ((_X, _X + " is_shape_tensor: true"), "input[0].is_shape_tensor"),
        (
            (
                "version_policy",
                'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" '
                'data_type: TYPE_INT32 source_input: "x" } ]\nversion_policy',
            ),
            "batch_input",
        ),
        (
            (
                "version_policy",
                'batch_output [ { target_name: "logits" '
                'kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]\nversion_policy',
            ),
            "batch_output",
        ),
    ],
)
def test_fields_plaza_would_ignore_wrongly_are_refused(edit: tuple[str, str], field: str) -> None:
    """Ragged or shape tensors: served as if the field were absent, the model would get
    wrong batches or shapes, so the config is refused (sequence_batching is served:
    tests/unit/test_sequence_batching.py)."""
    old, new = edit
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        spec(GOOD.replace(old, new, 1))
    assert f"field '{field}': is not supported" in info.value.message
    assert info.value.code == "bad_config"


def test_fields_that_only_tune_are_read_and_ignored() -> None:
    tuned = GOOD.replace("dynamic_batching {", "dynamic_batching {\n  preserve_ordering: true")
    tuned += "optimization { priority: PRIORITY_MAX }\n"
    assert spec(tuned).config.HasField("optimization")
    assert spec(tuned).config.dynamic_batching.preserve_ordering
    assert spec(GOOD.replace(_X, _X + " allow_ragged_batch: false")).inputs[0].name == "x"


def test_syntax_error_names_file_and_line() -> None:
    with pytest.raises(ConfigError, match=r"mlp/config.pbtxt: 2:\d+"):
        spec('name: "mlp"\nmax_batch_size: "lots"\n')


def test_unknown_field_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no_such_field"):
        spec(GOOD + "\nno_such_field: 1\n")


def _write_model(root: Path, name: str, config: str, versions: dict[str, str]) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    for version, filename in versions.items():
        (root / name / version).mkdir()
        if filename:
            (root / name / version / filename).write_bytes(b"onnx")


def test_repository_versions_and_model_files(tmp_path: Path) -> None:
    _write_model(tmp_path, "mlp", GOOD, {"1": "model.onnx", "3": "model.onnx", "x": ""})
    repo = ModelRepository(tmp_path)
    assert repo.model_names() == ["mlp"]
    assert repo.available_versions("mlp") == [1, 3]
    assert [mv.version for mv in repo.served_versions("mlp")] == [1, 3]
    assert repo.served_versions("mlp")[0].path == tmp_path / "mlp" / "1" / "model.onnx"


def test_only_triton_version_folders_count(tmp_path: Path) -> None:
    """Numbers in ASCII digits with no leading zero; a folder named otherwise is ignored
    (a ``0``, a ``01`` beside ``1``, other scripts' digits, which ``int`` would misread or
    refuse), never an error that fails the whole repository."""
    odd = ["0", "01", "\u00b2", "\u0663", "v2"]
    folders = {name: "model.onnx" for name in ["1", "3", *odd]}
    _write_model(tmp_path, "mlp", GOOD, folders)
    _write_model(tmp_path, "only_odd", GOOD, {name: "model.onnx" for name in odd})
    repo = ModelRepository(tmp_path)
    assert repo.available_versions("mlp") == [1, 3]
    assert [mv.version for mv in repo.served_versions("mlp")] == [1, 3]
    assert repo.available_versions("only_odd") == []
    assert model_file(tmp_path / "mlp") == tmp_path / "mlp" / "3" / "model.onnx"
    assert model_file(tmp_path / "only_odd") is None


def test_missing_model_file_names_the_file(tmp_path: Path) -> None:
    _write_model(tmp_path, "mlp", GOOD, {"1": "", "2": "model.onnx"})
    with pytest.raises(ConfigError, match=r"mlp/1/model.onnx: model file missing"):
        ModelRepository(tmp_path).served_versions("mlp")


def test_unknown_and_unsafe_model_names(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    with pytest.raises(ModelNotFound):
        repo.spec("nope")
    for bad in ("../etc", "a/b", "..", ""):
        with pytest.raises(Exception) as info:
            repo.spec(bad)
        assert getattr(info.value, "code", "") == "invalid_input"


def test_a_config_name_picks_each_models_named_config_where_it_has_one(tmp_path: Path) -> None:
    """Triton's --model-config-name: configs/<name>.pbtxt wins; config.pbtxt is the
    fallback; a model with only the named config is a model under that name alone."""
    _write_model(tmp_path, "mlp", GOOD, {"1": "model.onnx"})
    (tmp_path / "mlp" / "configs").mkdir()
    big = GOOD.replace("max_batch_size: 64", "max_batch_size: 128").replace(
        "preferred_batch_size: [ 32, 16 ]", "preferred_batch_size: [ 128 ]"
    )
    (tmp_path / "mlp" / "configs" / "big.pbtxt").write_text(big)
    only_named = GOOD.replace('name: "mlp"', "")
    (tmp_path / "solo" / "configs").mkdir(parents=True)
    (tmp_path / "solo" / "configs" / "big.pbtxt").write_text(only_named)
    named = ModelRepository(tmp_path, "big")
    assert named.model_names() == ["mlp", "solo"]
    assert named.spec("mlp").max_batch_size == 128
    assert named.spec("solo").name == "solo"  # the folder's name, not "configs"
    assert ModelRepository(tmp_path, "small").spec("mlp").max_batch_size == 64
    plain = ModelRepository(tmp_path)
    assert plain.model_names() == ["mlp"] and plain.spec("mlp").max_batch_size == 64


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "x y"])
def test_a_config_name_is_a_plain_file_stem(name: str) -> None:
    with pytest.raises(ValidationError):
        PlazaSettings(model_config_name=name)
    assert PlazaSettings(model_config_name="h100-v2.1").model_config_name == "h100-v2.1"


def test_a_repository_refuses_a_config_name_that_leads_elsewhere(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a file name's stem"):
        ModelRepository(tmp_path, "../../etc/x")


def test_decoupled_is_read_for_python_models_and_refused_where_plaza_cannot_stream() -> None:
    python = GOOD.replace('platform: "onnxruntime_onnx"', 'backend: "python"')
    policy = "model_transaction_policy { decoupled: true }\n"
    assert spec(python + policy).decoupled and not spec(python).decoupled
    with pytest.raises(ConfigError, match=r"decoupled.*not supported for onnxruntime_onnx") as err:
        spec(GOOD + policy)
    assert err.value.details["field"] == "model_transaction_policy.decoupled"
    stateful = (
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "sequence_batching { max_sequence_idle_microseconds: 1000 }\n"
    )
    assert spec(stateful).sequence.enabled
    with pytest.raises(ConfigError, match=r"decoupled.*not supported with sequence_batching"):
        spec(stateful + policy)
