"""``python -m plaza.workers.ensemble``: a user error is one line and exit status 1, before
any service is contacted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IDENTITY = """
name: "identity"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
BROKEN = """
name: "broken"
platform: "ensemble"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "missing" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" }
} ] }
"""


def run(*args: str, repository: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAZA_")}
    env["PLAZA_REPOSITORY"] = str(repository)
    argv = [sys.executable, "-m", "plaza.workers.ensemble", *args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    for name, config in (("identity", IDENTITY), ("broken", BROKEN)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(config)
    return tmp_path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "worker.model is required"),
        (("--worker.model", "identity"), "model 'identity' is not an ensemble"),
        (("--worker.model", "broken"), "step 0 (model 'missing'): model 'missing' is not in"),
        (("--worker.model", "nope"), "model 'nope' is not in the repository"),
    ],
)
def test_a_user_error_is_one_line(args: tuple[str, ...], message: str, repository: Path) -> None:
    done = run(*args, repository=repository)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("plaza ensemble: error: ") and message in done.stderr
    assert "Traceback" not in done.stderr
