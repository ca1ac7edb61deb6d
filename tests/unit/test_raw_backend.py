"""The raw ceiling runs the worker's own backend, with the worker's thread default."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from plaza.errors import PlazaError
from plaza.loadgen.raw_backend import BenchConfig, _parser, main, run, write_results
from plaza.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
QUICK = BenchConfig(rounds=1, window_s=0.01, device="cpu")


def _simulated_repo(tmp_path: Path) -> Path:
    """The committed simulated model with short sleeps, and no version folder yet."""
    repo = tmp_path / "repo"
    (repo / "simulated").mkdir(parents=True)
    config = (ROOT / "model_repository" / "simulated" / "config.pbtxt").read_text()
    config = config.replace('"1000"', '"20"').replace('"15000"', '"200"')
    (repo / "simulated" / "config.pbtxt").write_text(config)
    return repo


def _identity_repo(tmp_path: Path, threads: int | None = None) -> Path:
    source = ROOT / "model_repository" / "identity"
    if not (source / "1" / "model.onnx").is_file():
        pytest.skip("identity is not built (make models)")
    shutil.copytree(source, tmp_path / "identity")
    if threads is not None:
        config = tmp_path / "identity" / "config.pbtxt"
        value = f'value: {{ string_value: "{threads}" }}'
        param = f'parameters [{{ key: "intra_op_thread_count" {value} }}]'
        config.write_text(config.read_text() + param + "\n")
    return tmp_path


def test_the_default_threads_are_the_workers() -> None:
    worker_default = WorkerSettings.model_fields["intra_op_threads"].default
    assert BenchConfig().intra_op_threads == worker_default
    assert _parser().parse_args(["--model", "m"]).threads == worker_default


def test_a_simulated_model_runs_through_the_worker_backend(tmp_path: Path) -> None:
    """Only the worker's backend factory knows plaza_simulated: a bare onnxruntime could not."""
    repo = _simulated_repo(tmp_path)
    results = run(repo, "simulated", [1, 4], [16], QUICK)
    result = results["simulated"]
    assert set(result["batch_sizes"]) == {"1", "4"}
    assert all(row["items_per_s"] > 0 for row in result["batch_sizes"].values())
    assert result["environment"]["platform"] == "plaza_simulated"
    assert (repo / "simulated" / "1").is_dir()


def test_an_onnx_model_gets_the_workers_thread_count(tmp_path: Path) -> None:
    default = run(_identity_repo(tmp_path / "a"), "identity", [1, 2], [8], QUICK)
    env = default["identity/seq8"]["environment"]
    assert env["intra_op_threads"] == (os.cpu_count() or 1)  # worker default: every core
    assert env["execution_mode"] == "ORT_SEQUENTIAL" and "onnxruntime" in env
    pinned = run(_identity_repo(tmp_path / "b", threads=1), "identity", [1], [8], QUICK)
    assert pinned["identity/seq8"]["environment"]["intra_op_threads"] == 1


def test_batch_sizes_over_the_limit_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PlazaError, match="exceed max_batch_size 16"):
        run(_simulated_repo(tmp_path), "simulated", [1, 32], [16], QUICK)


def test_cli_reports_an_unknown_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "nope", "--repository", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err


def test_results_merge_by_label(tmp_path: Path) -> None:
    out = tmp_path / "raw.json"
    write_results(out, {"mlp": {"x": 1}})
    write_results(out, {"minilm/seq16": {"x": 2}})
    assert set(json.loads(out.read_text())["runs"]) == {"mlp", "minilm/seq16"}
