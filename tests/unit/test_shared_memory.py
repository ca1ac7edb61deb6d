"""System shared memory regions (``gateway/shared_memory.py``) on real memory objects in a
temporary folder, and both fronts' codecs reading inputs from them and writing outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from plaza.contract import InferResult
from plaza.errors import InvalidInput, SharedMemoryError
from plaza.gateway import grpc_codec, kserve
from plaza.gateway.service import GatewayService
from plaza.gateway.shared_memory import SharedMemoryRegions, ShmRef
from plaza.settings import GatewaySettings, PlazaSettings
from plaza.tensors import Tensor


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Stands in for /dev/shm: a memory object is a file there."""
    (tmp_path / "obj").write_bytes(bytes(range(64)))
    return tmp_path


def regions(root: Path, **kw: object) -> SharedMemoryRegions:
    return SharedMemoryRegions(allowed=True, root=root, **kw)  # type: ignore[arg-type]


def test_register_read_write_status_unregister(root: Path) -> None:
    shm = regions(root)
    shm.register("r", "/obj", 16, 32)  # bytes 16..47 of the object
    assert [(s.name, s.key, s.offset, s.byte_size) for s in shm.status()] == [("r", "/obj", 16, 32)]
    assert shm.read(ShmRef("r", 4, 2), "x") == bytes([18, 19, 20, 21])
    shm.write(ShmRef("r", 2, 30), b"\xff\xff", "out")
    assert (root / "obj").read_bytes()[46:48] == b"\xff\xff"
    with pytest.raises(SharedMemoryError, match="run past"):
        shm.read(ShmRef("r", 4, 30), "x")  # 30 + 4 > 32
    with pytest.raises(SharedMemoryError, match="byte size is 1"):
        shm.write(ShmRef("r", 1, 0), b"ab", "out")
    shm.unregister("r")
    shm.unregister("r")  # gone already: no error
    assert shm.status() == []
    with pytest.raises(SharedMemoryError, match="'r' is registered"):
        shm.status("r")
    with pytest.raises(SharedMemoryError, match="not registered"):
        shm.read(ShmRef("r", 1), "input 'x'")


@pytest.mark.parametrize(
    ("key", "offset", "size", "error", "words"),
    [
        ("../obj", 0, 8, SharedMemoryError, "not a shm_open name"),
        ("/a/obj", 0, 8, SharedMemoryError, "not a shm_open name"),
        ("..", 0, 8, SharedMemoryError, "not a shm_open name"),
        ("/missing", 0, 8, SharedMemoryError, "unable to open"),
        ("/obj", 60, 8, SharedMemoryError, "past the end"),
        ("/obj", 0, 0, InvalidInput, "byte_size > 0"),
        ("/obj", -1, 8, InvalidInput, "offset must be >= 0"),
    ],
)
def test_bad_registrations_are_refused(
    root: Path, key: str, offset: int, size: int, error: type[Exception], words: str
) -> None:
    shm = regions(root)
    with pytest.raises(error, match=words):
        shm.register("r", key, offset, size)
    assert shm.status() == []


def test_a_symlinked_object_is_not_followed(root: Path) -> None:
    (root / "link").symlink_to(root / "obj")
    with pytest.raises(SharedMemoryError, match="unable to open"):
        regions(root).register("r", "/link", 0, 8)


def test_registering_is_refused_unless_allowed_and_bounded(root: Path) -> None:
    with pytest.raises(SharedMemoryError, match="allow_client_shm"):
        SharedMemoryRegions(allowed=False, root=root).register("r", "/obj", 0, 8)
    with pytest.raises(SharedMemoryError, match="one gateway process"):
        regions(root, refusal="needs one gateway process").register("r", "/obj", 0, 8)
    shm = regions(root, max_regions=2)
    shm.register("a", "/obj", 0, 8)
    with pytest.raises(SharedMemoryError, match="already registered"):
        shm.register("a", "/obj", 0, 8)
    shm.register("b", "/obj", 8, 8)
    with pytest.raises(SharedMemoryError, match="2 shared memory regions"):
        shm.register("c", "/obj", 16, 8)
    shm.unregister()  # all of them
    shm.register("c", "/obj", 16, 8)


