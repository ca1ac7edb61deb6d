"""The GPU check (issue 4): the worker's batch runner on the device, beside the raw call.

Runs each model's backend through ``plaza.workers.runner.BatchRunner`` (no Kafka, no Redis) over
batch sizes 1..256 and prints items/s next to the same backend's raw ``infer`` on an
already-stacked batch, so the runner's own overhead (stacking, splitting, result objects)
shows as a ratio. ONNX Runtime uses its CUDA provider when the installed onnxruntime has
one; otherwise the TorchScript MLP runs on CUDA through the PyTorch backend.

    python scripts/gpu_check.py [--device auto|cpu|cuda] [--out results/gpu_check.json]

On a machine without a GPU it runs on the CPU (useful to check the script itself).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from plaza.client import make_request
from plaza.repository import ModelRepository
from plaza.workers.backends import create_backend
from plaza.workers.device import select_device
from plaza.workers.runner import BatchRunner, WorkItem

ROOT = Path(__file__).resolve().parents[1]
SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def rows_for(model: str, n: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    if model == "minilm":
        ids = rng.integers(1000, 20000, (n, 32), dtype=np.int64)
        mask = np.ones_like(ids)
        return [{"input_ids": ids[i : i + 1], "attention_mask": mask[i : i + 1]} for i in range(n)]
    name = "INPUT__0" if model == "mlp_torch" else "input"
    x = rng.standard_normal((n, 512)).astype(np.float32)
    return [{name: x[i : i + 1]} for i in range(n)]


def timed(fn: Any, min_s: float = 0.5) -> float:
    """Seconds per call, repeated for at least ``min_s`` after one warm-up call."""
    fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_s or calls < 3:
        fn()
        calls += 1
    return elapsed / calls


def check(model: str, device_pref: str) -> list[dict[str, Any]]:
    repo = ModelRepository(ROOT / "model_repository")
    mv = repo.served_versions(model)[0]
    mv = replace(mv, spec=replace(mv.spec, max_batch_size=max(SIZES)))
    device = select_device(device_pref)  # type: ignore[arg-type]
    backend = create_backend(mv, device, threads=0)
    backend.load()
    runner = BatchRunner(mv.spec, {mv.version: backend})
    rng = np.random.default_rng(0)
    rows = []
    for n in SIZES:
        reqs = rows_for(model, n, rng)
        items = [WorkItem(make_request(model, r), rows=1, version=mv.version) for r in reqs]
        stacked = {k: np.concatenate([r[k] for r in reqs]) for k in reqs[0]}
        outputs = [o.name for o in mv.spec.outputs]
        raw = timed(functools.partial(backend.infer, stacked, outputs))
        via_runner = timed(functools.partial(runner.run_group, items))
        rows.append(
            {
                "model": model,
                "device": str(device),
                "batch": n,
                "raw_items_s": n / raw,
                "runner_items_s": n / via_runner,
                "runner_over_raw": raw / via_runner,
            }
        )
        print(
            f"{model:10s} {device!s:>24s} batch {n:4d}: raw {n / raw:10.0f}/s  "
            f"runner {n / via_runner:10.0f}/s  ratio {raw / via_runner:5.2f}",
            flush=True,
        )
    backend.unload()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check.json")
    args = parser.parse_args()
    cuda_ort = "CUDAExecutionProvider" in ort.get_available_providers()
    models = ["mlp", "minilm"] if cuda_ort or args.device == "cpu" else ["mlp_torch"]
    print(f"onnxruntime providers: {ort.get_available_providers()}; models: {models}")
    rows = [row for m in models for row in check(m, args.device)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
