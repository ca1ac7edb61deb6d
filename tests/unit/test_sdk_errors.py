"""The SDK's refusals of bad input are typed (InvalidInput, stable code), never a Python
error or a retriable ``Unavailable``; a model config that did not read is read again.

No services: ``make_request``, the publisher's encoding and the client's config cache are
pure; a publish of a request that does not encode fails before Kafka is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from msgspec.structs import replace

import plaza.client
from plaza.client import PlazaClient, make_request
from plaza.errors import InvalidInput, PayloadTooLarge
from plaza.publisher import RequestPublisher
from plaza.settings import KafkaSettings, PlazaSettings
from plaza.tensors import Tensor
from tests.support import REPOSITORY

X = np.ones((1, 2), np.float32)


@pytest.mark.parametrize(
    "inputs",
    [
        {"INPUT0": [[1.0, 2.0]]},  # a Python list
        {"INPUT0": 1.5},  # a Python number
        {"INPUT0": np.float32(1.5)},  # a numpy scalar, not an array
        {0: X},  # a name that is no str
        [X],  # a sequence of arrays where Tensors go
        X,  # one array, not named
        1.5,
        "INPUT0",
    ],
    ids=["list", "float", "numpy-scalar", "int-name", "array-sequence", "array", "number", "str"],
)
def test_inputs_that_are_not_arrays_or_tensors_are_invalid_input(inputs: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        make_request("identity", inputs)
    assert caught.value.code == "invalid_input" and not caught.value.retriable


def test_arrays_by_name_and_tensors_make_a_request() -> None:
    by_name = make_request("identity", {"INPUT0": X})
    as_tensors = make_request("identity", [Tensor.from_numpy("INPUT0", X)])
    assert by_name.inputs == as_tensors.inputs


async def test_a_request_that_does_not_encode_is_invalid_input_not_unavailable() -> None:
    """An unencodable field used to surface from ``publish`` as ``Unavailable`` ("Kafka did
    not acknowledge..."), which a caller retries for ever."""
    settings = PlazaSettings()
    publisher = RequestPublisher(settings.kafka, settings.names)  # never started: no Kafka
    req = replace(make_request("identity", {"INPUT0": X}), parameters={"p": object()})
    with pytest.raises(InvalidInput) as caught:
        await publisher.publish(req, settings.names.request_topic("identity"))
    assert type(caught.value) is InvalidInput and req.id in caught.value.message


async def test_a_request_over_the_record_limit_is_payload_too_large() -> None:
    settings = PlazaSettings(kafka=KafkaSettings(max_request_bytes=1024))
    publisher = RequestPublisher(settings.kafka, settings.names)
    req = make_request("identity", {"INPUT0": np.ones((1, 512), np.float32)})
    with pytest.raises(PayloadTooLarge) as caught:
        await publisher.publish(req, settings.names.request_topic("identity"))
    assert caught.value.code == "payload_too_large"
    assert caught.value.details["size"] > 1024


async def test_a_config_that_did_not_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client sends a model whose config does not read without it (its worker judges),
    but it used to remember that for good: a config fixed later was never read."""
    monkeypatch.setattr(plaza.client, "SPEC_RETRY_S", 0.0, raising=False)
    folder = tmp_path / "identity"
    folder.mkdir()
    (folder / "config.pbtxt").write_text('name: "identity" max_batch_size: oops')
    client = PlazaClient(PlazaSettings(repository=tmp_path))
    try:
        assert await client._spec("identity") is None
        config = (REPOSITORY / "identity" / "config.pbtxt").read_text()
        (folder / "config.pbtxt").write_text(config)
        spec = await client._spec("identity")
        assert spec is not None and spec.name == "identity"
    finally:
        await client.stop()
