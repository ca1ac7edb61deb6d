"""The model alone: the worker's own backend in-process, no Kafka, Redis or HTTP.

    python -m plaza.loadgen.raw_backend --model mlp --batch-sizes 1,32
    python -m plaza.loadgen.raw_backend --model minilm --batch-sizes 1,32 --seq-lens 16,128

This is the ceiling the engine is measured against, and it tells how much batching is worth
for a model. The model runs exactly as a Plaza worker runs it: through
``plaza.workers.backends.create_backend(...)``, ``load()`` and ``infer(batch, outputs)``, with
the worker's default intra-op thread count (``WorkerSettings.intra_op_threads`` = 0: the
config's ``intra_op_thread_count`` parameter, else every core; ``--threads`` overrides it).
The ONNX backend adds ``inter_op_num_threads`` 1, ``ORT_SEQUENTIAL`` and the worker's default
thread spinning (``WorkerSettings.ort_intra_op_spinning``, off), as in the worker.
Batch sizes are measured side by side: each round runs one timed window per batch size, rounds
repeat, and the report gives the median items/s per batch size and the median over rounds of
the paired ratio to the smallest batch size (the machine is noisy; pairing cancels slow
drifts).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from plaza.errors import PlazaError
from plaza.loadgen import report_json
from plaza.loadgen.inputs import InputSet, model_inputs
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository, ModelVersion
from plaza.samples.simulated import ensure_servable
from plaza.settings import WorkerSettings
from plaza.workers.backends import Backend, create_backend
from plaza.workers.backends.base import thread_count
from plaza.workers.device import select_device

DEFAULT_OUTPUT = Path("results/raw_backend.json")
WARMUP_S = 0.3
MIN_RUNS_PER_WINDOW = 3
WORKER_DEFAULT_THREADS: int = WorkerSettings.model_fields["intra_op_threads"].default
"""The worker's default ``intra_op_threads`` (0: the model's config, else every core)."""

DeviceChoice = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class BenchConfig:
    """How to measure: threads (the worker's default), rounds and each timed window."""

    intra_op_threads: int = WORKER_DEFAULT_THREADS
    rounds: int = 5
    window_s: float = 1.0
    seed: int = 0
    device: DeviceChoice = "auto"


def open_session(path: Path, intra_op_threads: int, spinning: bool | None = None) -> Any:
    """A bare onnxruntime CPU session with a worker's thread options, for code that measures
    something other than Plaza (the baseline server); the ceiling uses the worker backend.
    ``spinning`` None leaves thread spinning at ONNX Runtime's default (on), as a naive
    server has it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if spinning is not None:
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if spinning else "0"
        )
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def time_calls(call: Callable[[], object], window_s: float) -> tuple[int, float]:
    """Run ``call`` back to back for ``window_s`` (at least a few runs); (runs, seconds)."""
    runs = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < window_s or runs < MIN_RUNS_PER_WINDOW:
        call()
        runs += 1
        elapsed = time.perf_counter() - started
    return runs, elapsed


def time_window(session: Any, feeds: InputSet, window_s: float) -> tuple[int, float]:
    """``time_calls`` over a bare onnxruntime session's ``run`` (see ``open_session``)."""
    return time_calls(lambda: session.run(None, feeds), window_s)


def _infer_call(backend: Backend, spec: ModelSpec, feeds: InputSet) -> Callable[[], object]:
    outputs = [o.name for o in spec.outputs]
    return lambda: backend.infer(feeds, outputs)


def benchmark(
    backend: Backend,
    spec: ModelSpec,
    batch_sizes: Sequence[int],
    seq_len: int,
    config: BenchConfig,
) -> dict[str, Any]:
    """Interleaved timed windows of ``backend.infer`` over ``batch_sizes``; medians and
    paired ratios."""
    rng = np.random.default_rng(config.seed)
    calls = {
        b: _infer_call(backend, spec, model_inputs(spec, b, seq_len, rng)) for b in batch_sizes
    }
    for b in batch_sizes:
        time_calls(calls[b], WARMUP_S)
    rates: dict[int, list[float]] = {b: [] for b in batch_sizes}
    latencies: dict[int, list[float]] = {b: [] for b in batch_sizes}
    for _ in range(config.rounds):
        for b in batch_sizes:
            runs, elapsed = time_calls(calls[b], config.window_s)
            rates[b].append(runs * b / elapsed)
            latencies[b].append(elapsed / runs * 1e3)
    return _summary(rates, latencies)


def _summary(rates: dict[int, list[float]], latencies: dict[int, list[float]]) -> dict[str, Any]:
    """Per batch size: median items/s, each window's rate, median latency, paired ratio."""
    base = min(rates)
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
            for b in rates
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
    path.write_text(report_json.dumps({"runs": merged}, sort_keys=True) + "\n", "utf-8")


def _environment(mv: ModelVersion, backend: Backend, config: BenchConfig) -> dict[str, Any]:
    """What the numbers were measured with: versions, the resolved threads, the device."""
    env: dict[str, Any] = {
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": mv.spec.platform,
        "device": str(backend.device),
        "intra_op_threads": thread_count(mv, config.intra_op_threads),
        "rounds": config.rounds,
        "window_s": config.window_s,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if "onnxruntime" in sys.modules:
        env["onnxruntime"] = sys.modules["onnxruntime"].__version__
        env.update(inter_op_threads=1, execution_mode="ORT_SEQUENTIAL")
    return env


def _served_version(repository: Path, model: str, batch_sizes: Sequence[int]) -> ModelVersion:
    """The latest served version; PlazaError when a batch size exceeds max_batch_size."""
    ensure_servable(repository, model)
    mv = ModelRepository(repository).served_versions(model)[-1]
    limit = mv.spec.max_batch_size
    too_big = [b for b in batch_sizes if limit and b > limit]
    if too_big:
        raise PlazaError(f"{model}: batch sizes {too_big} exceed max_batch_size {limit}")
    return mv


def run(
    repository: Path,
    model: str,
    batch_sizes: Sequence[int],
    seq_lens: Sequence[int],
    config: BenchConfig,
) -> dict[str, Any]:
    """Benchmark the latest served version of ``model`` on the worker backend; {label: result}."""
    mv = _served_version(repository, model, batch_sizes)
    backend = create_backend(mv, select_device(config.device), config.intra_op_threads)
    backend.load()
    try:
        lengths: list[int | None] = list(seq_lens) if _has_variable_dims(mv.spec) else [None]
        results = {}
        for seq_len in lengths:
            result = benchmark(backend, mv.spec, batch_sizes, seq_len or 1, config)
            env = _environment(mv, backend, config)
            result.update(model=model, version=mv.version, seq_len=seq_len, environment=env)
            _print_report(_label(model, seq_len), result)
            results[_label(model, seq_len)] = result
    finally:
        backend.unload()
    return results


def _ints(text: str) -> list[int]:
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model in the repository")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--batch-sizes", type=_ints, default=[1, 32], help="e.g. 1,8,32")
    parser.add_argument(
        "--seq-lens",
        type=_ints,
        default=[16],
        help="lengths for -1 dims (e.g. minilm's sequence), e.g. 16,128",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=WORKER_DEFAULT_THREADS,
        help="intra-op threads (default: the worker's, 0 = the config's, else every core)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--rounds", type=int, default=5, help="timed windows per batch size")
    parser.add_argument("--window-s", type=float, default=1.0, help="seconds per window")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; 0 on success, 2 when the model cannot be benchmarked."""
    args = _parser().parse_args(argv)
    config = BenchConfig(args.threads, args.rounds, args.window_s, device=args.device)
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
