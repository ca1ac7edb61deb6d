#!/usr/bin/env python
"""The parts of ``admit`` (the worker's per-record admission), microseconds each.

    python scripts/admit_cost.py [--model identity] [--requests 20000]

``admit`` as ``plaza.loadgen.hotpath`` times it, and each of its parts alone over the same
envelopes: the typed msgpack decode, ``decode_request`` (the decode and the rebuild into
the contract's ``InferRequest`` and ``Tensor``), ``validate_request``, ``resolve_version``,
the reply stream check, and the ``WorkItem``. CPU of this thread, best of five.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from aiokafka.structs import TopicPartition

from plaza.codec import _REQUEST_DECODER, decode_request, encode_request
from plaza.contract import InferRequest, ReplyTo
from plaza.loadgen.inputs import input_pool
from plaza.model_control import model_spec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from plaza.validation import validate_request
from plaza.workers.admission import admit, resolve_version
from plaza.workers.runner import WorkItem


def _best(fn: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="identity")
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    settings = PlazaSettings()
    names = settings.names
    repo = ModelRepository(settings.repository)
    spec = model_spec(repo, args.model)
    versions = [mv.version for mv in repo.served_versions(args.model, spec)]
    pool = input_pool(spec)
    stream = names.reply_stream("bench")
    n = args.requests
    values = [
        encode_request(
            InferRequest(
                id=f"r{i}",
                model=args.model,
                version="",
                inputs=tuple(Tensor.from_numpy(k, a) for k, a in pool[i % len(pool)].items()),
                reply=ReplyTo(stream),
                created_ms=1,
            )
        )
        for i in range(n)
    ]
    reqs = [decode_request(v) for v in values]
    tp = TopicPartition("t", 0)
    parts: dict[str, Callable[[], Any]] = {
        "admit": lambda: [
            admit(v, spec, versions, max_bytes=1 << 23, names=names, now=1.0, partition=tp)
            for v in values
        ],
        "typed decode": lambda: [_REQUEST_DECODER.decode(v) for v in values],
        "decode_request": lambda: [decode_request(v) for v in values],
        "validate_request": lambda: [validate_request(r, spec) for r in reqs],
        "resolve_version": lambda: [resolve_version(r, spec, versions) for r in reqs],
        "reply stream check": lambda: [names.is_reply_stream(stream) for _ in reqs],
        "WorkItem": lambda: [WorkItem(request=r, rows=1, version=1, received=1.0) for r in reqs],
    }
    print(f"{args.model}: {len(values[0])}-byte envelopes, {n} of them")
    for name, fn in parts.items():
        print(f"{name:20s} {_best(fn, n):6.2f} us/request")


if __name__ == "__main__":
    main()
