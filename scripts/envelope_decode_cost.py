"""The request envelope's decode: plaza.codec against a msgspec typed decoder, side by side.

``decode_request`` (msgpack, then the checks in Python, then an ``InferRequest``) is the
largest part of the worker's ``admit`` stage (``python -m plaza.loadgen.hotpath``). This
times it against msgspec decoding the same bytes into Structs whose types and constraints
carry the same checks (non-empty names, known datatypes, non-negative dims, bytes data),
then building the same ``InferRequest`` from them. msgspec is not a Plaza dependency:

    pip install --target /tmp/msgspec_pkg msgspec
    PYTHONPATH=/tmp/msgspec_pkg python scripts/envelope_decode_cost.py [--rounds 5]

Prints the best of ``--rounds`` for each, microseconds per envelope, in alternation.
"""

from __future__ import annotations

import argparse
import functools
import timeit
import uuid
from typing import Annotated, Any

import msgspec
import numpy as np

from plaza.codec import decode_request, encode_request
from plaza.contract import InferRequest, ReplyTo
from plaza.datatypes import DATATYPES
from plaza.tensors import Tensor

Name = Annotated[str, msgspec.Meta(min_length=1)]
Dim = Annotated[int, msgspec.Meta(ge=0)]
Datatype = Annotated[str, msgspec.Meta(pattern="^(" + "|".join(sorted(DATATYPES)) + ")$")]


class TensorMap(msgspec.Struct, forbid_unknown_fields=False):
    name: Name
    datatype: Datatype
    shape: list[Dim]
    data: bytes


class Envelope(msgspec.Struct, forbid_unknown_fields=False):
    v: int
    id: Name
    model: Name
    inputs: list[TensorMap]
    version: str = ""
    outputs: list[str] = []
    reply_stream: Name | None = None
    deadline_ms: int | None = None
    priority: int = 0
    parameters: dict[str, Any] = {}
    created_ms: int = 0


DECODER = msgspec.msgpack.Decoder(Envelope)


def decode_with_msgspec(data: bytes) -> InferRequest:
    env = DECODER.decode(data)
    return InferRequest(
        id=env.id,
        model=env.model,
        version=env.version,
        inputs=tuple(Tensor(t.name, t.datatype, tuple(t.shape), t.data) for t in env.inputs),
        outputs=tuple(env.outputs),
        reply=ReplyTo(stream=env.reply_stream) if env.reply_stream else ReplyTo(),
        deadline_ms=env.deadline_ms,
        priority=env.priority,
        parameters=dict(env.parameters),
        created_ms=env.created_ms,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-n", type=int, default=20_000)
    args = p.parse_args()
    data = np.arange(16, dtype=np.float32)
    request = InferRequest(
        id=uuid.uuid4().hex,
        model="identity",
        version="",
        inputs=(Tensor("INPUT0", "FP32", (1, 16), data.tobytes()),),
        reply=ReplyTo(stream="plaza:replies:bench"),
        created_ms=1,
    )
    envelope = encode_request(request)
    a, b = decode_request(envelope), decode_with_msgspec(envelope)
    assert (a.id, a.inputs[0].shape, bytes(a.inputs[0].data)) == (
        b.id,
        b.inputs[0].shape,
        bytes(b.inputs[0].data),
    )
    best = {"plaza.codec.decode_request": float("inf"), "msgspec Struct decoder": float("inf")}
    for _ in range(args.rounds):
        for name, fn in (
            ("plaza.codec.decode_request", decode_request),
            ("msgspec Struct decoder", decode_with_msgspec),
        ):
            seconds = timeit.timeit(functools.partial(fn, envelope), number=args.n)
            best[name] = min(best[name], seconds / args.n * 1e6)
    for name, us in best.items():
        print(f"{name:<28} {us:6.2f} us per envelope ({len(envelope)} bytes)")
    ratio = best["msgspec Struct decoder"] / best["plaza.codec.decode_request"]
    print(f"msgspec / plaza.codec: {ratio:.2f}")


if __name__ == "__main__":
    main()
