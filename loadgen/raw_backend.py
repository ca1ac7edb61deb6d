"""The model alone: ONNX Runtime in-process, no Kafka, Redis or HTTP, over batch sizes.

    python -m plaza.loadgen.raw_backend --model mlp --batch-sizes 1,32
    python -m plaza.loadgen.raw_backend --model minilm --batch-sizes 1,32 --seq-lens 16,128

This is the ceiling the engine is measured against, and it tells how much batching is worth
for a model. The session runs as a Plaza worker runs it: ``intra_op_num_threads`` 2 (the
default), ``inter_op_num_threads`` 1, ``ORT_SEQUENTIAL``. Batch sizes are measured side by
side: each round runs one timed window per batch size, rounds repeat, and the report gives
the median items/s per batch size and the median over rounds of the paired ratio to the
smallest batch size (the machine is noisy; pairing cancels slow drifts).

Results are printed and merged into ``results/raw_backend.json`` under a key per model and
sequence length (``mlp``, ``minilm/seq16``), so several invocations build up one file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plaza.datatypes import to_numpy_dtype
from plaza.errors import PlazaError
from plaza.modelconfig import PLATFORM_ONNX, ModelSpec, TensorSpec
from plaza.repository import ModelRepository

DEFAULT_OUTPUT = Path("results/raw_backend.json")
WARMUP_S = 0.3
MIN_RUNS_PER_WINDOW = 3


@dataclass(frozen=True)
class BenchConfig:
    """How to measure: threads, rounds and the length of each timed window."""

    intra_op_threads: int = 2
    rounds: int = 5
    window_s: float = 1.0
    seed: int = 0


def open_session(path: Path, intra_op_threads: int) -> Any:
    """An onnxruntime CPU session configured like a Plaza worker's."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _input_values(
    tensor: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """Plausible values: ones for an attention mask, in-vocabulary ids, normal floats."""
    dtype = to_numpy_dtype(tensor.datatype)
    if tensor.name == "attention_mask":
        return np.ones(shape, dtype=dtype)
    if tensor.name == "input_ids":
        ids = rng.integers(1000, 30000, shape, dtype=dtype)
        ids[..., 0], ids[..., -1] = 101, 102  # [CLS] ... [SEP]
        return ids
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def make_inputs(
    spec: ModelSpec, batch: int, seq_len: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """A batch of inputs for ``spec``: the batch dim first, each -1 dim set to ``seq_len``."""
    feeds = {}
    for tensor in spec.inputs:
        dims = tuple(seq_len if d == -1 else d for d in tensor.dims)
        shape = (batch, *dims) if spec.max_batch_size > 0 else dims
        feeds[tensor.name] = _input_values(tensor, shape, rng)
    return feeds


def time_window(session: Any, feeds: dict[str, np.ndarray], window_s: float) -> tuple[int, float]:
    """Run back to back for ``window_s`` (at least a few runs); (runs, seconds)."""
    runs = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < window_s or runs < MIN_RUNS_PER_WINDOW:
        session.run(None, feeds)
        runs += 1
        elapsed = time.perf_counter() - started
    return runs, elapsed


def benchmark(
    session: Any, spec: ModelSpec, batch_sizes: Sequence[int], seq_len: int, config: BenchConfig
) -> dict[str, Any]:
    """Interleaved timed windows over ``batch_sizes``; medians and paired ratios."""
    rng = np.random.default_rng(config.seed)
    feeds = {b: make_inputs(spec, b, seq_len, rng) for b in batch_sizes}
    for b in batch_sizes:
        time_window(session, feeds[b], WARMUP_S)
    rates: dict[int, list[float]] = {b: [] for b in batch_sizes}
    latencies: dict[int, list[float]] = {b: [] for b in batch_sizes}
    for _ in range(config.rounds):
        for b in batch_sizes:
            runs, elapsed = time_window(session, feeds[b], config.window_s)
            rates[b].append(runs * b / elapsed)
            latencies[b].append(elapsed / runs * 1e3)
    base = min(batch_sizes)
    return {
        "baseline_batch_size": base,
        "batch_sizes": {
            str(b): {
                "items_per_s": statistics.median(rates[b]),
                "items_per_s_windows": [round(r, 1) for r in rates[b]],
                "batch_latency_ms": statistics.median(latencies[b]),
                "ratio_vs_baseline": statistics.median(
                    r / r0 for r, r0 in zip(rates[b], rates[base], strict=True)
                ),
            }
            for b in batch_sizes
        },
    }


def _has_variable_dims(spec: ModelSpec) -> bool:
    return any(d == -1 for t in spec.inputs for d in t.dims)


def _label(model: str, seq_len: int | None) -> str:
    return model if seq_len is None else f"{model}/seq{seq_len}"


def _print_report(label: str, result: dict[str, Any]) -> None:
    base = result["baseline_batch_size"]
    print(f"{label}:")
    print(f"  {'batch':>5}  {'items/s':>10}  {'batch ms':>9}  {'ratio vs b' + str(base):>12}")
    for size, row in result["batch_sizes"].items():
        print(
            f"  {size:>5}  {row['items_per_s']:>10.0f}  {row['batch_latency_ms']:>9.3f}"
            f"  {row['ratio_vs_baseline']:>11.2f}x"
        )


def write_results(path: Path, runs: dict[str, Any]) -> None:
    """Merge ``runs`` into the JSON file at ``path`` (one key per model / sequence length)."""
    existing: dict[str, Any] = {}
    if path.is_file():
        try:
            existing = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            existing = {}
    merged = {**existing.get("runs", {}), **runs}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": merged}, indent=2, sort_keys=True) + "\n", "utf-8")


def _environment(config: BenchConfig) -> dict[str, Any]:
    import onnxruntime as ort

    return {
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "intra_op_threads": config.intra_op_threads,
        "inter_op_threads": 1,
        "execution_mode": "ORT_SEQUENTIAL",
        "rounds": config.rounds,
        "window_s": config.window_s,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run(
    repository: Path,
    model: str,
    batch_sizes: Sequence[int],
    seq_lens: Sequence[int],
    config: BenchConfig,
) -> dict[str, Any]:
    """Benchmark the latest served version of ``model``; {label: result}."""
    version = ModelRepository(repository).served_versions(model)[-1]
    spec = version.spec
    if spec.platform != PLATFORM_ONNX:
        raise PlazaError(f"{model}: raw_backend runs ONNX models only (platform {spec.platform})")
    too_big = [b for b in batch_sizes if spec.max_batch_size and b > spec.max_batch_size]
    if too_big:
        raise PlazaError(
            f"{model}: batch sizes {too_big} exceed max_batch_size {spec.max_batch_size}"
        )
    session = open_session(version.path, config.intra_op_threads)
    lengths: list[int | None] = list(seq_lens) if _has_variable_dims(spec) else [None]
    results = {}
    for seq_len in lengths:
        label = _label(model, seq_len)
        result = benchmark(session, spec, batch_sizes, seq_len or 1, config)
        result.update(
            model=model, version=version.version, seq_len=seq_len, environment=_environment(config)
        )
        _print_report(label, result)
        results[label] = result
    return results


def _ints(text: str) -> list[int]:
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; 0 on success, 2 when the model cannot be benchmarked."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model in the repository (ONNX)")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--batch-sizes", type=_ints, default=[1, 32], help="e.g. 1,8,32")
    parser.add_argument(
        "--seq-lens",
        type=_ints,
        default=[16],
        help="lengths for -1 dims (e.g. minilm's sequence), e.g. 16,128",
    )
    parser.add_argument("--threads", type=int, default=2, help="intra_op_num_threads")
    parser.add_argument("--rounds", type=int, default=5, help="timed windows per batch size")
    parser.add_argument("--window-s", type=float, default=1.0, help="seconds per window")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    config = BenchConfig(args.threads, args.rounds, args.window_s)
    try:
        results = run(args.repository, args.model, args.batch_sizes, args.seq_lens, config)
    except PlazaError as exc:
        print(f"error: {exc.message} (build the models with `make models`)", file=sys.stderr)
        return 2
    write_results(args.output, results)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
