"""orjson against msgspec for the HTTP front's JSON tensors, side by side, one process.

    PYTHONPATH=/tmp/perf2-pkgs python -m plaza.loadgen.json_codecs [--json PATH]

msgspec is not a dependency: install it apart from the venv to measure
(``pip install --target DIR msgspec``, then ``PYTHONPATH=DIR``). For each body size (the
sample mlp's request, 512 FP32 values, and larger ones) it times, per call, the two steps
``gateway/kserve.py`` spends on a JSON tensor body: parse the body and make the input's
numpy array (``np.asarray`` of the parsed list, as ``_numeric_array`` does), and write a
response holding an FP32 output (orjson serialises the numpy array itself; msgspec has no
numpy support, so it gets ``tolist()``). Prints microseconds a call and msgspec / orjson.
"""

from __future__ import annotations

import argparse
import timeit
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from plaza.loadgen import report_json


def _body(values: int, rng: np.random.Generator) -> bytes:
    data = rng.standard_normal(values).astype(np.float32)
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, values], "data": data.tolist()}
        ]
    }
    return orjson.dumps(doc)


def _best(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def measure(sizes: tuple[int, ...] = (10, 512, 4096)) -> list[dict[str, Any]]:
    """Per size: microseconds a call for each library and step, and the ratios."""
    import msgspec  # only here: not a dependency

    decoder, encoder = msgspec.json.Decoder(), msgspec.json.Encoder()
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        body = _body(n, rng)
        out = rng.standard_normal(n).astype(np.float32)
        response = {"model_name": "mlp", "model_version": "1", "id": "x"}
        number = max(200, 200_000 // n)

        def parse_orjson(body: bytes = body) -> Any:
            return np.asarray(orjson.loads(body)["inputs"][0]["data"])

        def parse_msgspec(body: bytes = body) -> Any:
            return np.asarray(decoder.decode(body)["inputs"][0]["data"])

        def write_orjson(out: Any = out, response: dict[str, str] = response) -> bytes:
            doc = {**response, "outputs": [{"name": "OUTPUT0", "data": out}]}
            return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)

        def write_msgspec(out: Any = out, response: dict[str, str] = response) -> bytes:
            doc = {**response, "outputs": [{"name": "OUTPUT0", "data": out.tolist()}]}
            return bytes(encoder.encode(doc))

        assert np.allclose(parse_orjson(), parse_msgspec())
        assert np.allclose(orjson.loads(write_msgspec())["outputs"][0]["data"], out)
        row: dict[str, Any] = {"values": n, "body_bytes": len(body)}
        for step, a, b in (
            ("parse", parse_orjson, parse_msgspec),
            ("write", write_orjson, write_msgspec),
        ):
            row[f"{step}_orjson_us"] = round(_best(a, number), 2)
            row[f"{step}_msgspec_us"] = round(_best(b, number), 2)
            row[f"{step}_msgspec_over_orjson"] = round(
                row[f"{step}_msgspec_us"] / row[f"{step}_orjson_us"], 2
            )
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = measure()
    for r in rows:
        print(
            f"{r['values']:5d} values: parse orjson {r['parse_orjson_us']:8.2f} us, msgspec "
            f"{r['parse_msgspec_us']:8.2f} ({r['parse_msgspec_over_orjson']:.2f}x); write "
            f"orjson {r['write_orjson_us']:8.2f} us, msgspec {r['write_msgspec_us']:8.2f} "
            f"({r['write_msgspec_over_orjson']:.2f}x)"
        )
    if args.json:
        args.json.write_text(report_json.dumps(rows), encoding="utf-8")


if __name__ == "__main__":
    main()