def test_a_shrunk_object_is_an_error_not_a_crash(root: Path) -> None:
    shm = regions(root)
    shm.register("r", "/obj", 0, 64)
    with open(root / "obj", "r+b") as f:
        f.truncate(8)
    with pytest.raises(SharedMemoryError, match="shrank"):
        shm.read(ShmRef("r", 16, 32), "input 'x'")
    assert shm.read(ShmRef("r", 8), "input 'x'") == bytes(range(8))


def _input_doc(region: str, size: int, **extra: object) -> dict[str, object]:
    params = {"shared_memory_region": region, "shared_memory_byte_size": size}
    return {"name": "X", "datatype": "FP32", "shape": [1, 2], "parameters": params, **extra}


def test_http_input_from_and_output_to_shared_memory(root: Path) -> None:
    shm = regions(root)
    (root / "obj").write_bytes(np.array([1.5, -2.0], np.float32).tobytes() + bytes(56))
    shm.register("r", "/obj", 0, 64)
    doc = {
        "inputs": [_input_doc("r", 8)],
        "outputs": [
            {
                "name": "Y",
                "parameters": {**_input_doc("r", 8)["parameters"], "shared_memory_offset": 32},
            }
        ],  # type: ignore[dict-item]
    }
    body = kserve.decode_infer_request(orjson.dumps(doc), None, shm)
    np.testing.assert_array_equal(body.inputs[0].to_numpy(), [[1.5, -2.0]])
    y = np.array([[7.0, 8.0]], np.float32)
    result = InferResult(id="c", model="m", version="1", outputs=(Tensor.from_numpy("Y", y),))
    encoded = kserve.encode_infer_response(
        result, response_id="c", binary=body.wants_binary, shm=body.shm_of, regions=shm
    )
    (out,) = orjson.loads(encoded.content)["outputs"]
    # no data, and no parameters: perf_analyzer's client would read them as binary data
    assert out == {"name": "Y", "datatype": "FP32", "shape": [1, 2]}
    assert (root / "obj").read_bytes()[32:40] == y.tobytes()


@pytest.mark.parametrize(
    ("item", "words"),
    [
        (_input_doc("r", 8, data=[1, 2]), "has data too"),
        (_input_doc("r", 12), "needs 8 bytes"),
        (_input_doc("nope", 8), "not registered"),
        (
            {**_input_doc("r", 8), "parameters": {"shared_memory_byte_size": 8}},
            "needs both",
        ),
        (
            {
                **_input_doc("r", 8),
                "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": -8},
            },
            "non-negative integer",
        ),
    ],
)
def test_bad_http_shared_memory_inputs(root: Path, item: dict[str, object], words: str) -> None:
    shm = regions(root)
    shm.register("r", "/obj", 0, 64)
    with pytest.raises((InvalidInput, SharedMemoryError), match=words):
        kserve.decode_infer_request(orjson.dumps({"inputs": [item]}), None, shm)


