"""`plaza up` (what `make up` runs): everything comes up, serves, and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from plaza.stack import free_port
from tests.support import REPOSITORY

pytestmark = pytest.mark.timeout(240)


def _children(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            for child in task.read_text().split():
                found.add(int(child))
                todo.append(int(child))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _grpc_add_sub(address: str) -> tuple[list[int], list[int]]:
    """add_sub of ones and twos over the gRPC front, with tritonclient.grpc."""
    client = grpcclient.InferenceServerClient(address)
    try:
        inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
        for i, item in enumerate(inputs):
            item.set_data_from_numpy(np.full((1, 16), i + 1, dtype=np.int32))
        result = client.infer("add_sub", inputs)
        return result.as_numpy("OUTPUT0")[0].tolist(), result.as_numpy("OUTPUT1")[0].tolist()
    finally:
        client.close()


def test_up_serves_the_models_asked_for_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    repo = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "add_sub", repo / "add_sub")
    shutil.copytree(REPOSITORY / "identity", repo / "identity")  # present, not asked for
    http, grpc_port = free_port(), free_port()
    argv = [
        sys.executable,
        "-m",
        "plaza.cli.main",
        "up",
        "--repository",
        str(repo),
        "--data-dir",
        str(tmp_path / "up"),
        "--kafka-port",
        str(free_port(count=2)),
        "--redis-port",
        str(free_port()),
        "--http-port",
        str(http),
        "--metrics-port",
        str(free_port()),
        "--grpc-port",
        str(grpc_port),
        "--models",
        "add_sub",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        banner = "".join(lines)
        assert "Plaza is up." in banner, banner
        assert f"http://127.0.0.1:{http}/v2" in banner
        assert f"127.0.0.1:{grpc_port}" in banner
        body = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16},
                ]
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{http}/v2/models/add_sub/infer",
            body,
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            answer = json.load(resp)
        assert answer["outputs"][0]["data"] == [3] * 16
        assert answer["outputs"][1]["data"] == [-1] * 16
        with pytest.raises(urllib.error.HTTPError) as not_served:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/identity", timeout=30)
        assert not_served.value.code == 404
        grpc_answer = _grpc_add_sub(f"127.0.0.1:{grpc_port}")
        assert grpc_answer == ([3] * 16, [-1] * 16)
        started = _children(proc.pid)
        assert len(started) >= 4  # Kafka, Redis, a worker, the gateway
        logs = tmp_path / "up" / "logs"
        assert (logs / "host.log").is_file()  # one host process serves the models
        assert list(logs.glob("worker-*.log")) == []
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    assert "stopped." in rest
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in started):
        time.sleep(0.1)
    assert [p for p in started if _alive(p)] == []
