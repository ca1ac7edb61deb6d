"""Triton's model loading API in pb_utils (``load_model``, ``unload_model``,
``is_model_ready``) without Kafka or Redis: the argument checks, what ``pb_utils`` hands the
process's loader, the refusals by phase (a real model process, and a real
``auto_complete_config`` child), and the loader's own refusals before any I/O (its Redis
address leads nowhere, so a check that let a call through would fail differently)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plaza.errors import ConfigError, ModelNotFound
from plaza.model_control import MODEL_CONTROL_DISABLED, read_load
from plaza.repository import ModelRepository
from plaza.settings import GatewaySettings, PlazaSettings, RedisSettings
from plaza.workers.backends import create_backend, pb_utils
from plaza.workers.backends.pb_model_loader import (
    LOAD_FAILED,
    READINESS_FAILED,
    UNLOAD_FAILED,
    ModelLoader,
    check_load,
    check_unload,
    parse_version,
)
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.device import CPU
from tests.python_models import write_repository
from tests.unit.test_python_autocomplete import hook, write_python_model
from tests.unit.test_python_backend import _item, _run

TritonModelException = pb_utils.TritonModelException
NOWHERE = "redis://127.0.0.1:1/0"
"""A Redis address where nothing answers: a call that got past the checks would fail there."""


@pytest.fixture(autouse=True)
def no_loader_left() -> Iterator[None]:
    """pb_utils' loader is process-wide: each test leaves it unset."""
    yield
    pb_utils.set_model_loading(None)


def settings(repo: Path, mode: str) -> PlazaSettings:
    return PlazaSettings(
        repository=repo,
        redis=RedisSettings(url=NOWHERE),
        gateway=GatewaySettings(model_control_mode=mode),  # type: ignore[arg-type]
    )


# -- the checks ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["none", "poll"])
def test_loads_and_unloads_need_explicit_mode_as_in_triton(mode: str) -> None:
    with pytest.raises(TritonModelException) as load:
        check_load("add_sub", "", None, mode)  # type: ignore[arg-type]
    with pytest.raises(TritonModelException) as unload:
        check_unload("add_sub", mode)  # type: ignore[arg-type]
    assert load.value.message().startswith(LOAD_FAILED + MODEL_CONTROL_DISABLED)
    assert unload.value.message().startswith(UNLOAD_FAILED + MODEL_CONTROL_DISABLED)
    assert f"gateway.model_control_mode is '{mode}'" in load.value.message()
    check_load("add_sub", "", None, "explicit")
    check_load("add_sub", '{"max_batch_size": 8}', {}, "explicit")  # no files: {} is none
    check_unload("add_sub", "explicit")


def test_file_overrides_are_refused_as_the_gateway_refuses_them() -> None:
    with pytest.raises(TritonModelException) as files:
        check_load("add_sub", "", {"file:1/model.onnx": b"\0"}, "explicit")
    assert files.value.message() == (
        "Failed to load model: failed to load 'add_sub': files=...: file overrides are not "
        "supported by Plaza (put the files in the model repository)"
    )
    with pytest.raises(TritonModelException, match="files should be a dictionary"):
        check_load("add_sub", "", [b"\0"], "explicit")


@pytest.mark.parametrize(
    ("name", "config", "words"),
    [("", "", "model_name must be a non-empty string"), ("m", {"a": 1}, "config must be a string")],
)
def test_bad_load_arguments_are_refused(name: str, config: Any, words: str) -> None:
    with pytest.raises(TritonModelException, match=words):
        check_load(name, config, None, "explicit")


def test_a_readiness_version_is_an_integer_string_or_empty() -> None:
    assert parse_version("") is None
    assert parse_version("3") == 3
    for bad in ("latest", "-1", 2):
        with pytest.raises(TritonModelException) as caught:
            parse_version(bad)
        assert caught.value.message().startswith(READINESS_FAILED)


def test_a_load_reads_the_model_before_anything_is_written(tmp_path: Path) -> None:
    repo = ModelRepository(write_repository(tmp_path, "add_sub"))
    assert read_load(repo, "add_sub").versions == (1,)
    with pytest.raises(ModelNotFound, match="failed to load 'nope': no such model"):
        read_load(repo, "nope")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        read_load(repo, "add_sub", "[1]")
    with pytest.raises(ConfigError) as broken:
        read_load(repo, "add_sub", '{"max_batch_size": "lots"}')
    assert broken.value.message.startswith("failed to load 'add_sub': ")
    assert broken.value.details["reason"] in broken.value.message


