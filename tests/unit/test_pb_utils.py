"""The pure parts of the Python backend: pb_utils, the error-code map, the frame channel and
the config Triton hands to ``initialize``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plaza.errors import ConfigError
from plaza.modelconfig import BACKEND_PYTHON, parse_model_config
from plaza.repository import ModelRepository
from plaza.settings import KafkaSettings, PlazaSettings, RedisSettings
from plaza.workers.backends import pb_utils
from plaza.workers.backends.python_backend import (
    initialize_args,
    settings_json,
    triton_config_json,
)
from plaza.workers.backends.python_channel import Channel, ChannelClosed, ChannelTimeout
from plaza.workers.backends.python_errors import plaza_code, triton_code
from plaza.workers.device import CPU, Device
from tests.python_models import ADD_SUB_CONFIG, write_repository


def test_tensor_holds_its_array_and_name() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("OUTPUT0", arr)
    assert t.name() == "OUTPUT0" and t.shape() == [2, 3] and t.is_cpu()
    np.testing.assert_array_equal(t.as_numpy(), arr)
    words = pb_utils.Tensor("TEXT", np.array(["a", "bc"]))
    assert words.as_numpy().dtype == np.object_  # fixed-width strings travel as BYTES
    with pytest.raises(pb_utils.TritonModelException, match="numpy array"):
        pb_utils.Tensor("X", [1, 2, 3])


def test_dlpack_round_trip_through_torch() -> None:
    pytest.importorskip("torch")
    arr = np.arange(4, dtype=np.int64)
    back = pb_utils.Tensor.from_dlpack("Y", pb_utils.Tensor("X", arr).to_dlpack())
    assert back.name() == "Y"
    np.testing.assert_array_equal(back.as_numpy(), arr)


def test_type_helpers_match_tritons_tables() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11  # TRITONSERVER_TYPE_FP32
    assert pb_utils.numpy_to_triton_type(np.object_) == 13  # TYPE_STRING
    for number in range(1, 14):
        np_type = pb_utils.triton_to_numpy_type(number)
        assert pb_utils.numpy_to_triton_type(np_type) == number
    with pytest.raises(pb_utils.TritonModelException, match="TYPE_NOPE"):
        pb_utils.triton_string_to_numpy("TYPE_NOPE")


def test_config_and_tensor_lookups_by_name() -> None:
    config = {"input": [{"name": "A", "data_type": "TYPE_INT32"}], "output": [{"name": "B"}]}
    assert pb_utils.get_input_config_by_name(config, "A") == config["input"][0]
    assert pb_utils.get_output_config_by_name(config, "B") == {"name": "B"}
    assert pb_utils.get_output_config_by_name(config, "A") is None
    assert not pb_utils.using_decoupled_model_transaction_policy(config)
    a = pb_utils.Tensor("A", np.zeros(1, np.int32))
    request = pb_utils.InferenceRequest(inputs=[a], requested_output_names=["B"])
    assert pb_utils.get_input_tensor_by_name(request, "A") is a
    assert pb_utils.get_input_tensor_by_name(request, "Z") is None
    response = pb_utils.InferenceResponse(output_tensors=[a])
    assert pb_utils.get_output_tensor_by_name(response, "A") is a


def test_responses_carry_outputs_or_an_error() -> None:
    ok = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("O", np.ones(2))])
    assert not ok.has_error() and ok.error() is None and len(ok.output_tensors()) == 1
    err = pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG)
    failed = pb_utils.InferenceResponse(output_tensors=[], error=err)
    assert failed.has_error() and failed.error() is err and failed.error().code() == 3
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL == 1
    assert pb_utils.TritonError.UNSUPPORTED == 5 and pb_utils.TritonError.NOT_FOUND == 2
    with pytest.raises(pb_utils.TritonModelException, match="not a Tensor"):
        pb_utils.InferenceResponse(output_tensors=[np.ones(2)])  # type: ignore[list-item]


def test_response_parameters_are_kept_as_json_text_and_as_their_values() -> None:
    given = {"a": 1, "b": "x", "c": True}
    response = pb_utils.InferenceResponse(parameters=given)
    assert json.loads(response.parameters()) == given
    assert response._values == given and type(response._values["c"]) is bool
    given["a"] = 2  # checked and taken at construction, as Triton serialises them
    assert response._values["a"] == 1
    as_text = pb_utils.InferenceResponse(parameters='{"n": -5, "s": ""}')  # a JSON object
    assert as_text._values == {"n": -5, "s": ""}
    for none in (None, {}, "{}"):
        assert pb_utils.InferenceResponse(parameters=none).parameters() == "{}"
        assert pb_utils.InferenceResponse(parameters=none)._values == {}
    largest = pb_utils.InferenceResponse(parameters={"big": 2**63 - 1, "small": -(2**63)})
    assert largest._values == {"big": 2**63 - 1, "small": -(2**63)}


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({1: "x"}, "keys to have type str, found type int"),
        ({"f": 0.5}, "parameter 'f': expect parameters values to have type bool/int/str, "
                     "found float"),
        ({"l": [1]}, "parameter 'l'.*found list"),
        ({"n": None}, "parameter 'n'.*found NoneType"),
        ({"d": {"k": 1}}, "parameter 'd'.*found dict"),
        ({"i": np.int64(3)}, "parameter 'i'.*found int64"),
        ({"big": 2**63}, "parameter 'big'.*int past 64 bits"),
        ('{"f": 1.5}', "parameter 'f'.*found float"),
        ("[1, 2]", "must be a dict .* not a list"),
        ("{not json", "not valid JSON"),
        ([("a", 1)], "must be a dict .* not a list"),
    ],
)  # fmt: skip
def test_bad_response_parameters_raise_at_construction(parameters: Any, words: str) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=words):
        pb_utils.InferenceResponse(parameters=parameters)


def test_request_parameters_are_json_text() -> None:
    request = pb_utils.InferenceRequest(
        model_name="m", request_id="r1", correlation_id=7, parameters={"k": "v", "n": 2}
    )
    assert json.loads(request.parameters()) == {"k": "v", "n": 2}
    assert request.request_id() == "r1" and request.correlation_id() == 7
    assert pb_utils.InferenceRequest().parameters() == "{}"


def test_what_plaza_does_not_build_says_not_supported() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="not supported"):
        pb_utils.InferenceRequest(model_name="m", shared_memory=True)


def test_only_a_decoupled_models_request_has_a_response_sender() -> None:
    with pytest.raises(pb_utils.TritonModelException, match=r"only a decoupled model's"):
        pb_utils.InferenceRequest(model_name="m").get_response_sender()


def test_a_response_sender_delivers_in_order_and_closes_at_the_final_flag() -> None:
    got: list[tuple[object, bool]] = []
    sender = pb_utils.InferenceResponseSender("r1", lambda resp, final: got.append((resp, final)))
    first = pb_utils.InferenceResponse([pb_utils.Tensor("y", np.array([1], np.int32))])
    sender.send(first)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert got == [(first, False), (None, True)] and sender.closed
    assert not sender.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match=r"'r1'.*response sender is closed"):
        sender.send(first)
    open_one = pb_utils.InferenceResponseSender("r2", lambda resp, final: got.append((resp, final)))
    with pytest.raises(pb_utils.TritonModelException, match="give a response, or the flag"):
        open_one.send()
    with pytest.raises(pb_utils.TritonModelException, match=r"not a pb_utils\.InferenceResponse"):
        open_one.send("text")  # type: ignore[arg-type]
    open_one.close()  # its batch ended: nothing more goes out
    with pytest.raises(pb_utils.TritonModelException, match="closed"):
        open_one.send(first, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert len(got) == 2


def test_async_exec_outside_an_async_execute_is_a_clear_error() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="inside an async def execute"):
        pb_utils.InferenceRequest(model_name="m").async_exec()


def test_exec_outside_the_backend_is_a_clear_error() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="only inside"):
        pb_utils.InferenceRequest(model_name="m").exec()
    with pytest.raises(pb_utils.TritonModelException, match="only inside"):
        pb_utils.InferenceRequest(model_name="m").exec(decoupled=True)
    with pytest.raises(pb_utils.TritonModelException, match="model_name"):
        pb_utils.InferenceRequest().exec()


@pytest.fixture
def bls_transport() -> Iterator[list[tuple[pb_utils.InferenceRequest, float]]]:
    seen: list[tuple[pb_utils.InferenceRequest, float]] = []

    def call(request: pb_utils.InferenceRequest, timeout_s: float) -> pb_utils.InferenceResponse:
        seen.append((request, timeout_s))
        return pb_utils.InferenceResponse(output_tensors=list(request.inputs()))

    pb_utils.set_bls_call(call)
    yield seen
    pb_utils.set_bls_call(None)


def test_exec_hands_the_request_to_the_transport(
    bls_transport: list[tuple[pb_utils.InferenceRequest, float]],
) -> None:
    x = pb_utils.Tensor("X", np.ones(3, np.float32))
    request = pb_utils.InferenceRequest(model_name="other", inputs=[x], timeout=2_500_000)
    response = request.exec()
    assert pb_utils.get_output_tensor_by_name(response, "X") is x
    assert bls_transport == [(request, 2.5)]  # Triton's timeout is in microseconds


def test_a_decoupled_exec_iterates_what_the_stream_transport_gives() -> None:
    def stream(
        request: pb_utils.InferenceRequest, timeout_s: float
    ) -> Iterator[pb_utils.InferenceResponse]:
        for x in request.inputs():
            yield pb_utils.InferenceResponse(output_tensors=[x])
        yield pb_utils.InferenceResponse()  # closed without a response: an empty one

    def call(request: pb_utils.InferenceRequest, timeout_s: float) -> pb_utils.InferenceResponse:
        raise AssertionError("a decoupled exec takes the stream")

    pb_utils.set_bls_call(call, stream)
    try:
        a, b = pb_utils.Tensor("A", np.ones(1)), pb_utils.Tensor("B", np.zeros(1))
        request = pb_utils.InferenceRequest(model_name="other", inputs=[a, b])
        got = [r.output_tensors() for r in request.exec(decoupled=True)]

        async def gathered() -> list[pb_utils.InferenceResponse]:
            return list(await request.async_exec(decoupled=True))

        awaited = [r.output_tensors() for r in asyncio.run(gathered())]
    finally:
        pb_utils.set_bls_call(None)
    assert got == awaited == [[a], [b], []]


def test_bytes_tensor_serialisation_round_trips() -> None:
    items = np.array([b"", b"abc", "d\u00e9".encode()], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(items)
    assert encoded.dtype == np.uint8 and encoded.nbytes == 3 * 4 + 3 + 3
    assert list(pb_utils.deserialize_bytes_tensor(encoded.tobytes())) == list(items)
    with pytest.raises(pb_utils.TritonModelException, match="runs past"):
        pb_utils.deserialize_bytes_tensor(b"\x09\x00\x00\x00ab")


def test_error_codes_map_both_ways() -> None:
    assert plaza_code(pb_utils.TritonError.INVALID_ARG) == "invalid_input"
    assert plaza_code(pb_utils.TritonError.UNAVAILABLE) == "unavailable"
    assert plaza_code(pb_utils.TritonError.INTERNAL) == "model_error"
    assert triton_code("model_not_found") == pb_utils.TritonError.NOT_FOUND
    assert triton_code("timeout") == pb_utils.TritonError.UNAVAILABLE
    assert triton_code("model_error") == pb_utils.TritonError.INTERNAL


def test_channel_frames_round_trip_and_report_a_closed_end() -> None:
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    a, b = Channel(a_r, a_w), Channel(b_r, b_w)
    big = bytes(range(256)) * 8192  # 2 MiB: more than a pipe holds, in several writes
    b.send({"op": "x", "data": b"\x00\x01"})
    assert a.recv(timeout_s=5) == {"op": "x", "data": b"\x00\x01"}
    with pytest.raises(ChannelTimeout):
        a.recv(timeout_s=0.01)
    sender = threading.Thread(target=b.send, args=({"blob": big},))
    sender.start()
    assert a.recv(timeout_s=30)["blob"] == big
    sender.join()
    b.close()
    with pytest.raises(ChannelClosed):
        a.recv(timeout_s=5)
    with pytest.raises(ChannelClosed):
        a.send({"op": "y"})
    a.close()


def test_backend_python_parses_and_needs_model_py(tmp_path: Path) -> None:
    spec = parse_model_config(ADD_SUB_CONFIG, source="add_sub", default_name="add_sub")
    assert spec.platform == BACKEND_PYTHON and spec.default_model_filename == "model.py"
    root = write_repository(tmp_path, "add_sub")
    mv = ModelRepository(root).served_versions("add_sub")[0]
    assert mv.path == root / "add_sub" / "1" / "model.py"
    (mv.path).unlink()
    with pytest.raises(ConfigError, match=r"model\.py"):
        ModelRepository(root).served_versions("add_sub")


def test_initialize_args_are_strings_as_triton_passes_them(tmp_path: Path) -> None:
    mv = ModelRepository(write_repository(tmp_path, "add_sub")).served_versions("add_sub")[0]
    args = initialize_args(mv, CPU)
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_instance_kind"] == "CPU" and args["model_version"] == "1"
    assert args["model_repository"] == str(tmp_path / "add_sub")
    config = json.loads(args["model_config"])
    assert config["name"] == "add_sub" and config["max_batch_size"] == 8
    assert config["input"][0] == {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}
    assert config == triton_config_json(mv)
    gpu = initialize_args(mv, Device("cuda", 1, "gpu"))
    assert gpu["model_instance_kind"] == "GPU" and gpu["model_instance_device_id"] == "1"


def test_settings_reach_the_model_process_whole() -> None:
    settings = PlazaSettings(
        kafka=KafkaSettings(bootstrap_servers="k:1", topic_prefix="t."),
        redis=RedisSettings(url="redis://r:2/0", password="s3cret", key_prefix="p:"),
    )
    again = PlazaSettings.model_validate(json.loads(settings_json(settings)))
    assert again == settings
    assert again.redis.password is not None and again.redis.password.get_secret_value() == "s3cret"


def test_dlpack_without_torch_is_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # ``import torch`` now fails
    t = pb_utils.Tensor("X", np.ones(2, np.float32))
    with pytest.raises(pb_utils.TritonModelException, match=r"without torch.*not supported"):
        t.to_dlpack()
    with pytest.raises(pb_utils.TritonModelException, match="not supported"):
        pb_utils.Tensor.from_dlpack("X", object())


def test_a_0d_tensor_keeps_its_shape_and_any_tensor_is_held_in_c_order() -> None:
    """A scalar output reaches the client as shape [] (Triton's pb_utils keeps numpy's
    shape); a transposed array is copied to C order, its shape kept."""
    scalar = pb_utils.Tensor("OUT", np.array(3.0, np.float32))
    assert scalar.shape() == [] and scalar.as_numpy().shape == ()
    word = pb_utils.Tensor("OUTB", np.array(b"x", dtype=np.object_))
    assert word.shape() == []
    transposed = np.arange(6, dtype=np.int32).reshape(2, 3).T
    held = pb_utils.Tensor("T", transposed).as_numpy()
    assert held.flags.c_contiguous and held.shape == (3, 2)
    assert np.array_equal(held, transposed)