def test_grpc_raw_contents_belong_to_the_inputs_not_in_shared_memory(root: Path) -> None:
    shm = regions(root)
    (root / "obj").write_bytes(np.array([3.0, 4.0], np.float32).tobytes() + bytes(56))
    shm.register("r", "/obj", 0, 64)
    msg = pb.ModelInferRequest(model_name="m")
    a = msg.inputs.add(name="A", datatype="FP32", shape=[1, 2])
    a.parameters["shared_memory_region"].string_param = "r"
    a.parameters["shared_memory_byte_size"].int64_param = 8
    msg.inputs.add(name="B", datatype="FP32", shape=[1, 2])
    msg.raw_input_contents.append(np.array([5.0, 6.0], np.float32).tobytes())
    out = msg.outputs.add(name="Y")
    out.parameters["shared_memory_region"].string_param = "r"
    out.parameters["shared_memory_byte_size"].int64_param = 8
    out.parameters["shared_memory_offset"].int64_param = 16
    msg.outputs.add(name="Z")
    front = grpc_codec.decode_infer_request(msg, shm)
    assert [t.to_numpy().tolist() for t in front.inputs] == [[[3.0, 4.0]], [[5.0, 6.0]]]

    y, z = np.array([[1.0, 2.0]], np.float32), np.array([[9.0]], np.float32)
    result = InferResult(
        id="c",
        model="m",
        version="1",
        outputs=(Tensor.from_numpy("Y", y), Tensor.from_numpy("Z", z)),
    )
    answer = grpc_codec.encode_infer_response(result, "c", front.shm_outputs, shm)
    assert list(answer.raw_output_contents) == [b"", z.tobytes()]  # Z keeps its index
    assert answer.outputs[0].parameters["shared_memory_region"].string_param == "r"
    assert (root / "obj").read_bytes()[16:24] == y.tobytes()

    msg.raw_input_contents.append(b"\0" * 8)  # one raw entry too many now
    with pytest.raises(InvalidInput, match="2 raw_input_contents for 1 inputs"):
        grpc_codec.decode_infer_request(msg, shm)


def test_a_gateway_of_several_processes_refuses_regions(root: Path) -> None:
    def service(workers: int) -> GatewayService:
        gw = GatewaySettings(allow_client_shm=True, workers=workers)
        return GatewayService(PlazaSettings(gateway=gw))

    with pytest.raises(SharedMemoryError, match=r"gateway\.workers is 2"):
        service(2).shm.register("r", "/obj", 0, 8)
    one = service(1).shm
    one.root = root
    one.register("r", "/obj", 0, 8)
    assert [s.name for s in one.status()] == ["r"]
    one.close()


@pytest.mark.parametrize(
    ("region", "size", "offset", "words"),
    [
        ("never", 8, 0, "'never' is not registered"),
        ("r", 8, 60, "run past shared memory region 'r'"),  # 60 + 8 > 64
        ("r", 72, 0, "run past shared memory region 'r'"),
    ],
)
def test_an_output_region_is_checked_when_the_request_is_decoded(
    root: Path, region: str, size: int, offset: int, words: str
) -> None:
    """Before the request is published (so before its model runs), over both fronts: a
    region not registered, or a place past the region's end."""
    shm = regions(root)
    shm.register("r", "/obj", 0, 64)
    params = {
        "shared_memory_region": region,
        "shared_memory_byte_size": size,
        "shared_memory_offset": offset,
    }
    doc = {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "outputs": [{"name": "Y", "parameters": params}],
    }
    with pytest.raises(SharedMemoryError, match=words):
        kserve.decode_infer_request(orjson.dumps(doc), None, shm)

    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[1])
    msg.raw_input_contents.append(np.array([1.0], np.float32).tobytes())
    out = msg.outputs.add(name="Y")
    out.parameters["shared_memory_region"].string_param = region
    out.parameters["shared_memory_byte_size"].int64_param = size
    out.parameters["shared_memory_offset"].int64_param = offset
    with pytest.raises(SharedMemoryError, match=words):
        grpc_codec.decode_infer_request(msg, shm)


def test_an_output_that_fits_its_region_but_not_its_byte_size_fails_when_written(
    root: Path,
) -> None:
    """Its size is known only once the model answered: decoding takes it."""
    shm = regions(root)
    shm.register("r", "/obj", 0, 64)
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 4}
    doc = {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "outputs": [{"name": "Y", "parameters": params}],
    }
    body = kserve.decode_infer_request(orjson.dumps(doc), None, shm)
    y = Tensor.from_numpy("Y", np.zeros((1, 2), np.float32))
    result = InferResult(id="c", model="m", version="1", outputs=(y,))
    with pytest.raises(SharedMemoryError, match="byte size is 4"):
        kserve.encode_infer_response(
            result, response_id="c", binary=body.wants_binary, shm=body.shm_of, regions=shm
        )
