"""A Python backend model that completes its own config (Triton's ``auto_complete_config``,
``plaza.autocomplete_python``): real model folders under tmp_path, each hook run in a real
child process; what the repository makes of them, the errors, and the cache."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from plaza import autocomplete_python
from plaza.errors import ConfigError
from plaza.model_control import model_spec
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository

HOOK_MODEL = """
import triton_python_backend_utils as pb_utils

from shapes import DIMS  # a neighbour of model.py: its folder is on sys.path


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        with open({calls!r}, "a") as f:
            f.write("call\\n")
        print("to stdout: not the answer")
        for name in ("INPUT0", "INPUT1"):
            auto_complete_model_config.add_input(
                {{"name": name, "data_type": "TYPE_FP32", "dims": DIMS}}
            )
        auto_complete_model_config.add_output(
            {{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": DIMS}}
        )
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""


def write_python_model(
    root: Path, name: str, source: str, config: str | None = None, version: int = 1
) -> Path:
    """``root/name/<version>/model.py`` (and ``config.pbtxt`` when ``config`` is given)."""
    folder = root / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    path = folder / str(version) / "model.py"
    path.write_text(source)
    return path


def hook_model(root: Path, name: str, config: str | None = None) -> Path:
    """The model above, counting its hook's calls in ``root/<name>.calls``."""
    path = write_python_model(
        root, name, HOOK_MODEL.format(calls=str(root / f"{name}.calls")), config
    )
    (path.parent / "shapes.py").write_text("DIMS = [4]\n")
    return path


def calls(root: Path, name: str) -> int:
    path = root / f"{name}.calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


def hook(body: str) -> str:
    """A model.py whose auto_complete_config is ``body`` (indented by this function)."""
    lines = "\n".join(f"        {line}" for line in body.strip().splitlines())
    return (
        "import triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(config):\n"
        f"{lines}\n\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )


def test_a_folder_with_only_model_py_is_a_model_completed_by_its_hook(tmp_path: Path) -> None:
    hook_model(tmp_path, "made")
    repo = ModelRepository(tmp_path)
    assert repo.model_names() == ["made"]
    spec = repo.spec("made")
    assert (spec.platform, spec.max_batch_size, spec.batching.enabled) == ("python", 8, True)
    assert [(t.name, t.datatype, t.dims) for t in spec.inputs] == [
        ("INPUT0", "FP32", (4,)),
        ("INPUT1", "FP32", (4,)),
    ]
    assert [(t.name, t.datatype, t.dims) for t in spec.outputs] == [("OUTPUT0", "FP32", (4,))]
    config = spec.config_json()
    batching = config["dynamic_batching"]  # added, every field at its default
    assert (config["name"], config["backend"], batching["max_queue_delay_microseconds"]) == (
        "made",
        "python",
        0,
    )
    assert [mv.path.name for mv in repo.served_versions("made")] == ["model.py"]


def test_a_config_naming_only_the_backend_is_completed(tmp_path: Path) -> None:
    hook_model(tmp_path, "partial", 'backend: "python"\n')
    spec = ModelRepository(tmp_path).spec("partial")
    assert [t.name for t in spec.inputs] == ["INPUT0", "INPUT1"]
    assert spec.max_batch_size == 8


def test_the_hook_runs_once_per_model_file_and_config(tmp_path: Path) -> None:
    path = hook_model(tmp_path, "counted")
    for _ in range(3):  # as repeated polls read it, in one process
        ModelRepository(tmp_path).spec("counted")
    assert calls(tmp_path, "counted") == 1
    (tmp_path / "counted" / "config.pbtxt").write_text('backend: "python" max_batch_size: 8')
    ModelRepository(tmp_path).spec("counted")
    assert calls(tmp_path, "counted") == 2  # another written config: run again
    path.write_text(path.read_text() + "\n# edited\n")
    ModelRepository(tmp_path).spec("counted")
    ModelRepository(tmp_path).spec("counted")
    assert calls(tmp_path, "counted") == 3  # another model.py: run again, once


def test_a_model_without_the_hook_starts_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_spawn(path: str, payload: str) -> autocomplete_python.Outcome:
        raise AssertionError("a process was started")

    monkeypatch.setattr(autocomplete_python, "run_child", no_spawn)
    write_python_model(tmp_path, "plain", "class TritonPythonModel:\n    pass\n")
    with pytest.raises(ConfigError, match="field 'input': at least one is required"):
        ModelRepository(tmp_path).spec("plain")


def test_what_the_config_names_stays_and_the_same_definition_is_accepted(
    tmp_path: Path,
) -> None:
    config = (
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'parameters [ { key: "k" value: { string_value: "v" } } ]\n'
    )
    hook_model(tmp_path, "kept", config)
    spec = ModelRepository(tmp_path).spec("kept")
    assert [t.name for t in spec.inputs] == ["INPUT0", "INPUT1"]
    assert spec.parameters == {"k": "v"}


def test_a_decoupled_policy_set_by_the_hook(tmp_path: Path) -> None:
    body = """
config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]})
config.set_model_transaction_policy({"decoupled": True})
return config
"""
    write_python_model(tmp_path, "streams", hook(body))
    spec = ModelRepository(tmp_path).spec("streams")
    assert spec.decoupled
    assert (spec.max_batch_size, spec.batching.enabled) == (0, False)


def test_a_load_override_config_is_completed_too(tmp_path: Path) -> None:
    hook_model(tmp_path, "over", 'backend: "python"\n')
    spec = model_spec(ModelRepository(tmp_path), "over", '{"backend": "python"}')
    assert [t.name for t in spec.outputs] == ["OUTPUT0"]


@pytest.mark.parametrize(
    ("body", "config", "why"),
    [
        ('raise RuntimeError("no tensors today")', None, "RuntimeError: no tensors today"),
        (
            'config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})\n'
            "return config",
            'backend: "python"\n'
            'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]\n',
            "ValueError: .*TYPE_INT32.*TYPE_FP32",
        ),
        ("return None", None, "must return .*ModelConfig.*NoneType"),
        ("import os\nos._exit(3)", None, "exited with status 3"),
        (
            'config.add_input({"name": "X", "data_type": "FP32", "dims": [4]})\nreturn config',
            None,
            "a config Plaza cannot read.*FP32",
        ),
    ],
    ids=["raises", "conflicting-input", "returns-none", "exits", "bad-type-name"],
)
def test_a_failing_hook_is_a_bad_config_naming_the_model(
    tmp_path: Path, body: str, config: str | None, why: str
) -> None:
    write_python_model(tmp_path, "broken", hook(body), config)
    with pytest.raises(ConfigError) as caught:
        ModelRepository(tmp_path).spec("broken")
    assert caught.value.code == "bad_config"
    assert "model 'broken'" in caught.value.message
    assert "auto_complete_config" in caught.value.message
    assert str(tmp_path / "broken") in caught.value.message
    assert re.search(why, caught.value.message), caught.value.message


def test_an_import_error_in_model_py_is_a_bad_config(tmp_path: Path) -> None:
    source = "import no_such_module_here\n\n" + hook("return config")
    write_python_model(tmp_path, "unimportable", source)
    with pytest.raises(ConfigError, match=r"ModuleNotFoundError.*no_such_module_here"):
        ModelRepository(tmp_path).spec("unimportable")


def test_a_hook_that_runs_past_the_limit_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(autocomplete_python, "TIMEOUT_S", 1.0)
    write_python_model(tmp_path, "slow", hook("import time\ntime.sleep(30)\nreturn config"))
    with pytest.raises(ConfigError, match=r"model 'slow'.*ran past 1 s"):
        ModelRepository(tmp_path).spec("slow")


def test_a_failure_is_not_remembered(tmp_path: Path) -> None:
    """As Triton runs the hook at each load: what model.py imports may have been fixed."""
    calls_file = tmp_path / "calls"
    body = f'open({str(calls_file)!r}, "a").write("x")\nraise ValueError("nope")'
    write_python_model(tmp_path, "again", hook(body))
    for _ in range(2):
        with pytest.raises(ConfigError, match="ValueError: nope"):
            ModelRepository(tmp_path).spec("again")
    assert calls_file.read_text() == "xx"


def test_nothing_of_the_hook_runs_in_this_process(tmp_path: Path) -> None:
    body = """
import os
os.environ["PLAZA_HOOK_RAN_HERE"] = "1"
config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]})
return config
"""
    write_python_model(tmp_path, "apart", hook(body), 'backend: "python"\n')
    assert [t.name for t in ModelRepository(tmp_path).spec("apart").inputs] == ["IN"]
    assert "PLAZA_HOOK_RAN_HERE" not in os.environ


RICH_CONFIG = """
name: "m" backend: "python" max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4, -1 ] optional: true
          reshape { shape: [ 2, 2, -1 ] } } ]
output [ { name: "B" data_type: TYPE_STRING dims: [ 1 ] label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 9007199254740993
  priority_levels: 2 default_priority_level: 1
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100 }
  priority_queue_policy { key: 2 value: { max_queue_size: 3 } }
}
instance_group [ { count: 2 kind: KIND_CPU
                   rate_limiter { resources [ { name: "R" count: 3 global: true } ] } } ]
parameters [ { key: "k" value: { string_value: "v" } } ]
version_policy { specific { versions: [ 1, 3 ] } }
model_warmup [ { name: "w" batch_size: 2 count: 3
                 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 4, 2 ]
                                             random_data: true } } } ]
"""


def test_a_hook_that_changes_nothing_gives_back_every_field_as_written(tmp_path: Path) -> None:
    path = write_python_model(tmp_path, "m", hook("config.as_dict()\nreturn config"))
    written = mc.ModelConfig()
    text_format.Parse(RICH_CONFIG, written)
    config = mc.ModelConfig()
    config.CopyFrom(written)
    autocomplete_python.complete(config, path, "test")
    assert config == written  # the 64-bit delay, the map keyed by level, the warmup too


SLOW_HOOK = hook(
    """
import time
time.sleep(0.5)
config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [2]})
return config
"""
)


async def _ticks_while(work: Awaitable[object]) -> tuple[object, int]:
    """``work``'s outcome, and how often the loop ran a 10 ms ticker meanwhile."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker is running
    try:
        done = await work
    finally:
        ticker.cancel()
    return done, ticks


async def test_the_gateway_and_the_sdk_read_a_slow_hook_off_their_loop(tmp_path: Path) -> None:
    """A hook that takes a while (a model.py importing a framework, say) must not stop the
    gateway's loop, nor an SDK caller's: they read the repository on a thread."""
    from plaza.client import PlazaClient
    from plaza.gateway.registry import ModelRegistry
    from plaza.settings import PlazaSettings

    write_python_model(tmp_path, "slow", SLOW_HOOK, 'backend: "python"')
    settings = PlazaSettings(repository=tmp_path)
    loaded, ticks = await _ticks_while(ModelRegistry(settings)._parse_off_loop("slow"))
    assert loaded is not None and ticks > 10  # the loop ran while the child ran the hook
    write_python_model(tmp_path, "slow2", SLOW_HOOK, 'backend: "python"')
    spec, ticks = await _ticks_while(PlazaClient(settings)._spec("slow2"))
    assert isinstance(spec, ModelSpec) and [t.name for t in spec.inputs] == ["X"]
    assert ticks > 10


def test_a_child_that_overran_is_not_remembered_and_the_next_read_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine busy enough to make the child overrun once must not leave the model
    unloadable until the process restarts: only the hook's own answers are remembered."""
    monkeypatch.setattr(autocomplete_python, "TIMEOUT_S", 1.0)
    go = tmp_path / "go"  # made by the test between the reads: the child only looks
    body = f"""
import os, time
if not os.path.exists({str(go)!r}):
    time.sleep(30)
config.add_input({{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}})
config.add_output({{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}})
return config
"""
    write_python_model(tmp_path, "late", hook(body))
    with pytest.raises(ConfigError, match=r"ran past 1 s"):
        ModelRepository(tmp_path).spec("late")
    # the same file, tried again; with the default limit, since a child's start alone can
    # take more than a second on a loaded two-core machine
    go.touch()
    monkeypatch.setattr(autocomplete_python, "TIMEOUT_S", 30.0)
    spec = ModelRepository(tmp_path).spec("late")
    assert [t.name for t in spec.inputs] == ["X"]
