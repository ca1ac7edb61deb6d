"""Time a decoupled model's first and final responses through the gRPC stream, as a client.

tritonclient's streaming client sends one request at a time (the next once the final
response came) and times, at the client, the first response that carries ``--output``
and the final one. Prints the medians after ``--skip`` warm-up requests.

    python scripts/stream_probe.py "the plaza merges cars" --requests 200   # on `plaza up`
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient


def probe(
    url: str, model: str, name: str, output: str, text: str, requests: int
) -> list[tuple[float, float, int]]:
    """(first response ms, final response ms, responses) per request."""
    got: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(
        callback=lambda result, error: got.put((time.perf_counter(), result, error))
    )
    rows = []
    try:
        for _ in range(requests):
            tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
            start = time.perf_counter()
            client.async_stream_infer(model, [tensor], enable_empty_final_response=True)
            first = None
            count = 0
            while True:
                at, result, error = got.get(timeout=30)
                if error is not None:
                    raise RuntimeError(str(error))
                count += 1
                if first is None and result.as_numpy(output) is not None:
                    first = at
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            rows.append(((first or at) - start, at - start, count))
    finally:
        client.stop_stream()
        client.close()
    return [(f * 1e3, t * 1e3, n) for f, t, n in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text")
    parser.add_argument("--url", default="localhost:8001")
    parser.add_argument("--model", default="words")
    parser.add_argument("--input", default="TEXT")
    parser.add_argument("--output", default="WORD")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--skip", type=int, default=10)
    args = parser.parse_args()
    rows = probe(args.url, args.model, args.input, args.output, args.text, args.requests)[
        args.skip :
    ]
    first = statistics.median(r[0] for r in rows)
    final = statistics.median(r[1] for r in rows)
    label = repr(args.text[:24])
    print(f"{label}: first p50 {first:.2f} ms, final p50 {final:.2f} ms, responses {rows[-1][2]}")


if __name__ == "__main__":
    main()
