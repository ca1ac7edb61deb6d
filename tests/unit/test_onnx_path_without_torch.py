"""torch is an optional extra: the ONNX path (worker, backend, runner) never imports it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import numpy as np
from plaza.client import make_request
from plaza.repository import ModelRepository
import plaza.workers.worker, workers.main, gateway.app  # the whole worker and gateway
from plaza.workers.backends import create_backend
from plaza.workers.device import CPU
from plaza.workers.runner import BatchRunner, WorkItem

mv = ModelRepository("model_repository").served_versions("identity")[0]
backend = create_backend(mv, CPU, threads=1)
backend.load()
item = WorkItem(make_request("identity", {"INPUT0": np.ones((1, 3), np.float32)}), 1, 1)
result = BatchRunner(mv.spec, {1: backend}).run_group([item])[0]
assert result.status == "ok", result
print("torch imported:", "torch" in sys.modules)
"""


def test_onnx_worker_path_does_not_import_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "torch imported: False" in out.stdout
