"""The request envelope's decode: the typed msgspec decoder against the checked one.

``plaza.codec.decode_request`` reads an envelope with msgspec's typed decoder, whose types
and constraints carry the protocol's checks, and hands what that refuses to
``_decode_checked`` (msgpack, then the checks written out in Python). This times both on
the same bytes, in alternation:

    python scripts/envelope_decode_cost.py [--rounds 5] [-n 20000]

Prints the best of ``--rounds`` for each, microseconds per envelope, and their ratio.
"""

from __future__ import annotations

import argparse
import functools
import timeit
import uuid

import numpy as np

from plaza.codec import _decode_checked, decode_request, encode_request
from plaza.contract import InferRequest, ReplyTo
from plaza.tensors import Tensor


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
        sent_us=2,
    )
    envelope = encode_request(request)
    assert decode_request(envelope) == _decode_checked(envelope)
    decoders = {
        "typed (decode_request)": decode_request,
        "checked (_decode_checked)": _decode_checked,
    }
    best = dict.fromkeys(decoders, float("inf"))
    for _ in range(args.rounds):
        for name, fn in decoders.items():
            seconds = timeit.timeit(functools.partial(fn, envelope), number=args.n)
            best[name] = min(best[name], seconds / args.n * 1e6)
    for name, us in best.items():
        print(f"{name:<26} {us:6.2f} us per envelope ({len(envelope)} bytes)")
    typed, checked = best.values()
    print(f"typed / checked: {typed / checked:.2f}")


if __name__ == "__main__":
    main()