# -- pb_utils -------------------------------------------------------------------------------
class Recorder:
    """A loader that records what pb_utils hands it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def load(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        self.calls.append(("load", name, config, files))

    def unload(self, name: str, unload_dependents: bool) -> None:
        self.calls.append(("unload", name, unload_dependents))

    def ready(self, name: str, version: str) -> bool:
        self.calls.append(("ready", name, version))
        return True


def test_pb_utils_hands_each_call_to_the_processs_loader() -> None:
    recorder = Recorder()
    pb_utils.set_model_loading(recorder)
    pb_utils.load_model("add_sub")
    pb_utils.load_model("add_sub", config='{"max_batch_size": 4}', files=None)
    pb_utils.unload_model("add_sub", unload_dependents=True)
    assert pb_utils.is_model_ready("add_sub", "1") is True
    assert recorder.calls == [
        ("load", "add_sub", "", None),
        ("load", "add_sub", '{"max_batch_size": 4}', None),
        ("unload", "add_sub", True),
        ("ready", "add_sub", "1"),
    ]


def test_outside_the_process_and_in_finalize_the_api_is_refused() -> None:
    with pytest.raises(TritonModelException, match="runs only inside Plaza's Python backend"):
        pb_utils.load_model("add_sub")
    pb_utils.set_model_loading(None, "finalize")
    with pytest.raises(TritonModelException, match="is_model_ready is not supported during final"):
        pb_utils.is_model_ready("add_sub")


# -- the loader, before any I/O ---------------------------------------------------------------
def test_the_loader_refuses_before_it_reaches_redis(tmp_path: Path) -> None:
    root = write_repository(tmp_path, "add_sub")
    made: list[PlazaSettings] = []

    def explicit() -> PlazaSettings:
        made.append(settings(root, "explicit"))
        return made[-1]

    loader = ModelLoader(explicit)
    try:
        with pytest.raises(TritonModelException) as unknown:
            loader.load("nope", "", None)
        assert (
            unknown.value.message() == "Failed to load model: failed to load 'nope': no such model"
        )
        with pytest.raises(TritonModelException, match=r"parameters\.config must be a JSON object"):
            loader.load("add_sub", "[1]", None)
        with pytest.raises(TritonModelException, match="file overrides are not supported"):
            loader.load("add_sub", "", {"file:1/model.py": b""})
        assert len(made) == 1  # the settings are read once
    finally:
        loader.close()
    refusing = ModelLoader(lambda: settings(root, "none"))
    with pytest.raises(TritonModelException, match=MODEL_CONTROL_DISABLED):
        refusing.unload("add_sub", False)
    refusing.close()


def test_a_loader_that_cannot_reach_redis_raises_a_triton_model_exception(tmp_path: Path) -> None:
    root = write_repository(tmp_path, "add_sub")
    loader = ModelLoader(lambda: settings(root, "explicit"))
    try:
        with pytest.raises(TritonModelException) as caught:
            loader.unload("add_sub", False)
        assert caught.value.message().startswith(UNLOAD_FAILED)
    finally:
        loader.close()


# -- the phases, in a real model process -------------------------------------------------------
def test_initialize_and_execute_reach_the_loader_and_finalize_is_refused(tmp_path: Path) -> None:
    """Mode none: initialize's and execute's calls reach the loader, which refuses them by
    mode and files; finalize's call is refused before it."""
    root = write_repository(tmp_path, "refusals")
    mv = ModelRepository(root).served_versions("refusals")[0]
    backend = create_backend(mv, CPU, settings=settings(root, "none"))
    assert isinstance(backend, PythonBackend)
    backend.load()
    try:
        [result] = _run(mv, backend, [_item("refusals", {"IN": np.array([7], np.int32)})])
    finally:
        backend.unload()
    assert result.error is None, result.error
    errors = result.as_numpy()["ERRORS"]
    by_mode = f"{LOAD_FAILED}{MODEL_CONTROL_DISABLED}"
    assert [e.decode() for e in np.asarray(errors).reshape(-1)] == [
        f"{by_mode} (the model loading API needs model control mode explicit; "
        "gateway.model_control_mode is 'none')",
        "Failed to load model: failed to load 'add_sub': files=...: file overrides are not "
        "supported by Plaza (put the files in the model repository)",
        f"{UNLOAD_FAILED}{MODEL_CONTROL_DISABLED} (the model loading API needs model control "
        "mode explicit; gateway.model_control_mode is 'none')",
    ]
    finalized = (root / "refusals" / "finalize.txt").read_text()
    assert finalized == (
        "load_model is not supported during finalize (the model loading API runs in "
        "initialize and execute)"
    )


def test_auto_complete_config_may_not_load_models(tmp_path: Path) -> None:
    write_python_model(tmp_path, "hooked", hook('pb_utils.load_model("other")\nreturn config'))
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).spec("hooked")
    assert "load_model is not supported during auto_complete_config" in caught.value.message
