"""The pieces behind issue 12's benchmarks: perf_analyzer's command, inputs and CSV; the
naive server's Triton endpoints; ONNX Runtime's spinning options; gateway processes'
settings and shared-port sockets. No speed is asserted anywhere here."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from starlette.testclient import TestClient

from plaza.errors import ConfigError
from plaza.gateway.main import process_settings, reuse_port_socket
from plaza.loadgen import perf_analyzer
from plaza.loadgen.baseline_server import create_app
from plaza.repository import ModelRepository
from plaza.settings import GatewaySettings, PlazaSettings, WorkerSettings
from plaza.workers.backends import create_backend, onnx
from plaza.workers.device import CPU
from tests.support import REPOSITORY

ROOT = Path(__file__).resolve().parents[2]

NAIVE_CSV = (
    "Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,"
    "p95 latency,p99 latency\n1,1474.34,56,0,329,693,2472,7661\n"
)


def test_parse_csv_reads_throughput_and_percentiles_in_ms() -> None:
    result = perf_analyzer.parse_csv(NAIVE_CSV)
    assert result.concurrency == 1
    assert result.throughput == pytest.approx(1474.34)
    assert (result.p50_ms, result.p99_ms) == (pytest.approx(0.329), pytest.approx(7.661))
    assert result.columns["Client Send"] == "56"


def test_parse_csv_without_a_row_is_an_error() -> None:
    with pytest.raises(ValueError, match="no result row"):
        perf_analyzer.parse_csv(NAIVE_CSV.splitlines()[0])


def test_input_data_drops_the_batch_dim_and_refuses_nan(tmp_path: Path) -> None:
    pool = [{"input": np.arange(4, dtype=np.float32).reshape(1, 4)} for _ in range(2)]
    path = perf_analyzer.write_input_data(pool, tmp_path / "in.json")
    doc = json.loads(path.read_text())
    assert doc["data"][0]["input"] == {"content": [0.0, 1.0, 2.0, 3.0], "shape": [4]}
    assert len(doc["data"]) == 2
    bad = [{"input": np.array([[np.nan]], dtype=np.float32)}]
    with pytest.raises(ValueError, match="NaN"):
        perf_analyzer.write_input_data(bad, tmp_path / "bad.json")


def test_command_is_sync_bounded_and_json_over_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "perf_analyzer"
    fake.write_text("")
    monkeypatch.setenv(perf_analyzer.BINARY_ENV, str(fake))
    http = perf_analyzer.command("mlp", "h:1", "http", 16, tmp_path / "i", tmp_path / "o", 2000)
    grpc = perf_analyzer.command("mlp", "h:2", "grpc", 16, tmp_path / "i", tmp_path / "o", 2000)
    assert http[0] == str(fake)
    for argv in (http, grpc):
        assert "--async" not in argv and "-a" not in argv
        assert argv[argv.index("--max-trials") + 1] == str(perf_analyzer.WINDOWS)
        assert argv[argv.index("--measurement-interval") + 1] == "2000"
        assert argv[argv.index("--input-data") + 1] == str(tmp_path / "i")
    assert http[http.index("--input-tensor-format") + 1] == "json"
    assert "--input-tensor-format" not in grpc


def test_missing_binary_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(perf_analyzer.BINARY_ENV, str(tmp_path / "absent"))
    with pytest.raises(perf_analyzer.PerfAnalyzerMissing, match="make bench-tools"):
        perf_analyzer.binary_path()


def _identity_repository(tmp_path: Path) -> Path:
    source = ROOT / "model_repository" / "identity"
    if not (source / "1" / "model.onnx").is_file():
        pytest.skip("identity is not built (make models)")
    shutil.copytree(source, tmp_path / "identity")
    return tmp_path


def test_naive_server_answers_what_perf_analyzer_asks(tmp_path: Path) -> None:
    _identity_repository(tmp_path)
    with TestClient(create_app(tmp_path, "identity", threads=1)) as client:
        assert client.get("/v2").status_code == 200
        meta = client.get("/v2/models/identity").json()
        assert meta["inputs"][0]["name"] == "INPUT0"
        assert client.get("/v2/models/identity/config").json()["max_batch_size"] == 64
        body = {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]
        }
        answer = client.post("/v2/models/identity/infer", json=body).json()
        assert answer["outputs"][0]["data"] == [1.0, 2.0, 3.0]
        stats = client.get("/v2/models/identity/stats").json()["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 1


@pytest.mark.parametrize("spinning", [True, False])
def test_session_tuning_sets_both_spinning_entries(spinning: bool) -> None:
    opts = ort.SessionOptions()
    onnx.SessionTuning(intra_op_spinning=spinning, inter_op_spinning=spinning).apply(opts)
    expected = "1" if spinning else "0"
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == expected
    assert opts.get_session_config_entry("session.inter_op.allow_spinning") == expected


def test_tuning_defaults_are_the_worker_settings_defaults() -> None:
    ws = WorkerSettings()
    assert onnx.SessionTuning() == onnx.SessionTuning.from_settings(ws)


def test_the_worker_settings_reach_the_onnx_backend() -> None:
    repo = ModelRepository(REPOSITORY)
    (mv,) = repo.served_versions("identity", repo.spec("identity"))
    worker = WorkerSettings(ort_intra_op_spinning=True, ort_inter_op_spinning=False)
    backend = create_backend(mv, CPU, 1, settings=PlazaSettings(worker=worker))
    assert isinstance(backend, onnx.OnnxBackend)
    assert backend.tuning == onnx.SessionTuning(intra_op_spinning=True, inter_op_spinning=False)
    default = create_backend(mv, CPU, 1)
    assert isinstance(default, onnx.OnnxBackend) and default.tuning == onnx.SessionTuning()


def test_each_gateway_process_gets_its_metrics_port_and_id() -> None:
    settings = PlazaSettings(gateway=GatewaySettings(workers=3, metrics_port=9002, gateway_id="gw"))
    second = process_settings(settings, 2).gateway
    assert (second.workers, second.metrics_port, second.gateway_id) == (3, 9004, "gw-2")
    assert second.http_port == settings.gateway.http_port
    off = PlazaSettings(gateway=GatewaySettings(workers=2, metrics_port=-1))
    first = process_settings(off, 1).gateway
    assert (first.metrics_port, first.gateway_id) == (-1, "")


def test_gateway_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        GatewaySettings(workers=0)


def test_shared_port_sockets_bind_together_and_refuse_a_taken_port() -> None:
    with reuse_port_socket("127.0.0.1", 0) as first:
        port = first.getsockname()[1]
        with reuse_port_socket("127.0.0.1", port) as second:
            assert second.getsockname()[1] == port
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        with pytest.raises(ConfigError, match="cannot listen"):
            reuse_port_socket("127.0.0.1", plain.getsockname()[1])


IDENTITY_BODY = {
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]
}


def test_the_canned_server_answers_its_start_answer_whatever_it_is_sent(tmp_path: Path) -> None:
    _identity_repository(tmp_path)
    with TestClient(create_app(tmp_path, "identity", threads=1, canned=True)) as client:
        first = client.post("/v2/models/identity/infer", json=IDENTITY_BODY).json()
        other = client.post("/v2/models/identity/infer", content=b"not even json").json()
        assert first == other
        (out,) = first["outputs"]
        assert out["name"] == "OUTPUT0" and out["data"] == [0.0] * len(out["data"])
        stats = client.get("/v2/models/identity/stats").json()["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 2


@pytest.mark.parametrize("canned", [False, True])
async def test_the_baseline_serves_its_lane_over_grpc(tmp_path: Path, canned: bool) -> None:
    import tritonclient.grpc.aio as grpcclient

    from plaza.loadgen.baseline_grpc import start_grpc
    from plaza.loadgen.baseline_server import Lane

    lane = Lane(_identity_repository(tmp_path), "identity", threads=1, canned=canned)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = await start_grpc(lane, "127.0.0.1", port)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert await client.is_model_ready("identity")
        meta = await client.get_model_metadata("identity", as_json=True)
        assert meta["inputs"][0]["name"] == "INPUT0"
        config = await client.get_model_config("identity", as_json=True)
        assert config["config"]["max_batch_size"] == 64
        sent = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", list(sent.shape), "FP32")
        tensor.set_data_from_numpy(sent)
        answer = (await client.infer("identity", [tensor])).as_numpy("OUTPUT0")
        # canned: the start answer, identity's output for zeros of shape [1, 1] (its dims
        # are free; free dims are 1 there), whatever was sent
        np.testing.assert_array_equal(answer, np.zeros((1, 1), np.float32) if canned else sent)
        stats = await client.get_inference_statistics("identity", as_json=True)
        assert int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) == 1
    finally:
        await client.close()
        await server.stop(None)


def test_a_perf_analyzer_run_reports_its_own_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """perf_analyzer.run times the binary it starts: a stand-in that burns CPU, then writes
    the CSV perf_analyzer would (its path follows -f)."""
    fake = tmp_path / "perf_analyzer"
    csv_text = tmp_path / "row.csv"
    csv_text.write_text(NAIVE_CSV)
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import shutil, sys, time\n"
        "end = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\n"
        f"shutil.copy({str(csv_text)!r}, sys.argv[sys.argv.index('-f') + 1])\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv(perf_analyzer.BINARY_ENV, str(fake))
    result = perf_analyzer.run("mlp", "h:1", "http", 1, tmp_path / "in.json", interval_ms=10)
    assert result.throughput == pytest.approx(1474.34)
    assert result.cpu_s >= 0.25
    assert result.as_dict()["client_cpu_s"] == round(result.cpu_s, 3)
    assert not result.lingered


def test_a_perf_analyzer_that_hangs_after_writing_its_csv_is_killed_and_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv_text = tmp_path / "row.csv"
    csv_text.write_text(NAIVE_CSV)
    fake = tmp_path / "perf_analyzer"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import shutil, signal, sys\n"
        f"shutil.copy({str(csv_text)!r}, sys.argv[sys.argv.index('-f') + 1])\n"
        "signal.pause()  # hangs on its way out, until killed\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv(perf_analyzer.BINARY_ENV, str(fake))
    monkeypatch.setattr(perf_analyzer, "EXIT_GRACE_S", 0.2)
    result = perf_analyzer.run("mlp", "h:1", "http", 1, tmp_path / "in.json", interval_ms=10)
    assert result.lingered and result.throughput == pytest.approx(1474.34)


def test_a_failing_perf_analyzer_run_says_what_it_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "perf_analyzer"
    fake.write_text("#!/bin/sh\necho 'Failed to obtain stable measurement'\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setenv(perf_analyzer.BINARY_ENV, str(fake))
    with pytest.raises(RuntimeError, match="exited 2: Failed to obtain stable measurement"):
        perf_analyzer.run("mlp", "h:1", "http", 1, tmp_path / "in.json", interval_ms=10)


def test_lane_ratios_skip_failed_runs_and_bound_the_client() -> None:
    from plaza.loadgen.bench.perf import CONCURRENCIES, _lane_ratios

    runs: dict[str, dict[str, object]] = {}
    for c in CONCURRENCIES:
        runs[f"naive http c{c}"] = {"throughput": 1000.0, "p50_ms": 1.0, "p99_ms": 2.0}
        runs[f"plaza http c{c}"] = {"throughput": 500.0, "p50_ms": 4.0, "p99_ms": 8.0}
        runs[f"canned http c{c}"] = {
            "throughput": 4000.0,
            "p50_ms": 0.5,
            "p99_ms": 1.0,
            "cpu_us_per_request": {"server": 100.0, "client": 250.0},
        }
    runs["plaza http c64"] = {"error": "perf_analyzer was killed past 40 s"}
    lanes = ["naive http", "plaza http", "canned http"]
    ratios = _lane_ratios(runs, lanes, cores=2)
    assert ratios["c16 plaza http / naive infer/s"] == 0.5
    assert ratios["c16 plaza http / naive p99"] == 4.0
    assert "c64 plaza http / naive infer/s" not in ratios
    assert ratios["c64 canned http / naive infer/s"] == 4.0
    # 2 cores / 250 us of client CPU per request = 8,000 infer/s: 8x the naive server
    assert ratios["c1 client-only bound http / naive infer/s"] == pytest.approx(8.0)
    assert not any("bound grpc" in k for k in ratios)


def test_a_baseline_lane_counts_its_requests_on_its_http_port() -> None:
    from types import SimpleNamespace

    from plaza.loadgen.bench.perf import _BaselineProcess

    proc = SimpleNamespace(pid=4321)
    both = _BaselineProcess(proc, 8100, 8101)
    grpc = both.lane("grpc")
    assert (grpc.address, grpc.protocol) == ("127.0.0.1:8101", "grpc")
    assert grpc.stats_address == "127.0.0.1:8100" and grpc.pids == {"server": 4321}
    with pytest.raises(ValueError, match="no gRPC port"):
        _BaselineProcess(proc, 8200, None).lane("grpc")
