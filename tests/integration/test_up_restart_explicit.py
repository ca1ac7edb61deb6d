"""`plaza up` owns its deployment: a restart in explicit mode serves only what it is asked
for (not what an earlier run loaded), and the operator's exported partitions and prefixes
reach it (a setting it overrides is named in a warning)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from aiokafka.admin import AIOKafkaAdminClient

from plaza.stack import free_port

pytestmark = pytest.mark.timeout(480)

EXPORTED = {
    "PLAZA_KAFKA__TOPIC_PREFIX": "tupr.",
    "PLAZA_REDIS__KEY_PREFIX": "tupr:",
    "PLAZA_KAFKA__PARTITIONS": "3",
    "PLAZA_KAFKA__REPLICATION_FACTOR": "2",  # one broker: plaza up must use 1
}


def _states(index: list[dict[str, Any]]) -> dict[str, str]:
    return {row["name"]: row.get("state", "") for row in index}


@contextlib.contextmanager
def _plaza_up(argv: list[str]) -> Iterator[str]:
    """``plaza up`` with EXPORTED in its environment, until its banner (the text printed so
    far, warnings included); stopped with Ctrl-C after the block."""
    env = {**os.environ, **EXPORTED}
    cmd = [sys.executable, "-m", "plaza.cli.main", "up", *argv]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line or "error" in line:
                break
        yield "".join(lines)
    finally:
        proc.send_signal(2)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(lines) + rest


async def _partitions(bootstrap: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return len(described["partitions"])
    finally:
        await admin.close()


def test_a_restart_in_explicit_mode_serves_only_what_it_is_asked_for(
    tmp_path: Path, make_repository: Callable[..., Path]
) -> None:
    repo = make_repository("identity", "add_sub")
    kafka_port, redis_port, http_port = free_port(count=2), free_port(), free_port()
    argv = [
        "--repository", str(repo), "--data-dir", str(tmp_path / "up"),
        "--kafka-port", str(kafka_port), "--redis-port", str(redis_port),
        "--http-port", str(http_port), "--grpc-port", str(free_port()),
        "--metrics-port", str(free_port()), "--model-control-mode", "explicit",
    ]  # fmt: skip
    table = redis.Redis(port=redis_port)
    base = f"http://127.0.0.1:{http_port}"
    with _plaza_up([*argv, "--load-model", "add_sub"]) as banner:
        assert "models: add_sub" in banner, banner
        assert "topics tupr.infer.<model>" in banner
        warning = "plaza up: warning: PLAZA_KAFKA__REPLICATION_FACTOR exported, not used"
        assert f"{warning}: plaza up sets 1" in banner
        assert "TOPIC_PREFIX" not in banner and "PARTITIONS" not in banner
        with httpx.Client(base_url=base, trust_env=False, timeout=150) as http:
            assert http.post("/v2/repository/models/identity/load").status_code == 200
        assert set(table.hkeys("tupr:models")) == {b"add_sub", b"identity"}
        bootstrap = f"127.0.0.1:{kafka_port}"
        assert asyncio.run(_partitions(bootstrap, "tupr.infer.identity")) == 3
    with _plaza_up(argv) as banner:  # the same data dir: the same Redis, its table kept
        assert "models: none loaded" in banner, banner
        with httpx.Client(base_url=base, trust_env=False, timeout=150) as http:
            index = _states(http.post("/v2/repository/index").json())
            assert index == {"add_sub": "", "identity": ""}
            assert http.get("/v2/models/identity/ready").status_code != 200
        assert table.hgetall("tupr:models") == {}
    table.close()
