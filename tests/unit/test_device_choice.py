"""The worker's device: an explicit ``cuda`` without a GPU, ``instance_group`` ``gpus`` ids,
and the device scheduler forgetting a removed model's peak (pure logic: a fake pynvml)."""

from __future__ import annotations

import sys
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from plaza.errors import ConfigError
from plaza.modelconfig import InstanceGroup, load_model_config, parse_model_config
from plaza.workers.device import CPU, Device, check_instance_gpus, select_device
from plaza.workers.device_scheduler import DeviceScheduler, InstanceSpec
from plaza.workers.host_services import HostServices
from plaza.workers.worker import Worker
from tests.support import make_settings, model_variant

GB = 2**30
REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"


def fake_pynvml(count: int) -> types.ModuleType:
    """``count`` GPUs by NVML index, GPU i with i + 1 GB free."""
    nvml: Any = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: f"GPU{h}"
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(free=(h + 1) * GB, used=0)
    return nvml  # type: ignore[no-any-return]


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(0))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.usefixtures("no_gpu")
def test_cuda_without_a_visible_gpu_is_a_config_error_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as info:
        select_device("cuda")
    assert info.value.code == "bad_config"
    assert info.value.details["field"] == "worker.device"
    assert "no GPU is visible" in info.value.message


def test_cuda_with_every_gpu_hidden_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES =''"):
        select_device("cuda")


@pytest.mark.usefixtures("no_gpu")
def test_auto_without_a_gpu_still_serves_on_the_cpu() -> None:
    assert select_device("auto") == CPU
    assert select_device("cpu") == CPU


def test_cuda_with_gpus_picks_the_freest_and_counts_the_visible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(3))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    device = select_device("cuda")
    assert device == Device("cuda", 0, "GPU2", 3 * GB, 2)
    assert device.visible == 2


GPU = Device("cuda", 0, "GPU0", GB, 0, visible=2)


def test_gpus_ids_a_gpu_worker_cannot_see_are_refused_naming_them_and_the_count() -> None:
    groups = [InstanceGroup(gpus=(0,)), InstanceGroup(gpus=(1, 7, 9))]
    with pytest.raises(ConfigError) as info:
        check_instance_gpus("idgpu", groups, GPU)
    assert info.value.code == "bad_config"
    assert info.value.details["field"] == "instance_group[1].gpus"
    assert "[7, 9]" in info.value.message and "sees 2 GPU(s)" in info.value.message
    assert "'idgpu'" in info.value.message


def test_negative_gpu_ids_are_refused_on_a_gpu() -> None:
    with pytest.raises(ConfigError, match=r"\[-1\]"):
        check_instance_gpus("m", [InstanceGroup(gpus=(-1,))], GPU)


def test_visible_gpus_ids_pass_and_a_cpu_worker_ignores_gpus() -> None:
    check_instance_gpus("m", [InstanceGroup(gpus=(0, 1)), InstanceGroup()], GPU)
    check_instance_gpus("m", [InstanceGroup(gpus=(7, 9))], CPU)


def test_instance_group_gpus_are_read_from_the_config() -> None:
    text = """
    name: "g"
    platform: "onnxruntime_onnx"
    max_batch_size: 4
    input [{ name: "x", data_type: TYPE_FP32, dims: [2] }]
    output [{ name: "y", data_type: TYPE_FP32, dims: [2] }]
    instance_group [{ count: 2, kind: KIND_GPU, gpus: [7, 9] }, { kind: KIND_CPU }]
    """
    spec = parse_model_config(text, source="g/config.pbtxt", default_name="g")
    assert [g.gpus for g in spec.instance_groups] == [(7, 9), ()]
    with pytest.raises(ConfigError, match=r"instance_group\[0\]\.gpus"):
        check_instance_gpus(spec.name, spec.instance_groups, GPU)


def test_every_sample_model_passes_the_gpus_check_on_the_cpu() -> None:
    configs = sorted(REPOSITORY.glob("*/config.pbtxt"))
    assert configs
    for path in configs:
        spec = load_model_config(path)
        check_instance_gpus(spec.name, spec.instance_groups, CPU)


def test_a_removed_models_peak_goes_with_it() -> None:
    """What a reload does each time: a unit of its own (``m~n``) added, run, removed."""
    s = DeviceScheduler()
    s.add_model("m", [InstanceSpec()])
    for n in range(1, 51):
        key = f"m~{n}"
        s.add_model(key, [InstanceSpec()])
        s.submit(key)
        (grant,) = s.dispatch()
        s.finish(grant, 0.001)
        s.remove_model(key)
    s.submit("m")
    (grant,) = s.dispatch()
    s.finish(grant, 0.001)
    assert s.peak == {"m": 1}


def test_a_grant_released_after_its_model_left_does_not_bring_the_peak_back() -> None:
    s = DeviceScheduler()
    s.add_model("gone", [InstanceSpec()])
    s.submit("gone")
    (grant,) = s.dispatch()
    s.remove_model("gone")
    s.finish(grant, 0.001)
    assert s.peak == {}


def test_a_gpu_worker_refuses_a_model_whose_instance_group_names_an_unseen_gpu(
    tmp_path: Path,
) -> None:
    """The check is the worker's: built on a one-GPU host, a worker of a model whose
    ``gpus`` names GPU 3 fails with the config error (a load failure, no instance made)."""
    config = (REPOSITORY / "identity" / "config.pbtxt").read_text()
    config += "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 3 ] } ]\n"
    repository = model_variant(tmp_path, "far", config.replace('"identity"', '"far"'))
    settings = make_settings("127.0.0.1:1", "redis://127.0.0.1:1/0", "gpus", model="far")
    settings = settings.model_copy(update={"repository": repository})
    gpu = Device("cuda", 0, "GPU0", GB, nvml_index=0, visible=1)
    services = replace(HostServices.create(settings), device=gpu)
    with pytest.raises(ConfigError, match=r"GPU ids \[3\] are not visible"):
        Worker(settings, services)
    assert "far" not in services.scheduler.peak
